"""The CUDA kernels' bodies, run on the CPU.

Every kernel in ``sparkavg/ops/cuda_src`` is written so that the same text
also compiles as plain C, with the warp and grid loops run serially (see
``spk.cuh``).  Here that C build, compiled with the system C compiler and
loaded with ctypes, runs under the very Python glue the device uses
(:mod:`sparkavg.ops._cuda_conv`, :mod:`sparkavg.ops._cuda`) on numpy arrays,
and is held to the numpy reference and to the Cython kernels.  No GPU is
needed; what this cannot check (warp intrinsics as such, launch limits,
nvrtc itself) the ``gpu``-marked tests do where a GPU exists.  When nvcc is
installed, the CUDA text is also compiled to PTX for sm_90.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkavg.ops import _cuda, _cuda_conv, _cuda_norm, _cuda_sequence, _cython, cuda_src, reference
from sparkavg.ops import reference_norm, reference_sequence
from sparkavg.ops import reference_conv as ref

from .strategies import conv_geometry

# ------------------------------------------------------------ the C build
_CTYPES = {
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.float32): ctypes.c_float,
    np.dtype(np.float64): ctypes.c_double,
}


class CLauncher:
    """A launcher (see :mod:`sparkavg.ops.cuda_src`) that runs the C build
    of the kernels on numpy arrays."""

    xp = np

    def __init__(self, workdir):
        self.workdir = workdir
        self.libs = {}
        self.launches = []

    def lib(self, file, dtype, index):
        key = (file, np.dtype(dtype), np.dtype(index))
        if key not in self.libs:
            compiler = shutil.which("cc") or shutil.which("gcc")
            assert compiler, "a C compiler (cc) is needed to run the kernel bodies on the CPU"
            stem = f"{file}_{key[1].name}_{key[2].name}"
            src = self.workdir / f"{stem}.c"
            src.write_text(cuda_src.source(*key))
            so = self.workdir / f"{stem}.so"
            # No FMA contraction, as the device build (--fmad=false).
            run = subprocess.run(
                [compiler, "-x", "c", "-std=c99", "-O2", "-ffp-contract=off", "-Wall", "-Wextra",
                 "-Werror", "-Wno-unused-parameter", "-fPIC", "-shared", "-o", str(so), str(src)],
                check=False, capture_output=True, text=True)
            assert run.returncode == 0, f"C build of {file}.cu failed:\n{run.stderr}"
            self.libs[key] = ctypes.CDLL(str(so))
        return self.libs[key]

    def launch(self, file, name, dtype, index, threads, args):
        if threads <= 0:
            return
        self.launches.append((name, np.dtype(index)))
        converted = []
        for a in args:
            if isinstance(a, np.ndarray):
                assert a.flags.c_contiguous, f"{name}: a strided array reached a kernel"
                converted.append(ctypes.c_void_p(a.ctypes.data))
            else:
                assert isinstance(a, np.generic), f"{name}: {a!r} is not a numpy scalar"
                converted.append(_CTYPES[a.dtype](a))
        kernel = getattr(self.lib(file, dtype, index), name)
        kernel.restype = None
        kernel(*converted)


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    return CLauncher(tmp_path_factory.mktemp("cuda_src"))


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


# ---------------------------------------------------------------- shapes
def geometry(padding=True):
    return conv_geometry(padding=padding, batches=(1, 1, 2, 3), max_side=11)


def images(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def out_hw(shape, kh, kw, sh, sw, ph=0, pw=0):
    return ref.conv_output_size(shape[1], kh, sh, ph), ref.conv_output_size(shape[2], kw, sw, pw)


some = settings(max_examples=60, deadline=None)
dtypes = st.sampled_from([np.float32, np.float64])


# ------------------------------------------------------------------ conv
@some
@given(geometry(), st.booleans(), dtypes)
def test_im2col_is_the_reference(launcher, case, ones, dtype):
    shape, g, seed = case
    x = images(shape, seed, dtype)
    got = _cuda_conv._im2col(launcher, x, *g, ones_column=ones)
    assert same_bits(got, ref.im2col(x, *g, ones_column=ones))
    out = np.full_like(got, np.nan)
    assert _cuda_conv._im2col(launcher, x, *g, out=out, ones_column=ones) is out
    assert same_bits(out, got)


@some
@given(geometry(), dtypes)
def test_col2im_gathers_the_reference_sum(launcher, case, dtype):
    shape, g, seed = case
    oh, ow = out_hw(shape, *g)
    cols = images((shape[0] * oh * ow, g[0] * g[1] * shape[3]), seed, dtype)
    got = _cuda_conv._col2im(launcher, cols, *g, out=np.full(shape, np.nan, dtype))
    want = ref.col2im(cols, *g, out=np.empty(shape, dtype))
    np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-6)
    if dtype == np.float32:  # the Cython kernel's order of additions: the same bits
        assert same_bits(got, _cython.col2im(cols, *g, np.empty(shape, dtype)))


@some
@given(geometry(padding=False), dtypes)
def test_maxpool_is_the_reference(launcher, case, dtype):
    shape, (kh, kw, sh, sw, _, _), seed = case
    x = images(shape, seed, dtype)
    x[..., 0] = np.round(x[..., 0])  # ties: the first maximum wins
    out, arg = _cuda_conv._maxpool_forward(launcher, x, kh, kw, sh, sw)
    want_out, want_arg = ref.maxpool_forward(x, kh, kw, sh, sw)
    assert same_bits(out, want_out) and same_bits(arg, want_arg)
    dout = images(out.shape, seed + 1, dtype)
    got = _cuda_conv._maxpool_backward(launcher, dout, arg, kh, kw, sh, sw,
                                       np.full(shape, np.nan, dtype))
    want = ref.maxpool_backward(dout, want_arg, kh, kw, sh, sw, np.empty(shape, dtype))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    if dtype == np.float32:
        assert same_bits(got, _cython.maxpool_backward(dout, arg, kh, kw, sh, sw,
                                                       np.empty(shape, dtype)))


@some
@given(geometry(padding=False), dtypes)
def test_avgpool_is_the_reference(launcher, case, dtype):
    shape, (kh, kw, sh, sw, _, _), seed = case
    x = images(shape, seed, dtype)
    out = _cuda_conv._avgpool_forward(launcher, x, kh, kw, sh, sw)
    np.testing.assert_allclose(out, ref.avgpool_forward(x, kh, kw, sh, sw), rtol=1e-5, atol=1e-6)
    dout = images(out.shape, seed + 1, dtype)
    got = _cuda_conv._avgpool_backward(launcher, dout, kh, kw, sh, sw,
                                       np.full(shape, np.nan, dtype))
    np.testing.assert_allclose(
        got, ref.avgpool_backward(dout, kh, kw, sh, sw, np.empty(shape, dtype)),
        rtol=1e-5, atol=1e-6)
    if dtype == np.float32:  # the Cython kernels' arithmetic, bit for bit
        assert same_bits(out, _cython.avgpool_forward(x, kh, kw, sh, sw))
        assert same_bits(got, _cython.avgpool_backward(dout, kh, kw, sh, sw,
                                                       np.empty(shape, dtype)))


def test_maxpool_nan_window_keeps_the_corner(launcher):
    x = np.zeros((1, 2, 2, 1), np.float32)
    x[0, 1, 1, 0] = np.nan
    out, arg = _cuda_conv._maxpool_forward(launcher, x, 2, 2, 2, 2)
    want_out, want_arg = _cython.maxpool_forward(x, 2, 2, 2, 2)
    assert same_bits(out, want_out) and same_bits(arg, want_arg)


def test_lenet_shapes_and_wide_index(launcher):
    """The LeNet layers' shapes, with the narrow and the wide index type."""
    x = images((4, 28, 28, 1), 1)
    cols = _cuda_conv._im2col(launcher, x, 5, 5, 1, 1, 0, 0, ones_column=True)
    assert launcher.launches[-1] == ("sparkavg_im2col", np.dtype(np.int32))
    assert same_bits(cols, ref.im2col(x, 5, 5, 1, 1, 0, 0, ones_column=True))
    wide = CLauncher(launcher.workdir)
    wide.libs = launcher.libs
    narrow = cuda_src.index_type
    try:
        cuda_src.index_type = lambda *sizes: np.int64
        _cuda_conv.index_type = cuda_src.index_type
        got = _cuda_conv._im2col(wide, x, 5, 5, 1, 1, 0, 0, ones_column=True)
        assert wide.launches[-1] == ("sparkavg_im2col", np.dtype(np.int64))
    finally:
        cuda_src.index_type = narrow
        _cuda_conv.index_type = narrow
    assert same_bits(got, cols)


# -------------------------------------------------------------- encoding
def residuals(dtype):
    """Values around +-tau (ties included), zeros of both signs, long runs."""
    values = st.one_of(st.floats(-3, 3, width=32), st.sampled_from([1.0, -1.0, 0.0, -0.0, 0.5]))
    return st.builds(
        lambda v, reps: np.repeat(np.asarray(v, dtype), reps),
        st.lists(values, max_size=300), st.integers(1, 12))


def tile_plans(n):
    """The default tiling and, for multi-chunk tiles, a coarse one."""
    return st.sampled_from([None, _cuda._tiles(n, target=1), _cuda._tiles(n, target=3)])


def bits_equal(a, b):
    return (a is None and b is None) or (a is not None and b is not None and same_bits(a, b))


@settings(max_examples=120, deadline=None)
@given(st.data(), dtypes, st.floats(0.25, 2.0, width=32), st.booleans())
def test_sparse_encode_is_the_reference(launcher, data, dtype, tau, apply_when_capped):
    r = data.draw(residuals(dtype))
    limit = data.draw(st.integers(1, r.size + 3))
    tiles = data.draw(tile_plans(r.size))
    mine, want = r.copy(), r.copy()
    got, total = _cuda._encode_sparse(launcher, mine, tau, limit, apply_when_capped, tiles)
    expect, expect_total = reference.encode_sparse(want, tau, limit, apply_when_capped)
    assert total == expect_total
    assert bits_equal(got, expect)
    assert same_bits(mine, want)


@settings(max_examples=80, deadline=None)
@given(st.data(), dtypes, st.floats(0.25, 2.0, width=32))
def test_bitmap_encode_is_the_reference(launcher, data, dtype, tau):
    r = data.draw(residuals(dtype))
    mine, want = r.copy(), r.copy()
    got, count = _cuda._encode_bitmap(launcher, mine, tau)
    expect, expect_count = reference.encode_bitmap(want, tau)
    assert count == expect_count
    assert same_bits(got, expect)
    assert same_bits(mine, want)


@pytest.mark.parametrize("n", [1, 31, 32, 33, 1000, 4097, 70_001])
@pytest.mark.parametrize("density", [0.001, 0.05, 0.6])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_encoders_on_random_vectors(launcher, n, density, dtype):
    """Every lane and word position, several tiles and tile plans."""
    rng = np.random.default_rng(n)
    r = rng.standard_normal(n).astype(dtype)
    tau = float(np.float32(np.quantile(np.abs(r), 1 - density)))
    for tiles in (None, _cuda._tiles(n, target=2)):
        mine, want = r.copy(), r.copy()
        got = _cuda._encode_sparse(launcher, mine, tau, n, True, tiles)
        assert got[1] == reference.encode_sparse(want, tau, n)[1]
        assert bits_equal(got[0], reference.encode_sparse(r.copy(), tau, n)[0])
        assert same_bits(mine, want)
    mine, want = r.copy(), r.copy()
    got, count = _cuda._encode_bitmap(launcher, mine, tau)
    expect, expect_count = reference.encode_bitmap(want, tau)
    assert count == expect_count and same_bits(got, expect) and same_bits(mine, want)


@pytest.mark.parametrize("encoder", ["sparse", "bitmap"])
@pytest.mark.parametrize("bad_at", [[7, 39], [1000, 3], [4095]])
def test_non_finite_rejected_before_anything_is_written(launcher, encoder, bad_at):
    r = np.full(4096, 2.0, np.float32)
    r[bad_at] = [np.nan, np.inf][:len(bad_at)] if len(bad_at) > 1 else [-np.inf]
    before = r.copy()
    with pytest.raises(ValueError) as got:
        if encoder == "sparse":
            _cuda._encode_sparse(launcher, r, 0.5, 4096, True, _cuda._tiles(4096, target=2))
        else:
            _cuda._encode_bitmap(launcher, r, 0.5)
    with pytest.raises(ValueError) as want:
        reference.encode_sparse(before.copy(), 0.5, 4096)
    assert str(got.value) == str(want.value)
    assert f"index {min(bad_at)}" in str(got.value)
    assert same_bits(r, before)


@settings(max_examples=80, deadline=None)
@given(st.data(), dtypes, st.floats(0.25, 2.0, width=32), st.booleans())
def test_decode_is_the_reference(launcher, data, dtype, tau, use_bitmap):
    r = data.draw(residuals(dtype))
    message = (reference.bitmap_encode(r.copy(), tau) if use_bitmap
               else reference.threshold_encode(r.copy(), tau))
    if message is None:
        return
    start = np.random.default_rng(r.size).standard_normal(r.size).astype(dtype)
    start[::7] = -0.0  # untouched -0.0 stays -0.0
    mine, want = start.copy(), start.copy()
    tau_bits = reference.bits_float(int(message[2]))
    if use_bitmap:
        _cuda._decode_bitmap(launcher, message, mine, tau_bits)
        reference.decode_bitmap(message, want, tau_bits)
    else:
        _cuda._decode_sparse(launcher, message, mine, int(message[0]), tau_bits)
        reference.decode_sparse(message, want, int(message[0]), tau_bits)
    assert same_bits(mine, want)


def _decode_both(launcher, decode, message, target, *header):
    """Run the C build's and the reference's decoder on copies of target:
    [(error text or None, target after)] for each."""
    results = []
    for run in (lambda t: getattr(_cuda, f"_{decode}")(launcher, message, t, *header),
                lambda t: getattr(reference, decode)(message, t, *header)):
        t = target.copy()
        try:
            run(t)
            results.append((None, t))
        except ValueError as exc:
            results.append((str(exc), t))
    return results


@pytest.mark.parametrize("pos, value", [(5, 0), (4, 9), (6, -9), (4, -8)])
def test_bad_sparse_body_rejected_alike(launcher, pos, value):
    r = np.zeros(8, np.float32)
    r[[1, 5, 6]] = [1.0, -1.0, 1.0]
    m = reference.threshold_encode(r, 0.5, 8)
    m[pos] = value
    target = np.arange(8, dtype=np.float32)
    (mine, t_mine), (want, t_want) = _decode_both(launcher, "decode_sparse", m, target, 3, 0.5)
    if value == -8:  # in range: a valid message
        assert mine is None and want is None and same_bits(t_mine, t_want)
    else:
        assert mine is not None and mine == want
        assert same_bits(t_mine, target)


def test_repeated_sparse_index_adds_twice(launcher):
    m = np.array([3, 8, reference.float_bits(0.5), 0, 2, -2, 2], np.int32)
    target = np.full(8, 1.0, np.float32)
    (mine, t_mine), (want, t_want) = _decode_both(launcher, "decode_sparse", m, target, 3, 0.5)
    assert mine is None and want is None and same_bits(t_mine, t_want)
    assert t_mine[1] == 1.5


def test_bad_bitmap_words_rejected_alike(launcher):
    m = reference.bitmap_encode(np.zeros(40, np.float32), 0.5)
    target = np.arange(40, dtype=np.float32)
    for pos, word in [(4, 1 << 18), (6, 1 << 9), (5, 3 << 16 | 1), (6, 1 << 7)]:
        bad = m.copy()
        bad[pos] = word
        (mine, t_mine), (want, _) = _decode_both(launcher, "decode_bitmap", bad, target, 0.5)
        if (pos, word) == (6, 1 << 7):  # element 39: the last valid one
            assert mine is None and want is None and t_mine[39] == 39.5
        else:
            assert mine is not None and mine == want
            assert same_bits(t_mine, target)


# ------------------------------------------------------------ CUDA build
def _kernel_names(module):
    """The kernel names a Python module launches, by kernel file."""
    import inspect
    import re

    text = inspect.getsource(module)
    file = {_cuda_conv: "conv", _cuda: "encode", _cuda_norm: "norm", _cuda_sequence: "rnn"}[module]
    return file, set(re.findall(r'(?:launcher|_ENCODE|_FILE), "(sparkavg_[a-z0-9_]+)"', text))


#: Kernels calling the device's tanh, which the math library builds on
#: explicit fused multiply-adds (their results are held to a few ulps).
_LIBRARY_FMA = {"sparkavg_lstm_forward_step"}


@pytest.mark.slow
@pytest.mark.parametrize("file", cuda_src.FILES)
def test_cuda_text_compiles_to_ptx(tmp_path, file):
    """The same text as CUDA: nvcc (no GPU needed) to PTX for sm_90, no
    warnings, an entry for every kernel the Python side launches, and no
    fused multiply-add where --fmad=false must keep the CPU's roundings."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not installed: the CUDA text is compiled only where the CUDA "
                    "toolkit is (the C build above still runs every kernel body)")
    launched = {f: names for f, names in map(_kernel_names, (_cuda_conv, _cuda, _cuda_norm, _cuda_sequence))}[file]
    assert launched, f"found no kernel names for {file}.cu in the Python glue"
    for dtype in (np.float32, np.float64):
        for index in (np.int32, np.int64):
            stem = f"{file}_{np.dtype(dtype).name}_{np.dtype(index).name}"
            src = tmp_path / f"{stem}.cu"
            src.write_text(cuda_src.source(file, dtype, index))
            ptx = tmp_path / f"{stem}.ptx"
            run = subprocess.run(
                [nvcc, "-ptx", "-arch=compute_90", *cuda_src.NVRTC_OPTIONS, "--Werror",
                 "all-warnings", "-o", str(ptx), str(src)],
                check=False, capture_output=True, text=True)
            assert run.returncode == 0, f"nvcc rejected {stem}:\n{run.stderr}"
            text = ptx.read_text()
            for name in launched:
                assert f".entry {name}(" in text, f"{stem}: no kernel {name}"
            for name in launched - _LIBRARY_FMA:
                body = text.split(f".entry {name}(", 1)[1].split(".entry ", 1)[0]
                assert "fma.rn" not in body, f"{stem}: a multiply-add was contracted in {name}"


# ------------------------------------------------------ BatchNorm's sums
@some
@given(st.integers(1, 300), st.integers(1, 40), st.integers(0, 2**31 - 1), dtypes)
def test_channel_sums_are_the_reference(launcher, m, c, seed, dtype):
    """Both stages (chunks of rows, then chunk order) give the reference's
    float64 sums of the same terms, to the last bits of a double."""
    rng = np.random.default_rng(seed)
    x = (3.0 + 2.0 * rng.standard_normal((m, c))).astype(dtype)
    dy = rng.standard_normal((m, c)).astype(dtype)
    center = rng.standard_normal(c).astype(dtype)
    tol = dict(rtol=2e-7, atol=1e-7) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-13)
    mean, var = _cuda_norm._channel_stats(launcher, x)
    want_mean, want_var = reference_norm.channel_stats(x)
    assert mean.dtype == var.dtype == dtype
    np.testing.assert_allclose(mean, want_mean, **tol)
    np.testing.assert_allclose(var, want_var, **tol)
    given = (np.full(c, np.nan, dtype), np.full(c, np.nan, dtype))
    got = _cuda_norm._channel_stats(launcher, x, *given)  # written in place
    assert got[0] is given[0] and got[1] is given[1]
    np.testing.assert_allclose(given[0], want_mean, **tol)
    np.testing.assert_allclose(given[1], want_var, **tol)
    out = (np.full(c, np.nan, dtype), np.full(c, np.nan, dtype))
    got = _cuda_norm._channel_sums(launcher, dy, x, center, *out)
    assert got[0] is out[0] and got[1] is out[1]
    for a, b in zip(got, reference_norm.channel_sums(dy, x, center)):
        np.testing.assert_allclose(a, b, **tol)


def test_channel_sums_split_rows_into_chunks(launcher):
    """Past the stage-1 target a channel's rows come from several chunks,
    and the chunk sizes leave no row out or twice."""
    m, c = 50_000, 3
    chunks, rows = _cuda_norm._chunks(m, c)
    assert chunks > 1 and (chunks - 1) * rows < m <= chunks * rows
    x = np.arange(m * c, dtype=np.float64).reshape(m, c) % 7
    s1, s2 = np.full(c, np.nan), np.full(c, np.nan)
    _cuda_norm._sums(launcher, "sparkavg_channel_grad_partials", (x, x, np.zeros(c)), m, c, s1, s2,
                     _cuda_norm._SUMS)
    np.testing.assert_array_equal(s1, x.sum(axis=0))
    np.testing.assert_array_equal(s2, (x * x).sum(axis=0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m", [1, 9])
def test_batchnorm_coefficients_are_the_reference_bit_for_bit(launcher, dtype, m):
    rng = np.random.default_rng(m)
    mean, var, gamma, beta = (rng.standard_normal(17).astype(dtype) for _ in range(4))
    var = np.abs(var)
    args = (1e-5, 0.9, (1.0 - 0.9) * m / (m - 1) if m > 1 else 0.0)
    got = [rng.standard_normal(17).astype(dtype), np.abs(rng.standard_normal(17)).astype(dtype)]
    got += [np.full(17, np.nan, dtype) for _ in range(3)]
    want = [a.copy() for a in got]
    _cuda_norm._batchnorm_coefficients(launcher, mean, var, gamma, beta, *args, *got)
    reference_norm.batchnorm_coefficients(mean, var, gamma, beta, *args, *want)
    assert all(same_bits(a, b) for a, b in zip(got, want))


# ------------------------------------------------------------ LSTM steps
@some
@given(st.integers(1, 9), st.integers(1, 17), st.integers(0, 2**31 - 1), dtypes)
def test_lstm_steps_are_the_reference(launcher, n, u, seed, dtype):
    """Forward: the reference's terms in its order (tanh from the C
    library here, so a few ulps); backward has no transcendental: the
    same bits."""
    rng = np.random.default_rng(seed)
    r = lambda *shape: (2 * rng.standard_normal(shape)).astype(dtype)  # noqa: E731
    z, rec, c_prev = r(n, 4 * u), r(n, 4 * u), r(n, u)
    got = [z.copy(), np.empty((n, u), dtype), np.empty((n, u), dtype), np.empty((n, u), dtype)]
    want = [z.copy(), np.empty((n, u), dtype), np.empty((n, u), dtype), np.empty((n, u), dtype)]
    _cuda_sequence._lstm_forward_step(launcher, got[0], rec, c_prev, *got[1:])
    reference_sequence.lstm_forward_step(want[0], rec, c_prev, *want[1:])
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-14, atol=1e-14)
    for what, a, b in zip(("activations", "c", "tanh(c)", "h"), got, want):
        np.testing.assert_allclose(a, b, err_msg=what, **tol)

    a, tc, dh, dc = want[0], want[2], r(n, u), r(n, u)
    got_dc, got_dz = dc.copy(), np.full((n, 4 * u), np.nan, dtype)
    want_dc, want_dz = dc.copy(), np.full((n, 4 * u), np.nan, dtype)
    _cuda_sequence._lstm_backward_step(launcher, a, c_prev, tc, dh, got_dc, got_dz)
    reference_sequence.lstm_backward_step(a, c_prev, tc, dh, want_dc, want_dz)
    assert same_bits(got_dz, want_dz) and same_bits(got_dc, want_dc)


def test_device_backend_runs_the_raw_conv_kernels():
    """CuPy arrays reach the raw kernels, not the reference twins."""
    from sparkavg.ops import _dispatch
    from sparkavg.ops._kernels import CONV

    assert _dispatch.route("cupy", np.float32) == _dispatch.CUDA
    for name in CONV:
        assert getattr(_cuda, name) is getattr(_cuda_conv, name), name
    for name in ("channel_stats", "channel_sums", "batchnorm_coefficients"):
        assert getattr(_cuda, name) is getattr(_cuda_norm, name), name
    for name in ("lstm_forward_step", "lstm_backward_step"):
        assert getattr(_cuda, name) is getattr(_cuda_sequence, name), name
