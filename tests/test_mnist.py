"""MNIST-format loading from IDX folders, and one-hot encoding."""
import numpy as np
import pytest

from sparkavg.data import mnist
from sparkavg.data.idx import IdxFormatError, write_idx
from sparkavg.data.mnist import default_data_dir, find_mnist_files, load_mnist, one_hot


def _write_split(folder, prefix="t10k", n=5, h=28, w=28, n_labels=None, gz=True, dotted=False, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(n, h, w), dtype=np.uint8)
    images[0, 0, 0], images[0, 0, 1] = 0, 255
    labels = rng.integers(0, 10, size=n_labels if n_labels is not None else n, dtype=np.uint8)
    sep = "." if dotted else "-"
    ext = ".gz" if gz else ""
    write_idx(folder / f"{prefix}-images{sep}idx3-ubyte{ext}", images)
    write_idx(folder / f"{prefix}-labels{sep}idx1-ubyte{ext}", labels)
    return images, labels


@pytest.mark.parametrize("gz", [True, False])
@pytest.mark.parametrize("dotted", [True, False])
def test_load_synthetic(tmp_path, gz, dotted):
    images, labels = _write_split(tmp_path, "train", n=6, h=5, w=7, gz=gz, dotted=dotted)
    x, y = load_mnist(tmp_path, "train")
    assert x.shape == (6, 1, 5, 7) and x.dtype == np.float32
    assert y.shape == (6,) and y.dtype == np.int64
    np.testing.assert_array_equal(y, labels)
    np.testing.assert_allclose(x[:, 0], images / 255.0, rtol=1e-6)
    assert x.min() == 0.0 and x.max() == 1.0


def test_limit_dtype_and_named_fields(tmp_path):
    images, labels = _write_split(tmp_path, n=8)
    split = load_mnist(tmp_path, "test", limit=3, dtype=np.float64)
    assert split.images.shape == (3, 1, 28, 28) and split.images.dtype == np.float64
    np.testing.assert_array_equal(split.labels, labels[:3])


def test_bad_arguments(tmp_path):
    _write_split(tmp_path)
    with pytest.raises(ValueError, match="split 'train' or 'test', got 'val'"):
        load_mnist(tmp_path, "val")
    with pytest.raises(ValueError, match="floating dtype"):
        load_mnist(tmp_path, "test", dtype=np.int32)
    with pytest.raises(ValueError, match="limit"):
        load_mnist(tmp_path, "test", limit=-2)


def test_missing_files_lists_names_and_folder(tmp_path):
    _write_split(tmp_path, "t10k")
    with pytest.raises(FileNotFoundError) as info:
        load_mnist(tmp_path, "train")
    msg = str(info.value)
    assert str(tmp_path) in msg
    for name in ("train-images-idx3-ubyte", "train-images-idx3-ubyte.gz", "train-images.idx3-ubyte"):
        assert name in msg


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        find_mnist_files(tmp_path / "nowhere")


def test_count_mismatch_names_both_files(tmp_path):
    _write_split(tmp_path, n=5, n_labels=4)
    with pytest.raises(ValueError) as info:
        load_mnist(tmp_path, "test")
    msg = str(info.value)
    assert "t10k-images-idx3-ubyte.gz has 5 images" in msg
    assert "t10k-labels-idx1-ubyte.gz has 4 labels" in msg


def test_label_out_of_range(tmp_path):
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((3, 2, 2), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([1, 10, 12], np.uint8))
    with pytest.raises(ValueError, match=r"t10k-labels-idx1-ubyte: expected labels in 0..9 \(num_classes=10\), "
                                         r"got 10 at index 1"):
        load_mnist(tmp_path, "test")


@pytest.mark.parametrize("num_classes", [0, -3, True, 2.0])
def test_num_classes_below_one_is_named_as_the_argument_not_as_a_label_range(tmp_path, num_classes):
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((3, 2, 2), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.array([1, 0, 1], np.uint8))
    with pytest.raises(ValueError) as info:
        load_mnist(tmp_path, "test", num_classes=num_classes)
    message = str(info.value)
    assert message == (f"Expect num_classes (the load_mnist argument: labels lie in 0 .. num_classes - 1) to be an "
                       f"int >= 1, got {type(num_classes).__name__} {num_classes!r}")
    assert "0..-1" not in message
    with pytest.raises(ValueError, match=r"Expect num_classes \(the one_hot argument.*got int 0"):
        one_hot([0], 0)


def test_images_must_be_2d_per_item(tmp_path):
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((3, 4), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte: expected images of shape \(N, H, W\)"):
        load_mnist(tmp_path, "test")


def test_images_must_be_uint8(tmp_path):
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((3, 2, 2), np.float32))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(3, np.uint8))
    with pytest.raises(ValueError, match="expected uint8 images, got float32"):
        load_mnist(tmp_path, "test")


def test_corrupt_file_propagates_idx_error(tmp_path):
    _write_split(tmp_path, gz=False)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(IdxFormatError, match="t10k-images-idx3-ubyte"):
        load_mnist(tmp_path, "test")


def test_default_data_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKAVG_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path
    _write_split(tmp_path, n=2)
    assert load_mnist(split="test").labels.shape == (2,)
    monkeypatch.setenv("SPARKAVG_DATA_DIR", str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="SPARKAVG_DATA_DIR"):
        default_data_dir()


def test_default_data_dir_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("SPARKAVG_DATA_DIR", raising=False)
    monkeypatch.setattr(mnist, "DEFAULT_DATA_DIR", tmp_path / "absent")
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist"):
        default_data_dir()


def test_real_fashion_mnist_test_split(fashion_dir):
    from sparkavg.data.idx import read_idx_header

    images_path, labels_path = find_mnist_files(fashion_dir, "test")
    assert read_idx_header(images_path).shape == (10000, 28, 28)
    assert read_idx_header(labels_path).shape == (10000,)
    x, y = load_mnist(fashion_dir, "test", limit=500)
    assert x.shape == (500, 1, 28, 28) and x.dtype == np.float32
    assert y.shape == (500,) and y.dtype == np.int64
    assert 0.0 <= x.min() and x.max() <= 1.0 and x.max() == 1.0
    assert y.min() >= 0 and y.max() <= 9
    assert len(np.unique(y)) == 10  # 500 Fashion-MNIST test items cover every class


def test_one_hot():
    out = one_hot(np.array([2, 0, 1, 2]), 3)
    assert out.dtype == np.float32 and out.shape == (4, 3)
    np.testing.assert_array_equal(out, np.eye(3, dtype=np.float32)[[2, 0, 1, 2]])
    assert one_hot(np.array([], dtype=np.int64), 4).shape == (0, 4)


def test_one_hot_validation():
    with pytest.raises(ValueError, match="got 3 at index 2"):
        one_hot([0, 1, 3, 5], 3)
    with pytest.raises(ValueError, match="got -1 at index 0"):
        one_hot([-1], 3)
    with pytest.raises(ValueError, match="num_classes"):
        one_hot([0], 0)
    with pytest.raises(ValueError, match="integer labels"):
        one_hot([0.5], 2)
    with pytest.raises(ValueError, match=r"shape \(N,\)"):
        one_hot([[0]], 2)
