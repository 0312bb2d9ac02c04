"""Executor side of parameter averaging: one task per worker per round."""
from __future__ import annotations

import time
from typing import Iterator, Optional

import numpy as np

from ... import ops
from ...backend import get_array_module
from ...averaging.merge import block_squares, moment_blocks
from ...configurable import register
from ...data.validation import split_weights
from ..errors import DivergenceError, failure_aware, task_failure_guard
from ...stats import Phase, PhaseRecorder, task_lane
from .context import LossSum, Record, cached_network, host_copy, load_state, task_partition
from .device import task_device
from .minibatches import recorded_minibatches

__all__ = ["RoundResult", "combine_results", "make_round_task", "check_finite"]


@register("result")
class RoundResult(Record):
    """What one worker returns from a round: weighted sums, ready to add.

    ``params``, ``state`` (the updater's) and ``buffers`` hold ``weight *
    value``; the driver divides the aggregated sums by the aggregated ``weight``.  ``devices`` lists each
    worker's :meth:`~sparkavg.spark.executor.device.DeviceChoice.to_plain`.
    ``speeds`` lists each worker's ``[partition, examples, fit_seconds,
    task_seconds, task_start]``: the examples it fitted, the wall time from
    its first minibatch's wait to its last step, and from the task's start
    to its result, and the task's start (``time.time()`` on the executor:
    how long after the round's launch it began) -- what the runner's shares
    by speed are cut from.  ``moment_sq`` holds ``weight`` times the
    sums of ``m * m`` per parameter block (:func:`~sparkavg.averaging.merge.block_squares`) of the
    updater's first moment (:meth:`~sparkavg.nn.updaters.Updater.slot` ``"first_moment"``)
    when the master corrects the averaged state for the workers' gradient
    noise, else None.
    """

    __slots__ = ("weight", "params", "state", "buffers", "loss_sum", "examples", "batches", "max_iterations",
                 "stats", "devices", "speeds", "moment_sq")


@failure_aware
def combine_results(a, b):
    """Sum two round results in place (``a`` is reused): a deal's ``aggregate`` adds
    them so in the all-reduce's order.  A :class:`TaskFailure` wins over any result."""
    ops.accumulate(a.params, b.params)
    if a.state is not None and b.state is not None:
        ops.accumulate(a.state, b.state)
    if a.moment_sq is not None and b.moment_sq is not None:
        ops.accumulate(a.moment_sq, b.moment_sq)
    if a.buffers.size:
        ops.accumulate(a.buffers, b.buffers)
    a.weight += b.weight
    a.loss_sum += b.loss_sum
    a.examples += b.examples
    a.batches += b.batches
    a.max_iterations = max(a.max_iterations, b.max_iterations)
    a.stats = a.stats + b.stats
    a.devices = a.devices + b.devices
    a.speeds = a.speeds + b.speeds
    return a


def check_finite(net, loss_sum: float, where: str) -> None:
    """Raise :class:`DivergenceError` when the loss or a parameter is not finite."""
    if not np.isfinite(loss_sum):
        raise DivergenceError(f"training diverged: non-finite loss ({loss_sum}) on {where} at iteration "
                              f"{net.iteration}; lower the learning rate")
    xp = get_array_module(net.state["params"])
    if not bool(xp.isfinite(net.state["params"]).all()):
        raise DivergenceError(f"training diverged: non-finite parameters on {where} at iteration {net.iteration}; "
                              "lower the learning rate")


def make_round_task(config_json: str, shipped, *, round_no: int, save_updater: bool, uniform: bool,
                    collect_stats: bool, prefetch: int, hooks=None, device: str = "auto",
                    moment_spread: bool = False):
    """Executor function for one averaging round: fit every minibatch of
    this worker's shard, return one :class:`RoundResult` (none if empty),
    or a :class:`TaskFailure` for an error retrying cannot fix.

    ``device`` is the master's ``device`` as a plain str (``"auto"``,
    ``"gpu"``, ``"cpu"``; :mod:`.device`): the network trains there and
    only the round's result crosses to the host.  ``moment_spread``: also
    return ``weight`` times the sums of ``m * m`` per parameter block of the
    updater's first moment (the master's ``moment_correction``).
    """

    def run(items) -> Iterator:
        if hooks is not None:
            hooks.on_task_start()
        partition = task_partition()
        failures: list = []
        result: Optional[RoundResult] = None
        with task_failure_guard(failures, worker=partition, round=round_no):
            result = _fit_shard(items, partition)
        if failures:
            yield failures[0]
        elif result is not None:
            yield result

    def _fit_shard(items, partition) -> Optional[RoundResult]:
        task_began, task_wall = time.perf_counter(), time.time()
        rec = PhaseRecorder(task_lane(partition))
        with rec.phase(Phase.FETCH):
            state = shipped.value
        with rec.phase(Phase.MODEL_INIT):
            choice = task_device(device)
            net = cached_network(config_json, choice)
            load_state(net, state, save_updater)  # host -> device for a GPU network
        start_iteration = net.iteration
        losses, examples, batches, weighed = LossSum(), 0, 0, None
        delay = hooks.minibatch_delay(partition) if hooks is not None else 0.0
        began = time.perf_counter()
        for x, y in recorded_minibatches(items, prefetch, rec, state.get("transform"), partition):
            x, w = split_weights(x)
            if w is not None:
                weighed = float(w.sum()) + (weighed or 0.0)
            with rec.phase(Phase.FIT):
                losses.add(net.fit_batch(x, y, weights=w, sync=False), len(y))  # a GPU step does not wait
                if delay:
                    time.sleep(delay)
            examples += len(y)  # x is a dict of inputs by name
            batches += 1
        if examples == 0:
            return None
        loss_sum = losses.value()  # (a GPU step's loss: the wait for the device ends the fitting time)
        seconds = time.perf_counter() - began
        check_finite(net, loss_sum, f"worker {partition}, round {round_no}")
        weight = 1.0 if uniform else float(examples) if weighed is None else weighed  # weight_col: their sum
        params = host_copy(net.state["params"])  # the round's one device -> host copy (GPU)
        ops.scale(params, weight)
        updater_state = moment_sq = None
        live = net.state
        if save_updater and live["updater"].size:
            updater_state = host_copy(live["updater"])
            if moment_spread:  # ParameterAveraging.corrects_moments, decided on the driver
                moment = net.updater.slot("first_moment", live["params"].size)
                moment_sq = block_squares(updater_state[moment], moment_blocks(net)).astype(np.float32)
                ops.scale(moment_sq, weight)
            ops.scale(updater_state, weight)
        buffers = host_copy(live["buffers"])  # BatchNorm's statistics: averaged like parameters
        if buffers.size:
            ops.scale(buffers, weight)
        return RoundResult(weight, params, updater_state, buffers, loss_sum, examples, batches,
                           net.iteration - start_iteration, [rec.to_payload()] if collect_stats else [],
                           [choice.to_plain(partition)],
                           [[int(partition), int(examples), float(seconds), float(time.perf_counter() - task_began),
                             task_wall]], moment_sq)

    return run
