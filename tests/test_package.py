import importlib

import numpy as np
import pytest

from sparkavg import backend


def test_package_imports_without_cupy_loaded():
    import sys

    import sparkavg  # noqa: F401
    import sparkavg.ops  # noqa: F401

    assert "cupy" not in sys.modules or backend.available()


def test_get_array_module_numpy():
    assert backend.get_array_module(np.zeros(3)) is np
    assert backend.to_cpu(np.ones(2)).sum() == 2


def test_check_available_error_is_helpful():
    if backend.available():
        pytest.skip("a GPU is present; the error path cannot be observed")
    with pytest.raises(RuntimeError, match="gpu"):
        backend.check_available()


def test_extension_package_builds():
    importlib.import_module("sparkavg_ext")
