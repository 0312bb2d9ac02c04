"""Block momentum: blockwise model-update filtering (BMUF;
Chen & Huo, ICASSP 2016; also SlowMo, Wang et al. 2020).

A round's averaged change is a *block gradient* ``G = W_avg - W_sent``.
The driver (or, rounds inside one stage, every rank) keeps a flat block
velocity ``Delta`` and sets (:func:`~sparkavg.averaging.merge.block_momentum_step`)::

    Delta = mu * Delta + zeta * G
    W     = W + Delta

and the next round starts from the Nesterov look-ahead ``W + mu * Delta``
(the network itself holds ``W``), with ``mu = 1 - 1/workers`` (the paper's
rule: averaging ``N`` workers shrinks a round's step to about one worker's)
and ``zeta = 1``.  It multiplies the averaged model's step by about
``1 / (1 - mu)``: at small frequencies that is a doubled learning rate, and
on top of an updater's own momentum it overshoots -- so it runs only in
epochs averaging every :data:`MIN_FREQUENCY` minibatches or more, with an
updater without a momentum of its own (measured: benchmarks/).  An epoch
without it averages plainly and drops the velocity.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from ... import ops
from ...averaging.merge import block_momentum_step
from . import Policy

__all__ = ["BlockMomentum", "block_momentum_step", "MIN_FREQUENCY"]

#: Block momentum runs only in epochs averaging at least this many minibatches per round.
MIN_FREQUENCY = 32


class BlockMomentum(Policy):
    """Decision ``block_momentum`` (the momentum, 0.0 when off) and the block velocity.

    Parameters
    ----------
    enabled : bool
        False (preset ``"dl4j"``): plain averaging always.
    min_frequency : int
        Tests may lower :data:`MIN_FREQUENCY` to see it act on small data.
    """

    name = "block_momentum"

    def __init__(self, enabled: bool = True, min_frequency: int = MIN_FREQUENCY, block_lr: float = 1.0,
                 nesterov: bool = True):
        self.enabled, self.min_frequency = enabled, min_frequency
        self.block_lr, self.nesterov = block_lr, nesterov
        self.delta: Optional[np.ndarray] = None
        self.momentum: Optional[float] = None
        self.on = False

    def decide(self, frequency: int, updater, workers: int) -> Tuple[float, str]:
        """Whether it runs in an epoch averaging every ``frequency``
        minibatches with ``updater``; off drops the velocity."""
        own = float(getattr(updater, "momentum", 0.0) or 0.0)
        name = type(updater).__name__
        if not self.enabled:
            self.on, why = False, "preset 'dl4j': plain averaging"
        elif own > 0.0:
            self.on, why = False, (f"off: the updater {name} has its own momentum {own:g}, and block momentum on top "
                                   f"overshoots")
        elif frequency < self.min_frequency:
            self.on, why = False, (f"off: averaging every {frequency} minibatches (< {self.min_frequency}) is close "
                                   f"to one process at the workers' combined batch, where block momentum only "
                                   f"doubles the step")
        else:
            if self.momentum is None:
                self.momentum = 1.0 - 1.0 / workers
            self.on, why = True, (f"on: averaging every {frequency} minibatches with {name}; momentum "
                                  f"{self.momentum:g} = 1 - 1/workers (Chen & Huo 2016), Nesterov look-ahead")
        if not self.on:
            self.delta = None
        return (self.momentum if self.on else 0.0), why

    def look_ahead(self, params):
        """The parameters a round starts from: ``W + mu * Delta`` when on (a copy), else ``params``."""
        if not (self.on and self.nesterov and self.delta is not None):
            return params
        ahead = params.copy()
        ops.accumulate(ahead, self.delta, self.momentum)
        return ahead

    def step(self, model, averaged) -> None:
        """``averaged`` (the workers' mean) becomes the next ``W`` (:func:`block_momentum_step`)."""
        if self.delta is None:
            self.delta = np.zeros_like(model)
        block_momentum_step(model, averaged, self.delta, self.momentum, self.block_lr, self.nesterov)

    def state_dict(self) -> dict:
        return {} if self.delta is None else {"block_momentum_delta": self.delta.copy()}

    def load_state_dict(self, state: dict) -> None:
        delta = state.get("block_momentum_delta")
        self.delta = None if delta is None else np.array(delta, dtype=np.float32)
