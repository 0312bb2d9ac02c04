"""Sphinx configuration of the sparkavg user guide and API reference.

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html``
(``tests/test_docs.py`` runs exactly this, with warnings as errors).
"""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)  # document this checkout's sparkavg, not another install of it

import sparkavg  # noqa: E402

project = "sparkavg"
author = "the sparkavg authors"
copyright = "the sparkavg authors"
release = version = sparkavg.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build"]

# MyST: the guide is Markdown; headings get anchors for links like page.md#section.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# The docstrings are numpydoc style.
napoleon_numpy_docstring = True
napoleon_google_docstring = False
napoleon_use_rtype = False

autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"

html_theme = "furo"
html_title = f"sparkavg {release}"
html_static_path = []


def _skip_namedtuple_aliases(app, what, name, obj, skip, options):
    """A NamedTuple's fields are documented by its own "Attributes" section;
    skip the ``Alias for field number N`` members Python generates for them."""
    doc = getattr(obj, "__doc__", None) or ""
    if what == "class" and doc.startswith("Alias for field number"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_namedtuple_aliases)
