"""Master configurations, minibatch dealing and threshold state: pure logic."""
import numpy as np
import pytest

from sparkavg.configurable import ConfigError

from sparkavg.data.validation import DataSpec, DataValidationError, rebatch_partition
from sparkavg.spark.data import PreparedData
from sparkavg.spark.deal import deal, deal_choice, deal_shards, local_shards, shard_label_skew
from sparkavg.spark.masters import (DEFAULT_THRESHOLD, AdaptiveThreshold, DataOptions, EndpointConfig, FixedThreshold,
                                    GradientSharing, ParameterAveraging, Placement, ResidualClipping,
                                    TargetSparsityThreshold, Topology, Weighting, master_from_config)


def test_parameter_averaging_defaults_fix_dl4j_flaws():
    m = ParameterAveraging()
    assert m.save_updater is True  # DL4J documents True but ships False
    assert m.weighting is Weighting.EXAMPLES
    assert (m.batch_size_per_worker, m.averaging_frequency, m.aggregation_depth) == (16, "auto", 2)
    assert m.data == DataOptions() and m.data.placement is Placement.AUTO and m.data.shared_dir is None


@pytest.mark.parametrize("kwargs, message", [
    ({"averaging_frequency": 0}, "Expect averaging_frequency >= 1"),
    ({"batch_size_per_worker": -3}, "Expect batch_size_per_worker >= 1"),
    ({"workers": 0}, "Expect workers >= 1"),
    ({"weighting": "median"}, "Expect weighting in"),
    ({"data": "ftp"}, "Expect data to be DataOptions"),
    ({"seed": -1}, r"Expect seed in \[0, 2147483647\]"),
    ({"device": "tpu"}, "Expect device in"),
])
def test_parameter_averaging_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParameterAveraging(**kwargs)


def test_gradient_sharing_validation_and_float_threshold():
    g = GradientSharing(threshold=1e-3)
    assert g.threshold == FixedThreshold(1e-3)
    d = GradientSharing()  # issue 22's defaults
    assert d.threshold == AdaptiveThreshold(initial=1e-3) == DEFAULT_THRESHOLD  # DL4J's rule, band and 1e-3
    assert d.staleness == 0 and d.update_scale == "auto"
    assert "the default" in d.threshold_reason() and "0.01-1%" in d.threshold_reason()
    assert g.threshold_reason() == "threshold=FixedThreshold(threshold=0.001) (set by user)"
    with pytest.raises(ValueError, match="Expect staleness >= 0"):
        GradientSharing(staleness=-1)
    with pytest.raises(ValueError, match="Expect update_scale 'auto', 'mean' or 'sum', got 'avg'"):
        GradientSharing(update_scale="avg")
    with pytest.raises(ValueError, match="Expect momentum_masking to be a bool, got 'yes'"):
        GradientSharing(momentum_masking="yes")
    with pytest.raises(ValueError, match="Expect local_view to be a bool, got 0"):
        GradientSharing(local_view=0)
    assert d.local_view and "its own residual" in d.view_reason()
    assert "set by user" in GradientSharing(local_view=False).view_reason()
    with pytest.raises(ValueError, match="Expect moment_correction to be a bool, got 1"):
        ParameterAveraging(moment_correction=1)
    from sparkavg.nn import SGD, Adam, Nesterov

    assert d.masking_for(Nesterov())[0] and not d.masking_for(Adam())[0]
    assert GradientSharing(momentum_masking=False).masking_for(Nesterov()) == (
        False, "momentum_masking=False (set by user): the velocity keeps every entry")
    assert ParameterAveraging().corrects_moments(Adam(), 2)[0] and not ParameterAveraging().corrects_moments(SGD(), 2)[0]
    assert ParameterAveraging().corrects_moments(Adam(), 1) == (False, "one worker: its state is one process's")
    assert g.residual_post_processor == ResidualClipping(5, 5.0)
    with pytest.raises(ValueError, match="threshold"):
        GradientSharing(threshold=-1.0)
    with pytest.raises(ValueError, match="Expect max_datagram_bytes in"):
        GradientSharing(transport=EndpointConfig(max_datagram_bytes=70000))
    with pytest.raises(ValueError, match="Expect network_mask in CIDR"):
        GradientSharing(network_mask="not-a-mask")
    with pytest.raises(ValueError, match="Expect topology in"):
        GradientSharing(topology="ring")


@pytest.mark.parametrize("master", [
    ParameterAveraging(weighting="uniform", averaging_frequency=3),
    GradientSharing(threshold=AdaptiveThreshold(), topology=Topology.MESH),
    GradientSharing(threshold=TargetSparsityThreshold(target=1e-2), residual_post_processor=None),
    GradientSharing(staleness=None, update_scale="sum"),
])
def test_master_config_round_trip(master):
    import json

    assert master_from_config(json.loads(json.dumps(master.to_config()))) == master


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


@pytest.mark.parametrize("batches, workers, per_round", [(0, 2, 5), (1, 2, 5), (23, 2, 5), (40, 4, 5), (7, 3, 1),
                                                         (9, 2, 100)])
def test_local_deal_trains_every_minibatch_exactly_once(batches, workers, per_round):
    shards = local_shards(batches, workers)
    rounds = deal_shards(shards, per_round, seed=7)
    assert sorted(i for r in rounds for shard in r for i in shard) == list(range(batches))
    for r in rounds:
        assert len(r) == workers
        sizes = [len(s) for s in r]
        assert max(sizes) <= per_round and max(sizes) - min(sizes) <= 1
    for w in range(workers):  # a worker only ever sees its own shard, every epoch
        for seed in (7, 8):
            assert sorted(i for r in deal_shards(shards, per_round, seed) for i in r[w]) == sorted(shards[w])
    assert deal_shards(shards, per_round, seed=7) == rounds
    if batches > 2 * workers:
        assert deal_shards(shards, per_round, seed=8) != rounds  # reshuffled every epoch


def test_local_shards_follow_hosts_then_partitions():
    # Blocks made by 4 tasks: partitions 0 and 2 on host b, 1 and 3 on host a, 3 minibatches each.
    layout = [("b", 0)] * 3 + [("a", 1)] * 3 + [("b", 2)] * 3 + [("a", 3)] * 3
    assert local_shards(12, 2, layout) == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]
    # Which host got which partitions does not change the shards (a resumed fit deals the same).
    swapped = [("a" if h == "b" else "b", p) for h, p in layout]
    assert local_shards(12, 2, swapped) == local_shards(12, 2, layout)
    # Unequal hosts: shards stay balanced (sizes differ by at most one), host by host.
    layout = [("a", 0)] * 5 + [("b", 1)] * 2
    assert local_shards(7, 2, layout) == [[0, 1, 2, 3], [4, 5, 6]]
    assert local_shards(3, 5) == [[0], [1], [2], [], []]
    assert deal_shards(local_shards(6, 2), 2, seed=None) == [[[0, 1], [3, 4]], [[2], [5]]]
    with pytest.raises(ValueError, match="layout entry per minibatch"):
        local_shards(3, 2, [("a", 0)])


@pytest.mark.parametrize("repartition, in_files, local", [
    ("auto", False, True), ("auto", True, False), ("local", True, True), ("balanced", False, False),
    ("never", False, False)])
def test_repartition_chooses_the_deal(repartition, in_files, local):
    prepared = PreparedData([1, 1], paths=["a", "b"] if in_files else None)
    chosen, reason = deal_choice(DataOptions(repartition=repartition), prepared, 2)
    assert chosen is local and reason


@pytest.mark.parametrize("options, depth", [
    (DataOptions(), 0), (DataOptions(shared_dir="/mnt/nfs/x"), 0), (DataOptions(shared_dir="file:///mnt/x"), 0),
    (DataOptions(shared_dir="s3://bucket/x"), 1), (DataOptions(shared_dir="hdfs://nn/x", prefetch=3), 3),
    (DataOptions(prefetch=2), 2)])
def test_prefetch_auto_loads_ahead_only_from_remote_filesystems(options, depth):
    assert options.prefetch_depth == depth


def test_auto_deals_balanced_when_hosts_hold_different_classes():
    # 8 minibatches of 4 examples, 2 classes; partition 0 (host a) and 1 (host b).
    layout = [("a", 0)] * 4 + [("b", 1)] * 4
    mixed = np.array([[2.0, 2.0]] * 8)
    by_label = np.array([[4.0, 0.0]] * 4 + [[0.0, 4.0]] * 4)
    assert shard_label_skew(local_shards(8, 2, layout), mixed) == 0.0
    assert shard_label_skew(local_shards(8, 2, layout), by_label) == pytest.approx(0.5)
    auto = DataOptions()
    local, reason = deal_choice(auto, PreparedData([4] * 8, layout=layout, labels=mixed), 2)
    assert local and "within 0.000" in reason
    local, reason = deal_choice(auto, PreparedData([4] * 8, layout=layout, labels=by_label), 2)
    assert not local and "differ from the data's by 0.50" in reason
    # Asked for explicitly, local stays local.
    assert deal_choice(DataOptions(repartition="local"), PreparedData([4] * 8, labels=by_label), 2)[0]


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


@pytest.mark.parametrize("bad", [
    (np.ones(5), 0),  # too many values
    (np.array([1, np.nan, 0, 0]), 0),
    (np.ones(4), 3),  # class out of range
    (np.ones(4), 1.5),  # not a class index
    (np.ones(4), [0.0, 1.0]),  # one-hot row of the wrong width
    (np.ones(4), [0.0, np.inf, 0.0]),
])
def test_rows_and_arrow_batches_break_a_rule_with_one_message(bad):
    # One rule, one message: the row path and the Arrow path (outside Spark: partition 0) agree.
    import pyarrow as pa

    from sparkavg.spark.executor.arrow import failure_from_row, make_minibatcher

    features, label = bad
    onehot = isinstance(label, list)
    good = (np.ones(4), [1.0, 0.0, 0.0] if onehot else 0)
    with pytest.raises(DataValidationError) as rows:
        list(rebatch_partition(SPEC, 2)(0, iter([good, (features, np.asarray(label))])))
    batch = pa.RecordBatch.from_pydict({
        "features": pa.array([good[0].tolist(), features.tolist()], pa.list_(pa.float64())),
        "label": pa.array([good[1], label], pa.list_(pa.float64()) if onehot else None)})
    out = list(make_minibatcher(SPEC, 2, "features", "label")(iter([batch])))
    failure = failure_from_row(out[-1].column("error")[0].as_py())
    assert failure is not None and failure.kind == "DataValidationError"
    assert failure.message == str(rows.value)
    assert "partition 0, row 1" in failure.message


@pytest.mark.parametrize("source, kept", [
    ("uint8", "uint8"), ("int16:0..255", "uint8"), ("int16:-3..100", "int8"), ("int64:0..300", "uint16"),
    ("int32:-300..300", "int16"), ("int32:0..70000", "float32"), ("float16", "float16"), ("float64", "float32"),
])
def test_feature_dtype_auto_keeps_integers_and_float16_compact_with_float32_values(source, kept):
    """feature_dtype='auto' (the default): the rows path (RDD) and the Arrow
    path (DataFrame, outside Spark) keep a minibatch's integers in the
    narrowest compact integer dtype holding them and float16 as it is, else
    float32; converted to float32 the values are what None (float32) gives."""
    import pyarrow as pa

    from sparkavg.spark.executor.arrow import inputs_from_bytes, make_minibatcher

    assert DataOptions().feature_dtype == "auto" and "feature_dtype" not in DataOptions().config_arguments()
    dtype, _, bounds = source.partition(":")
    lo, hi = (int(v) for v in bounds.split("..")) if bounds else (0, 200)
    x = np.linspace(lo, hi, 16).round().astype(dtype).reshape(4, 4)
    rows = [(x[i], i % 3) for i in range(4)]
    auto = [mb for mb, _ in rebatch_partition(SPEC, 4, "auto")(0, iter(rows))]
    old = [mb for mb, _ in rebatch_partition(SPEC, 4)(0, iter(rows))]
    assert auto[0].dtype == np.dtype(kept) and old[0].dtype == np.float32
    np.testing.assert_array_equal(auto[0].astype(np.float32), old[0])
    arrow_type = pa.from_numpy_dtype(x.dtype)
    batch = pa.RecordBatch.from_pydict({"features": pa.array(list(x), pa.list_(arrow_type)),
                                        "label": pa.array([i % 3 for i in range(4)], pa.int64())})
    for feature_dtype, want in (("auto", kept), (None, "float32")):
        out = list(make_minibatcher(SPEC, 4, "features", "label", feature_dtype=feature_dtype)(iter([batch])))
        got = inputs_from_bytes(out[0].column("x")[0])
        assert got.dtype == np.dtype(want)
        np.testing.assert_array_equal(got.astype(np.float32), old[0])


@pytest.mark.parametrize("kwargs, message", [
    ({"storage_level": "IN_THE_CLOUD"}, "Expect storage_level"),
    ({"placement": "ftp"}, "Expect placement in"),
    ({"placement": "files"}, "Expect shared_dir"),
    ({"shared_dir": 123}, "Expect shared_dir to be a path or URL"),
    ({"prefetch": -1}, "Expect prefetch >= 0"),
])
def test_data_options_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DataOptions(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    # settings the executors' transport and encoder reject are rejected here, by the same rules
    ({"threshold": 1e-50}, "threshold"),
    ({"threshold": 1e39}, "threshold"),
    ({"threshold": float("nan")}, "threshold"),
    ({"port": 65535, "workers": 2}, r"Expect port \+ workers - 1 <= 65535"),
    ({"simulate_loss": 1.0}, r"Expect loss in \[0, 1\)"),
    ({"simulate_loss": "0.1"}, "Expect simulate_loss to be a float"),
])
def test_gradient_sharing_rejects_what_executors_would(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GradientSharing(**kwargs)


def test_transport_and_clipping_settings_fail_at_construction():
    with pytest.raises(ValueError, match=r"Expect retransmit_timeout in \(0, 60\]"):
        GradientSharing(transport=EndpointConfig(retransmit_timeout=0.0))
    with pytest.raises(ValueError, match="k"):
        ResidualClipping(k=float("inf"))
    # the base port must leave room for every worker, also when workers come from Spark at fit time
    GradientSharing(port=65535).validate_for(1)
    with pytest.raises(ValueError, match="port"):
        GradientSharing(port=65535).validate_for(3)


def test_config_with_numbers_as_strings_names_the_field():
    config = ParameterAveraging().to_config()
    config["averaging_frequency"] = "5"
    with pytest.raises(ConfigError, match=r"ParameterAveraging.averaging_frequency to be int or one of \['auto'\], "
                                          r"got str '5'"):
        master_from_config(config)
    nested = GradientSharing().to_config()
    nested["transport"]["retransmit_timeout"] = "0.5"
    with pytest.raises(ConfigError, match="retransmit_timeout to be float, got str"):
        master_from_config(nested)


def test_a_new_threshold_rule_is_one_class_and_masters_find_runners_by_registry():
    # A rule registered under "threshold" is a GradientSharing threshold and round-trips through
    # the master's config, with no list of rules to extend anywhere.
    from dataclasses import dataclass

    from sparkavg.configurable import register
    from sparkavg.sharing import ThresholdRule
    from sparkavg.spark.runners import runner_for
    from sparkavg.spark.runners.averaging import AveragingRunner
    from sparkavg.spark.runners.sharing import SharingRunner

    @register("threshold", name="HalvingThresholdForTest")
    @dataclass(frozen=True)
    class HalvingThreshold(ThresholdRule):
        initial: float = 1e-2

        def initial_tau(self) -> float:
            return self.initial

        def _update(self, tau: float, sparsity: float) -> float:
            return tau / 2

    master = GradientSharing(threshold=HalvingThreshold(4e-3))
    assert master_from_config(master.to_config()).threshold == HalvingThreshold(4e-3)
    with pytest.raises(ValueError, match=r"Expect threshold to be a ThresholdRule \(.*HalvingThresholdForTest.*\)"):
        GradientSharing(threshold="1e-3")
    # Each master names its runner's module; the runner declares itself with @runs.
    assert type(runner_for(None, ParameterAveraging())) is AveragingRunner
    assert type(runner_for(None, master)) is SharingRunner
    with pytest.raises(TypeError, match="Expect master to be a Master with a runner"):
        runner_for(None, "averaging")


def test_gradient_sharing_update_scale_follows_the_updater():
    from sparkavg.nn.updaters import SGD, Adam, Nesterov

    auto = GradientSharing()
    for updater, scale in ((Nesterov(lr=0.05), 0.25), (SGD(lr=0.1), 0.25), (Adam(lr=1e-3), 1.0)):
        value, why = auto.scale_for(updater, 4)
        assert value == scale and type(updater).__name__ in why
    # Normalising updaters: summed in the trainer's first epoch only, divided from the second on.
    assert auto.scale_for(Adam(), 4, epoch=0)[0] == 1.0 and "first epoch" in auto.scale_for(Adam(), 4, 0)[1]
    value, why = auto.scale_for(Adam(), 4, epoch=2)
    assert value == 0.25 and "epoch 3" in why and "divided by 4" in why
    assert auto.scale_for(Nesterov(), 4, epoch=2)[0] == 0.25
    assert GradientSharing(update_scale="sum").scale_for(Nesterov(), 4)[0] == 1.0
    assert GradientSharing(update_scale="mean").scale_for(Adam(), 4)[0] == 0.25
