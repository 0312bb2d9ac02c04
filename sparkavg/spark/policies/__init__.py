"""Run-time policies: each rule that decides something while an epoch runs,
one small object in a module of its own (after PyTorch's DDP communication
hooks and ``PeriodicModelAverager``: the rule plus its state).

A policy has a ``name`` (the decision it records, one of
:data:`sparkavg.stats.DecisionName`), ``decide(...) -> (value,
reason)`` with whatever it needs, and, when it keeps state across epochs,
``state_dict()`` / ``load_state_dict()`` (checkpointed by its runner).
The runners compose them by the master's ``preset``:

==========================  ========================================  ==================
policy                      ``"sparkavg"``                            ``"dl4j"``
==========================  ========================================  ==================
``AveragingPath``           in one barrier stage where it can         a job per round
``AveragingFrequency``      auto, momentum cap                        pinned (5)
``BlockMomentum``           where it measured better                  off
``MomentCorrection``        Adam-like updaters, 2+ workers            off
``WorkerShares``            by measured speed                         equal
(the workers' mean)         weighted by examples                      unweighted (DL4J)
``UpdateScale``             mean for SGD-like; Adam-like from epoch 2 sum
``MomentumMasking``         Nesterov's velocity masked                off
``LocalView``               on                                        off
==========================  ========================================  ==================

:func:`record` is the one ``when_changed`` recorder every runner uses.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

__all__ = ["Policy", "record"]

logger = logging.getLogger(__name__)


class Policy:
    """Base of the run-time policies (see the module doc)."""

    #: The decision this policy records.
    name: str = ""

    def decide(self, *args, **kwargs):  # pragma: no cover - every policy defines its own
        raise NotImplementedError

    def state_dict(self) -> dict:
        """What the policy carries across epochs (plain arrays and numbers); empty by default."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output (nothing by default)."""


def record(stats, name: str, value: Any, reason: str, epoch: Optional[int]) -> bool:
    """Record ``name``'s decision when its value changed since the last one
    recorded (and log it); returns whether it was recorded."""
    if stats.decision(name, value, reason, epoch=epoch, when_changed=True):
        logger.info("%s%s: %s (%s)", "" if epoch is None else f"epoch {epoch + 1}: ", name, value, reason)
        return True
    return False
