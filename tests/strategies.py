"""Hypothesis strategies shared by the kernel tests."""
from __future__ import annotations

from hypothesis import strategies as st


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
