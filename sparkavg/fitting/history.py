"""What ``SparkTrainer.fit`` returns: the run's epochs and its best one."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, List, Optional

__all__ = ["History"]


@dataclass
class History:
    """A fit's per-epoch history and its best epoch.

    Attributes
    ----------
    history : list of dict
        One entry per epoch of the run (a resumed run's earlier epochs
        first), as ``trainer.history``: ``epoch`` (from 1), ``loss`` (the
        training loss), ``learning_rate`` (of the epoch's last step),
        ``seconds``, ``examples``, ``examples_per_second``, what the master
        adds and, with validation data, ``val_loss`` and ``val_<metric>``
        (:mod:`sparkavg.fitting.metrics`; a classifier's ``val_accuracy``
        also under its earlier name ``accuracy``).
    best_epoch : int or None
        The epoch (from 1) with the best ``monitor`` value among this fit's
        epochs (a resumed run's earlier ones included); None when no epoch
        had a finite one.
    monitor : str
        What ``best_epoch`` is best at: the early stopping's monitor, else
        ``val_loss`` with validation data, else ``loss``.
    mode : {"min", "max"}
        Whether lower or higher ``monitor`` is better.
    best_value : float or None
        ``monitor`` at ``best_epoch``.
    stop_reason : str or None
        Why the fit ended before its last epoch
        (:data:`~sparkavg.fitting.early_stopping.STOP_REASONS`), or None.
    stop_message : str
        The same in words ("" when the fit ran all its epochs).
    restored_best : bool
        Whether the model was put back to ``best_epoch``'s state at the end.
    """

    history: List[dict] = field(default_factory=list)
    best_epoch: Optional[int] = None
    monitor: str = "loss"
    mode: str = "min"
    best_value: Optional[float] = None
    stop_reason: Optional[str] = None
    stop_message: str = ""
    restored_best: bool = False

    @property
    def epochs(self) -> List[int]:
        """The epochs of :attr:`history` (from 1)."""
        return [entry.get("epoch") for entry in self.history]

    def metric(self, name: str) -> list:
        """``name``'s value per epoch (None where an epoch has none), e.g. ``metric("val_loss")``."""
        return [entry.get(name) for entry in self.history]

    @property
    def best(self) -> Optional[dict]:
        """The history entry of :attr:`best_epoch` (None without one)."""
        return next((e for e in self.history if e.get("epoch") == self.best_epoch), None)

    def __len__(self) -> int:
        return len(self.history)

    def __iter__(self) -> Iterator[dict]:
        return iter(self.history)
