"""Driver side of training: one epoch skeleton (:mod:`.base`) and how each
master distributes an epoch (:mod:`.averaging`, :mod:`.sharing`)."""
from ..masters import GradientSharing, ParameterAveraging
from .base import EpochRunner

__all__ = ["EpochRunner", "runner_for"]


def runner_for(seam, master) -> EpochRunner:
    """The runner of ``master`` on ``seam``."""
    if isinstance(master, ParameterAveraging):
        from .averaging import AveragingRunner

        return AveragingRunner(seam, master)
    if isinstance(master, GradientSharing):
        from .sharing import SharingRunner

        return SharingRunner(seam, master)
    raise TypeError(f"Expect master to be ParameterAveraging(...) or GradientSharing(...), "
                    f"got {type(master).__name__}")
