"""One round's merge: the workers' weighted sums become the model's next
state -- the same arithmetic on the driver (a Spark job per round) and on
every rank of a stage that runs its rounds inside (:mod:`.rounds`).

The moment correction of averaged Adam-like state
(:func:`correct_second_moment`; decided by
:class:`~sparkavg.spark.policies.moments.MomentCorrection`): each of ``K``
workers adds ``g^2`` of its own ``B``-example gradients to the second moment
``v``: ``E[g_B^2] = mu^2 + s^2 / B``, where one process at ``K B`` examples
per step adds ``mu^2 + s^2 / (K B)``.  The plain average of the workers'
``v`` is too large by ``(1 - 1/K) s^2 / B`` in the share of ``v`` written
this round, and the steps ``m / sqrt(v)`` too small: up to ``1/sqrt(K)``
where the noise dominates.  The workers' first moments ``m`` started the
round equal, so their spread is noise: its variance across workers is ``c
s^2 / B`` with ``c = (1 - b1) / (1 + b1) (1 - b1^(2 F))`` after ``F`` steps,
which gives the excess to take off the round's share ``1 - b2^F`` of ``v``.
With few workers one coordinate's spread is too noisy to use alone, so the
excess is pooled per block (a parameter tensor, :func:`moment_blocks`): each
block keeps the fraction ``1 - excess / added`` of what the round added to
its ``v``, in ``[1/K, 1]``.  A block's spread is the workers' mean of
``sum m_w^2`` over it less ``sum m^2`` of their mean, so a worker sends one
number per block (:func:`block_squares`), not a vector as long as ``m``.  The updater names its slots through its sub-contract
(:attr:`~sparkavg.nn.updaters.Updater.roles`, ``slots``, ``decays``).

Block momentum (BMUF; Chen & Huo, ICASSP 2016; decided by
:class:`~sparkavg.spark.policies.block_momentum.BlockMomentum`): a round's
averaged change ``G = W_avg - W_sent`` feeds a block velocity ``Delta = mu
Delta + zeta G`` and ``W = W + Delta`` (:func:`block_momentum_step`).
"""
from __future__ import annotations

import numpy as np

from .. import ops
from ..backend import get_array_module, to_cpu
from ..nn.finetune import keep_frozen

__all__ = ["correct_second_moment", "correct_moments", "moment_blocks", "block_squares", "block_momentum_step",
           "merge_sums", "start_of"]


def moment_blocks(network) -> list:
    """The ``(start, stop)`` parameter ranges the moment correction pools: the
    model's declared parameter tensors (one block of all when it declares none)."""
    segments, n = network.param_segments, network.num_params
    return [(seg.start, seg.stop) for seg in segments] if segments and segments[-1].stop == n else [(0, n)]


def block_squares(m, blocks) -> np.ndarray:
    """``sum m_i^2`` over each block of ``m`` (float64): what a worker sends for the moment correction."""
    m = np.asarray(to_cpu(m), dtype=np.float64)
    return np.array([float(m[a:b] @ m[a:b]) for a, b in blocks])


def correct_second_moment(updater, state, moment_sq, sent, workers: int, steps: int, blocks) -> None:
    """Correct the averaged second moment of ``workers`` workers in ``state`` in place.

    Parameters
    ----------
    updater : Updater
        With ``"first_moment"`` and ``"second_moment"`` slots (else nothing happens).
    state : ndarray
        The workers' average state; its second-moment slot is corrected.
    moment_sq : ndarray (len(blocks),)
        The workers' average (same weights) of :func:`block_squares` of their ``m``.
    sent : ndarray
        The state every worker started the round from.
    workers, steps : int
        Workers averaged (nothing below 2); minibatches each fitted.
    blocks : list of (start, stop)
        Parameter ranges pooled together, covering ``0 .. n`` (:func:`moment_blocks`).
    """
    n = blocks[-1][1] if blocks else 0
    first, second = updater.slot("first_moment", n), updater.slot("second_moment", n)
    if first is None or second is None or workers < 2 or steps < 1 or n == 0:
        return
    if len(moment_sq) != len(blocks):
        raise ValueError(f"Expect one sum of squared first moments per block ({len(blocks)}), got {len(moment_sq)}")
    decays = updater.decays()
    b1, b2 = decays[updater.roles["first_moment"]], decays[updater.roles["second_moment"]]
    xp = get_array_module(state)
    c = (1.0 - b1) / (1.0 + b1) * (1.0 - b1 ** (2 * steps))
    m, v = state[first], state[second]
    added = xp.maximum(v - (b2 ** steps) * sent[second], 0.0)  # what this round wrote into v
    mean_sq = block_squares(m, blocks)
    for (start, stop), sq, mean in zip(blocks, np.asarray(to_cpu(moment_sq), dtype=np.float64), mean_sq):
        total = float(added[start:stop].sum())
        if total > 0.0:
            spread = max(float(sq) - float(mean), 0.0)  # the workers' variance of m over the block (population)
            # (1 - 1/K) s^2/B from a population variance of K values: spread * K/(K-1) / c * (1 - 1/K) = spread / c
            excess = spread * ((1.0 - b2 ** steps) / c)
            keep = min(1.0, max(1.0 / workers, 1.0 - excess / total))
            v[start:stop] -= (1.0 - keep) * added[start:stop]


def correct_moments(network, state_sum, moment_sq_sum, weight: float, sent, workers: int, batches: int) -> None:
    """The workers' summed updater state ``state_sum`` (weighted sums, in
    place) corrected for their gradient noise (:func:`correct_second_moment`
    on the averages); ``sent``: the updater state the round started from;
    ``batches``: the minibatches the ``workers`` fitted together."""
    inv = 1.0 / weight
    state = state_sum.astype(np.float64) * inv
    correct_second_moment(network.updater, state, moment_sq_sum.astype(np.float64) * inv,
                          np.asarray(sent, dtype=np.float64), workers, max(1, round(batches / workers)),
                          moment_blocks(network))
    state_sum[...] = state * weight


def block_momentum_step(model, averaged, delta, momentum: float, block_lr: float, nesterov: bool) -> None:
    """One BMUF update, in place on flat float32 vectors, no temporaries.

    Parameters
    ----------
    model : ndarray (n,)
        ``W``, the model before the round (read only).
    averaged : ndarray (n,)
        The workers' average ``W_avg`` on entry; ``W``'s successor on exit.
    delta : ndarray (n,)
        The block velocity ``Delta``, updated.
    momentum, block_lr : float
        ``mu`` and ``zeta``.
    nesterov : bool
        The round started from ``W + mu * Delta`` (else from ``W``).
    """
    ops.accumulate(averaged, model, -1.0)  # W_avg - W
    if nesterov:
        ops.accumulate(averaged, delta, -momentum)  # - mu * Delta: the round started from the look-ahead
    ops.scale(delta, momentum)
    ops.accumulate(delta, averaged, block_lr)
    np.copyto(averaged, model)
    ops.accumulate(averaged, delta)


def start_of(network) -> dict:
    """The host state a round starts from (``params``: ``W``, not a block
    momentum look-ahead; ``updater``), as :func:`merge_sums` takes it: views
    of a CPU network's live vectors."""
    return {name: np.ascontiguousarray(to_cpu(network.state[name])) for name in ("params", "updater")}


def merge_sums(network, sums: dict, weight: float, iterations: int, *, start: dict, workers: int, batches: int,
               moment_sq=None, momentum=None) -> None:
    """Set ``network``'s state to the round's average of the workers' sums.

    Parameters
    ----------
    network : Model
        Gets the new state and advances its iteration by ``iterations``.
    sums : dict of str to ndarray
        ``params``, ``updater`` (None without it) and ``buffers``: ``sum_w
        weight_w * value_w`` over the round's workers, float32; divided
        (and corrected) in place.
    weight : float
        The workers' summed weights.
    start : dict
        :func:`start_of` the round: the moment correction's and block
        momentum's reference, and the values frozen ranges keep.
    workers, batches : int
        Workers with examples in the round and the minibatches they fitted.
    moment_sq : ndarray, optional
        ``sum_w weight_w block_squares(m_w)`` of the first moments, one per
        block: correct the updater state (:func:`correct_moments`).
    momentum : BlockMomentum, optional
        The running block momentum (its ``step``), when on.
    """
    if sums.get("updater") is not None and moment_sq is not None and workers >= 2:
        correct_moments(network, sums["updater"], moment_sq, weight, start["updater"], workers, batches)
    inv = 1.0 / weight
    for value in sums.values():
        if value is not None and value.size and (momentum is not None or inv != 1.0):
            ops.scale(value, inv)
    if momentum is not None:
        momentum.step(np.ascontiguousarray(start["params"], dtype=np.float32), sums["params"])
    keep_frozen(network, sums, own=start)
    network.load_state(sums)
    network.iteration = network.iteration + int(iterations)
