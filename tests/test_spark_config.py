"""Master configurations, minibatch dealing and threshold state: pure logic."""
import numpy as np
import pytest

from sparkavg.configurable import ConfigError

from sparkavg.data.validation import DataSpec, DataValidationError, rebatch_partition
from sparkavg.data.deal import deal, deal_shards, local_shards, shard_label_skew
from sparkavg.spark.sources import SharedFiles, SparkBlocks
from sparkavg.spark.masters import (DEFAULT_THRESHOLD, AdaptiveThreshold, DataOptions, FixedThreshold,
                                    GradientSharing, ParameterAveraging, Placement, TargetSparsityThreshold, Topology,
                                    master_from_config)
from sparkavg.data.storage import prefetch_depth


def test_parameter_averaging_defaults_fix_dl4j_flaws():
    from sparkavg.spark.runners.averaging import AGGREGATION_DEPTH

    m = ParameterAveraging()
    assert m.save_updater is True  # DL4J documents True but ships False
    assert m.preset == "sparkavg"  # weighted by examples, moment correction, block momentum, shares by speed
    assert (m.batch_size_per_worker, m.averaging_frequency, AGGREGATION_DEPTH) == (16, "auto", 2)
    assert m.data == DataOptions() and m.data.placement is Placement.AUTO and m.data.shared_dir is None
    dl4j = ParameterAveraging.dl4j()
    assert (dl4j.preset, dl4j.averaging_frequency, dl4j.save_updater) == ("dl4j", 5, True)
    assert ParameterAveraging.dl4j(averaging_frequency="auto", workers=3) == ParameterAveraging(
        averaging_frequency="auto", workers=3, preset="dl4j")


@pytest.mark.parametrize("kwargs, message", [
    ({"averaging_frequency": 0}, "Expect averaging_frequency >= 1"),
    ({"batch_size_per_worker": -3}, "Expect batch_size_per_worker >= 1"),
    ({"workers": 0}, "Expect workers >= 1"),
    ({"preset": "torch"}, "Expect preset in"),
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
    assert (d.staleness, d.preset) == (0, "sparkavg")
    dl4j = GradientSharing.dl4j()  # DL4J's SharedTrainingMaster: asynchronous
    assert (dl4j.staleness, dl4j.preset, dl4j.threshold) == (None, "dl4j", DEFAULT_THRESHOLD)
    assert GradientSharing.dl4j(staleness=0).staleness == 0
    with pytest.raises(ValueError, match="Expect staleness >= 0"):
        GradientSharing(staleness=-1)
    with pytest.raises(ValueError, match="Expect preset in"):
        GradientSharing(preset="DL4J")
    with pytest.raises(ValueError, match="threshold"):
        GradientSharing(threshold=-1.0)
    with pytest.raises(ValueError, match="Expect network_mask in CIDR"):
        GradientSharing(network_mask="not-a-mask")
    with pytest.raises(ValueError, match="Expect topology in"):
        GradientSharing(topology="ring")


def test_sharing_policies_follow_the_preset_and_the_updater():
    from sparkavg.nn import SGD, Adam, Nesterov
    from sparkavg.spark.policies.sharing import LocalView, MomentumMasking, ThresholdChoice

    assert MomentumMasking().decide(Nesterov())[0] and not MomentumMasking().decide(Adam())[0]
    assert MomentumMasking(enabled=False).decide(Nesterov())[0] is False  # preset "dl4j"
    assert MomentumMasking().decide(SGD())[0] is False  # no velocity to mask
    assert LocalView().decide()[0] is True and LocalView(enabled=False).decide()[0] is False
    choice = ThresholdChoice()
    assert choice.name == "threshold"
    assert choice.decide(DEFAULT_THRESHOLD, DEFAULT_THRESHOLD)[0] == DEFAULT_THRESHOLD.to_config()
    assert choice.decide(FixedThreshold(1e-3), DEFAULT_THRESHOLD)[0] == FixedThreshold(1e-3).to_config()


def test_moment_correction_choice():
    from sparkavg.nn import SGD, Adam
    from sparkavg.spark.policies.moments import MomentCorrection

    on = MomentCorrection()
    assert on.name == "moment_correction"
    assert on.choice(Adam(), 2, save_updater=True)[0] is True
    assert on.choice(SGD(), 2, save_updater=True)[0] is False  # no second moment
    assert on.choice(Adam(), 1, save_updater=True)[0] is False  # one worker: one process's state
    assert on.choice(Adam(), 2, save_updater=False)[0] is False  # no updater state averaged
    assert MomentCorrection(enabled=False).choice(Adam(), 2, save_updater=True)[0] is False  # preset "dl4j"
    assert on.on is False, "choice() leaves the running epoch's decision alone"
    assert on.decide(Adam(), 2, save_updater=True)[0] is True and on.on is True


#: Every constructor keyword the house issue retired; each is now the library's behaviour, a preset,
#: a policy (sparkavg.spark.policies), a constant or a test hook.
RETIRED_KEYWORDS = [
    ("ParameterAveraging", "collect_stats", False),
    ("ParameterAveraging", "target_overhead", 0.05),
    ("ParameterAveraging", "max_averaging_frequency", 64),
    ("ParameterAveraging", "aggregation_depth", 3),
    ("ParameterAveraging", "weighting", "uniform"),
    ("ParameterAveraging", "worker_shares", "equal"),
    ("ParameterAveraging", "max_plain_momentum_frequency", 16),
    ("ParameterAveraging", "moment_correction", False),
    ("ParameterAveraging", "block_momentum", None),
    ("GradientSharing", "collect_stats", False),
    ("GradientSharing", "residual_post_processor", None),
    ("GradientSharing", "transport", None),
    ("GradientSharing", "simulate_loss", 0.1),
    ("GradientSharing", "max_stage_attempts", 1),
    ("GradientSharing", "update_scale", "sum"),
    ("GradientSharing", "momentum_masking", False),
    ("GradientSharing", "local_view", False),
    ("DataOptions", "prefetch", 2),
    ("DataOptions", "storage_level", "MEMORY_ONLY"),
    ("AdaptiveThreshold", "decay", 0.9),
    ("TargetSparsityThreshold", "decay", 0.9),
    ("SparkTrainer", "eval_batch_size", 32),
    ("SparkTrainer", "max_recoveries", 5),
    ("SparkTrainer", "recovery_lr_factor", 0.1),
]


@pytest.mark.parametrize("cls, keyword, value", RETIRED_KEYWORDS)
def test_retired_keywords_are_rejected(cls, keyword, value):
    import sparkavg.spark

    with pytest.raises(TypeError, match=f"unexpected keyword argument '{keyword}'"):
        getattr(sparkavg.spark, cls)(**{keyword: value})  # SparkTrainer: refused before it looks at a session


def test_retired_names_are_no_longer_exported():
    import sparkavg.spark

    for name in ("BlockMomentum", "Weighting", "EndpointConfig", "ResidualClipping"):
        assert name not in sparkavg.spark.__all__ and not hasattr(sparkavg.spark, name), name
    from sparkavg.spark import Recover  # noqa: F401 - where the divergence switches went
    import sparkavg.sharing
    import sparkavg.transport

    # the transport's sizes and DL4J's residual clipping are the library's behaviour, nothing a user names
    for module, name in ((sparkavg.transport, "EndpointConfig"), (sparkavg.sharing, "ResidualClipping")):
        assert name not in module.__all__ and not hasattr(module, name), name


@pytest.mark.parametrize("master", [
    ParameterAveraging.dl4j(averaging_frequency=3),
    GradientSharing(threshold=AdaptiveThreshold(), topology=Topology.TREE),
    GradientSharing(threshold=TargetSparsityThreshold(target=1e-2)),
    GradientSharing.dl4j(),
])
def test_master_config_round_trip(master):
    import json

    assert master_from_config(json.loads(json.dumps(master.to_config()))) == master


def test_default_preset_is_left_out_of_configs():
    # configurations (and checkpoints) of releases before presets stay equal
    assert "preset" not in ParameterAveraging().to_config() and "preset" not in GradientSharing().to_config()
    assert ParameterAveraging.dl4j().to_config()["preset"] == "dl4j"


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
    prepared = SharedFiles([1, 1], paths=["a", "b"]) if in_files else SparkBlocks([1, 1])
    chosen, reason = prepared.deal_choice(DataOptions(repartition=repartition), 2)
    assert chosen is local and reason


def test_every_source_deals_each_minibatch_once_and_rebuilds_only_what_spark_could_lose():
    from sparkavg.spark.runners import runner_for
    from sparkavg.spark.masters import GradientSharing, ParameterAveraging
    from sparkavg.spark.streaming import StreamedSource

    paths = [f"/shared/m{i}" for i in range(5)]
    files = SharedFiles([2] * 5, paths=paths)
    dealt = files.plan(2, 2, seed=3)
    assert sorted(i for shards in dealt.rounds for shard in shards for i in shard) == list(range(5))
    assert sorted(p for r in range(len(dealt.rounds)) for shard in dealt.shards(r) for p in shard) == paths
    streamed = StreamedSource([4, 4, 2], rows={0: 8, 1: 0, 2: 2}, batches={0: [0, 1], 2: [2]}, parts=[0, 2])
    # A streamed source deals the source's partitions afresh every epoch, whatever repartition says.
    assert streamed.deal_choice(DataOptions(repartition="local"), 2)[0] is False
    assert streamed.plan(2, 5, None).shards(0) == [0, 2]  # a round is a partition per worker, not per_round
    for source in (files, streamed):  # nothing Spark could lose: nothing to rebuild, and no error
        assert source.rebuild() is None
    assert {files.description, streamed.description, SparkBlocks.description} == {
        "shared files", "streamed", "Spark blocks"}
    # The runner says whether its epoch can train streamed rounds; the trainer never asks the master's type.
    assert runner_for(None, ParameterAveraging()).streams and not runner_for(None, GradientSharing()).streams


@pytest.mark.parametrize("options, depth", [
    (DataOptions(), 0), (DataOptions(shared_dir="/mnt/nfs/x"), 0), (DataOptions(shared_dir="file:///mnt/x"), 0),
    (DataOptions(shared_dir="s3://bucket/x"), 1), (DataOptions(shared_dir="hdfs://nn/x"), 1)])
def test_prefetch_loads_ahead_only_from_remote_filesystems(options, depth):
    assert prefetch_depth(options) == depth


def test_auto_deals_balanced_when_hosts_hold_different_classes():
    # 8 minibatches of 4 examples, 2 classes; partition 0 (host a) and 1 (host b).
    layout = [("a", 0)] * 4 + [("b", 1)] * 4
    mixed = np.array([[2.0, 2.0]] * 8)
    by_label = np.array([[4.0, 0.0]] * 4 + [[0.0, 4.0]] * 4)
    assert shard_label_skew(local_shards(8, 2, layout), mixed) == 0.0
    assert shard_label_skew(local_shards(8, 2, layout), by_label) == pytest.approx(0.5)
    auto = DataOptions()
    assert SparkBlocks([4] * 8, layout=layout, labels=mixed).deal_choice(auto, 2)[0] is True
    assert SparkBlocks([4] * 8, layout=layout, labels=by_label).deal_choice(auto, 2)[0] is False
    # Asked for explicitly, local stays local.
    assert SparkBlocks([4] * 8, labels=by_label).deal_choice(DataOptions(repartition="local"), 2)[0]


SPEC = DataSpec((1, 2, 2), 3)


def _run(rows, batch=2):
    return list(rebatch_partition(SPEC, batch)(4, iter(rows)))


def test_rebatch_keeps_every_example_and_mixes_formats():
    pairs = [(np.full(4, i, np.float32), i % 3) for i in range(5)]
    mb = (np.zeros((3, 4), np.float32), np.array([0, 1, 2]))
    out = _run(pairs + [mb], batch=3)
    assert [len(y) for _, y in out] == [3, 3, 2]
    assert list(out[0][0]) == ["input"]  # the one input's bare features come out as a mapping of one
    assert out[0][0]["input"].shape == (3, 1, 2, 2) and out[0][0]["input"].dtype == np.float32
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

    from sparkavg.spark.data import resolve_features
    from sparkavg.spark.executor.arrow import failure_from_row, make_minibatcher

    features, label = bad
    onehot = isinstance(label, list)
    good = (np.ones(4), [1.0, 0.0, 0.0] if onehot else 0)
    with pytest.raises(DataValidationError) as rows:
        list(rebatch_partition(SPEC, 2)(0, iter([good, (features, np.asarray(label))])))
    batch = pa.RecordBatch.from_pydict({
        "features": pa.array([good[0].tolist(), features.tolist()], pa.list_(pa.float64())),
        "label": pa.array([good[1], label], pa.list_(pa.float64()) if onehot else None)})
    out = list(make_minibatcher(SPEC, 2, resolve_features("features", SPEC), "label")(iter([batch])))
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

    from sparkavg.spark.data import resolve_features
    from sparkavg.spark.executor.arrow import inputs_from_bytes, make_minibatcher

    assert DataOptions().feature_dtype == "auto" and "feature_dtype" not in DataOptions().config_arguments()
    dtype, _, bounds = source.partition(":")
    lo, hi = (int(v) for v in bounds.split("..")) if bounds else (0, 200)
    x = np.linspace(lo, hi, 16).round().astype(dtype).reshape(4, 4)
    rows = [(x[i], i % 3) for i in range(4)]
    auto = [mb["input"] for mb, _ in rebatch_partition(SPEC, 4, "auto")(0, iter(rows))]
    old = [mb["input"] for mb, _ in rebatch_partition(SPEC, 4)(0, iter(rows))]
    assert auto[0].dtype == np.dtype(kept) and old[0].dtype == np.float32
    np.testing.assert_array_equal(auto[0].astype(np.float32), old[0])
    arrow_type = pa.from_numpy_dtype(x.dtype)
    batch = pa.RecordBatch.from_pydict({"features": pa.array(list(x), pa.list_(arrow_type)),
                                        "label": pa.array([i % 3 for i in range(4)], pa.int64())})
    for feature_dtype, want in (("auto", kept), (None, "float32")):
        out = list(make_minibatcher(SPEC, 4, resolve_features("features", SPEC), "label",
                                    feature_dtype=feature_dtype)(iter([batch])))
        got = inputs_from_bytes(out[0].column("x")[0])["input"]
        assert got.dtype == np.dtype(want)
        np.testing.assert_array_equal(got.astype(np.float32), old[0])


@pytest.mark.parametrize("kwargs, message", [
    ({"placement": "ftp"}, "Expect placement in"),
    ({"placement": "files"}, "Expect shared_dir"),
    ({"shared_dir": 123}, "Expect shared_dir to be a path or URL"),
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
])
def test_gradient_sharing_rejects_what_executors_would(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GradientSharing(**kwargs)


def test_transport_settings_and_stage_attempts_come_from_the_test_hooks():
    # Fault injection is no master field: the driver reads the hooks' job properties once per job.
    from sparkavg.spark.executor.hooks import (MAX_STAGE_ATTEMPTS, RETRANSMIT_TIMEOUT, STAGE_ATTEMPTS, STALL_TIMEOUT,
                                               UDP_LOSS, TestHooks, stage_attempts, transport_limits)
    from sparkavg.transport.limits import STALL_TIMEOUT as DEFAULT_STALL, endpoint_limits

    assert TestHooks.from_properties({}.get) is None  # production: no hook code at all
    assert transport_limits(None, 12345, 1, 0) == {} and stage_attempts(None) == MAX_STAGE_ATTEMPTS == 3
    assert endpoint_limits(transport_limits(None, 12345, 1, 0)).stall_timeout == DEFAULT_STALL
    properties = {UDP_LOSS: "0.2", RETRANSMIT_TIMEOUT: "0.05", STALL_TIMEOUT: "20", STAGE_ATTEMPTS: "1"}
    hooks = TestHooks.from_properties(properties.get)
    config = endpoint_limits(transport_limits(hooks, 12345, 1, 2))
    assert (config.retransmit_timeout, config.stall_timeout) == (0.05, 20.0)
    assert (config.faults.loss, config.faults.duplicate, config.faults.reorder) == (0.2, 0.1, 0.1)
    assert transport_limits(hooks, 12345, 0, 2)["faults"].seed != config.faults.seed  # each rank its own faults
    assert stage_attempts(hooks) == 1
    assert "faults" not in transport_limits(TestHooks.from_properties({STALL_TIMEOUT: "3"}.get), 0, 0, 0)


def test_the_base_port_leaves_room_for_every_worker():
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
    nested["threshold"]["initial"] = "0.5"
    with pytest.raises(ConfigError, match="AdaptiveThreshold.initial to be float, got str"):
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
    from sparkavg.spark.policies.sharing import UpdateScale

    auto = UpdateScale()
    assert auto.name == "update_scale"
    for updater, scale in ((Nesterov(lr=0.05), 0.25), (SGD(lr=0.1), 0.25), (Adam(lr=1e-3), 1.0)):
        assert auto.decide(updater, 4, epoch=0)[0] == scale
    # Normalising updaters: summed in the trainer's first epoch only, divided from the second on.
    assert auto.decide(Adam(), 4, epoch=2)[0] == 0.25
    assert auto.decide(Nesterov(), 4, epoch=2)[0] == 0.25
    dl4j = UpdateScale(enabled=False)  # preset "dl4j": every worker's whole update, always
    assert [dl4j.decide(u, 4, e)[0] for u in (Nesterov(), Adam()) for e in (0, 2)] == [1.0] * 4
