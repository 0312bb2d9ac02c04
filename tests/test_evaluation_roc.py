"""ROC AUC and PR AUC: the exact mode against scikit-learn, the bounded
mode's error bound, merging in any split, and the JSON form."""
import json
import math
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sklearn.metrics import average_precision_score, roc_auc_score

from sparkavg.configurable import registered
from sparkavg.evaluation import ROC
from sparkavg.spark.executor.codec import decode_value, encode_value

from .strategies import evaluated_in_parts, predictions

#: scikit-learn agreement the exact mode promises.
TOLERANCE = 1e-9


def _binary_case(seed: int):
    """Labels, scores and weights of one binary case: every third with
    heavy ties (scores rounded to one decimal), every other one weighted
    (some weights zero)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    y = rng.integers(0, 2, n)
    y[:2] = [0, 1]
    s = np.clip(rng.normal(0.4 + 0.25 * y, 0.25), 0, 1)
    if seed % 3 == 0:
        s = np.round(s, 1)
    w = None
    if seed % 2:
        w = rng.random(n) * 3
        w[rng.random(n) < 0.1] = 0.0
        w[:2] = 1.0
    return y, s, w


def _multiclass_case(seed: int):
    """Labels (every class present), normalised probability rows drawn from a
    few prototypes (so every column has exact ties) and weights."""
    rng = np.random.default_rng(seed)
    c = int(rng.integers(3, 8))
    n = int(rng.integers(c, 400))
    y = rng.integers(0, c, n)
    y[:c] = np.arange(c)
    prototypes = rng.dirichlet(np.ones(c), int(rng.integers(2, 12)))
    p = prototypes[rng.integers(0, len(prototypes), n)]
    p = np.where(rng.random((n, 1)) < 0.5, p, rng.dirichlet(np.ones(c), n))
    w = rng.random(n) * 2 if seed % 2 else None
    return c, y, p, w


# ------------------------------------------------------------ exact mode
def test_hand_computed_binary_values():
    # scores 0.9 (+), 0.6 (+ and -, tied), 0.2 (-): pairs (+0.9,-0.6) 1, (+0.9,-0.2) 1, (+0.6,-0.6) 1/2,
    # (+0.6,-0.2) 1 -> AUC 3.5 / 4; precision at 0.9 is 1, at 0.6 is 2/3 -> AP 1/2 + 1/2 * 2/3
    roc = ROC().eval([0, 1, 1, 0], [0.2, 0.9, 0.6, 0.6])
    assert roc.auc() == 0.875
    assert roc.pr_auc() == pytest.approx(0.5 + 1 / 3, abs=1e-15)
    assert roc.auc_error_bound() == 0.0 and roc.pr_auc_error_bound() == 0.0
    assert roc.count == 4 and roc.exact
    assert repr(roc) == "ROC(num_classes=2, exact, count=4, auc=0.8750)"


@pytest.mark.parametrize("seed", range(60))
def test_exact_binary_equals_scikit_learn(seed):
    y, s, w = _binary_case(seed)
    roc = ROC().eval(y, s, w)
    assert abs(roc.auc() - roc_auc_score(y, s, sample_weight=w)) <= TOLERANCE
    assert abs(roc.pr_auc() - average_precision_score(y, s, sample_weight=w)) <= TOLERANCE
    # the same predictions as float32 (N, 2) probabilities and one-hot labels, in two batches
    p2 = np.stack([1 - s, s], axis=1).astype(np.float32)
    k = len(y) // 2
    roc32 = ROC().eval(np.eye(2)[y[:k]], p2[:k], None if w is None else w[:k])
    roc32.eval(np.eye(2)[y[k:]], p2[k:], None if w is None else w[k:])
    s32 = p2[:, 1].astype(np.float64)
    assert abs(roc32.auc() - roc_auc_score(y, s32, sample_weight=w)) <= TOLERANCE
    assert abs(roc32.pr_auc() - average_precision_score(y, s32, sample_weight=w)) <= TOLERANCE


@pytest.mark.parametrize("seed", range(40))
def test_exact_one_vs_rest_equals_scikit_learn(seed):
    c, y, p, w = _multiclass_case(seed)
    roc = ROC(c).eval(y, p, w)
    for average in ("macro", "weighted"):
        expected = roc_auc_score(y, p, multi_class="ovr", average=average, labels=range(c), sample_weight=w)
        assert abs(roc.auc(average=average) - expected) <= TOLERANCE
        expected = average_precision_score(y, p, average=average, sample_weight=w)
        assert abs(roc.pr_auc(average=average) - expected) <= TOLERANCE
    for cls in range(c):
        assert abs(roc.auc(cls) - roc_auc_score(y == cls, p[:, cls], sample_weight=w)) <= TOLERANCE
        assert abs(roc.pr_auc(cls) - average_precision_score(y == cls, p[:, cls], sample_weight=w)) <= TOLERANCE


def test_exact_mode_keeps_copies_of_what_it_was_given():
    y, s, w = np.array([0, 1, 1, 0]), np.array([0.2, 0.9, 0.6, 0.6]), np.ones(4)
    p = np.stack([1 - s, s, np.zeros(4)], axis=1)
    binary, multi = ROC().eval(y, s, w), ROC(3).eval(y, p, w)
    before = binary.to_dict(), multi.to_dict()
    y[:], s[:], w[:], p[:] = 1, 0.0, 5.0, 0.0  # the caller reuses its buffers
    assert (binary.to_dict(), multi.to_dict()) == before and binary.auc() == 0.875


def test_exact_mode_takes_any_finite_scores():
    rng = np.random.default_rng(3)
    y, logits = rng.integers(0, 2, 200), rng.normal(size=200) * 10
    roc = ROC().eval(y, logits)
    assert abs(roc.auc() - roc_auc_score(y, logits)) <= TOLERANCE


def test_undefined_values_raise_or_are_left_out_of_averages():
    with pytest.raises(ValueError, match=r"Expect positive and negative examples \(of non-zero weight\) of class 1 "
                                         r"for its ROC AUC, got positive weight 0 and negative weight 3 in 3 "
                                         r"examples: the ROC AUC is undefined"):
        ROC().eval([0, 0, 0], [0.1, 0.5, 0.7]).auc()
    with pytest.raises(ValueError, match="positive weight 0 and negative weight 0 in 2 examples"):
        ROC().eval([0, 1], [0.1, 0.5], weights=[0.0, 0.0]).auc()
    only_positive = ROC().eval([1, 1], [0.2, 0.3])
    assert only_positive.pr_auc() == 1.0  # defined without negatives
    assert only_positive.excluded_classes("auc") == [1] and only_positive.excluded_classes("pr_auc") == []
    # class 2 never occurs: no one-vs-rest AUC or AP of its own, left out of the averages
    y = np.array([0, 1, 0, 1, 3, 3, 0])
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(4), len(y))
    roc = ROC(4).eval(y, p)
    assert roc.excluded_classes("auc") == [2] == roc.excluded_classes("pr_auc")
    per_class = [roc_auc_score(y == c, p[:, c]) for c in (0, 1, 3)]
    assert abs(roc.auc() - np.mean(per_class)) <= TOLERANCE
    counts = [3, 2, 2]
    assert abs(roc.auc(average="weighted") - np.average(per_class, weights=counts)) <= TOLERANCE
    with pytest.raises(ValueError, match="of class 2 for its PR AUC, got positive weight 0"):
        roc.pr_auc(2)
    with pytest.raises(ValueError, match="Expect at least one class with positive and negative examples for the "
                                         "macro ROC AUC, got none in 2 examples"):
        ROC(3).eval([1, 1], np.full((2, 3), 1 / 3)).auc()


def test_empty_and_argument_errors():
    roc = ROC(3)
    for metric in (roc.auc, roc.pr_auc, roc.auc_error_bound, roc.pr_auc_error_bound):
        with pytest.raises(ValueError, match="Expect at least one evaluated example for .*, got 0: the ROC has seen"):
            metric()
    assert repr(roc) == "ROC(num_classes=3, exact, count=0, auc=n/a)"
    assert roc.excluded_classes() == [0, 1, 2]
    with pytest.raises(ValueError, match=r"Expect cls in 0..2, or None for an average, got 3"):
        roc.auc(3)
    with pytest.raises(ValueError, match=r"Expect cls None or 1 \(the positive class of a two-class ROC\), got 0"):
        ROC().auc(0)
    with pytest.raises(ValueError, match=r"Expect average in \('macro', 'weighted'\), got 'micro'"):
        roc.auc(average="micro")
    with pytest.raises(ValueError, match="Expect metric 'auc' or 'pr_auc', got 'f1'"):
        roc.excluded_classes("f1")
    with pytest.raises(ValueError, match=r"Expect threshold_steps None \(the exact mode\) or an int >= 1 "
                                         r"\(the number of score bins\), got 0"):
        ROC(threshold_steps=0)
    with pytest.raises(ValueError, match="num_classes to be an int >= 2, got 1"):
        ROC(1)


def test_bad_input_names_what_was_wrong():
    roc = ROC(3)
    cases = [
        (([0, 3], np.full((2, 3), 0.3)), r"Expect labels in 0..2, got 3 at index 1"),
        (([0, 1], np.full((2, 4), 0.3)), r"Expect probabilities of shape \(N, 3\), got shape \(2, 4\)"),
        (([0, 1], np.full(2, 0.3)), r"Expect probabilities of shape \(N, 3\), got shape \(2,\)"),
        (([0, 1], np.array([[0.1, np.inf, 0.2], [0.1, 0.2, 0.3]])),
         r"Expect finite probabilities, got inf at index \(0, 1\)"),
        (([0, 1, 2], np.full((2, 3), 0.3)), "same number of examples, got 3 and 2"),
        (([0, 1], np.full((2, 3), 0.3), [1.0, -2.0]), r"Expect non-negative weights, got -2.0 at index 1"),
        (([0, 1], np.full((2, 3), 0.3), [1.0]), r"Expect weights of shape \(2,\), one per example, got shape \(1,\)"),
        (([0, 1], np.full((2, 3), 0.3), [1.0, np.nan]), r"Expect finite weights, got nan at index \(1,\)"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            roc.eval(*args)
    with pytest.raises(ValueError, match=r"Expect probabilities in \[0, 1\], got 1.5 at index \(1,\)"):
        ROC(threshold_steps=10).eval([0, 1], [0.5, 1.5])
    assert roc.count == 0  # failed calls added nothing


def test_exact_mode_is_bounded_by_max_count():
    roc = ROC(3, max_count=30).eval(np.zeros(8, int), np.full((8, 3), 0.2))
    message = (r"Expect at most max_count=30 scores in an exact ROC, got 33 \(11 examples x 3 scores\): the exact "
               r"mode keeps every score; use ROC\(threshold_steps=N\) for bounded memory \(its error is "
               r"auc_error_bound\(\)\), or a larger max_count")
    with pytest.raises(ValueError, match=message):
        roc.eval(np.zeros(3, int), np.full((3, 3), 0.2))
    assert roc.count == 8
    other = ROC(3).eval(np.zeros(3, int), np.full((3, 3), 0.2))
    with pytest.raises(ValueError, match=message):
        roc.merge(other)
    assert roc.count == 8
    with pytest.raises(ValueError, match=r"max_count=5 scores in an exact ROC, got 8 \(8 examples x 1 score\)"):
        ROC.from_dict({**ROC().eval(np.zeros(8, int), np.full(8, 0.5)).to_dict(), "max_count": 5})
    ROC(threshold_steps=4, max_count=1).eval(np.zeros(8, int), np.full(8, 0.5))  # the bounded mode ignores it


# ---------------------------------------------------------- bounded mode
def _bin_indices(s: np.ndarray, steps: int) -> np.ndarray:
    """The documented binning: floor(s * N) capped at N - 1, and 1.0 alone in bin N."""
    return np.where(s == 1.0, steps, np.minimum(np.floor(s * steps), steps - 1))


@pytest.mark.parametrize("seed", range(30))
def test_bounded_values_equal_scikit_learn_on_the_bins(seed):
    steps = [1, 2, 7, 10, 100, 1000][seed % 6]
    y, s, w = _binary_case(seed)
    roc = ROC(threshold_steps=steps).eval(y, s, w)
    bins = _bin_indices(s, steps)
    assert abs(roc.auc() - roc_auc_score(y, bins, sample_weight=w)) <= TOLERANCE
    assert abs(roc.pr_auc() - average_precision_score(y, bins, sample_weight=w)) <= TOLERANCE
    c, y, p, w = _multiclass_case(seed)
    roc = ROC(c, threshold_steps=steps).eval(y, p, w)
    for cls in range(c):
        bins = _bin_indices(p[:, cls], steps)
        assert abs(roc.auc(cls) - roc_auc_score(y == cls, bins, sample_weight=w)) <= TOLERANCE
        assert abs(roc.pr_auc(cls) - average_precision_score(y == cls, bins, sample_weight=w)) <= TOLERANCE


def _within_bounds(y, s, w, steps):
    """The bounded ROC of (y, s, w) and its observed errors against the exact
    values, each checked within its stated bound."""
    roc = ROC(threshold_steps=steps).eval(y, s, w)
    auc_error = roc_auc_score(y, s, sample_weight=w) - roc.auc()
    ap_error = average_precision_score(y, s, sample_weight=w) - roc.pr_auc()
    assert abs(auc_error) <= roc.auc_error_bound() + 1e-12, (auc_error, roc.auc_error_bound())
    assert abs(ap_error) <= roc.pr_auc_error_bound() + 1e-12, (ap_error, roc.pr_auc_error_bound())
    return roc, auc_error, ap_error


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("steps", [1, 3, 10, 64, 1000])
def test_exact_values_lie_within_the_bound_on_random_data(seed, steps):
    _within_bounds(*_binary_case(seed), steps)
    c, y, p, w = _multiclass_case(seed)
    roc = ROC(c, threshold_steps=steps).eval(y, p, w)
    exact = ROC(c).eval(y, p, w)
    for average in ("macro", "weighted"):
        for metric in ("auc", "pr_auc"):
            error = getattr(exact, metric)(average=average) - getattr(roc, metric)(average=average)
            assert abs(error) <= getattr(roc, f"{metric}_error_bound")(average=average) + 1e-12


@pytest.mark.parametrize("steps", [1, 3, 10, 100])
@pytest.mark.parametrize("positives_above", [True, False])
def test_adversarial_data_reaches_the_auc_bound(steps, positives_above):
    # in every bin, all positives score above all negatives (or all below): each within-bin pair is fully
    # ordered, where the bins count it 1/2, so the AUC error is exactly the bound
    rng = np.random.default_rng(steps)
    y = rng.integers(0, 2, 2000)
    j = rng.integers(0, steps, y.size)
    high, low = (0.9, 0.1) if positives_above else (0.1, 0.9)
    s = (j + np.where(y == 1, high, low)) / steps
    roc, auc_error, ap_error = _within_bounds(y, s, None, steps)
    assert abs(abs(auc_error) - roc.auc_error_bound()) <= 1e-12
    assert (auc_error > 0) == positives_above
    if steps == 1 and positives_above:  # one bin, positives first: the precision bound is reached too
        assert abs(abs(ap_error) - roc.pr_auc_error_bound()) <= 1e-12


def test_adversarial_extremes():
    # everything in one bin, perfectly separated: the binned AUC says 1/2, the truth 1, the bound 1/2
    y = np.array([0] * 50 + [1] * 50)
    s = np.r_[np.full(50, 0.501), np.full(50, 0.502)]
    roc, auc_error, _ = _within_bounds(y, s, None, 1)
    assert roc.auc() == 0.5 and auc_error == 0.5 == roc.auc_error_bound()
    # scores of exactly 1.0 are their own bin (DL4J's threshold 1.0): a true tie, no error
    roc, auc_error, ap_error = _within_bounds(y, np.ones(100), None, 5)
    assert roc.auc() == 0.5 and roc.auc_error_bound() == 0.0 and roc.pr_auc_error_bound() == 0.0
    # a few heavy weights on misordered pairs
    w = np.r_[np.full(50, 1e-3), np.full(50, 1e-3)]
    w[0], w[-1] = 1e3, 1e3
    s = np.r_[np.full(50, 0.12), np.full(50, 0.11)]
    _within_bounds(y, s, w, 10)


def test_the_bound_shrinks_with_the_number_of_bins():
    rng = np.random.default_rng(7)
    y = rng.integers(0, 2, 20000)
    s = np.clip(rng.normal(0.4 + 0.2 * y, 0.2), 0, 1)
    bounds = [_within_bounds(y, s, None, steps)[0] for steps in (4, 16, 64, 256, 1024, 4096)]
    auc_bounds = [r.auc_error_bound() for r in bounds]
    ap_bounds = [r.pr_auc_error_bound() for r in bounds]
    assert all(a > b for a, b in zip(auc_bounds, auc_bounds[1:])), auc_bounds
    assert all(a > b for a, b in zip(ap_bounds, ap_bounds[1:])), ap_bounds
    # about 1 / N for a smooth score density: four times the bins, about a quarter of the AUC bound
    assert auc_bounds[-1] < 1e-3 and 3 < auc_bounds[0] / auc_bounds[1] < 5


# ----------------------------------------------------------------- merge
def _outcome(fn):
    """``fn()``, or the error it raised (undefined metrics raise on both sides alike)."""
    try:
        return fn()
    except ValueError as e:
        return f"ValueError: {str(e).split(':')[0]}"


def _values(roc):
    c = None if roc.num_classes == 2 else 0
    return [_outcome(lambda m=m, a=a: m(average=a)) for m in (roc.auc, roc.pr_auc, roc.auc_error_bound,
                                                              roc.pr_auc_error_bound)
            for a in ("macro", "weighted")] + [_outcome(lambda: roc.auc(c))]


def _close(a, b, tol=1e-12):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert (x == y) if isinstance(x, str) or isinstance(y, str) else math.isclose(x, y, rel_tol=tol, abs_tol=tol)


@given(predictions(), st.randoms(use_true_random=False))
def test_exact_merge_in_any_split_and_order_equals_all_at_once(data, random):
    c, y, p, w, cuts = data
    order = list(range(len(cuts) + 1))
    random.shuffle(order)
    whole = ROC(c).eval(y, p, w)
    merged = evaluated_in_parts(lambda: ROC(c), y, p, w, cuts, order)
    assert merged.count == whole.count
    _close(_values(merged), _values(whole))
    if order == sorted(order):  # partitions in turn: the very same examples in the same order
        assert evaluated_in_parts(lambda: ROC(c), y, p, w, cuts) == whole


@given(predictions(integer_weights=True), st.sampled_from([1, 3, 10, 100]))
def test_bounded_merge_in_any_split_equals_all_at_once_exactly(data, steps):
    c, y, p, w, cuts = data
    whole = ROC(c, threshold_steps=steps).eval(y, p, w)
    merged = evaluated_in_parts(lambda: ROC(c, threshold_steps=steps), y, p, w, cuts)
    assert merged == whole  # the same counts, bit for bit
    assert _values(merged) == _values(whole)


@given(predictions(), st.sampled_from([1, 3, 10, 100]))
def test_bounded_merge_with_fractional_weights_equals_all_at_once_to_rounding(data, steps):
    c, y, p, w, cuts = data
    whole = ROC(c, threshold_steps=steps).eval(y, p, w)
    merged = evaluated_in_parts(lambda: ROC(c, threshold_steps=steps), y, p, w, cuts)
    np.testing.assert_allclose(merged._bins, whole._bins, rtol=1e-12, atol=1e-12)
    _close(_values(merged), _values(whole))


def test_merge_checks():
    with pytest.raises(ValueError, match="Expect a ROC with num_classes=2 to merge, got 3"):
        ROC().merge(ROC(3))
    with pytest.raises(ValueError, match="Expect a ROC with threshold_steps=None to merge, got 10"):
        ROC().merge(ROC(threshold_steps=10))
    with pytest.raises(TypeError, match="Expect a ROC to merge, got Evaluation"):
        from sparkavg.evaluation import Evaluation
        ROC().merge(Evaluation(2))


# ------------------------------------------------------------ JSON form
@pytest.mark.parametrize("steps", [None, 8])
@pytest.mark.parametrize("num_classes", [2, 4])
def test_json_pickle_and_task_result_round_trips(steps, num_classes):
    rng = np.random.default_rng(num_classes)
    y = rng.integers(0, num_classes, 50)
    p = rng.dirichlet(np.ones(num_classes), 50).astype(np.float32)
    roc = ROC(num_classes, threshold_steps=steps).eval(y, p, rng.random(50))
    d = roc.to_dict()
    assert json.loads(json.dumps(d)) == d  # plain JSON
    for back in (ROC.from_json(roc.to_json()), pickle.loads(pickle.dumps(roc)), decode_value(*encode_value(roc))):
        assert type(back) is ROC and back == roc
        assert back.auc() == roc.auc() and back.pr_auc() == roc.pr_auc()
        assert back.auc_error_bound() == roc.auc_error_bound()
    assert registered("evaluation")["ROC"] is ROC


def test_from_dict_names_the_bad_field():
    exact = ROC(3).eval([0, 1, 2], np.full((3, 3), 0.2), [1.0, 2.0, 3.0]).to_dict()
    bounded = ROC(threshold_steps=4).eval([0, 1], [0.2, 0.9]).to_dict()
    cases = [
        ({**exact, "scores": [[0.1, 0.2]] * 3}, r"Expect ROC field 'scores' of shape \(3, 3\), got shape \(3, 2\)"),
        ({**exact, "scores": [[0.1, None, 0.2]] * 3}, r"Expect finite ROC field 'scores', got nan"),
        ({**exact, "targets": [0, 1, 3]}, r"Expect ROC field 'targets' in 0..2, got 3"),
        ({**exact, "targets": [0, 1.5, 2]}, r"Expect whole numbers in ROC field 'targets', got 1.5"),
        ({**exact, "weights": [1.0, -1.0, 1.0]}, r"Expect non-negative ROC field 'weights', got -1.0"),
        ({**exact, "count": 4}, r"Expect ROC field 'targets' of shape \(4,\), got shape \(3,\)"),
        ({**exact, "count": -1}, r"Expect ROC field 'count' to be an int >= 0, got -1"),
        ({**exact, "extra": 1}, r"Expect the fields .* in a ROC dict, got unknown \['extra'\]"),
        ({k: v for k, v in exact.items() if k != "weights"}, r"got missing \['weights'\]"),
        ({**bounded, "bins": [[[1, 2]] * 4]}, r"Expect ROC field 'bins' of shape \(1, 5, 2\), got shape \(1, 4, 2\)"),
        ({**bounded, "bins": [[[1, -2]] * 5]}, r"Expect non-negative ROC field 'bins', got -2.0"),
        ({**bounded, "bins": "many"}, r"Expect ROC field 'bins' to be numbers of shape"),
        ({**bounded, "threshold_steps": None},
         r"got missing \['targets', 'scores', 'weights'\] and unknown \['bins'\]"),
        ({**bounded, "type": "Evaluation"}, r"Expect a dict with type 'ROC', got 'Evaluation'"),
        ({**bounded, "num_classes": 1}, r"num_classes to be an int >= 2, got 1"),
    ]
    for d, message in cases:
        with pytest.raises(ValueError, match=message):
            ROC.from_dict(d)


# ------------------------------------------------------------ on Spark
@pytest.mark.spark
def test_a_distributed_evaluate_carries_and_merges_them(sc):
    from sparkavg.evaluation import CalibrationError, LogLoss, TopKAccuracy
    from sparkavg.spark import ParameterAveraging, SparkTrainer

    from .nets import blobs, small_net

    x, y = blobs(120, seed=21)
    net = small_net(seed=22)
    net.fit_batch(x, y)
    metrics = [ROC(), ROC(threshold_steps=50), TopKAccuracy(2, 1), LogLoss(2), CalibrationError(2, 10)]
    rdd = sc.parallelize(list(zip(x, y.tolist())), 4)
    distributed = SparkTrainer(sc, net, ParameterAveraging(workers=2)).evaluate(rdd, evaluations=metrics)
    out = net.output(x)
    local = [type(m).from_dict(m.to_dict()).eval(y, out) for m in metrics]
    for d, m in zip(distributed, local):
        assert type(d) is type(m) and d.count == m.count == 120
    exact, bounded, top1, loss, ece = distributed
    assert abs(exact.auc() - roc_auc_score(y, out[:, 1].astype(np.float64))) <= 1e-6  # executors' own float32 outputs
    assert abs(bounded.auc() - local[1].auc()) <= 1e-6 and bounded.auc_error_bound() > 0
    assert math.isclose(top1.accuracy(), local[2].accuracy(), abs_tol=1e-12)
    assert math.isclose(loss.log_loss(), local[3].log_loss(), rel_tol=1e-5)
    assert math.isclose(ece.expected_calibration_error(), local[4].expected_calibration_error(), abs_tol=1e-5)
