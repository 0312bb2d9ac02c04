"""Deferred checks of labels on the device (sparkavg.nn.device_checks): the
verdicts wait, one read resolves them all, the first bad batch is named; a
training step defers only device labels (host labels are checked at once,
here on numpy arrays standing in for device ones where the module is
agnostic)."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from sparkavg.nn import device_checks
from sparkavg.nn.losses import prepare_targets
from sparkavg.spark.executor.context import LossSum


@pytest.fixture(autouse=True)
def _clean():
    """No verdict left to the next test."""
    yield
    try:
        device_checks.resolve()
    except ValueError:
        pass


def test_verdicts_wait_until_one_read_resolves_them_all():
    for low, high in [(0, 9), (2, 7), (0, 0)]:
        device_checks.clip_labels(np.array([low, high]), 10)
    assert device_checks.pending() == 3
    device_checks.resolve()
    assert device_checks.pending() == 0
    device_checks.resolve()  # nothing pending: nothing read


def test_the_first_bad_batch_is_named_with_how_far_back_it_lies():
    device_checks.clip_labels(np.array([0, 9]), 10)
    device_checks.clip_labels(np.array([0, 12]), 10)
    device_checks.clip_labels(np.array([-1, 3]), 10)
    with pytest.raises(ValueError, match=r"^Expect class labels in \[0, 10\), got values from 0 to 12 .*"
                                         r"the batch 2 training step\(s\) before it"):
        device_checks.resolve()
    assert device_checks.pending() == 0  # read once: a later read does not raise again


def test_a_full_queue_resolves_and_the_queue_is_per_thread():
    for _ in range(device_checks.MAX_PENDING - 1):
        device_checks.clip_labels(np.array([0, 1]), 2)
        device_checks.resolve_if_full()
    assert device_checks.pending() == device_checks.MAX_PENDING - 1
    seen = []
    other = threading.Thread(target=lambda: seen.append(device_checks.pending()))
    other.start()
    other.join()
    assert seen == [0]
    device_checks.clip_labels(np.array([0, 5]), 2)
    with pytest.raises(ValueError, match="got values from 0 to 5"):
        device_checks.resolve_if_full()


def test_only_a_training_step_defers_and_host_labels_are_checked_at_once():
    assert not device_checks.active()
    with device_checks.deferring():
        assert device_checks.active()
        with device_checks.deferring():
            assert device_checks.active()
        assert device_checks.active()
        with pytest.raises(ValueError, match=r"^Expect class labels in \[0, 3\), got values from 0 to 5$"):
            prepare_targets("nll", np.array([0, 5, 1]), 3, 3, np, np.float32)  # host labels: at once
    assert not device_checks.active() and device_checks.pending() == 0


def test_a_tasks_loss_sum_reads_the_deferred_checks():
    losses = LossSum()
    losses.add(0.5, 4)
    device_checks.clip_labels(np.array([0, 7]), 5)
    with pytest.raises(ValueError, match="got values from 0 to 7"):
        losses.value()
    assert losses.value() == pytest.approx(2.0)


@pytest.mark.gpu
def test_device_labels_are_clipped_by_one_kernel_and_their_range_read_in_one_copy():
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(3)
    batches = [rng.integers(0, 10, size=n) for n in (1, 7, 1000, 4099)]
    batches.append(np.array([3, -4, 11, 0, 2]))  # bad: out of range both ways
    with device_checks.deferring():
        for i in range(2 * device_checks.MAX_PENDING + 3):  # the rows wrap round twice
            host = batches[i % 4]
            got = device_checks.clip_labels(cp.asarray(host), 10)
            np.testing.assert_array_equal(cp.asnumpy(got), host)
        assert device_checks.pending() == 3
        got = device_checks.clip_labels(cp.asarray(batches[4]), 10)
        np.testing.assert_array_equal(cp.asnumpy(got), [3, 0, 9, 0, 2])  # clipped meanwhile
        with pytest.raises(ValueError, match=r"^Expect class labels in \[0, 10\), got values from -4 to 11 .*"
                                             r"the batch 1 training step\(s\) before it"):
            device_checks.resolve()
        got = device_checks.clip_labels(cp.asarray(batches[2]), 10)  # the rows start afresh
        device_checks.resolve()
        np.testing.assert_array_equal(cp.asnumpy(got), batches[2])
