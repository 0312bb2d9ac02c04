"""Several named inputs on the data path without Spark: the DataSpec of a
Graph, RDD-style rows (pairs of dicts and dict minibatches) validated and
re-cut, ids kept int64, errors naming the input."""
import numpy as np
import pytest

from sparkavg.data.validation import DataSpec, DataValidationError, rebatch_partition

from .nets import tabular, tabular_graph


def _spec():
    return DataSpec.of(tabular_graph().spec)


def test_rows_of_dict_pairs_and_dict_minibatches_are_cut_by_name():
    cats, nums, y = tabular(10, seed=2)
    rows = [({"cats": c.tolist(), "nums": v}, int(label)) for c, v, label in zip(cats[:3], nums[:3], y[:3])]
    rows.append(({"cats": cats[3:], "nums": nums[3:]}, y[3:]))  # a minibatch record of 7
    batches = list(rebatch_partition(_spec(), 4)(0, iter(rows)))
    assert [len(b[1]) for b in batches] == [4, 4, 2]
    x = {k: np.concatenate([b[0][k] for b in batches]) for k in ("cats", "nums")}
    assert x["cats"].dtype == np.int64 and x["nums"].dtype == np.float32
    np.testing.assert_array_equal(x["cats"], cats)
    np.testing.assert_array_equal(x["nums"], nums)
    np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), y)


@pytest.mark.parametrize("features, message", [
    ({"cats": [1, 2]}, r"Bad features at partition 3, row 1: expected a dict keyed by the inputs \['cats', 'nums'\], "
                       r"got keys \['cats'\]"),
    ({"cats": [1, 2.5], "nums": [0, 0, 0]}, r"features of input 'cats' at partition 3, row 1: expected integer ids"),
    ({"cats": [1, 2], "nums": [0, np.inf, 0]}, r"features of input 'nums' at partition 3, row 1: 1 NaN/inf"),
    ({"cats": [1, 2, 3], "nums": [0, 0, 0]}, r"features of input 'cats' at partition 3, row 1: expected 2 values"),
])
def test_bad_rows_name_the_input_partition_and_row(features, message):
    rows = [({"cats": [0, 1], "nums": [0.0, 0.0, 0.0]}, 0), (features, 1)]
    with pytest.raises(DataValidationError, match=message):
        list(rebatch_partition(_spec(), 4)(3, iter(rows)))


def test_a_single_input_is_a_mapping_of_one_by_the_models_input_name_and_messages_say_features():
    spec = DataSpec.of(tabular_graph().spec.__class__(tabular_graph().spec.inputs[1:], tabular_graph().spec.outputs))
    assert spec.input_shape == (3,) and [(i.name, i.shape, i.sole) for i in spec.inputs] == [("nums", (3,), True)]
    assert [(i.name, i.sole) for i in DataSpec((3,), 2).inputs] == [("input", True)]  # no model: "input"
    # The one-input forms users give (bare arrays, as pairs or as a minibatch) come out by input name.
    rows = [(np.ones(3), 0), (np.zeros((2, 3)), np.array([1, 0]))]
    batches = list(rebatch_partition(spec, 4)(0, iter(rows)))
    assert [sorted(x) for x, _ in batches] == [["nums"]] and batches[0][0]["nums"].shape == (3, 3)
    with pytest.raises(DataValidationError, match=r"^Bad features at partition 0, row 1: expected 3 values"):
        list(rebatch_partition(spec, 4)(0, iter([(np.ones(3), 0), (np.ones(4), 1)])))


def test_a_one_input_model_takes_a_mapping_of_one_by_its_input_name_as_it_takes_its_array():
    from .nets import blobs, small_net

    x, y = blobs(8, seed=4)
    net, twin = small_net(seed=5), small_net(seed=5)
    name = net.spec.inputs[0].name
    np.testing.assert_array_equal(net.output({name: x}), net.output(x))
    assert net.fit_batch({name: x}, y) == twin.fit_batch(x, y) and net.score({name: x}, y) == twin.score(x, y)
    np.testing.assert_array_equal(net.params, twin.params)
    with pytest.raises(ValueError, match=r"Expect the features keyed by the model's input \['input'\], got keys "
                                         r"\['pixels'\]"):
        net.output({"pixels": x})
