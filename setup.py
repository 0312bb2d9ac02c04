"""Build script: compiles the Cython kernels in ``sparkavg_ext``.

Compiler directives live here once (not in per-file headers), after
scikit-learn.  ``SPARKAVG_CYTHON_DEBUG=1`` turns bounds/wraparound/
initialized checks back on for debugging.
"""
import glob
import os
import sys

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

DEBUG = os.environ.get("SPARKAVG_CYTHON_DEBUG", "0") == "1"

directives = {
    "language_level": 3,
    "boundscheck": DEBUG,
    "wraparound": DEBUG,
    "initializedcheck": DEBUG,
    "cdivision": not DEBUG,
    "embedsignature": True,
}

if sys.platform == "darwin" or os.environ.get("SPARKAVG_NO_OPENMP") == "1":
    openmp_compile, openmp_link = [], []
else:
    openmp_compile, openmp_link = ["-fopenmp"], ["-fopenmp"]

# No -ffast-math: the kernels must see NaN/inf to reject them.
extra_compile = ["-O3"] + openmp_compile

extensions = [
    Extension(
        "sparkavg_ext." + os.path.splitext(os.path.basename(pyx))[0],
        [pyx],
        include_dirs=[np.get_include()],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        extra_compile_args=extra_compile,
        extra_link_args=openmp_link,
    )
    for pyx in sorted(glob.glob(os.path.join("sparkavg_ext", "*.pyx")))
]

setup(ext_modules=cythonize(extensions, compiler_directives=directives))
