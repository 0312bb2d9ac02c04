"""The user guide and API reference build, with Sphinx's warnings as errors,
and the README's links reach the pages they name.

The build runs Sphinx exactly as ``docs/development.md`` says, with this
interpreter (the virtual environment ``scripts/setup.sh`` makes, which
installs the doc tools with the ``test`` extra).  A docstring that Sphinx
cannot read (a broken field list, an unclosed literal) fails here, naming
its file and line.
"""
from __future__ import annotations

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: Pages the guide must have (the README's "where to read more" links them).
GUIDE = ["index", "quickstart", "models", "masters", "data", "training", "cluster", "connect-ml", "torch", "export",
         "listeners", "troubleshooting", "performance", "security", "development"]
#: API pages and one object each must document.
API = {"nn": "sparkavg.nn.Network", "spark": "sparkavg.spark.SparkTrainer", "ml": "sparkavg.ml.NetworkEstimator",
       "torch": "sparkavg.torch.TorchModel", "listeners": "sparkavg.listeners.TrainingListener",
       "evaluation": "sparkavg.evaluation.Evaluation", "references": "sparkavg.references.trusting",
       "data": "sparkavg.data.load_mnist", "export": "sparkavg.export.ExportError"}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs-html")
    done = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-b", "html", "docs", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    problems = [line for line in (done.stdout + done.stderr).splitlines() if "WARNING" in line or "ERROR" in line]
    assert done.returncode == 0, ("sphinx-build -W failed:\n" + "\n".join(problems[:60])
                                  + "\n" + done.stderr[-3000:])
    return out


@pytest.mark.slow
def test_the_guide_builds_without_warnings(built):
    for page in GUIDE:
        text = (built / f"{page}.html").read_text(encoding="utf-8")
        assert "<h1>" in text, f"{page}.html has no title"
    index = (built / "index.html").read_text(encoding="utf-8")
    for page in GUIDE[1:] + ["api/index"]:
        assert f'href="{page}.html' in index, f"the index does not link {page}.html"


@pytest.mark.slow
def test_the_api_reference_documents_the_public_packages(built):
    for page, name in API.items():
        text = (built / "api" / f"{page}.html").read_text(encoding="utf-8")
        assert f'id="{name}"' in text, f"api/{page}.html does not document {name}"


@pytest.mark.slow
def test_the_security_page_lists_the_marks_and_trust(built):
    page = (built / "security.html").read_text(encoding="utf-8")
    text = html.unescape(re.sub(r"<[^>]+>", "", page))
    for words in ("@sparkavg.torch.factory", "@sparkavg.loss", "@sparkavg.transform", "trusted=",
                  "sparkavg.trusting"):
        assert words in text, words


def test_the_readme_is_a_front_door_whose_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links no guide page"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert missing == [], f"README links to missing files: {missing}"
    for page in ("docs/security.md", "docs/performance.md", "docs/index.md"):
        assert page in local, f"the README does not link {page}"
    # CI extracts and runs this block (.ci/run); it must stay where it is.
    assert "<!-- test-command -->\n```\nbash scripts/setup.sh && .venv/bin/python -m pytest -q\n```\n" \
           "<!-- /test-command -->" in text
