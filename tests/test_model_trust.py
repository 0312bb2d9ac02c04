"""Loading a model file never runs code the file names unless the user
marked or trusted it (sparkavg.references).

Every loader is given a file made with the library's own ``save`` whose
JSON was edited to name ``subprocess:getoutput`` with a command that would
create a marker file -- with the digest recomputed (a forger) and without
(an edit) -- and must refuse it with an error naming the reference, the
marker never created.  Marked code (and code the caller trusts) still
loads, in this process and in a new one; a huge module is refused in
bounded memory."""
import json
import os
import subprocess
import sys
import textwrap
import types
import zipfile
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sparkavg  # noqa: E402
from sparkavg.configurable import ConfigError  # noqa: E402
from sparkavg.nn import Adam, Network, load_model, model_from_json  # noqa: E402
from sparkavg.nn.serialization import ModelFileError, _digest  # noqa: E402
from sparkavg.references import UntrustedReference, trusting  # noqa: E402
from sparkavg.torch import TorchModel  # noqa: E402

from .nets import blobs, small_net  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
REFUSED = r"Refusing to call the .* 'subprocess:getoutput'"


# ------------------------------------------------------------------ crafting
def _members(path) -> dict:
    with zipfile.ZipFile(path) as zf:
        out = {}
        for name in zf.namelist():
            with zf.open(name) as fh:
                out[name[:-4]] = np.lib.format.read_array(fh, allow_pickle=False)
        return out


def _write(path, members: dict) -> None:
    with open(path, "wb") as fh:
        np.savez(fh, **members)


def craft(source, target, edit, *, redigest: bool) -> None:
    """``source``'s members with its JSON config edited by ``edit(config)``;
    the SHA-256 recomputed (as a forger would) or left stale."""
    m = _members(source)
    config = json.loads(m["config"].tobytes().decode())
    edit(config)
    m["config"] = np.frombuffer(json.dumps(config).encode(), dtype=np.uint8)
    if redigest:
        vectors = [m[k] for k in ("params", "updater_state", "buffers") if k in m]
        m["sha256"] = _digest(m["config"].tobytes(), (*vectors, m["counters"]))
    _write(target, m)


def evil_factory(marker):
    def edit(config):
        config.update(type="TorchModel", factory="subprocess:getoutput",
                      factory_kwargs={"cmd": f"touch {marker}"}, input_shape=[1, 4, 4])
        for key in ("layers", "inputs", "outputs", "vertices"):
            config.pop(key, None)
    return edit


def evil_loss(marker):
    def edit(config):
        config.update(loss="subprocess:getoutput", targets="classes")
    return edit


def _torch_mlp(seed=1, factory="tests.torch_models:mlp", **kw):
    return TorchModel(factory, updater=Adam(lr=0.01), input_shape=(1, 4, 4), seed=seed, **kw)


@pytest.fixture()
def torch_file(tmp_path):
    path = tmp_path / "torch.npz"
    _torch_mlp().save(path)
    return path


@pytest.fixture()
def marker(tmp_path):
    path = tmp_path / "MARKER"
    yield path
    assert not path.exists(), "a loader ran the command the file named"


# ------------------------------------------------------------- every loader
LOADERS = {
    "load_model": lambda p: load_model(p),
    "load_model(max_params=10)": lambda p: load_model(p, max_params=10),
    "TorchModel.load": lambda p: TorchModel.load(p),
    "model_from_json": lambda p: model_from_json(_members(p)["config"].tobytes().decode()),
    "TorchModel.from_json": lambda p: TorchModel.from_json(_members(p)["config"].tobytes().decode()),
}


@pytest.mark.parametrize("redigest", [True, False], ids=["digest-recomputed", "digest-stale"])
@pytest.mark.parametrize("loader", list(LOADERS))
@pytest.mark.parametrize("edit", [evil_factory, evil_loss], ids=["factory", "loss"])
def test_a_crafted_file_is_refused_and_runs_nothing(torch_file, tmp_path, marker, loader, edit, redigest):
    crafted = tmp_path / "crafted.npz"
    craft(torch_file, crafted, edit(marker), redigest=redigest)
    from_json = loader in ("model_from_json", "TorchModel.from_json")
    if loader == "load_model(max_params=10)":
        expected = r"declares \d+ values in 'params', more than 10"  # sizes before the digest and the config
    elif not redigest and not from_json:
        expected = "SHA-256 mismatch"  # an edit is caught by the digest before the config is read
    else:
        expected = REFUSED
    with pytest.raises((ModelFileError, ConfigError), match=expected) as info:
        LOADERS[loader](crafted)
    if expected == REFUSED:
        assert "trusted=" in str(info.value)  # says how to allow it
    assert not marker.exists()


def test_trusting_everything_is_explicit_and_runs_what_the_file_names(torch_file, tmp_path):
    # The opt-out does what it says: a trusted file's factory is called (here: refused afterwards
    # because getoutput returns a str, not a module -- but it ran).
    marker = tmp_path / "RAN"
    crafted = tmp_path / "crafted.npz"
    craft(torch_file, crafted, evil_factory(marker), redigest=True)
    with pytest.raises(ModelFileError, match="to return a torch.nn.Module, got str"):
        load_model(crafted, trusted=True)
    assert marker.exists()


def test_a_network_loader_refuses_a_torch_config_before_importing_it(torch_file, tmp_path, marker):
    crafted = tmp_path / "crafted.npz"
    craft(torch_file, crafted, evil_factory(marker), redigest=True)
    with pytest.raises(ModelFileError, match="Expect a Network config, got type 'TorchModel'"):
        Network.load(crafted)


def test_the_mlflow_pyfunc_loader_refuses_a_crafted_file(torch_file, tmp_path, marker):
    pytest.importorskip("mlflow")
    from sparkavg.listeners.mlflow_model import ARTIFACT, NetworkPyfunc

    crafted = tmp_path / "crafted.npz"
    craft(torch_file, crafted, evil_factory(marker), redigest=True)
    context = types.SimpleNamespace(artifacts={ARTIFACT: str(crafted)}, model_config={})
    with pytest.raises(ModelFileError, match=REFUSED):  # it loads any model kind, so the trust check refuses it
        NetworkPyfunc().load_context(context)


# ------------------------------------------------- no import of what is refused
def _run(code: str, timeout=120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=str(REPO))


def _loaded_elsewhere(net, folder) -> tuple:
    """``(type name, epoch)`` of ``net`` saved and loaded by a new Python
    process with the default (safe) loader, its parameters checked equal."""
    path, expected = folder / "elsewhere.npz", folder / "expected.npy"
    net.save(path)
    np.save(expected, net.params)
    done = _run(f"""
        import numpy as np
        from sparkavg.nn import load_model
        net = load_model({str(path)!r})
        np.testing.assert_array_equal(net.params, np.load({str(expected)!r}))
        print("LOADED", type(net).__name__, net.epoch)
    """)
    assert done.returncode == 0, done.stderr
    kind, epoch = done.stdout.split("LOADED")[1].split()
    return kind, int(epoch)


def test_a_standard_library_name_is_refused_without_importing_it(torch_file, tmp_path):
    # ``this`` prints the Zen of Python when imported: the loader must not import it to refuse it.
    crafted = tmp_path / "zen.npz"
    craft(torch_file, crafted, lambda c: c.update(loss="this:s"), redigest=True)
    done = _run(f"""
        import sys
        from sparkavg.nn import load_model
        try:
            load_model({str(crafted)!r})
        except ValueError as exc:
            print("REFUSED", exc)
        print("IMPORTED" if "this" in sys.modules else "NOT-IMPORTED")
    """)
    assert done.returncode == 0, done.stderr
    assert "REFUSED" in done.stdout and "Python's standard library" in done.stdout
    assert "NOT-IMPORTED" in done.stdout and "Beautiful is better than ugly" not in done.stdout


# -------------------------------------------------------- marked and trusted
def test_unmarked_code_is_refused_by_a_loader_unless_trusted(tmp_path):
    net = _torch_mlp(factory="tests.torch_models:unmarked_mlp")  # named in code: the user's own call
    x, y = blobs(8, seed=1)
    net.fit_batch(x, y)
    path = tmp_path / "unmarked.npz"
    net.save(path)
    with pytest.raises(ModelFileError, match=r"'tests.torch_models:unmarked_mlp' .* not marked as a factory"):
        load_model(path)
    for loaded in (load_model(path, trusted={"tests.torch_models:unmarked_mlp"}), load_model(path, trusted=True)):
        np.testing.assert_array_equal(loaded.params, net.params)
    with trusting({"tests.torch_models:unmarked_mlp"}):
        np.testing.assert_array_equal(TorchModel.load(path).params, net.params)
    with pytest.raises(UntrustedReference, match="unmarked_mlp"):  # the block ended
        model_from_json(net.to_json())


def test_an_unmarked_loss_is_refused_and_a_marked_one_loads(tmp_path):
    x = np.random.default_rng(0).standard_normal((8, 3)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    for loss, ok in (("tests.torch_models:huber", True), ("tests.torch_models:unmarked_huber", False)):
        net = TorchModel("tests.torch_models:regressor", loss=loss, targets="values", input_shape=(3,))
        net.fit_batch(x, y)
        path = tmp_path / "reg.npz"
        net.save(path)
        if ok:
            np.testing.assert_array_equal(load_model(path).params, net.params)
        else:
            with pytest.raises(ModelFileError, match="not marked as a loss"):
                load_model(path)


def test_trusted_names_are_checked_and_false_is_not_a_policy():
    with pytest.raises(ConfigError, match="Expect the trusted name as 'package.module:function'"):
        load_model("unused.npz", trusted={"not a reference"})
    with pytest.raises(ValueError, match="got False"):
        load_model("unused.npz", trusted=False)


def test_marks_are_the_objects_own_not_inherited():
    from sparkavg.references import is_marked

    @sparkavg.torch.factory
    class Base(torch.nn.Module):
        pass

    class Child(Base):
        pass

    assert is_marked(Base, "factory") and not is_marked(Child, "factory") and not is_marked(Base, "loss")


def test_a_marked_model_loads_in_a_new_process(tmp_path):
    net = _torch_mlp(factory="tests.torch_models:conv_bn")
    x, y = blobs(8, seed=2)
    net.fit_batch(x, y)
    assert _loaded_elsewhere(net, tmp_path) == ("TorchModel", 0)


def test_a_native_network_file_needs_no_trust(tmp_path):
    net = small_net(seed=3)
    path = tmp_path / "native.npz"
    net.save(path)
    np.testing.assert_array_equal(load_model(path).params, net.params)


# ------------------------------------------------------- counted before built
def test_a_900m_parameter_module_is_refused_in_bounded_memory(torch_file, tmp_path):
    # The zoo's (marked) MLP asked for 30000 x 30000: 900M parameters behind small arrays and a valid digest.
    crafted = tmp_path / "huge.npz"
    craft(torch_file, crafted, lambda c: c.update(factory="sparkavg.torch.zoo:mlp",
                                                   factory_kwargs={"inputs": 30000, "hidden": 30000}),
          redigest=True)
    done = _run(f"""
        import resource
        import torch, sparkavg.torch.zoo
        from sparkavg.nn import load_model
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            load_model({str(crafted)!r})
        except ValueError as exc:
            print("REFUSED", exc)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print("GROWTH_KB", after - before)
    """)
    assert done.returncode == 0, done.stderr
    assert "REFUSED" in done.stdout and "900" in done.stdout and "more than max_params" in done.stdout, done.stdout
    growth_kb = int(done.stdout.split("GROWTH_KB")[1].split()[0])
    assert growth_kb < 100 * 1024, f"refusing the file grew peak RSS by {growth_kb / 1024:.0f} MiB"


# ---------------------------------------------------------- Spark's loaders
def _frame(session, x, y, partitions=2):
    rows = [(i, row.reshape(-1).tolist(), float(label)) for i, (row, label) in enumerate(zip(x, y))]
    return session.createDataFrame(rows, "id long, features array<float>, label double").repartition(partitions)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("redigest", [True, False], ids=["digest-recomputed", "digest-stale"])
@pytest.mark.parametrize("stage_was", ["torch", "native"])
def test_saved_stages_with_a_crafted_network_are_refused(spark, tmp_path, torch_file, marker, stage_was, redigest):
    from pyspark.ml import PipelineModel

    from sparkavg.ml import NetworkModel

    network = _torch_mlp() if stage_was == "torch" else small_net(seed=4)
    model = NetworkModel(network=network)
    path = tmp_path / "stage"
    model.write().save(str(path))
    PipelineModel(stages=[model]).write().save(str(tmp_path / "pipeline"))
    for target in (path / "network.npz", next((tmp_path / "pipeline" / "stages").iterdir()) / "network.npz"):
        craft(torch_file, target, evil_factory(marker), redigest=redigest)
    expected = REFUSED if redigest else "SHA-256 mismatch"
    with pytest.raises(ModelFileError, match=expected):
        NetworkModel.load(str(path))
    with pytest.raises(ModelFileError, match=expected):
        PipelineModel.load(str(tmp_path / "pipeline"))


@pytest.mark.spark
@pytest.mark.slow
def test_a_saved_estimator_naming_an_unmarked_transform_is_refused(spark, tmp_path, marker):
    from sparkavg.ml import NetworkEstimator
    from sparkavg.spark import DataOptions, ParameterAveraging

    master = ParameterAveraging(batch_size_per_worker=4, workers=2,
                                data=DataOptions(transform="tests.data_transforms:random_flip"))
    est = NetworkEstimator(network=small_net(seed=5), master=master, epochs=1)
    path = tmp_path / "estimator"
    est.write().save(str(path))
    assert NetworkEstimator.load(str(path)).getMaster() == master  # marked: loads
    extra = json.loads((path / "sparkavg.json").read_text())
    extra["master"]["data"]["transform"] = "subprocess:getoutput"
    (path / "sparkavg.json").write_text(json.dumps(extra))
    with pytest.raises(ValueError, match=r"Refusing to call the transform 'subprocess:getoutput'"):
        NetworkEstimator.load(str(path))
    extra["master"]["data"]["transform"] = "tests.data_transforms:unmarked_flip"
    (path / "sparkavg.json").write_text(json.dumps(extra))
    with pytest.raises(ValueError, match=r"'tests.data_transforms:unmarked_flip' .* not marked as a transform"):
        NetworkEstimator.load(str(path))
    with trusting({"tests.data_transforms:unmarked_flip"}):
        assert NetworkEstimator.load(str(path)).getMaster().data.transform == "tests.data_transforms:unmarked_flip"


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize("redigest", [True, False], ids=["digest-recomputed", "digest-stale"])
def test_resume_from_a_checkpoint_with_a_crafted_network_is_refused(spark, tmp_path, torch_file, marker, redigest):
    from sparkavg.spark import ParameterAveraging, SparkTrainer

    x, y = blobs(32, seed=6)
    df = _frame(spark, x, y)
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2)
    ckpt = tmp_path / "ckpt"
    SparkTrainer(spark, small_net(seed=6), master, checkpoint_dir=str(ckpt)).fit(df, epochs=1)
    for network_file in ckpt.rglob("network.npz"):
        craft(torch_file, network_file, evil_factory(marker), redigest=redigest)
    with pytest.raises(Exception, match=REFUSED if redigest else "SHA-256 mismatch"):
        SparkTrainer(spark, small_net(seed=6), master, checkpoint_dir=str(ckpt)).fit(df, epochs=2,
                                                                                     resume_from=str(ckpt))


@pytest.mark.spark
@pytest.mark.slow
def test_marked_factory_loss_and_transform_train_checkpoint_resume_and_load_elsewhere(spark, tmp_path):
    from sparkavg.spark import DataOptions, ParameterAveraging, SparkTrainer

    rng = np.random.default_rng(7)
    x = rng.standard_normal((48, 3)).astype(np.float32)
    y = x.sum(axis=1)
    df = _frame(spark, x, y)
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2,
                                data=DataOptions(transform="tests.data_transforms:identity"))

    def make(seed):
        return TorchModel("tests.torch_models:regressor", loss="tests.torch_models:huber", targets="values",
                          updater=Adam(lr=0.01), input_shape=(3,), seed=seed)

    ckpt = tmp_path / "ckpt"
    first = make(8)
    SparkTrainer(spark, first, master, checkpoint_dir=str(ckpt)).fit(df, epochs=1)
    resumed = make(9)  # another seed: the state must come from the checkpoint
    trainer = SparkTrainer(spark, resumed, master, checkpoint_dir=str(ckpt))
    trainer.fit(df, epochs=2, resume_from=str(ckpt))
    assert trainer.epochs_done == 2 and resumed.epoch == 2
    assert _loaded_elsewhere(resumed, tmp_path) == ("TorchModel", 2)


@pytest.mark.spark
@pytest.mark.slow
def test_unmarked_code_named_in_the_program_trains_on_spark_and_resumes(spark, tmp_path):
    from sparkavg.spark import ParameterAveraging, SparkTrainer

    x, y = blobs(32, seed=10)
    df = _frame(spark, x, y)
    master = ParameterAveraging(batch_size_per_worker=4, averaging_frequency=2, workers=2)
    ckpt = tmp_path / "ckpt"
    net = _torch_mlp(seed=11, factory="tests.torch_models:unmarked_mlp")
    before = net.params.copy()
    SparkTrainer(spark, net, master, checkpoint_dir=str(ckpt)).fit(df, epochs=1)
    assert not np.array_equal(net.params, before)
    # the resuming model names the same code: its checkpoint may name it too
    again = _torch_mlp(seed=12, factory="tests.torch_models:unmarked_mlp")
    SparkTrainer(spark, again, master, checkpoint_dir=str(ckpt)).fit(df, epochs=2, resume_from=str(ckpt))
    assert again.epoch == 2
