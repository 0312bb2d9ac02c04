"""What a fit does when training diverges (a non-finite loss or parameter on
a worker): ``SparkTrainer(on_divergence=...)``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

__all__ = ["Recover", "divergence_policy"]


@dataclass(frozen=True)
class Recover:
    """Restore the state from the start of the diverged epoch, multiply the
    learning rate by ``lr_factor`` and train the epoch again, up to
    ``max_recoveries`` times per fit (then raise as ``"raise"`` does).

    Parameters
    ----------
    max_recoveries : int, default 3
    lr_factor : float, default 0.5
        In (0, 1).
    """

    max_recoveries: int = 3
    lr_factor: float = 0.5

    def __post_init__(self):
        m = self.max_recoveries
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            raise ValueError(f"Expect max_recoveries >= 0 (an int), got {m!r}")
        f = self.lr_factor
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f) or not 0 < f < 1:
            raise ValueError(f"Expect lr_factor in (0, 1), got {f!r}")


def divergence_policy(value) -> Optional[Recover]:
    """``on_divergence`` as a policy: None for ``"raise"`` (stop the fit with
    :class:`~sparkavg.spark.DivergenceError`), :class:`Recover` for
    ``"recover"`` (its defaults) or a ``Recover(...)``."""
    if isinstance(value, Recover):
        return value
    if value == "raise":
        return None
    if value == "recover":
        return Recover()
    raise ValueError(f"Expect on_divergence 'raise', 'recover' or Recover(max_recoveries=..., lr_factor=...), got "
                     f"{value!r}")
