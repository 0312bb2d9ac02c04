"""Top-k accuracy, log loss and expected calibration error: against
scikit-learn (and a direct numpy ECE), merging in any split, the JSON form."""
import json
import math
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given
from sklearn.exceptions import UndefinedMetricWarning
from sklearn.metrics import log_loss, top_k_accuracy_score

from sparkavg.configurable import registered
from sparkavg.evaluation import CalibrationError, LogLoss, TopKAccuracy
from sparkavg.spark.executor.codec import decode_value, encode_value

from .strategies import evaluated_in_parts, predictions

#: scikit-learn agreement promised.
TOLERANCE = 1e-9


def _case(seed: int, c: int):
    """Labels, probability rows (half from a few prototypes, so rows tie
    exactly within and across classes, some with zeros and ones) and weights."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 300))
    y = rng.integers(0, c, n)
    prototypes = np.round(rng.dirichlet(np.ones(c), 4), 1)
    prototypes /= prototypes.sum(axis=1, keepdims=True)
    p = np.where(rng.random((n, 1)) < 0.5, prototypes[rng.integers(0, 4, n)], rng.dirichlet(np.ones(c) * 0.3, n))
    w = rng.random(n) * 3 if seed % 2 else None
    return y, p, w


# ------------------------------------------------------------ top-k accuracy
@pytest.mark.parametrize("seed", range(30))
def test_top_k_equals_scikit_learn(seed):
    c = 3 + seed % 5
    y, p, w = _case(seed, c)
    for k in range(1, c + 1):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UndefinedMetricWarning)  # k == c: "meaningless", 1.0
            expected = top_k_accuracy_score(y, p, k=k, labels=range(c), sample_weight=w)
        assert abs(TopKAccuracy(c, k).eval(y, p, w).accuracy() - expected) <= TOLERANCE


def test_top_k_ties_rank_the_higher_class_first():
    p = np.array([[0.4, 0.4, 0.2], [0.4, 0.4, 0.2], [0.2, 0.4, 0.4]])
    for y, hits in (([0, 1, 1], [0, 1, 0]), ([1, 0, 2], [1, 0, 1])):
        expected = top_k_accuracy_score(y, p, k=1, labels=range(3))
        assert TopKAccuracy(3, 1).eval(y, p).accuracy() == expected == np.mean(hits)


def test_top_k_of_two_classes():
    y = np.array([0, 0, 1, 0, 1, 0])
    p1 = np.array([0.5, 0.5, 0.7, 0.2, 0.1, 0.9])  # exactly 0.5 predicts class 0, as in scikit-learn
    assert TopKAccuracy(2, 1).eval(y, p1).accuracy() == top_k_accuracy_score(y, p1, k=1) == 4 / 6
    assert TopKAccuracy(2, 2).eval(y, p1).accuracy() == 1.0
    # as (N, 2) rows the tie-break of the multi-class rule applies: a tie predicts class 1
    assert TopKAccuracy(2, 1).eval(y, np.stack([1 - p1, p1], axis=1)).accuracy() == 2 / 6
    with pytest.raises(ValueError, match=r"Expect probabilities in \[0, 1\], got 1.5 at index \(0,\)"):
        TopKAccuracy(2, 1).eval([1], [1.5])
    logits = np.array([[3.0, -1.0, 7.5]])  # (N, C) scores need not be probabilities
    assert TopKAccuracy(3, 1).eval([2], logits).accuracy() == 1.0


# ------------------------------------------------------------------ log loss
@pytest.mark.parametrize("seed", range(30))
def test_log_loss_equals_scikit_learn(seed):
    c = 2 + seed % 5
    y, p, w = _case(seed, c)
    p[0] = 0.0
    p[0, (y[0] + 1) % c] = 1.0  # a true class of probability 0: clipped at eps
    expected = log_loss(y, p, labels=range(c), sample_weight=w)
    assert math.isclose(LogLoss(c).eval(y, p, w).log_loss(), expected, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
    if c == 2:  # (N,) probabilities of class 1
        expected = log_loss(y, p[:, 1], labels=range(c), sample_weight=w)
        assert math.isclose(LogLoss(2).eval(y, p[:, 1], w).log_loss(), expected, rel_tol=TOLERANCE)


def test_log_loss_clipping_convention():
    y = np.array([0, 1, 1])
    p = np.array([[1.0, 0.0], [0.3, 0.7], [1.0, 0.0]])
    eps64 = np.finfo(np.float64).eps
    assert math.isclose(LogLoss(2).eval(y, p).log_loss(), (-math.log1p(-eps64) - math.log(0.7) - math.log(eps64)) / 3,
                        rel_tol=1e-15)
    # float32 probabilities clip at float32's eps, the logarithm still in float64
    p32 = p.astype(np.float32)
    eps32 = float(np.finfo(np.float32).eps)
    expected = log_loss(y, np.clip(p32.astype(np.float64), eps32, 1 - eps32), labels=range(2))
    assert math.isclose(LogLoss(2).eval(y, p32).log_loss(), expected, rel_tol=TOLERANCE)
    assert LogLoss(2).eval(y, p32).log_loss() < LogLoss(2).eval(y, p).log_loss()  # 15.9 vs 36.0 for the zero
    # an explicit eps overrides the dtype's
    assert math.isclose(LogLoss(2, eps=1e-3).eval([1], [[1.0, 0.0]]).log_loss(), -math.log(1e-3), rel_tol=1e-15)
    with pytest.raises(ValueError, match=r"Expect eps None \(the dtype's machine epsilon\) or a float in \(0, 0.5\), "
                                         r"got 0.7"):
        LogLoss(2, eps=0.7)


# ------------------------------------------------------- calibration error
def _direct_ece(y, p, w, bins):
    """ECE computed directly: for each bin (lo, hi] (the first also holding
    0), the weighted |accuracy - mean confidence| times its weight share."""
    w = np.ones(len(y)) if w is None else w
    confidence, predicted = p.max(axis=1), p.argmax(axis=1)
    edges = np.linspace(0, 1, bins + 1)
    total = 0.0
    for m in range(bins):
        inside = (confidence > edges[m]) & (confidence <= edges[m + 1])
        if m == 0:
            inside |= confidence == 0
        weight = w[inside].sum()
        if weight > 0:
            accuracy = np.dot(w[inside], predicted[inside] == y[inside]) / weight
            mean_confidence = np.dot(w[inside], confidence[inside]) / weight
            total += weight / w.sum() * abs(accuracy - mean_confidence)
    return total


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("bins", [1, 5, 10, 15])
def test_calibration_error_equals_a_direct_computation(seed, bins):
    c = 2 + seed % 4
    y, p, w = _case(seed, c)
    p[:3] = 0.0
    p[:3, 0] = [0.3, 1.0, 0.0] if c == 2 else [0.3, 0.6, 0.2]  # confidences on the bin edges, p*M round up
    p[:3, 1] = 1 - p[:3, 0] if c == 2 else [0.2, 0.4, 0.2]
    ece = CalibrationError(c, bins).eval(y, p, w)
    assert abs(ece.expected_calibration_error() - _direct_ece(y, p, w, bins)) <= 1e-12


def test_calibration_error_by_hand():
    # confidences 0.9 (right), 0.8 (wrong) in bin (0.6, 0.8]/(0.8, 1.0]; 0.6 (right) in (0.4, 0.6]
    y = np.array([0, 1, 1])
    p = np.array([[0.9, 0.1], [0.8, 0.2], [0.4, 0.6]])
    ece = CalibrationError(2, num_bins=5).eval(y, p)
    assert math.isclose(ece.expected_calibration_error(), (0.1 + 0.8 + 0.4) / 3, rel_tol=1e-15)
    r = ece.reliability()
    np.testing.assert_allclose(r["edges"], [0, 0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_array_equal(r["weight"], [0, 0, 1, 1, 1])
    np.testing.assert_array_equal(r["accuracy"][2:], [1, 0, 1])
    assert np.isnan(r["accuracy"][:2]).all() and np.isnan(r["confidence"][:2]).all()
    np.testing.assert_allclose(r["confidence"][2:], [0.6, 0.8, 0.9])
    assert repr(ece) == "CalibrationError(num_classes=2, num_bins=5, count=3, ece=0.4333)"


# ------------------------------------------------------------ shared rules
METRICS = {
    "top_k": (lambda c: TopKAccuracy(c, k=min(2, c)), "accuracy"),
    "log_loss": (lambda c: LogLoss(c), "log_loss"),
    "ece": (lambda c: CalibrationError(c, num_bins=7), "expected_calibration_error"),
}


@pytest.mark.parametrize("name", METRICS)
def test_bad_input_names_what_was_wrong(name):
    make, _ = METRICS[name]
    ev = make(3)
    cases = [
        (([0, 3], np.full((2, 3), 0.3)), r"Expect labels in 0..2, got 3 at index 1"),
        (([0, 0.5], np.full((2, 3), 0.3)), r"Expect integer class indices in labels, got 0.5 at index 1"),
        (([0, 1], np.full((2, 2), 0.3)), r"Expect probabilities of shape \(N, 3\), got shape \(2, 2\)"),
        (([0, 1], np.array([[0.1, np.nan, 0.2], [0.1, 0.2, 0.3]])),
         r"Expect finite probabilities, got nan at index \(0, 1\)"),
        (([0, 1], np.full((3, 3), 0.3)), "same number of examples, got 2 and 3"),
        (([0, 1], np.full((2, 3), 0.3), [1.0, -0.5]), r"Expect non-negative weights, got -0.5 at index 1"),
        (([0, 1], np.full((2, 3), 0.3), np.ones((2, 1))), r"Expect weights of shape \(2,\), one per example"),
        (([0, 1], np.array([["a", "b", "c"]] * 2)), r"Expect real probabilities, got dtype <U1"),
    ]
    if name != "top_k":  # top-k ranks any finite scores
        cases.append((([0, 1], np.array([[0.1, -0.2, 0.3], [0.1, 0.2, 0.3]])),
                      r"Expect probabilities in \[0, 1\], got -0.2 at index \(0, 1\)"))
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            ev.eval(*args)
    assert ev.count == 0 and ev.total_weight == 0.0  # failed calls added nothing
    metric = getattr(ev, METRICS[name][1])
    with pytest.raises(ValueError, match=f"Expect at least one evaluated example for .*, got 0: the "
                                         f"{type(ev).__name__} has seen no examples"):
        metric()
    assert "n/a" in repr(ev)
    ev.eval([0, 1], np.full((2, 3), 0.3), [0.0, 0.0])
    with pytest.raises(ValueError, match=r"Expect a positive total weight for .*, got 0.0 over 2 examples"):
        metric()


def test_constructor_checks(caplog):
    with pytest.raises(ValueError, match="Expect k <= num_classes=3, got k=4"):
        TopKAccuracy(3, 4)
    with caplog.at_level("WARNING", logger="sparkavg.evaluation.probabilistic"):
        assert TopKAccuracy(3, 3).eval([0, 1, 2], np.eye(3)[::-1]).accuracy() == 1.0
    assert "TopKAccuracy with k == num_classes == 3 counts every example a hit" in caplog.text
    with pytest.raises(ValueError, match="Expect k to be an int >= 1, got 0"):
        TopKAccuracy(3, 0)
    with pytest.raises(ValueError, match="Expect num_bins to be an int >= 1, got 0"):
        CalibrationError(3, 0)
    with pytest.raises(ValueError, match="Expect num_classes to be an int >= 2, got 1"):
        LogLoss(1)


@pytest.mark.parametrize("name", METRICS)
@given(data=predictions())
def test_merge_in_any_split_equals_all_at_once(name, data):
    make, metric = METRICS[name]
    c, y, p, w, cuts = data
    whole = make(c).eval(y, p, w)
    merged = evaluated_in_parts(lambda: make(c), y, p, w, cuts, order=list(range(len(cuts), -1, -1)))
    assert merged.count == whole.count
    assert math.isclose(merged.total_weight, whole.total_weight, rel_tol=1e-12, abs_tol=1e-12)
    if whole.total_weight > 0:
        assert math.isclose(getattr(merged, metric)(), getattr(whole, metric)(), rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize("name", METRICS)
def test_merge_checks(name):
    make, _ = METRICS[name]
    cls = type(make(3)).__name__
    with pytest.raises(ValueError, match=f"Expect a {cls} with num_classes=3 to merge, got 4"):
        make(3).merge(make(4))
    with pytest.raises(TypeError, match=f"Expect a {cls} to merge, got ROC"):
        from sparkavg.evaluation import ROC
        make(3).merge(ROC(3))
    with pytest.raises(ValueError, match="Expect a TopKAccuracy with k=1 to merge, got 2"):
        TopKAccuracy(3, 1).merge(TopKAccuracy(3, 2))


@pytest.mark.parametrize("name", METRICS)
def test_json_pickle_and_task_result_round_trips(name):
    make, metric = METRICS[name]
    y, p, w = _case(5, 4)
    ev = make(4).eval(y, p.astype(np.float32), w)
    d = ev.to_dict()
    assert json.loads(json.dumps(d)) == d
    for back in (type(ev).from_json(ev.to_json()), pickle.loads(pickle.dumps(ev)), decode_value(*encode_value(ev))):
        assert type(back) is type(ev) and back == ev
        assert getattr(back, metric)() == getattr(ev, metric)()
    assert registered("evaluation")[type(ev).__name__] is type(ev)
    bad = [
        ({**d, "count": 1.5}, r"field 'count' to be an int >= 0, got 1.5"),
        ({**d, "weight": "x"}, r"field 'weight' to be numbers of shape \(\)"),
        ({**d, "weight": -1.0}, r"Expect non-negative .* field 'weight', got -1.0"),
        ({**d, "surprise": 1}, r"got unknown \['surprise'\]"),
        ({k: v for k, v in d.items() if k != "count"}, r"got missing \['count'\]"),
    ]
    if name == "ece":
        bad.append(({**d, "bin_correct": [0.0] * 3}, r"Expect CalibrationError field 'bin_correct' of shape \(7,\), "
                                                     r"got shape \(3,\)"))
    for broken, message in bad:
        with pytest.raises(ValueError, match=message):
            type(ev).from_dict(broken)
