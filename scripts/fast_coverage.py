"""Check that the fast selection (``pytest -m "not slow"``) touches every module of sparkavg.

Runs the selection under ``coverage`` -- the pytest process and, through
coverage's ``patch = subprocess``, the Python processes it starts that exit
normally (Spark's Python workers, driver programs, transport peers) -- then
lists every module of ``sparkavg/`` with

- no executed line at all ("untouched"): a failure, unless the module is one
  of :data:`EXPECTED_UNTOUCHED` (GPU-only code, which a machine without CUDA
  may leave untouched);
- functions or methods of which none ran, only the module's top level
  ("imported only"): reported, not a failure.

Usage (from the repository root, in the venv that runs the tests)::

    .venv/bin/python scripts/fast_coverage.py                 # the fast selection
    .venv/bin/python scripts/fast_coverage.py -- -m ""        # any other pytest selection

Arguments after ``--`` replace the default pytest arguments
(``-q -m "not slow"``).  Needs ``coverage`` (in the ``test`` extra).
Exit status: 0 when the tests passed and every module outside
EXPECTED_UNTOUCHED was touched; 1 otherwise.  Takes about 1.5 times the
selection's own time (tracing, and the workers' data files).
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "sparkavg"

# GPU-only modules: their real callers are CuPy arrays (the gpu-marked tests, skipped
# without CUDA), so a CPU machine may leave them untouched without that being a gap in
# the fast selection.  Today a CPU machine touches them anyway: sparkavg.ops._dispatch
# imports _cuda, and tests/test_cuda_sources.py runs these modules' Python glue on numpy
# arrays over a C build of the CUDA kernels (system C compiler).  Listed so that the
# check keeps meaning "no CPU module is untouched" if that ever changes.
EXPECTED_UNTOUCHED: dict[str, str] = {
    "sparkavg/ops/_cuda.py": "GPU only: the CuPy backend of sparkavg.ops, for arrays on a CUDA device",
    "sparkavg/ops/_cuda_conv.py": "GPU only: CuPy convolution and pooling over the raw kernels of "
                                  "cuda_src/conv.cu, reached from _cuda with CuPy arrays",
    "sparkavg/ops/_cuda_norm.py": "GPU only: BatchNorm's per-channel sums over cuda_src/norm.cu, reached from "
                                  "_cuda with CuPy arrays",
    "sparkavg/ops/_cuda_sequence.py": "GPU only: the LSTM step over cuda_src/rnn.cu, reached from _cuda with "
                                      "CuPy arrays",
}

DEFAULT_PYTEST_ARGS = ["-q", "-m", "not slow", "-p", "no:cacheprovider"]


def _rcfile(directory: Path) -> Path:
    rc = directory / "coveragerc"
    rc.write_text(
        "[run]\n"
        f"source = {PACKAGE}\n"
        f"data_file = {directory / 'data' / '.coverage'}\n"
        "parallel = true\n"
        "branch = false\n"
        # subprocesses (Spark's Python workers, driver programs, peers), the
        # forks of pyspark's daemon, and os._exit (how a forked worker ends)
        "patch =\n    subprocess\n    fork\n    _exit\n"
        "disable_warnings =\n    no-data-collected\n    module-not-measured\n    couldnt-parse\n"
    )
    (directory / "data").mkdir()
    return rc


def _function_body_lines(source: str) -> set[int]:
    """Line numbers inside the bodies of functions and methods (not lambdas: their
    body shares its line with the statement that defines them)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt in node.body:
                lines.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return lines


def _report(rc: Path) -> tuple[list[str], list[str], list[str], int]:
    """(untouched, imported_only, empty, number of modules) over every .py under sparkavg/."""
    import coverage

    cov = coverage.Coverage(config_file=str(rc))
    with warnings.catch_warnings():
        # A Python worker still being torn down after pytest ended may leave a data
        # file name behind without its file; what it measured is lost, nothing else.
        warnings.filterwarnings("ignore", message="Couldn't use data file")
        cov.combine()
    cov.load()
    untouched, imported_only, empty = [], [], []
    modules = sorted(PACKAGE.rglob("*.py"))
    for path in modules:
        rel = path.relative_to(ROOT).as_posix()
        _, statements, _, missing, _ = cov.analysis2(str(path))
        executed = set(statements) - set(missing)
        if not statements:
            empty.append(rel)
        elif not executed:
            untouched.append(rel)
        else:
            bodies = _function_body_lines(path.read_text())
            if bodies and not executed & bodies:
                imported_only.append(rel)
    return untouched, imported_only, empty, len(modules)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = DEFAULT_PYTEST_ARGS
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", action="store_true", help="keep the coverage data folder and say where")
    args = parser.parse_args(argv)

    if importlib.util.find_spec("coverage") is None:
        print("coverage is not installed: pip install coverage (it is in the 'test' extra)", file=sys.stderr)
        return 1

    work = Path(tempfile.mkdtemp(prefix="sparkavg-fast-coverage-"))
    rc = _rcfile(work)
    command = [sys.executable, "-m", "coverage", "run", f"--rcfile={rc}", "-m", "pytest", *pytest_args]
    print("+", " ".join(command), flush=True)
    tests = subprocess.run(command, cwd=ROOT)

    untouched, imported_only, empty, total = _report(rc)
    unexpected = [m for m in untouched if m not in EXPECTED_UNTOUCHED]
    print()
    print(f"sparkavg modules: {total}; with no statement: {len(empty)}; "
          f"untouched: {len(untouched)}; imported only: {len(imported_only)}")
    for m in untouched:
        reason = EXPECTED_UNTOUCHED.get(m)
        print(f"  untouched   {m}: " + (f"expected ({reason})" if reason else "NOT EXPECTED"))
    for m in sorted(set(EXPECTED_UNTOUCHED) - set(untouched)):
        print(f"  touched     {m} (allowed to be untouched: {EXPECTED_UNTOUCHED[m]})")
    for m in imported_only:
        print(f"  imported only (no function body ran)   {m}")
    if args.keep:
        print(f"coverage data: {work} (coverage report --rcfile={rc})")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    if tests.returncode != 0:
        print(f"the tests failed (pytest exit status {tests.returncode})")
        return 1
    if unexpected:
        print(f"{len(unexpected)} module(s) untouched by the selection: " + ", ".join(unexpected))
        return 1
    print("every module outside the expected list was touched")
    return 0


if __name__ == "__main__":
    sys.exit(main())
