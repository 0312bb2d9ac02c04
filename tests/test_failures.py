"""What an outside fault-injection run still broke (issue 23), on real local Spark.

Each test injects one fault and checks what the user sees and what is kept.
"""
import gc
import glob
import os

import numpy as np
import pytest

from sparkavg.spark import ParameterAveraging, SparkTrainer

from .nets import blobs, small_net

pytestmark = pytest.mark.spark


def _temp_files(sc) -> int:
    return len(glob.glob(os.path.join(sc._temp_dir, "**"), recursive=True))


def test_predict_outlives_its_trainer_and_is_released_with_its_rdd(sc):
    x, _ = blobs(6, seed=51)
    before = _temp_files(sc)
    # The trainer is garbage as soon as the expression is evaluated.
    out = SparkTrainer(sc, small_net(seed=51), ParameterAveraging(workers=2)).predict(sc.parallelize(list(x), 2))
    gc.collect()
    derived = out.map(lambda row: float(np.sum(row)))
    del out
    gc.collect()
    assert len(derived.collect()) == 6  # not "Attempted to use Broadcast after it was destroyed"
    assert _temp_files(sc) > before
    del derived
    gc.collect()
    assert _temp_files(sc) == before  # the shipped parameters went with the last RDD referring to them
