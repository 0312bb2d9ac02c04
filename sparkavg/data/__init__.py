"""Data loading: IDX files, MNIST-format datasets and minibatching.

Only numpy-level helpers live here; importing this package never imports
pyspark (the RDD/DataFrame adapters are separate modules of this package).
"""
from .batching import minibatches, num_batches
from .idx import IdxFormatError, IdxHeader, read_idx, read_idx_header, write_idx
from .mnist import MnistSplit, default_data_dir, find_mnist_files, load_mnist, one_hot

__all__ = [
    "IdxFormatError",
    "IdxHeader",
    "MnistSplit",
    "default_data_dir",
    "find_mnist_files",
    "load_mnist",
    "minibatches",
    "num_batches",
    "one_hot",
    "read_idx",
    "read_idx_header",
    "write_idx",
]
