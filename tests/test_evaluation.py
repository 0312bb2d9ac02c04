"""Mergeable classification and regression metrics."""
import json
import math
import pickle

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from sparkavg.evaluation import Evaluation, RegressionEvaluation

# actual \ predicted   0  1  2
CONFUSION = np.array([[3, 1, 0],
                      [0, 2, 0],
                      [2, 0, 3]])


def _pairs_from_confusion(m):
    actual, predicted = [], []
    for i in range(m.shape[0]):
        for j in range(m.shape[1]):
            actual += [i] * int(m[i, j])
            predicted += [j] * int(m[i, j])
    return np.array(actual), np.array(predicted)


def _hand_eval():
    y, p = _pairs_from_confusion(CONFUSION)
    return Evaluation(3, labels=["cat", "dog", "emu"]).eval(y, p)


def test_hand_computed_metrics():
    ev = _hand_eval()
    np.testing.assert_array_equal(ev.confusion_matrix, CONFUSION)
    assert ev.confusion_matrix.dtype == np.int64
    assert ev.count == 11
    assert ev.accuracy() == pytest.approx(8 / 11)
    # TP = [3, 2, 3], FP = [2, 1, 0], FN = [1, 0, 2]
    np.testing.assert_array_equal(ev.true_positives(), [3, 2, 3])
    np.testing.assert_array_equal(ev.false_positives(), [2, 1, 0])
    np.testing.assert_array_equal(ev.false_negatives(), [1, 0, 2])
    precision, recall, f1 = [3 / 5, 2 / 3, 1.0], [3 / 4, 1.0, 3 / 5], [2 / 3, 0.8, 0.75]
    for c in range(3):
        assert ev.precision(c) == pytest.approx(precision[c])
        assert ev.recall(c) == pytest.approx(recall[c])
        assert ev.f1(c) == pytest.approx(f1[c])
    assert ev.precision() == pytest.approx(np.mean(precision))
    assert ev.recall() == pytest.approx(np.mean(recall))
    assert ev.f1() == pytest.approx(np.mean(f1))
    for metric in (ev.precision, ev.recall, ev.f1):
        assert metric(average="micro") == pytest.approx(8 / 11)


def test_one_hot_truth_and_probability_predictions_match_indices():
    y, p = _pairs_from_confusion(CONFUSION)
    rng = np.random.default_rng(0)
    scores = rng.random((len(p), 3)).astype(np.float32) * 0.5
    scores[np.arange(len(p)), p] = 0.9  # argmax is p
    ev = Evaluation(3).eval(np.eye(3, dtype=np.float32)[y], scores)
    np.testing.assert_array_equal(ev.confusion_matrix, CONFUSION)
    # float labels holding integers (e.g. a Spark DataFrame double column) are accepted
    ev2 = Evaluation(3).eval(y.astype(np.float64), p)
    assert ev2 == ev


def test_classes_never_predicted_or_absent():
    # class 1: has an example, never predicted; class 2: neither
    ev = Evaluation(3).eval([0, 0, 1], [0, 0, 0])
    assert ev.precision(1) == 0.0 and ev.precision(2) == 0.0
    assert ev.recall(2) == 0.0 and ev.f1(1) == 0.0
    assert ev.excluded_classes("precision") == [1, 2]
    assert ev.excluded_classes("recall") == [2]
    assert ev.excluded_classes("f1") == [1, 2]
    assert ev.precision() == pytest.approx(2 / 3)  # only class 0 counts
    assert ev.recall() == pytest.approx(0.5)  # classes 0 (1.0) and 1 (0.0)
    assert ev.f1() == pytest.approx(0.8)  # class 0 only
    text = ev.stats()
    assert "2 classes were never predicted by the model and excluded from average precision: [1, 2]" in text
    assert "1 class was never present in the data and excluded from average recall: [2]" in text


def test_macro_f1_zero_when_no_class_qualifies():
    ev = Evaluation(2).eval([0, 0], [1, 1])
    assert ev.accuracy() == 0.0 and ev.f1() == 0.0


@pytest.mark.parametrize("metric", [lambda ev: ev.accuracy(), lambda ev: ev.precision(),
                                    lambda ev: ev.recall(average="micro"), lambda ev: ev.f1(),
                                    lambda ev: ev.precision(2), lambda ev: ev.recall(0)])
def test_empty_evaluation_metrics_raise(metric):
    ev = Evaluation(4).eval(np.zeros(0, np.int64), np.zeros((0, 4)))  # empty batches add nothing
    assert ev.count == 0
    with pytest.raises(ValueError, match=r"Expect at least one evaluated example for \w+, got 0: "
                                         r"the Evaluation has seen no examples"):
        metric(ev)


def test_empty_evaluation_still_prints():
    ev = Evaluation(4)
    assert "Accuracy:        n/a" in ev.stats() and "F1 Score:        n/a" in ev.stats()
    assert repr(ev) == "Evaluation(num_classes=4, count=0, accuracy=n/a)"
    with pytest.raises(ValueError, match="class index in 0..3, got 7"):  # argument errors come first
        ev.precision(7)


def test_stats_text():
    text = _hand_eval().stats()
    for fragment in (" Accuracy:        0.7273", " Precision:       0.7556", " Recall:          0.7833",
                     " F1 Score:        0.7389", " 3 1 0 | 0 = cat", " 2 0 3 | 2 = emu",
                     "Actual (rowClass) predicted as (columnClass)"):
        assert fragment in text, text
    assert "Confusion Matrix" not in _hand_eval().stats(confusion=False)


def test_validation_errors():
    ev = Evaluation(3)
    with pytest.raises(ValueError, match=r"Expect finite y_pred, got nan at index \(1, 2\)"):
        ev.eval([0, 1], np.array([[0.1, 0.2, 0.7], [0.1, 0.2, np.nan]]))
    with pytest.raises(ValueError, match="same number of examples, got 2 and 3"):
        ev.eval([0, 1], [0, 1, 2])
    with pytest.raises(ValueError, match=r"y_true in 0..2, got 3 at index 1"):
        ev.eval([0, 3], [0, 1])
    with pytest.raises(ValueError, match=r"y_pred of shape \(N,\) class indices or \(N, 3\)"):
        ev.eval([0, 1], np.zeros((2, 4)))
    with pytest.raises(ValueError, match="integer class indices in y_true, got 0.5"):
        ev.eval([0.5, 1.0], [0, 1])
    with pytest.raises(ValueError, match="class index in 0..2, got 5"):
        ev.precision(5)
    with pytest.raises(ValueError, match="average"):
        ev.f1(average="weighted")
    assert ev.count == 0  # failed calls changed nothing
    with pytest.raises(ValueError, match="num_classes to be an int >= 2, got 1"):
        Evaluation(1)
    with pytest.raises(ValueError, match="Expect 3 labels, got 2"):
        Evaluation(3, labels=["a", "b"])


def test_merge_checks():
    with pytest.raises(ValueError, match="num_classes=3 to merge, got 4"):
        Evaluation(3).merge(Evaluation(4))
    with pytest.raises(TypeError, match="got RegressionEvaluation"):
        Evaluation(3).merge(RegressionEvaluation(3))
    with pytest.raises(ValueError, match="matching labels"):
        Evaluation(2, ["a", "b"]).merge(Evaluation(2, ["a", "c"]))
    merged = Evaluation(2).merge(Evaluation(2, ["a", "b"]))
    assert merged.labels == ["a", "b"]


@st.composite
def _classification_data(draw):
    c = draw(st.integers(2, 6))
    n = draw(st.integers(0, 60))
    y = draw(hnp.arrays(np.int64, n, elements=st.integers(0, c - 1)))
    scores = draw(hnp.arrays(np.float32, (n, c), elements=st.floats(0, 1, width=32)))
    split = draw(st.integers(0, n))
    return c, y, scores, split


@given(_classification_data())
def test_merge_equals_eval_on_concatenated_data(data):
    c, y, scores, k = data
    whole = Evaluation(c).eval(y, scores)
    a = Evaluation(c).eval(y[:k], scores[:k])
    b = Evaluation(c).eval(y[k:], scores[k:])
    merged = a.merge(b)
    assert merged == whole
    assert merged.count == len(y)
    if len(y):
        for name in ("accuracy", "precision", "recall", "f1"):
            assert getattr(merged, name)() == getattr(whole, name)()


def test_json_round_trip():
    ev = _hand_eval()
    text = ev.to_json()
    assert json.loads(text)["confusion_matrix"] == CONFUSION.tolist()
    back = Evaluation.from_json(text)
    assert back == ev and back.labels == ["cat", "dog", "emu"]
    assert back.f1() == ev.f1()
    with pytest.raises(ValueError, match="3x3 non-negative integers"):
        Evaluation.from_dict({**ev.to_dict(), "confusion_matrix": [[1, 2], [3, 4]]})
    with pytest.raises(ValueError, match="type 'Evaluation'"):
        Evaluation.from_dict({"type": "RegressionEvaluation"})


def test_pickle_round_trip():
    ev = _hand_eval()
    back = pickle.loads(pickle.dumps(ev))
    assert back == ev and back is not ev
    assert type(back._confusion) is np.ndarray


def test_against_scikit_learn_if_installed():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(1)
    y, p = rng.integers(0, 5, 300), rng.integers(0, 5, 300)
    ev = Evaluation(5).eval(y, p)
    np.testing.assert_array_equal(ev.confusion_matrix, metrics.confusion_matrix(y, p, labels=range(5)))
    assert ev.precision() == pytest.approx(metrics.precision_score(y, p, average="macro"))
    assert ev.recall() == pytest.approx(metrics.recall_score(y, p, average="macro"))
    assert ev.f1() == pytest.approx(metrics.f1_score(y, p, average="macro"))


# ------------------------------------------------------------------ regression
def _hand_regression():
    y_true = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0], [4.0, 4.0]])
    y_pred = np.array([[1.0, 1.0], [3.0, 2.0], [2.0, 3.0], [6.0, 4.0]])
    return RegressionEvaluation(2, ["noisy", "exact"]).eval(y_true, y_pred)


def test_regression_hand_computed():
    ev = _hand_regression()
    # column 0: errors 0, 1, -1, 2 -> SSE 6; labels mean 2.5, SST 5
    assert ev.mse(0) == pytest.approx(1.5)
    assert ev.mae(0) == pytest.approx(1.0)
    assert ev.rmse(0) == pytest.approx(math.sqrt(1.5))
    assert ev.r2(0) == pytest.approx(1 - 6 / 5)
    assert ev.mse(1) == 0.0 and ev.r2(1) == 1.0
    assert ev.mse() == pytest.approx(0.75)
    assert ev.r2() == pytest.approx((-0.2 + 1.0) / 2)
    m = ev.metrics()
    np.testing.assert_allclose(m["rmse"], [math.sqrt(1.5), 0.0])
    text = ev.stats()
    assert "noisy" in text and "1.50000e+00" in text and "(4 examples)" in text


def test_regression_constant_labels_and_empty():
    ev = RegressionEvaluation(1).eval(np.full(4, 5.0), np.array([5.0, 5.0, 5.0, 6.0]))
    assert ev.r2() == 0.0 and ev.mse() == pytest.approx(0.25)
    assert RegressionEvaluation(1).eval([5.0, 5.0], [5.0, 5.0]).r2() == 1.0
    empty = RegressionEvaluation(3).eval(np.zeros((0, 3)), np.zeros((0, 3)))
    for metric in (empty.mse, empty.mae, empty.rmse, lambda: empty.r2(2), empty.metrics):
        with pytest.raises(ValueError, match="Expect at least one evaluated example for .*, got 0: "
                                             "the RegressionEvaluation has seen no examples"):
            metric()
    assert "n/a" in empty.stats() and "(0 examples)" in empty.stats()
    assert repr(empty) == "RegressionEvaluation(num_columns=3, count=0, mse=n/a)"


def test_regression_validation():
    ev = RegressionEvaluation(2)
    with pytest.raises(ValueError, match=r"Expect finite y_pred, got nan at index \(0, 1\)"):
        ev.eval(np.zeros((2, 2)), np.array([[0.0, np.nan], [0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"y_true of shape \(N, 2\), got shape \(3,\)"):
        ev.eval(np.zeros(3), np.zeros(3))
    with pytest.raises(ValueError, match="same number of examples, got 2 and 3"):
        ev.eval(np.zeros((2, 2)), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="num_columns=2 to merge, got 3"):
        ev.merge(RegressionEvaluation(3))
    with pytest.raises(ValueError, match="column index in 0..1, got 2"):
        ev.mae(2)
    assert ev.count == 0


_finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


@st.composite
def _regression_data(draw):
    c = draw(st.integers(1, 4))
    n = draw(st.integers(0, 40))
    t = draw(hnp.arrays(np.float64, (n, c), elements=_finite))
    p = draw(hnp.arrays(np.float64, (n, c), elements=_finite))
    return c, t, p, draw(st.integers(0, n))


@given(_regression_data())
def test_regression_merge_equals_eval_on_concatenated_data(data):
    c, t, p, k = data
    whole = RegressionEvaluation(c).eval(t, p)
    merged = RegressionEvaluation(c).eval(t[:k], p[:k]).merge(RegressionEvaluation(c).eval(t[k:], p[k:]))
    assert merged.count == whole.count
    for key in ("sum_squared_error", "sum_absolute_error", "label_mean", "label_m2"):
        np.testing.assert_allclose(getattr(merged, key), getattr(whole, key), rtol=1e-9, atol=1e-6)


def test_regression_json_and_pickle_round_trip():
    ev = _hand_regression()
    back = RegressionEvaluation.from_json(ev.to_json())
    assert back == ev and back.r2(0) == ev.r2(0)
    assert pickle.loads(pickle.dumps(ev)) == ev
    with pytest.raises(ValueError, match="label_mean of length 2"):
        RegressionEvaluation.from_dict({**ev.to_dict(), "label_mean": [1.0]})
