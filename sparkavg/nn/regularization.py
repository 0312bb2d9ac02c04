"""L2 penalties and decoupled weight decay over the flat parameter vector.

A network's regularised parameters are a few contiguous ranges of its flat
vector (adjacent segments with the same coefficient merged, segments whose
coefficient is 0 left out), fixed when the network is built.  Each term is
then one fused in-place pass per range through :func:`sparkavg.ops.accumulate`
(Cython on numpy float32, a CUDA kernel on CuPy, the numpy reference for
float64; unchecked, as the ranges are slices of the network's own flat
vectors), instead of a Python loop over every segment with a temporary
the size of the weights.

Everything is array-module generic: the functions take the flat vectors and
slice them; nothing is cached per device, so a network moved between host
and GPU keeps the same :class:`Regularization`.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..ops.elementwise import unchecked

__all__ = ["Regularization"]


class Regularization:
    """The L2 and weight-decay terms of one network layout.

    Parameters
    ----------
    segments : sequence of Segment
        The network's ``(layer, name, start, stop, shape, regularized)``
        segments in flat-vector order.
    l2, l2_bias : float
        Penalty ``0.5 * l2 * |W|^2`` on ``regularized`` segments (weights)
        and ``0.5 * l2_bias * |b|^2`` on the others (biases).
    weight_decay : float
        Decoupled decay on weights: ``update -= lr * weight_decay * W``.

    Attributes
    ----------
    l2_ranges : tuple of (start, stop, coefficient)
        Where the L2 gradient ``coefficient * params`` is added.
    decay_ranges : tuple of (start, stop)
        The weights weight decay acts on (empty when ``weight_decay`` is 0).
    coefficients : tuple of float
        ``(l2, l2_bias, weight_decay)`` as given.
    """

    __slots__ = ("coefficients", "decay_ranges", "l2_ranges", "weight_decay")

    def __init__(self, segments: Sequence, l2: float, l2_bias: float, weight_decay: float):
        self.coefficients = (l2, l2_bias, weight_decay)
        self.l2_ranges = _ranges((seg.start, seg.stop, l2 if seg.regularized else l2_bias)
                                 for seg in segments)
        self.weight_decay = float(weight_decay)
        self.decay_ranges = tuple((start, stop) for start, stop, _ in _ranges(
            (seg.start, seg.stop, self.weight_decay if seg.regularized else 0.0) for seg in segments))

    def add_gradient(self, grads, params) -> None:
        """``grads += coefficient * params`` over every L2 range, in place."""
        for start, stop, coeff in self.l2_ranges:
            unchecked("accumulate", grads, grads[start:stop], params[start:stop], coeff)

    def penalty_terms(self, params) -> list:
        """``[(0.5 * coefficient, params[r] @ params[r]) ...]`` per L2 range.

        The dot products stay on the device (0-d arrays on CuPy), so a step
        can queue them before the update and read them back at its end;
        :meth:`penalty` sums them on the host.
        """
        return [(0.5 * coeff, params[start:stop] @ params[start:stop])
                for start, stop, coeff in self.l2_ranges]

    @staticmethod
    def penalty(terms) -> float:
        """The L2 penalty from :meth:`penalty_terms` (a device -> host sync
        per range on CuPy)."""
        return sum(half * float(dot) for half, dot in terms)

    def decay(self, update, params, lr: float) -> None:
        """``update -= lr * weight_decay * params`` over the weights, in place."""
        if self.decay_ranges:
            weight = -lr * self.weight_decay
            for start, stop in self.decay_ranges:
                unchecked("accumulate", update, update[start:stop], params[start:stop], weight)


def _ranges(items) -> tuple:
    """Merge consecutive (start, stop, coeff) with equal coefficients and
    touching bounds; drop those whose coefficient is 0."""
    merged = []
    for start, stop, coeff in items:
        if not coeff or stop == start:
            continue
        if merged and merged[-1][1] == start and merged[-1][2] == coeff:
            merged[-1] = (merged[-1][0], stop, coeff)
        else:
            merged.append((start, stop, coeff))
    return tuple(merged)
