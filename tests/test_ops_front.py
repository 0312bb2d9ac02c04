"""The kernel front itself: one kernel list that every module agrees with,
one routing rule that every kernel follows, one "is it built" check."""
from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest

from sparkavg import ops
from sparkavg.ops import _cuda, _cython, _dispatch, _kernels, reference

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = {"_cython": _cython, "_cuda": _cuda, "reference": reference}


def params(function, drop=("n_threads",)):
    """(name, kind, default) of each parameter, less those in ``drop``."""
    return [(p.name, p.kind if p.kind != p.KEYWORD_ONLY else p.POSITIONAL_OR_KEYWORD, p.default)
            for p in inspect.signature(function).parameters.values() if p.name not in drop]


def names(function, drop=("n_threads",)):
    return [p[0] for p in params(function, drop)]


# ---------------------------------------------------------- one kernel list
def test_kernels_are_the_public_fronts():
    assert len(set(ops.KERNELS)) == len(ops.KERNELS)
    assert len(set(ops.__all__)) == len(ops.__all__)
    assert set(ops.KERNELS) <= set(ops.__all__)
    for name in ops.__all__:
        assert hasattr(ops, name), f"ops.__all__ names {name}, which ops does not define"
    modules = {"elementwise", "encoding", "conv", "norm", "sequence"}
    for name in ops.KERNELS:
        assert getattr(ops, name).__module__.rsplit(".", 1)[-1] in modules


@pytest.mark.parametrize("kernel", _kernels.KERNELS)
def test_every_kernel_has_a_twin_of_its_signature(kernel):
    twin = getattr(reference, kernel)
    assert params(getattr(ops, kernel)) == params(twin)
    assert kernel in reference.__all__


@pytest.mark.parametrize("operation", _kernels.OPERATIONS)
def test_every_backend_defines_every_operation_alike(operation):
    signatures = {name: names(getattr(module, operation)) for name, module in BACKENDS.items()}
    assert len({tuple(s) for s in signatures.values()}) == 1, signatures
    for module in BACKENDS.values():
        assert operation in module.__all__


def test_cython_options_are_only_n_threads():
    for operation in _kernels.OPERATIONS:
        cython = names(getattr(_cython, operation), drop=())
        assert set(cython) - set(names(getattr(reference, operation), drop=())) <= {"n_threads"}


# ---------------------------------------------------------- one routing rule
def test_route(monkeypatch):
    monkeypatch.delenv("SPARKAVG_PURE_NUMPY", raising=False)
    fast = _dispatch.CYTHON if ops.have_extension() else _dispatch.REFERENCE
    assert _dispatch.route("numpy", np.dtype(np.float32)) == fast
    assert _dispatch.route("numpy", np.dtype(np.float64)) == _dispatch.REFERENCE
    for dtype in (np.float32, np.float64):
        assert _dispatch.route("cupy", np.dtype(dtype)) == _dispatch.CUDA
    monkeypatch.setenv("SPARKAVG_PURE_NUMPY", "1")
    for kind in ("numpy", "cupy"):
        for dtype in (np.float32, np.float64):
            assert _dispatch.route(kind, np.dtype(dtype)) == _dispatch.REFERENCE


def samples(dtype):
    """One call of every kernel on small numpy arrays of ``dtype``."""
    rng = np.random.default_rng(0)

    def vec():
        return rng.standard_normal(64).astype(dtype)

    def pos():
        return np.abs(vec())

    def img():
        return rng.standard_normal((2, 6, 6, 3)).astype(dtype)

    sparse = reference.threshold_encode(vec(), 0.5, limit=64)
    bitmap = reference.bitmap_encode(vec(), 0.5)
    pooled = (2, 3, 3, 3)

    def rows():
        return rng.standard_normal((10, 3)).astype(dtype)

    def chan():
        return rng.standard_normal(3).astype(dtype)

    def gates(g):
        return rng.standard_normal((5, g * 3)).astype(dtype)

    def state():
        return rng.standard_normal((5, 3)).astype(dtype)

    def kernel():  # (KH, KW, C, F) for img()
        return rng.standard_normal((3, 3, 3, 4)).astype(dtype)

    def chan4():
        return rng.standard_normal(4).astype(dtype)
    return {
        "accumulate": lambda: ops.accumulate(vec(), vec(), 0.5),
        "scale": lambda: ops.scale(vec(), 0.5),
        "sgd_step": lambda: ops.sgd_step(vec(), vec(), 0.1),
        "nesterov_step": lambda: ops.nesterov_step(vec(), vec(), vec(), 0.1, 0.9),
        "adagrad_step": lambda: ops.adagrad_step(vec(), vec(), pos(), 0.1),
        "rmsprop_step": lambda: ops.rmsprop_step(vec(), vec(), pos(), 0.1),
        "adam_step": lambda: ops.adam_step(vec(), vec(), vec(), pos(), 0.1, t=2),
        "threshold_encode": lambda: ops.threshold_encode(vec(), 0.5, limit=64),
        "threshold_decode": lambda: ops.threshold_decode(sparse, vec()),
        "bitmap_encode": lambda: ops.bitmap_encode(vec(), 0.5),
        "bitmap_decode": lambda: ops.bitmap_decode(bitmap, vec()),
        "count_above": lambda: ops.count_above(vec(), 0.5),
        "clip_residual": lambda: ops.clip_residual(vec(), 0.1),
        "im2col": lambda: ops.im2col(img(), 2, 2, 1, 1, 1, 1),
        "col2im": lambda: ops.col2im(np.ones((98, 12), dtype), 2, 2, 1, 1, 1, 1, out=img()),
        "conv2d_forward": lambda: ops.conv2d_forward(img(), kernel(), chan4(), 1, 0),
        "conv2d_backward_data": lambda: ops.conv2d_backward_data(
            rng.standard_normal((2, 6, 4, 4)).astype(dtype), kernel(), 1, 0, out=img()),
        "conv2d_backward_weights": lambda: ops.conv2d_backward_weights(
            img(), rng.standard_normal((2, 6, 4, 4)).astype(dtype), 1, 0, kernel(), chan4()),
        "maxpool_forward": lambda: ops.maxpool_forward(img(), 2, 2, 2, 2),
        "maxpool_backward": lambda: ops.maxpool_backward(
            np.ones(pooled, dtype), np.zeros(pooled, np.int32), 2, 2, 2, 2, out=img()),
        "avgpool_forward": lambda: ops.avgpool_forward(img(), 2, 2, 2, 2),
        "avgpool_backward": lambda: ops.avgpool_backward(np.ones(pooled, dtype), 2, 2, 2, 2,
                                                         out=img()),
        "channel_stats": lambda: ops.channel_stats(rows()),
        "channel_affine": lambda: ops.channel_affine(rows(), chan(), chan()),
        "channel_sums": lambda: ops.channel_sums(rows(), rows(), chan()),
        "channel_blend": lambda: ops.channel_blend(rows(), rows(), chan(), chan(), chan(), chan()),
        "batchnorm_coefficients": lambda: ops.batchnorm_coefficients(
            chan(), np.abs(chan()), chan(), chan(), 1e-5, 0.9, 0.1, chan(), np.abs(chan()), chan(), chan(), chan()),
        "lstm_forward_step": lambda: ops.lstm_forward_step(gates(4), gates(4), state(), state(), state(), state()),
        "lstm_backward_step": lambda: ops.lstm_backward_step(gates(4), state(), state(), state(), state(), gates(4)),
        "gru_forward_step": lambda: ops.gru_forward_step(gates(3), gates(3), chan(), state(), state(), state()),
        "gru_backward_step": lambda: ops.gru_backward_step(gates(3), state(), state(), state(), gates(3), gates(3)),
        "scatter_add_rows": lambda: ops.scatter_add_rows(np.array([0, 2, 0]), rows()[:3], rows()[:4]),
    }


def test_samples_cover_every_kernel():
    assert set(samples(np.float32)) == set(ops.KERNELS)


def _spy_on_backends(monkeypatch):
    """Wrap every operation of every backend; returns the list of
    (backend, operation) calls made."""
    calls = []
    for backend_name, module in BACKENDS.items():
        for operation in _kernels.OPERATIONS:
            original = getattr(module, operation)

            def spy(*args, _b=backend_name, _o=operation, _f=original, **kwargs):
                calls.append((_b, _o))
                return _f(*args, **kwargs)

            monkeypatch.setattr(module, operation, spy)
    return calls


@pytest.mark.parametrize("kernel", _kernels.KERNELS)
@pytest.mark.parametrize("dtype, pure_numpy", [(np.float32, "0"), (np.float64, "0"),
                                               (np.float32, "1")])
def test_every_kernel_follows_the_rule(monkeypatch, kernel, dtype, pure_numpy):
    monkeypatch.setenv("SPARKAVG_PURE_NUMPY", pure_numpy)
    run = samples(dtype)[kernel]
    calls = _spy_on_backends(monkeypatch)
    run()
    want = _dispatch.route("numpy", np.dtype(dtype))
    backend_name = {_dispatch.CYTHON: "_cython", _dispatch.REFERENCE: "reference"}[want]
    assert calls == [(backend_name, _kernels.operation(kernel))]
    if dtype == np.float32 and pure_numpy == "0" and ops.have_extension():
        assert backend_name == "_cython"
    else:
        assert backend_name == "reference"


# ------------------------------------------------------ one "is it built"
def test_one_extension_check():
    """Only sparkavg.ops._cython imports sparkavg_ext; nothing else asks."""
    importers = []
    for path in sorted((ROOT / "sparkavg").rglob("*.py")):
        text = path.read_text()
        if "import sparkavg_ext" in text or "from sparkavg_ext" in text:
            importers.append(path.relative_to(ROOT).as_posix())
        assert "extension_available" not in text, path
    assert importers == ["sparkavg/ops/_cython.py"]
    with pytest.raises(ModuleNotFoundError):
        __import__("sparkavg.nn.kernels")
