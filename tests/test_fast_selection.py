"""scripts/fast_coverage.py, the check that the fast selection (-m "not slow")
touches every module: its GPU exceptions are real modules, each with its
reason, and "imported only" means that no function or method body ran."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _script():
    spec = importlib.util.spec_from_file_location("fast_coverage", ROOT / "scripts" / "fast_coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_expected_untouched_modules_exist_and_are_gpu_only():
    expected = _script().EXPECTED_UNTOUCHED
    assert expected
    for path, reason in expected.items():
        assert (ROOT / path).is_file(), f"{path} is listed as expected untouched but is not a module"
        assert path.startswith("sparkavg/") and reason.startswith("GPU only: "), (path, reason)


def test_function_body_lines_are_the_lines_inside_functions_and_methods():
    source = ("import os\n"            # 1
              "X = [1,\n"              # 2
              "     2]\n"              # 3
              "\n"                     # 4
              "def f(a=X):\n"          # 5
              "    return (a +\n"      # 6
              "            1)\n"       # 7
              "\n"                     # 8
              "class C:\n"             # 9
              "    y = 2\n"            # 10
              "    def g(self):\n"     # 11
              "        pass\n"         # 12
              "h = lambda: 3\n")       # 13
    assert _script()._function_body_lines(source) == {6, 7, 12}  # not the lambda's line: it runs at import
