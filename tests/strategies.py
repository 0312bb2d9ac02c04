"""Hypothesis strategies shared by the kernel and evaluation tests."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp


@st.composite
def conv_geometry(draw, padding=True, batches=(0, 1, 2, 3), channels=(1, 3, 20), max_side=11):
    """``((n, h, w, c), (kh, kw, sh, sw, ph, pw), seed)``: an NHWC shape and a
    convolution/pooling geometry with at least one output position."""
    n = draw(st.sampled_from(batches))
    c = draw(st.sampled_from(channels))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    ph = draw(st.integers(0, kh - 1)) if padding else 0
    pw = draw(st.integers(0, kw - 1)) if padding else 0
    h = draw(st.integers(max(1, kh - 2 * ph), max_side))
    w = draw(st.integers(max(1, kw - 2 * pw), max_side))
    seed = draw(st.integers(0, 2**32 - 1))
    return (n, h, w, c), (kh, kw, sh, sw, ph, pw), seed


#: Probabilities with many exact ties (and the ends of [0, 1]) between arbitrary ones.
_TIED = st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])


@st.composite
def predictions(draw, classes=(2, 6), max_examples=40, integer_weights=False):
    """``(c, labels, probabilities, weights, cuts)``: c classes, N labels in
    0..c-1, (N, c) probabilities in [0, 1] (rows not normalised, many tied),
    weights (None, or N non-negative ones, whole numbers when
    ``integer_weights``) and the sorted cut points of a split into partitions."""
    c = draw(st.integers(*classes))
    n = draw(st.integers(0, max_examples))
    labels = draw(hnp.arrays(np.int64, n, elements=st.integers(0, c - 1)))
    probabilities = draw(hnp.arrays(np.float64, (n, c), elements=_TIED | st.floats(0, 1)))
    weight = st.integers(0, 5).map(float) if integer_weights else st.floats(0, 10)
    weights = draw(st.none() | hnp.arrays(np.float64, n, elements=weight))
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=4)))
    return c, labels, probabilities, weights, cuts


def evaluated_in_parts(make, labels, probabilities, weights, cuts, order=None):
    """``make()`` evaluated on each partition the ``cuts`` split the data in,
    merged in ``order`` (a permutation of the partitions; in turn by default)."""
    bounds = [0, *cuts, len(labels)]
    parts = [make().eval(labels[a:b], probabilities[a:b], None if weights is None else weights[a:b])
             for a, b in zip(bounds, bounds[1:])]
    merged = make()
    for i in order if order is not None else range(len(parts)):
        merged.merge(parts[i])
    return merged
