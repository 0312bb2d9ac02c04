"""Averaging and fused updater steps: Cython == numpy reference.

The Cython kernels evaluate the reference's formulas in the same order with
the same float32 constants, so on the default build (no FMA contraction) they
agree bit for bit; the tolerance below leaves room for a build that
contracts multiply-adds.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from sparkavg import ops
from sparkavg.ops import reference

pytestmark = pytest.mark.skipif(not ops.have_extension(), reason="sparkavg_ext not built")

sizes = st.integers(0, 300)
values = st.floats(-10.0, 10.0, width=32)
positive = st.floats(0.0, 10.0, width=32)
TOL = dict(rtol=1e-5, atol=1e-6)


def vectors(k, elements=values):
    """k float32 vectors of one drawn length."""
    return sizes.flatmap(lambda n: st.tuples(*[arrays(np.float32, n, elements=elements)] * k))


def run_both(name, arrays_in, *args, **kwargs):
    fast = [a.copy() for a in arrays_in]
    ref = [a.copy() for a in arrays_in]
    out = getattr(ops, name)(*fast, *args, **kwargs)
    getattr(reference, name)(*ref, *args, **kwargs)
    assert out is fast[0]
    return fast, ref


@given(vectors(2), st.floats(-4.0, 4.0))
def test_accumulate(pair, weight):
    fast, ref = run_both("accumulate", pair, weight)
    np.testing.assert_allclose(fast[0], ref[0], **TOL)
    assert np.array_equal(fast[1], pair[1])  # x is only read


@given(vectors(1), st.floats(-4.0, 4.0))
def test_scale(one, factor):
    fast, ref = run_both("scale", one, factor)
    np.testing.assert_allclose(fast[0], ref[0], **TOL)


@given(vectors(2), st.floats(1e-4, 1.0))
def test_sgd(pair, lr):
    fast, ref = run_both("sgd_step", pair, lr)
    np.testing.assert_allclose(fast[0], ref[0], **TOL)


@given(vectors(3), st.floats(1e-4, 1.0), st.floats(0.0, 0.99))
def test_nesterov(triple, lr, momentum):
    fast, ref = run_both("nesterov_step", triple, lr, momentum)
    for f, r in zip(fast, ref):
        np.testing.assert_allclose(f, r, **TOL)


@given(sizes.flatmap(lambda n: st.tuples(arrays(np.float32, n, elements=values),
                                         arrays(np.float32, n, elements=values),
                                         arrays(np.float32, n, elements=positive))),
       st.floats(1e-4, 1.0))
def test_adagrad(triple, lr):
    fast, ref = run_both("adagrad_step", triple, lr, eps=1e-6)
    for f, r in zip(fast, ref):
        np.testing.assert_allclose(f, r, **TOL)


@given(sizes.flatmap(lambda n: st.tuples(arrays(np.float32, n, elements=values),
                                         arrays(np.float32, n, elements=values),
                                         arrays(np.float32, n, elements=positive))),
       st.floats(1e-4, 1.0), st.floats(0.5, 0.999))
def test_rmsprop(triple, lr, decay):
    fast, ref = run_both("rmsprop_step", triple, lr, decay=decay)
    for f, r in zip(fast, ref):
        np.testing.assert_allclose(f, r, **TOL)


@given(sizes.flatmap(lambda n: st.tuples(arrays(np.float32, n, elements=values),
                                         arrays(np.float32, n, elements=values),
                                         arrays(np.float32, n, elements=values),
                                         arrays(np.float32, n, elements=positive))),
       st.floats(1e-4, 0.1), st.integers(1, 1000))
def test_adam(quad, lr, t):
    fast, ref = run_both("adam_step", quad, lr, 0.9, 0.999, 1e-8, t)
    for f, r in zip(fast, ref):
        np.testing.assert_allclose(f, r, **TOL)


def test_zero_params_receive_the_update():
    rng = np.random.default_rng(0)
    g = rng.standard_normal(1000).astype(np.float32)
    update = np.zeros_like(g)
    ops.adam_step(update, g, np.zeros_like(g), np.zeros_like(g), 1e-3, t=1)
    want = np.zeros_like(g)
    reference.adam_step(want, g, np.zeros_like(g), np.zeros_like(g), 1e-3, t=1)
    np.testing.assert_allclose(update, want, **TOL)
    assert np.all(np.sign(update) == -np.sign(g))


def test_threads_give_the_same_result():
    rng = np.random.default_rng(1)
    p, g, m, v = (rng.standard_normal(300_001).astype(np.float32) for _ in range(4))
    v = np.abs(v)
    one = [a.copy() for a in (p, g, m, v)]
    two = [a.copy() for a in (p, g, m, v)]
    ops.adam_step(*one, 1e-3, t=3)
    ops.adam_step(*two, 1e-3, t=3, n_threads=2)
    assert all(np.array_equal(a, b) for a, b in zip(one, two))
    b1, b2 = p.copy(), p.copy()
    ops.accumulate(b1, g, 0.25)
    ops.accumulate(b2, g, 0.25, n_threads=2)
    assert np.array_equal(b1, b2)


def test_any_shape_and_float64():
    p = np.ones((3, 4), np.float32)
    ops.sgd_step(p, np.full((3, 4), 2.0, np.float32), 0.5)
    assert np.all(p == 0.0)
    p64 = np.ones(5)
    ops.accumulate(p64, np.ones(5), 2.0)
    assert np.all(p64 == 3.0)


def test_strided_operand_is_converted():
    buf = np.zeros(5, np.float32)
    x = np.arange(10, dtype=np.float32)
    ops.accumulate(buf, x[::2])
    assert list(buf) == [0, 2, 4, 6, 8]


def test_bad_arguments():
    p = np.zeros(8, np.float32)
    with pytest.raises(TypeError, match="dtype float32 like params"):
        ops.sgd_step(p, np.zeros(8), 0.1)
    with pytest.raises(ValueError, match=r"shape \(8,\) like params"):
        ops.sgd_step(p, np.zeros(7, np.float32), 0.1)
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.sgd_step(np.zeros(16, np.float32)[::2], np.zeros(8, np.float32), 0.1)
    with pytest.raises(ValueError, match="C-contiguous"):
        ops.adam_step(p, p.copy(), np.zeros(16, np.float32)[::2], p.copy(), 0.1)
    with pytest.raises(TypeError, match="float32"):
        ops.scale(np.zeros(4, np.int64), 2.0)
    with pytest.raises(ValueError, match="t >= 1"):
        ops.adam_step(p, p.copy(), p.copy(), p.copy(), 0.1, t=0)
    with pytest.raises(ValueError, match="n_threads >= 1"):
        ops.accumulate(p, p.copy(), n_threads=0)
    frozen = np.zeros(8, np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        ops.scale(frozen, 2.0)
