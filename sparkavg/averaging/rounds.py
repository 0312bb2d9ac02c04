"""An epoch's rounds of parameter averaging inside one barrier stage, on one
rank (no Spark here: the executor's task, :mod:`sparkavg.spark.executor.instage`,
hands in its network, its minibatches and a connected
:class:`~sparkavg.transport.CollectiveGroup`).

Round ``r``: every rank fits its ``counts[r][rank]`` minibatches, scales its
parameters, updater state, buffers (and the sums of its first moment's
squares per parameter block where the moment correction runs) by its weight (its examples, or 1 under
DL4J's unweighted mean; 0 without examples) and the ranks sum them with an
all-reduce that adds each element in one fixed order
(``allreduce_weighted(average=False)``; the job path's deal sums its
workers' results in the same order,
:func:`~sparkavg.transport.summation.ordered_sum`: bit for bit).  Then every rank merges the sums
as the driver would (:func:`~.merge.merge_sums`, the same function: moment
correction, block momentum, frozen ranges, the iteration advanced by the
round's longest shard) and starts the next round from that state.  With
the same frequency and summation order the ranks end each round with the
state the job-per-round path's driver sets.
"""
from __future__ import annotations

import time
from itertools import islice
from typing import Callable, List, Optional

import numpy as np

from ..data.transforms import transformed
from ..data.validation import split_weights
from ..stats import Phase
from .merge import block_squares, merge_sums, moment_blocks

__all__ = ["run_rounds", "EpochLog"]


class EpochLog:
    """What a rank's rounds leave for the driver: per round ``[loss_sum,
    examples, minibatches, wall start, wall end]`` (``rounds``), a
    recorder payload (``payloads``) and, where it fitted, ``[rank,
    examples, fit seconds, fit seconds]`` (``speeds``, as a round result's)."""

    __slots__ = ("rounds", "payloads", "speeds")

    def __init__(self):
        self.rounds: List[list] = []
        self.payloads: List[dict] = []
        self.speeds: List[list] = []


def run_rounds(net, minibatches, counts, rank: int, group, *, recorder: Callable, copy: Callable,
               losses: Callable, check: Callable, save_updater: bool, uniform: bool, moment_spread: bool,
               momentum=None, model=None, transform: Optional[dict] = None, hooks=None, delay: float = 0.0):
    """Run the epoch's rounds on ``net`` (which holds the shipped state); its final state stays in it.

    Parameters
    ----------
    net : Model
        This rank's network, holding the state round 0 starts from (a block
        momentum look-ahead when ``momentum`` is on).
    minibatches : iterator of (x, y)
        This rank's minibatches of every round, in order (not yet transformed).
    counts : list of list of int
        ``counts[r][w]``: minibatches worker ``w`` fits in round ``r``, the same on every rank.
    group : CollectiveGroup
        Connected; one all-reduce per round.
    recorder : callable
        A fresh ``PhaseRecorder`` for a round (round 0 gets the first one made).
    copy, losses, check : callable
        ``host_copy(vector)``, a ``LossSum()`` and ``check_finite(net, loss_sum, where)`` of the executor.
    save_updater, uniform, moment_spread : bool
        Average the updater state; weight 1 per worker (DL4J); send the first
        moment's sums of squares per block for the moment correction.
    momentum : BlockMomentum, optional
        On: its velocity and ``step`` (the driver's policy object, with its ``delta``).
    model : ndarray, optional
        ``W`` under block momentum (``net`` holds the look-ahead).
    transform : dict, optional
        The epoch's :func:`~sparkavg.data.transforms.transform_plan`; each round's
        minibatches are seeded with the iteration it starts at.
    hooks : TestHooks, optional
        The tests' faults: ``on_round`` and, before the last all-reduce, ``on_epoch_end``.

    Returns
    -------
    EpochLog
    """
    log, rec = EpochLog(), recorder()
    n = net.num_params
    w = copy(net.state["params"]) if model is None else np.array(model, dtype=np.float32)
    for r, row in enumerate(counts):
        if r:
            rec = recorder()
        if hooks is not None:
            hooks.on_round(r)
        began_wall, iteration = time.time(), net.iteration
        start = {"params": w, "updater": copy(net.state["updater"]) if save_updater else None}
        plan = None if transform is None else {**transform, "iteration": iteration}
        source = transformed(islice(minibatches, row[rank]), plan, rank)
        loss, examples, weighed, fit_began = losses(), 0, None, time.perf_counter()
        while True:
            with rec.phase(Phase.DATA_LOAD):
                mb = next(source, None)
            if mb is None:
                break
            x, weights = split_weights(mb[0])
            if weights is not None:  # weight_col: the rows' weights scale their loss and weigh the average
                weighed = float(weights.sum()) + (weighed or 0.0)
            with rec.phase(Phase.FIT):
                loss.add(net.fit_batch(x, mb[1], weights=weights, sync=False), len(mb[1]))
                if delay:
                    time.sleep(delay)
            examples += len(mb[1])
        loss_sum, seconds = loss.value(), time.perf_counter() - fit_began
        if examples:
            check(net, loss_sum, f"worker {rank}, round {r + 1}")  # as the job path names it
            log.speeds.append([rank, examples, seconds, seconds])
        live = net.state
        sums = {"params": copy(live["params"])}
        if save_updater and live["updater"].size:
            sums["updater"] = copy(live["updater"])
            if moment_spread:
                first = sums["updater"][net.updater.slot("first_moment", n)]
                sums["moment_sq"] = block_squares(first, moment_blocks(net)).astype(np.float32)
        sums["buffers"] = copy(live["buffers"])
        if hooks is not None and r == len(counts) - 1:
            hooks.on_epoch_end(rank)
        with rec.phase(Phase.WAIT):
            weight = (1.0 if uniform else float(examples) if weighed is None else weighed) if examples else 0.0
            _, total = group.allreduce_weighted(sums, weight, average=False)
        net.iteration = iteration  # the driver's network did not train: the merge advances it
        if not total and weighed is not None:
            raise ValueError(f"Expect rows of a non-zero total weight in round {r + 1}, got {examples} rows on "
                             f"worker {rank} weighing 0 and none elsewhere: every row's weight (weight_col) is 0")
        if total:
            with rec.phase(Phase.APPLY):
                moment_sq = sums.pop("moment_sq", None)
                merge_sums(net, {"params": sums["params"], "updater": sums.get("updater"), "buffers": sums["buffers"]},
                           total, max(row), start=start, workers=sum(1 for k in row if k), batches=sum(row),
                           moment_sq=moment_sq, momentum=momentum)
                w = sums["params"]  # W, loaded into the network
                if momentum is not None and r < len(counts) - 1:
                    net.load_state({"params": momentum.look_ahead(w)})  # the next round starts there
        log.rounds.append([loss_sum, examples, row[rank], began_wall, time.time()])
        log.payloads.append(rec.to_payload())
    return log
