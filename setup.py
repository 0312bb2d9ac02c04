"""Build script: compiles the Cython kernels in ``sparkavg_ext``.

Templates ``sparkavg_ext/*.pyx.tp`` are rendered to ``.pyx`` first, with the
Tempita bundled in Cython (as scikit-learn does); the generated files are
not in git.  Compiler directives live here once (not in per-file headers),
after scikit-learn.  ``SPARKAVG_CYTHON_DEBUG=1`` turns bounds/wraparound/
initialized checks back on for debugging.
"""
import glob
import os
import sys

import numpy as np
from Cython import Tempita
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


def render_templates(folder):
    """Render every ``<name>.pyx.tp`` in ``folder`` to ``<name>.pyx`` when
    the template is newer (or the .pyx missing)."""
    for template in sorted(glob.glob(os.path.join(folder, "*.pyx.tp"))):
        target = template[: -len(".tp")]
        if os.path.exists(target) and os.path.getmtime(target) >= os.path.getmtime(template):
            continue
        with open(template, encoding="utf-8") as f:
            text = Tempita.sub(f.read())
        with open(target, "w", encoding="utf-8") as f:
            f.write(text)


render_templates("sparkavg_ext")

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

#: Cython's translation and the C compiler each use every core (``build_ext -j``): the five
#: kernels compile side by side, also under ``pip install``/``pip wheel``, which pass no ``-j``.
JOBS = os.cpu_count() or 1

setup(ext_modules=cythonize(extensions, compiler_directives=directives, nthreads=JOBS),
      options={"build_ext": {"parallel": JOBS}})
