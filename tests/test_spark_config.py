"""Master configurations, minibatch dealing and threshold state: pure logic."""
import numpy as np
import pytest

from sparkavg.data.spark_data import DataSpec, DataValidationError, rebatch_partition
from sparkavg.spark.config import (AdaptiveThreshold, DataApproach, FixedThreshold, GradientSharing,
                                   ParameterAveraging, ResidualClipping, TargetSparsityThreshold, Topology,
                                   Weighting, master_from_dict)
from sparkavg.spark.dataprep import deal
from sparkavg.spark.threshold import ThresholdState


def test_parameter_averaging_defaults_fix_dl4j_flaws():
    m = ParameterAveraging()
    assert m.save_updater is True  # DL4J documents True but ships False
    assert m.weighting is Weighting.EXAMPLES
    assert (m.batch_size_per_worker, m.averaging_frequency, m.aggregation_depth) == (16, 5, 2)
    assert m.data_approach is DataApproach.EXPORT


@pytest.mark.parametrize("kwargs, message", [
    ({"averaging_frequency": 0}, "Expect averaging_frequency >= 1"),
    ({"batch_size_per_worker": -3}, "Expect batch_size_per_worker >= 1"),
    ({"workers": 0}, "Expect workers >= 1"),
    ({"weighting": "median"}, "Expect weighting in"),
    ({"data_approach": "ftp"}, "Expect data_approach in"),
    ({"storage_level": "IN_THE_CLOUD"}, "Expect storage_level"),
])
def test_parameter_averaging_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParameterAveraging(**kwargs)


def test_gradient_sharing_validation_and_float_threshold():
    g = GradientSharing(threshold=1e-3)
    assert g.threshold == FixedThreshold(1e-3)
    assert g.residual_post_processor == ResidualClipping(5, 5.0)
    with pytest.raises(ValueError, match="Expect threshold > 0"):
        GradientSharing(threshold=-1.0)
    with pytest.raises(ValueError, match="Expect max_datagram_bytes in"):
        GradientSharing(max_datagram_bytes=70000)
    with pytest.raises(ValueError, match="Expect network_mask in CIDR"):
        GradientSharing(network_mask="not-a-mask")
    with pytest.raises(ValueError, match="Expect topology in"):
        GradientSharing(topology="ring")


@pytest.mark.parametrize("master", [
    ParameterAveraging(weighting="uniform", averaging_frequency=3),
    GradientSharing(threshold=AdaptiveThreshold(), topology=Topology.MESH),
    GradientSharing(threshold=TargetSparsityThreshold(target=1e-2), residual_post_processor=None),
])
def test_master_dict_round_trip(master):
    assert master_from_dict(master.to_dict()) == master


@pytest.mark.parametrize("batches, workers, per_round", [(0, 2, 5), (1, 2, 5), (23, 2, 5), (40, 4, 5), (7, 3, 1)])
def test_deal_trains_every_minibatch_exactly_once(batches, workers, per_round):
    rounds = deal(batches, workers, per_round, seed=7)
    ids = sorted(i for r in rounds for shard in r for i in shard)
    assert ids == list(range(batches))
    for r in rounds:
        assert len(r) == workers
        sizes = [len(s) for s in r]
        assert max(sizes) <= per_round and max(sizes) - min(sizes) <= 1
    assert deal(batches, workers, per_round, seed=7) == rounds


def test_deal_without_seed_keeps_order():
    assert deal(6, 2, 2, seed=None) == [[[0, 2], [1, 3]], [[4], [5]]]


def test_adaptive_threshold_moves_towards_band():
    alg = AdaptiveThreshold(initial=1e-3)
    st = ThresholdState(alg, None)
    residual = np.zeros(10, np.float32)
    st.after_step(0, 1000, residual)  # nothing sent: too sparse -> lower tau
    assert st.tau == pytest.approx(1e-3 * alg.decay)
    st.after_step(500, 1000, residual)  # far too dense -> raise tau
    assert st.tau == pytest.approx(1e-3)
    st.after_step(5, 1000, residual)  # inside [1e-4, 1e-2] -> keep
    assert st.tau == pytest.approx(1e-3)
    again = ThresholdState.from_plain(alg, None, st.to_plain())
    assert again.to_plain() == st.to_plain()


def test_residual_clipping_schedule():
    st = ThresholdState(FixedThreshold(0.1), ResidualClipping(frequency=2, k=5.0))
    r = np.array([3.0, -3.0, 0.2], np.float32)
    st.after_step(0, 3, r)
    assert r[0] == 3.0  # not yet due
    st.after_step(0, 3, r)
    np.testing.assert_allclose(r, [0.5, -0.5, 0.2], rtol=1e-6)


SPEC = DataSpec((1, 2, 2), 3)


def _run(rows, batch=2):
    return list(rebatch_partition(SPEC, batch)(4, iter(rows)))


def test_rebatch_keeps_every_example_and_mixes_formats():
    pairs = [(np.full(4, i, np.float32), i % 3) for i in range(5)]
    mb = (np.zeros((3, 4), np.float32), np.array([0, 1, 2]))
    out = _run(pairs + [mb], batch=3)
    assert [len(y) for _, y in out] == [3, 3, 2]
    assert out[0][0].shape == (3, 1, 2, 2) and out[0][0].dtype == np.float32
    onehot = _run([(np.ones(4), np.array([0, 0, 1.0])), (np.ones(4), 1)])
    np.testing.assert_array_equal(onehot[0][1], [[0, 0, 1], [0, 1, 0]])


@pytest.mark.parametrize("row, message", [
    ((np.ones(5), 0), r"partition 4, row 1: expected 4 values \(input shape \(1, 2, 2\)\)"),
    ((np.array([1, np.nan, 0, 0]), 0), "partition 4, row 1: 1 NaN/inf"),
    ((np.ones(4), 3), r"partition 4, row 1: expected a class index in \[0, 3\)"),
    ((np.ones(4), 1.5), "Bad label at partition 4, row 1"),
    ("garbage", "expected a \\(features, label\\) pair"),
])
def test_rebatch_rejects_bad_rows_naming_them(row, message):
    with pytest.raises(DataValidationError, match=message):
        _run([(np.ones(4), 0), row])
