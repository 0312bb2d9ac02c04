"""The best epoch of a run: where its state is kept, how it is marked, how it is put back.

With a ``checkpoint_dir`` the best epoch's state is its checkpoint folder
(``epoch-NNNNN/``, every epoch's folder is kept) and ``best.json`` beside
the folders names it -- ``{"folder", "run_id", "epoch", "monitor", "mode",
"value"}``, written atomically --; a fresh run removes another run's
``best.json`` before its first epoch.  Without one, the state vectors are
copied into driver memory when the epoch is the best so far (only when
they will be restored).  After validation, the epoch's checkpoint record
(``trainer.json``) is brought up to date with the validation values and
the early-stopping state (:func:`update_record`), so a resumed run goes on
from where the rule was.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Optional

from ..jsonfile import read_json
from ..nn.model import STATE_VECTORS

__all__ = ["BEST_FILE", "BestEpoch", "update_record", "best_record"]

logger = logging.getLogger(__name__)

#: The file beside a run's checkpoint folders that names the best one.
BEST_FILE = "best.json"


def _write_json(path: str, value: dict) -> None:
    """``value`` to ``path`` atomically (a reader sees the old file or the new one)."""
    with open(path + ".tmp", "w") as fh:
        json.dump(value, fh, indent=2)
    os.replace(path + ".tmp", path)


def update_record(folder: str, extra: dict) -> None:
    """Merge ``extra`` into checkpoint ``folder``'s record (``trainer.json``'s
    ``extra``: the history, the early-stopping state), atomically."""
    path = os.path.join(folder, "trainer.json")
    record = read_json(path)
    record["extra"] = {**record.get("extra", {}), **extra}
    _write_json(path, record)


def best_record(directory: str) -> Optional[dict]:
    """The ``best.json`` of checkpoint folder ``directory``, or None when there is none."""
    path = os.path.join(directory, BEST_FILE)
    return read_json(path) if os.path.exists(path) else None


class BestEpoch:
    """Keeps the state of a run's best epoch, where it already is or in memory.

    Parameters
    ----------
    checkpoint_dir : str, optional
        The run's checkpoint folder.
    run_id : str
        The run (a resumed run's, after :meth:`resume`).
    in_memory : bool
        Copy the state into driver memory when there is no checkpoint
        (early stopping will restore it).
    """

    def __init__(self, checkpoint_dir: Optional[str], run_id: str, in_memory: bool):
        self.checkpoint_dir, self.run_id, self.in_memory = checkpoint_dir, run_id, in_memory
        self.epoch: Optional[int] = None
        self.folder: Optional[str] = None
        self.state: Optional[dict] = None

    def forget_other_runs(self) -> None:
        """Remove ``best.json`` of another run (or a damaged one) from the checkpoint folder."""
        if not self.checkpoint_dir:
            return
        try:
            stale = (best_record(self.checkpoint_dir) or {"run_id": self.run_id}).get("run_id") != self.run_id
        except ValueError:  # a damaged record names no run
            stale = True
        if stale:
            os.remove(os.path.join(self.checkpoint_dir, BEST_FILE))

    def resume(self, directory: str, run_id: str, epoch: Optional[int]) -> None:
        """A resumed run whose best epoch is ``epoch``: its folder in ``directory``, when there."""
        self.run_id, self.epoch = run_id, epoch
        folder = None if epoch is None else os.path.join(directory, f"epoch-{epoch:05d}")
        self.folder = folder if folder is not None and os.path.isdir(folder) else None

    def keep(self, epoch: int, checkpoint: Optional[str], snapshot, record: dict) -> None:
        """Epoch ``epoch`` is the best so far: mark its ``checkpoint`` folder
        (``record``: the monitor, its mode and value), or copy ``snapshot()``
        into memory when there is none."""
        self.epoch, self.folder, self.state = epoch, checkpoint, None
        if checkpoint is not None:
            _write_json(os.path.join(os.path.dirname(checkpoint), BEST_FILE),
                        {"folder": os.path.basename(checkpoint), "run_id": self.run_id, "epoch": epoch, **record})
        elif self.in_memory:
            self.state = snapshot()

    def restore(self, network) -> Optional[str]:
        """Put the best epoch's state vectors into ``network``; where they came
        from, or None (logged) when they are in neither place."""
        if self.state is not None:
            network.load_state(self.state)
            return "driver memory"
        if self.folder is not None:
            from ..nn import load_model
            from ..references import named_code

            saved = load_model(os.path.join(self.folder, "network.npz"), trusted=named_code(network))
            network.load_state({k: saved.state[k] for k in STATE_VECTORS})
            return self.folder
        logger.warning("restore_best: the state of the best epoch %s is neither in a checkpoint nor in memory (its "
                       "checkpoint folder is gone?): the model keeps the state of its last epoch", self.epoch)
        return None
