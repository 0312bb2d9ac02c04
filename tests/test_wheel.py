"""The binary wheel: built from a clean copy of the source tree (``pip wheel
--no-build-isolation``: the compiler and build tools of this environment,
nothing downloaded), it holds the compiled kernels and every sparkavg
package, declares the optional extras, and imports from where pip puts it
with no compiler on the PATH."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

#: What a clean source copy leaves out: build outputs and local environments.
_IGNORED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.c",
                                  ".pytest_cache", ".hypothesis")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source") / "sparkavg"
    shutil.copytree(ROOT, source, ignore=_IGNORED)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out),
                           str(source)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    wheels = list(out.glob("sparkavg-*.whl"))
    assert len(wheels) == 1, f"Expect one sparkavg wheel, got {[w.name for w in out.iterdir()]}"
    return wheels[0]


def test_the_wheel_holds_the_compiled_kernels_and_every_package(wheel):
    assert "-none-any" not in wheel.name  # a binary wheel: it carries compiled modules
    names = set(zipfile.ZipFile(wheel).namelist())
    kernels = sorted({p.name.split(".")[0] for p in ROOT.glob("sparkavg_ext/*.pyx*")})
    assert kernels
    for kernel in kernels:
        assert any(n.startswith(f"sparkavg_ext/{kernel}.") and n.endswith(".so") for n in names), kernel
    packages = sorted(str(p.parent.relative_to(ROOT)) for p in ROOT.glob("sparkavg/**/__init__.py"))
    for package in packages:
        assert f"{package}/__init__.py" in names, package
    for module in ("base", "mlflow_listener", "mlflow_model", "_mlflow_model_code", "tensorboard_listener",
                   "progress"):
        assert f"sparkavg/listeners/{module}.py" in names, module
    assert any(n.startswith("sparkavg/ops/cuda_src/") and n.endswith(".cu") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/", "sparkavg/testing/")) for n in names)
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(zipfile.ZipFile(wheel).read(metadata).decode())
    assert {"mlflow", "tensorboard", "progress", "connect", "gpu", "torch", "test"} <= \
        set(meta.get_all("Provides-Extra"))


def test_the_wheel_imports_and_runs_the_example_without_a_compiler(wheel, tmp_path, fashion_dir):
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(target),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    # No compiler on the PATH, and nothing of the source tree importable: only the installed wheel.
    env = {"PATH": str(Path(sys.executable).parent), "PYTHONPATH": str(target), "HOME": str(tmp_path),
           "PYTHONNOUSERSITE": "1"}
    code = ("import sparkavg_ext._threshold as t, sparkavg.listeners as l, sparkavg.spark.trainer; "
            "from sparkavg import ops; print(t.__file__); print(l.__file__); print(ops.have_extension())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    kernel, listeners, have = done.stdout.split()
    assert kernel.startswith(str(target)) and listeners.startswith(str(target)) and have == "True"
    assert shutil.which("cc", path=env["PATH"]) is None and shutil.which("gcc", path=env["PATH"]) is None
    # The example, copied away from the source tree, trains with the installed wheel.
    examples = tmp_path / "examples"
    shutil.copytree(ROOT / "examples", examples)
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(examples / "mnist_lenet.py"), "--mode", "local", "--data-dir",
                           str(fashion_dir), "--epochs", "1", "--limit-train", "512", "--limit-test", "256",
                           "--threads", "1", "--report", str(report)], capture_output=True, text=True,
                          cwd=tmp_path, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(report.read_text())["train_examples"] == 512
