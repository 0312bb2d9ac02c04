"""MNIST-format datasets (MNIST, Fashion-MNIST, ...) from a folder of IDX files.

A folder holds ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each raw or
``.gz``, also spelled with a dot (``train-images.idx3-ubyte``). The default
folder is ``$SPARKAVG_DATA_DIR`` or the Debian package
``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .idx import read_idx, read_idx_header

__all__ = [
    "DATA_DIR_ENV",
    "DEFAULT_DATA_DIR",
    "MnistSplit",
    "default_data_dir",
    "find_mnist_files",
    "load_mnist",
    "one_hot",
]

logger = logging.getLogger(__name__)

#: Environment variable naming the folder :func:`default_data_dir` returns.
DATA_DIR_ENV = "SPARKAVG_DATA_DIR"
#: Where the Debian package ``dataset-fashion-mnist`` installs its files.
DEFAULT_DATA_DIR = Path("/usr/share/datasets/fashion-mnist")

_SPLIT_PREFIX = {"train": "train", "test": "t10k"}


class MnistSplit(NamedTuple):
    """One split of an MNIST-format dataset; unpacks as ``images, labels``.

    Attributes
    ----------
    images : numpy.ndarray
        Shape (N, 1, H, W), floating dtype, values in [0, 1].
    labels : numpy.ndarray
        Shape (N,), int64, values in ``0 .. num_classes - 1``.
    """

    images: np.ndarray
    labels: np.ndarray


def default_data_dir() -> Path:
    """The folder MNIST-format files are read from when none is given.

    Returns
    -------
    pathlib.Path
        ``$SPARKAVG_DATA_DIR`` when set, else ``/usr/share/datasets/fashion-mnist``.

    Raises
    ------
    FileNotFoundError
        The folder does not exist; the message says how to get it.
    """
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        path = Path(env)
        if not path.is_dir():
            raise FileNotFoundError(
                f"{DATA_DIR_ENV}={env!r} is not a folder: point it at a folder with "
                "train-/t10k- images/labels IDX files, or unset it to use "
                f"{DEFAULT_DATA_DIR} (apt-get install dataset-fashion-mnist)"
            )
        return path
    if not DEFAULT_DATA_DIR.is_dir():
        raise FileNotFoundError(
            f"No MNIST-format data folder: {DEFAULT_DATA_DIR} does not exist and "
            f"{DATA_DIR_ENV} is not set. Install Fashion-MNIST with "
            "'apt-get install dataset-fashion-mnist', or set "
            f"{DATA_DIR_ENV} to a folder with train-/t10k- images/labels IDX files"
        )
    return DEFAULT_DATA_DIR


def _candidates(prefix: str, kind: str, idx: str) -> list[str]:
    # Raw before .gz (cheaper to read); the canonical dash spelling before the dotted one.
    names = [f"{prefix}-{kind}-{idx}-ubyte", f"{prefix}-{kind}.{idx}-ubyte"]
    return [n + ext for n in names for ext in ("", ".gz")]


def find_mnist_files(data_dir, split: str = "train") -> tuple[Path, Path]:
    """Locate the images and labels files of one split.

    Parameters
    ----------
    data_dir : str or os.PathLike
        Folder to search.
    split : {'train', 'test'}
        ``'test'`` means the ``t10k-`` files.

    Returns
    -------
    (pathlib.Path, pathlib.Path)
        Images file, labels file.

    Raises
    ------
    ValueError
        Unknown split.
    FileNotFoundError
        The folder or a file is missing; the message lists every name tried.
    """
    if split not in _SPLIT_PREFIX:
        raise ValueError(f"Expect split 'train' or 'test', got {split!r}")
    folder = Path(data_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"MNIST data folder {str(folder)!r} does not exist or is not a folder")
    prefix = _SPLIT_PREFIX[split]
    found = []
    for kind, idx in (("images", "idx3"), ("labels", "idx1")):
        names = _candidates(prefix, kind, idx)
        path = next((folder / n for n in names if (folder / n).is_file()), None)
        if path is None:
            raise FileNotFoundError(
                f"No {split} {kind} file in {str(folder)!r}: looked for {', '.join(names)}"
            )
        found.append(path)
    return found[0], found[1]


def load_mnist(
    data_dir=None,
    split: str = "train",
    limit: int | None = None,
    dtype=np.float32,
    num_classes: int = 10,
) -> MnistSplit:
    """Load one split of an MNIST-format dataset.

    Parameters
    ----------
    data_dir : str or os.PathLike, optional
        Folder with the IDX files; :func:`default_data_dir` when ``None``.
    split : {'train', 'test'}
        Which files: ``train-*`` or ``t10k-*``.
    limit : int, optional
        Keep only the first ``limit`` examples (all when ``None``).
    dtype : numpy floating dtype, default float32
        Dtype of the returned images.
    num_classes : int, default 10
        Labels must lie in ``0 .. num_classes - 1``.

    Returns
    -------
    MnistSplit
        ``images`` of shape (N, 1, H, W) and ``dtype``, scaled from uint8 to
        [0, 1]; ``labels`` of shape (N,), int64. Unpacks as ``images, labels``.

    Raises
    ------
    FileNotFoundError
        Folder or files missing (lists what was looked for, and where).
    ValueError
        Images not uint8 (N, H, W); labels not integer (N,); image and label
        counts differ; a label outside ``0 .. num_classes - 1``; bad arguments.
    sparkavg.data.idx.IdxFormatError
        A file is not well-formed IDX.
    """
    if limit is not None and (not isinstance(limit, (int, np.integer)) or isinstance(limit, (bool, np.bool_))
                              or limit < 0):
        raise ValueError(f"Expect limit to be None or an int >= 0, got {type(limit).__name__} {limit!r}")
    _check_num_classes(num_classes, "load_mnist")
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise ValueError(f"Expect a floating dtype for images, got {dtype}")
    folder = default_data_dir() if data_dir is None else Path(data_dir)
    images_path, labels_path = find_mnist_files(folder, split)

    # Headers first: counts and ranks are checked before any payload is read.
    ih, lh = read_idx_header(images_path), read_idx_header(labels_path)
    if len(ih.shape) != 3:
        raise ValueError(
            f"{images_path}: expected images of shape (N, H, W) (2-D per item), got shape {ih.shape}"
        )
    if ih.dtype.kind != "u" or ih.dtype.itemsize != 1:
        raise ValueError(f"{images_path}: expected uint8 images, got {ih.dtype.name}")
    if len(lh.shape) != 1:
        raise ValueError(f"{labels_path}: expected labels of shape (N,), got shape {lh.shape}")
    if lh.dtype.kind not in "iu":
        raise ValueError(f"{labels_path}: expected integer labels, got {lh.dtype.name}")
    if ih.shape[0] != lh.shape[0]:
        raise ValueError(
            f"image and label counts differ: {images_path} has {ih.shape[0]} images, "
            f"{labels_path} has {lh.shape[0]} labels"
        )

    raw_images = read_idx(images_path, limit=limit)
    raw_labels = read_idx(labels_path, limit=limit)
    labels = raw_labels.astype(np.int64)
    _check_label_range(labels, num_classes, str(labels_path))

    n, h, w = raw_images.shape
    images = raw_images.astype(dtype).reshape(n, 1, h, w)
    np.divide(images, 255, out=images)  # divide, not multiply by 1/255: 255 maps to exactly 1.0
    logger.info("loaded %s %s: images %s %s, labels %s", folder, split, images.shape, images.dtype, labels.shape)
    return MnistSplit(images, labels)


def _check_num_classes(num_classes, caller: str) -> None:
    if isinstance(num_classes, (bool, np.bool_)) or not isinstance(num_classes, (int, np.integer)) \
            or num_classes < 1:
        raise ValueError(f"Expect num_classes (the {caller} argument: labels lie in 0 .. num_classes - 1) to be an "
                         f"int >= 1, got {type(num_classes).__name__} {num_classes!r}")


def _check_label_range(labels: np.ndarray, num_classes: int, source: str) -> None:
    bad = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{source}: expected labels in 0..{num_classes - 1} (num_classes={num_classes}), got {labels[i]} at "
            f"index {i} ({bad.size} out of range)"
        )


def one_hot(labels, num_classes: int) -> np.ndarray:
    """One-hot encode integer class labels.

    Parameters
    ----------
    labels : array_like of int, shape (N,)
        Class indices in ``0 .. num_classes - 1``.
    num_classes : int
        Number of classes C, at least 1.

    Returns
    -------
    numpy.ndarray
        Shape (N, C), float32, a single 1.0 per row.

    Raises
    ------
    ValueError
        ``num_classes < 1``, labels not 1-D integers, or a label out of range
        (the message names the first bad index and value).
    """
    _check_num_classes(num_classes, "one_hot")
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise ValueError(f"Expect labels of shape (N,), got shape {labels.shape}")
    if labels.size and labels.dtype.kind not in "iu":
        raise ValueError(f"Expect integer labels, got dtype {labels.dtype}")
    _check_label_range(labels, int(num_classes), "one_hot")
    out = np.zeros((labels.shape[0], int(num_classes)), dtype=np.float32)
    out[np.arange(labels.shape[0]), labels.astype(np.intp, copy=False)] = 1.0
    return out
