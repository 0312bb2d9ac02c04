"""Gradient sharing's policies, decided on the driver each epoch and shipped
to the ranks as plain values: the update scale, momentum masking, the local
view and the threshold rule's record."""
from __future__ import annotations

from typing import Tuple

from . import Policy

__all__ = ["UpdateScale", "MomentumMasking", "LocalView", "ThresholdChoice"]

class UpdateScale(Policy):
    """Decision ``update_scale``: the factor each worker's update is multiplied
    by before encoding.  Preset ``"sparkavg"``: ``1/workers`` for SGD-like
    updaters (the workers' updates then sum to one process's step at the
    combined batch); for updaters that normalise their step (Adam ...) the
    whole update in the first epoch, while training moves fast, and
    ``1/workers`` from the second on.  Preset ``"dl4j"``: the whole update."""

    name = "update_scale"

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def decide(self, updater, workers: int, epoch: int) -> Tuple[float, str]:
        name = type(updater).__name__ if updater is not None else "an unknown updater"
        if not self.enabled:
            return 1.0, "preset 'dl4j': every worker's whole update"
        if getattr(updater, "linear", False):
            return 1.0 / workers, (f"{name}'s step is linear in the gradient: the workers' updates divided by "
                                   f"{workers} sum to one process's step at {workers} x the batch")
        if epoch == 0:
            return 1.0, (f"first epoch: {name} normalises its step, so each worker's is about one process's size; "
                         f"summed while training moves fast")
        return 1.0 / workers, (f"epoch {epoch + 1}: {name}'s steps summed over {workers} workers would be {workers} x "
                               f"one process's step; divided by {workers} from the second epoch on")


class MomentumMasking(Policy):
    """Decision ``momentum_masking``: after each message a worker clears its
    updater's velocity where the message sent the entry (DGC's momentum
    factor masking, Lin et al. 2018), so an update already in flight is not
    pushed again by the momentum it left behind.  Off under ``"dl4j"``."""

    name = "momentum_masking"

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def decide(self, updater) -> Tuple[bool, str]:
        name = type(updater).__name__ if updater is not None else "the model's updater"
        has_velocity = "velocity" in getattr(updater, "roles", {})
        if not self.enabled:
            return False, "preset 'dl4j': the velocity keeps every entry"
        if not has_velocity:
            return False, f"{name} keeps no velocity to mask"
        return True, f"{name}'s velocity is cleared where a message sent the entry: the residual carries it"


class LocalView(Policy):
    """Decision ``local_view``: each worker's gradient at the shared parameters
    plus its own residual (error-compensated local iterates, Basu et al.
    2019), so its own updates below τ are not invisible to it.  Off under
    ``"dl4j"`` (gradients at the shared parameters alone)."""

    name = "local_view"

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def decide(self) -> Tuple[bool, str]:
        if not self.enabled:
            return False, "preset 'dl4j': gradients at the shared parameters alone"
        return True, "each worker's gradient is taken at the shared parameters plus its own residual"


class ThresholdChoice(Policy):
    """Decision ``threshold``: the rule in use (the master's)."""

    name = "threshold"

    def decide(self, rule, default) -> Tuple[dict, str]:
        if rule == default:
            return rule.to_config(), "the default: DL4J's adaptive rule and band from its documented 1e-3"
        return rule.to_config(), "set by user"
