"""Compiled Cython kernels for sparkavg (built by setup.py).

Use them through :mod:`sparkavg.ops`, which validates, dispatches and falls
back to the numpy reference; these modules assume validated input.
"""
