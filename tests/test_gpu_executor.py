"""The GPU executor path end to end, without Spark (skipped without CUDA).

The executor functions run here as Spark would run them -- an averaging
round task on an iterator of minibatches with a shipped handle, the
gradient-sharing step on two in-process replicas -- once on the CPU and
once on CuPy: state stays on the device, only results cross to the host,
and the results match the CPU path.
"""
from __future__ import annotations

import contextlib
import numpy as np
import pytest

from sparkavg import backend
from sparkavg.data.validation import DEFAULT_INPUT
from sparkavg.nn import Network
from sparkavg.sharing import SharingState, apply_message, apply_received, encode_update, message_bytes
from sparkavg.sharing.thresholds import FixedThreshold
from sparkavg.spark.executor.averaging import make_round_task
from sparkavg.spark.executor.context import cached_network, host_copy, load_state
from sparkavg.spark.executor.device import select_device, task_device
from sparkavg.spark.runners.base import network_state

from .nets import blobs, small_net

pytestmark = pytest.mark.gpu

TAU = 1e-3


class Shipped:
    """What a task reads from a Spark broadcast: ``.value``."""

    def __init__(self, value):
        self.value = value


@contextlib.contextmanager
def spark_task(partition: int, gpus=("0",)):
    """The task context a Spark Python worker sets before running a task
    (pyspark's worker.py): this partition, and Spark's GPU assignment."""
    from pyspark import TaskContext
    from pyspark.resource import ResourceInformation

    resources = {"gpu": ResourceInformation("gpu", list(gpus))} if gpus else {}
    TaskContext._setTaskContext(None)
    TaskContext._setTaskContext(TaskContext(partitionId=partition, resources=resources, cpus=1))
    try:
        yield TaskContext.get()
    finally:
        TaskContext._setTaskContext(None)


def _round(device: str, config_json: str, state, minibatches):
    task = make_round_task(config_json, Shipped(state), round_no=1, save_updater=True, uniform=False,
                           collect_stats=True, prefetch=1, device=device)
    with spark_task(0):  # Spark assigned GPU "0"; device="cpu" does not read it
        [result] = list(task(iter(minibatches)))
    return result


def test_averaging_round_on_the_gpu_matches_the_cpu_and_keeps_state_on_the_device():
    cp = backend.cupy()
    net = small_net(seed=31)
    config_json, state = net.to_json(), network_state(net, with_updater=True)
    x, y = blobs(48, seed=32)
    minibatches = [({DEFAULT_INPUT: x[i:i + 8]}, y[i:i + 8]) for i in range(0, 48, 8)]  # as the data path gives them

    on_cpu = _round("cpu", config_json, state, minibatches)
    on_gpu = _round("gpu", config_json, state, minibatches)

    assert type(on_gpu).__name__ == "RoundResult", on_gpu  # not a TaskFailure
    assert on_gpu.devices[0]["kind"] == "gpu" and on_gpu.devices[0]["index"] == backend.current_device()
    assert on_gpu.devices[0]["address"] == "0"  # Spark's assignment, read from the task context
    assert (on_gpu.examples, on_gpu.batches, on_gpu.max_iterations) == (48, 6, 6)
    # The round's result crossed to the host once, into pinned memory.
    for array in (on_gpu.params, on_gpu.state):
        assert isinstance(array, np.ndarray) and array.dtype == np.float32
        assert isinstance(array.base, cp.cuda.PinnedMemoryPointer)
    np.testing.assert_allclose(on_gpu.params, on_cpu.params, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(on_gpu.state, on_cpu.state, rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(on_gpu.loss_sum, on_cpu.loss_sum, rtol=1e-4)

    # The worker's cached network lives on the device: parameters, gradients, updater state.
    gpu_net = cached_network(config_json, task_device("gpu"))
    assert gpu_net.xp is cp
    assert backend.is_gpu_array(gpu_net.params) and backend.is_gpu_array(gpu_net.updater_state)
    assert cached_network(config_json, task_device("gpu")) is gpu_net  # reused by the next round
    assert cached_network(config_json, task_device("cpu")).xp is np  # one network per device


def _replicas(config_json: str, state, on_gpu: bool):
    nets = []
    for _ in range(2):
        net = Network.from_json(config_json)
        if on_gpu:
            net.to_gpu()
        load_state(net, state, with_updater=True)  # host arrays onto the device, as in a task
        nets.append(net)
    return nets


def _sharing_steps(nets, batches):
    """The executor's loop (executor/sharing.py) for two replicas exchanging bytes in memory."""
    xp = nets[0].xp
    n = nets[0].num_params
    states = [SharingState(FixedThreshold(TAU), n, xp=xp) for _ in nets]
    updates = [xp.zeros(n, xp.float32) for _ in nets]
    sent = []
    for step in batches:
        outbox = []
        for w, (net, st, update) in enumerate(zip(nets, states, updates)):
            x, y = step[w]
            net.compute_update(x, y, update)
            message = encode_update(st, update)
            if message is not None:
                assert backend.is_gpu_array(message) == (xp is not np)  # encoded on the device
                outbox.append((w, message_bytes(message)))  # only the message crosses
                apply_message(message, net.params)
        for w, (net, st) in enumerate(zip(nets, states)):
            apply_received(st, [b for src, b in outbox if src != w], net.params)  # host -> device
        sent.append(outbox)
    return states, updates, sent


def test_sharing_step_on_the_gpu_keeps_state_on_the_device_and_matches_the_cpu():
    net = small_net(seed=33)
    config_json, state = net.to_json(), network_state(net, with_updater=True)
    x, y = blobs(96, seed=34)
    batches = [[(x[i:i + 8], y[i:i + 8]), (x[i + 8:i + 16], y[i + 8:i + 16])] for i in range(0, 96, 16)]

    gpu_nets = _replicas(config_json, state, on_gpu=True)
    gpu_states, gpu_updates, gpu_sent = _sharing_steps(gpu_nets, batches)
    cpu_nets = _replicas(config_json, state, on_gpu=False)
    cpu_states, _, cpu_sent = _sharing_steps(cpu_nets, batches)

    for net, st, update in zip(gpu_nets, gpu_states, gpu_updates):
        for array in (net.params, net.updater_state, st.residual, update):
            assert backend.is_gpu_array(array)
    assert sum(len(o) for o in gpu_sent) > 0  # messages were exchanged
    a, b = (backend.to_cpu(n.params) for n in gpu_nets)
    assert np.max(np.abs(a - b)) < 1e-5  # the replicas applied the same messages
    # Threshold encoding quantises to +-tau: a float difference in an update may move an entry
    # across tau, so the CPU path agrees to a few tau, and params + residuals (all updates) closely.
    np.testing.assert_allclose(a, cpu_nets[0].params, atol=5 * TAU)
    gpu_total = a + sum(backend.to_cpu(s.residual) for s in gpu_states)
    cpu_total = cpu_nets[0].params + sum(s.residual for s in cpu_states)
    np.testing.assert_allclose(gpu_total, cpu_total, atol=5 * TAU)


def test_sharing_encode_and_apply_on_the_gpu_are_bit_exact_for_the_same_updates():
    rng = np.random.default_rng(35)
    n = 500
    updates = [(rng.standard_normal(n) * 2e-3).astype(np.float32) for _ in range(8)]
    results = {}
    for on_gpu in (False, True):
        xp = backend.cupy() if on_gpu else np
        st = SharingState(FixedThreshold(TAU), n, xp=xp)
        params = xp.zeros(n, xp.float32)
        messages = []
        for u in updates:
            message = encode_update(st, xp.asarray(u))
            if message is not None:
                messages.append(message_bytes(message))
                apply_message(messages[-1], params)  # bytes, as a peer's message arrives
        results[on_gpu] = (messages, backend.to_cpu(params), backend.to_cpu(st.residual))
    assert results[True][0] == results[False][0]
    assert np.array_equal(results[True][1], results[False][1])
    assert np.array_equal(results[True][2], results[False][2])


def test_host_copy_is_one_pinned_float32_copy():
    cp = backend.cupy()
    d = cp.arange(10, dtype=cp.float32)
    h = host_copy(d)
    assert isinstance(h.base, cp.cuda.PinnedMemoryPointer) and np.array_equal(h, np.arange(10))
    h[0] = 7  # an independent, writable copy
    assert float(d[0]) == 0.0
    h64 = host_copy(cp.arange(4, dtype=cp.float64))
    assert h64.dtype == np.float32 and np.array_equal(h64, np.arange(4))
    assert host_copy(cp.zeros(0, cp.float32)).shape == (0,)


def test_a_spark_assigned_address_becomes_the_current_device():
    last = backend.device_count() - 1
    choice = select_device("gpu", {"gpu": [str(last)]})
    assert (choice.kind, choice.index, choice.address) == ("gpu", last, str(last))
    assert backend.current_device() == last
    select_device("gpu", {"gpu": ["0"]})
    assert backend.current_device() == 0


class _TaskContext:
    """A Spark task's context as :func:`task_device` reads it: the GPU Spark assigned."""

    def __init__(self, address: str):
        self._resources = {"gpu": [address]}

    def resources(self):
        return self._resources

    def partitionId(self):
        return 0


def test_predict_evaluate_and_score_on_the_gpu_match_the_cpu_with_the_network_on_the_device(monkeypatch):
    import pyspark

    from sparkavg.evaluation import Evaluation
    from sparkavg.spark.executor.inference import make_evaluator, make_predict_fn, make_scorer

    cp = backend.cupy()
    net = small_net(seed=33)
    x, y = blobs(70, seed=34)
    net.fit_batch(x, y)
    config_json, shipped = net.to_json(), Shipped(network_state(net, with_updater=False))

    on_cpu = make_predict_fn(config_json, shipped, 32, None, "cpu")()({"input": x})
    on_gpu = make_predict_fn(config_json, shipped, 32, None, "gpu")()({"input": x})
    assert isinstance(on_gpu, np.ndarray) and on_gpu.shape == (70, 2)  # outputs cross back to the host
    np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-4, atol=1e-6)

    # The task's network is the worker's cached one on the device; each chunk runs there.
    gpu_net = cached_network(config_json, task_device("gpu"))
    assert gpu_net.xp is cp and backend.is_gpu_array(gpu_net.params)
    outputs, run = [], gpu_net.output

    def recorded(features):
        result = run(features)
        chunk = features["input"] if isinstance(features, dict) else features
        outputs.append((type(chunk).__module__.split(".")[0], type(result).__module__.split(".")[0]))
        return result

    monkeypatch.setattr(gpu_net, "output", recorded)
    # auto inside a Spark task with an assigned GPU: that GPU, as for training.
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: _TaskContext(str(backend.current_device()))))
    again = make_predict_fn(config_json, shipped, 32, None, "auto")()({"input": x})
    assert outputs == [("numpy", "cupy")] * 3  # host chunks in, device outputs, each copied back once
    np.testing.assert_allclose(again, on_gpu, rtol=1e-6)

    batches = [(x[s:s + 32], y[s:s + 32]) for s in range(0, 70, 32)]
    results = {}
    for device in ("cpu", "gpu"):
        [evals] = list(make_evaluator(config_json, shipped, [Evaluation(2)], lambda i, rows: iter(rows), None,
                                      device)(0, batches))
        [(loss_sum, n)] = list(make_scorer(config_json, shipped, lambda i, rows: iter(rows), None, device)(0, batches))
        results[device] = (evals[0], loss_sum, n)
    (ev_cpu, loss_cpu, n_cpu), (ev_gpu, loss_gpu, n_gpu) = results["cpu"], results["gpu"]
    assert n_cpu == n_gpu == 70 and ev_gpu.count == 70
    np.testing.assert_array_equal(ev_gpu.confusion_matrix, ev_cpu.confusion_matrix)
    np.testing.assert_allclose(loss_gpu, loss_cpu, rtol=1e-4)


def test_labels_on_the_device_are_checked_at_the_next_read_not_in_the_step():
    """A training step with CuPy labels defers their range check (no device read in the step) and trains on
    them clipped; the task's loss sum reads the verdict and names the batch; a synced step raises at once.
    A torch module never sees an out-of-range class (a CUDA assert would end the process's context)."""
    from sparkavg.nn import device_checks
    from sparkavg.spark.executor.context import LossSum
    from sparkavg.nn import Adam
    from sparkavg.torch import TorchModel

    cp = backend.cupy()
    x, y = blobs(16, seed=61)
    good, bad = cp.asarray(y), cp.asarray(np.where(np.arange(16) == 3, 7, y))
    for net in (small_net(seed=62).to_gpu(),
                TorchModel("tests.torch_models:mlp", updater=Adam(lr=0.01), input_shape=(1, 4, 4), seed=63).to_gpu()):
        losses = LossSum()
        losses.add(net.fit_batch(cp.asarray(x), good, sync=False), 16)
        losses.add(net.fit_batch(cp.asarray(x), bad, sync=False), 16)  # no raise here
        losses.add(net.fit_batch(cp.asarray(x), good, sync=False), 16)
        assert device_checks.pending() == 3
        with pytest.raises(ValueError, match=r"got values from 0 to 7 .*the batch 2 training step\(s\) before it"):
            losses.value()
        with pytest.raises(ValueError, match=r"^Expect class labels in \[0, 2\), got values from 0 to 7"):
            net.fit_batch(cp.asarray(x), bad)  # sync=True: read with the step's loss
        assert device_checks.pending() == 0
