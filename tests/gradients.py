"""Central differences for the float64 gradient checks (layers, vertices,
losses, whole models)."""
import numpy as np

EPS = 1e-6


def relative_error(analytic, numeric) -> float:
    """|analytic - numeric| / (|analytic| + |numeric|) in the 2-norm; 0 when both are zero."""
    denom = np.linalg.norm(analytic) + np.linalg.norm(numeric)
    return np.linalg.norm(analytic - numeric) / denom if denom > 0 else 0.0


def central(loss, values, where=None) -> np.ndarray:
    """Central differences of ``loss()`` in each entry of ``values`` (or those
    ``where`` is True), shape ``(values.size,)`` (0 where not computed).
    ``loss`` reads ``values``, which is moved in place, one entry at a time,
    and left as it was."""
    flat = values.reshape(-1)
    idx = np.arange(flat.size) if where is None else np.flatnonzero(where.reshape(-1))
    out = np.zeros(flat.size)
    for i in idx:
        keep = flat[i]
        flat[i] = keep + EPS
        up = loss()
        flat[i] = keep - EPS
        down = loss()
        flat[i] = keep
        out[i] = (up - down) / (2 * EPS)
    return out


def parameter_central(model, loss, idx=None) -> np.ndarray:
    """Central differences of ``loss()`` in ``model.params[idx]`` (default:
    every parameter), in the order of ``idx``: each moved copy of the
    parameters is set on the model before ``loss()``; the model's parameters
    are restored after."""
    start = model.params.copy()
    moved = start.copy()
    where = None
    if idx is not None:
        where = np.zeros(moved.size, bool)
        where[idx] = True

    def at_moved():
        model.params = moved
        return loss()

    numeric = central(at_moved, moved, where)
    model.params = start
    return numeric if idx is None else numeric[idx]
