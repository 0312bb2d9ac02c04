"""Packaging facts, each checked where it can fail: the extension is built,
sparkavg works (slowly) without it, and the CuPy path is lazy and explains
itself when CUDA is missing.  The last two run in a fresh interpreter with
the module hidden (``sys.modules[name] = None`` makes importing it fail)."""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from sparkavg import backend, ops

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON object."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"subprocess failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_extension_module_is_built():
    sources = sorted(ROOT.glob("sparkavg_ext/*.pyx")) + sorted(ROOT.glob("sparkavg_ext/*.pyx.tp"))
    names = sorted({p.name.split(".")[0] for p in sources})
    assert names, "no Cython sources found in sparkavg_ext"
    for name in names:
        importlib.import_module(f"sparkavg_ext.{name}")  # ImportError: not built
    assert ops.have_extension()


PURE_NUMPY = """
    import json, logging, sys
    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
    logging.getLogger("sparkavg").addHandler(Keep())
    logging.getLogger("sparkavg").setLevel(logging.WARNING)
    if HIDE:
        sys.modules["sparkavg_ext"] = None
    import numpy as np
    from sparkavg import ops
    from sparkavg.ops import reference
    from sparkavg.nn import Conv2D, MaxPool2D, Network, Output
    r = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    want = reference.threshold_encode(r.copy(), 1.5)
    got = ops.threshold_encode(r, 1.5)
    net = Network((1, 6, 6), [Conv2D(2, 3), MaxPool2D(2), Output(3)], dtype="float32")
    x = np.random.default_rng(1).standard_normal((4, 1, 6, 6)).astype(np.float32)
    loss = net.fit_batch(x, np.array([0, 1, 2, 0]))
    print(json.dumps({
        "have_extension": ops.have_extension(),
        "extension_loaded": any(m.startswith("sparkavg_ext.") for m in sys.modules),
        "same_message": bool(np.array_equal(got, want)),
        "loss_finite": bool(np.isfinite(loss)),
        "warnings": records,
    }))
"""


def test_pure_numpy_without_the_extension():
    hidden = run_python("HIDE = True\n" + textwrap.dedent(PURE_NUMPY))
    assert hidden["have_extension"] is False and hidden["extension_loaded"] is False
    assert hidden["same_message"] and hidden["loss_finite"]
    assert any("sparkavg_ext is not built" in w and "pip install -e ." in w
               for w in hidden["warnings"]), hidden["warnings"]
    # The control: the same program with the extension in place uses it, quietly.
    built = run_python("HIDE = False\n" + textwrap.dedent(PURE_NUMPY))
    assert built["have_extension"] is True and built["extension_loaded"] is True
    assert built["same_message"] and built["loss_finite"] and built["warnings"] == []


def test_importing_sparkavg_does_not_import_cupy():
    seen = run_python("""
        import json, sys
        tried = []
        class Spy:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "cupy":
                    tried.append(name)
                return None
        sys.meta_path.insert(0, Spy())
        import numpy as np
        import sparkavg, sparkavg.ops, sparkavg.nn
        from sparkavg import backend, ops
        buf = np.zeros(8, np.float32)
        ops.accumulate(buf, np.ones(8, np.float32))
        backend.get_array_module(buf)
        print(json.dumps({"tried": tried}))
    """)
    assert seen["tried"] == []


def test_without_cuda_the_gpu_path_says_how_to_get_it():
    got = run_python("""
        import json, sys
        sys.modules["cupy"] = None  # as on a machine without CuPy
        import numpy as np
        from sparkavg import backend
        errors = []
        for call in (backend.check_available, backend.cupy,
                     lambda: backend.to_gpu(np.zeros(2))):
            try:
                call()
                errors.append(None)
            except RuntimeError as exc:
                errors.append(str(exc))
        print(json.dumps({"available": backend.available(), "errors": errors,
                          "xp_is_numpy": backend.get_array_module(np.zeros(2)) is np}))
    """)
    assert got["available"] is False and got["xp_is_numpy"] is True
    assert len(got["errors"]) == 3
    for message in got["errors"]:
        assert message is not None, "the GPU path ran without CuPy"
        assert "CuPy with a CUDA device is required" in message
        assert "pip install sparkavg[gpu]" in message


def test_get_array_module_and_to_cpu_on_numpy():
    a = np.ones(2)
    assert backend.get_array_module(a) is np
    assert backend.to_cpu(a) is a
    assert backend.to_cpu([1.0, 2.0]).sum() == 3.0


def test_the_package_ships_no_test_harness():
    # The packages setuptools finds under pyproject's [tool.setuptools.packages.find]
    # (namespaces on, its default): the simulated hosts and the Connect server stay with the tests.
    import tomllib

    from setuptools import find_namespace_packages, find_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    finder = find_namespace_packages if find.get("namespaces", True) else find_packages
    shipped = finder(str(ROOT), include=find["include"], exclude=find.get("exclude", ()))
    assert "sparkavg.spark.executor" in shipped and "sparkavg_ext" in shipped
    assert [p for p in shipped if p.split(".")[0] not in ("sparkavg", "sparkavg_ext")] == []
    assert [p for p in shipped if "testing" in p or "harness" in p] == []
    assert (ROOT / "tests" / "harness" / "hosts.py").exists()  # the harness is still there, for tests
    assert not (ROOT / "sparkavg" / "testing").exists()
