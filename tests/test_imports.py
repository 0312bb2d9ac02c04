"""No import circles in ``sparkavg/`` (issue 34, item 7).

Every module is parsed with :mod:`ast` (nothing is imported) and every
import it can run counts, wherever it stands -- at module level, inside a
function or method, under ``if``/``try``:

- ``import a.b.c`` is an edge to ``a.b.c``;
- ``from pkg import name`` is an edge to ``pkg.name`` where that is a
  module, else to ``pkg`` (relative imports resolved against the importing
  module's package);
- ``importlib.import_module("literal")`` (with ``__name__``/``__package__``
  as the package for a relative literal) is an edge to the module named;
- a lazy re-export map (a module-level dict literal whose string values name
  modules, in a module that calls ``importlib.import_module`` with a name it
  computes: ``sparkavg.spark``'s ``_EXPORTS``, ``sparkavg.listeners``'
  ``_LAZY``, ``sparkavg.nn``'s ``OPTIONAL_TYPES``) is an edge to each module
  it names.

An edge into a package's ``__init__`` counts like any other, re-export or
not: importing the package runs it.  The parents Python imports on the way
to ``a.b.c`` do not count (every module would otherwise depend on its own
package).  Names a module computes at run time from data (the runners'
``runner_module``) cannot be followed and are not edges.
"""
from __future__ import annotations

import ast
import textwrap
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "sparkavg"

#: Import circles not broken yet, each exactly this set of modules (a new
#: member, or a circle that is gone, fails the test: update or delete the entry).
KNOWN_CYCLES: dict[frozenset, str] = {}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted((ROOT / PACKAGE).rglob("*.py"))}


def resolve_relative(name: str, level: int, package: str) -> str:
    base = package.split(".")
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def resolve_literal(text: str, package: str | None) -> str:
    """``importlib.import_module(text, package)`` as an absolute name."""
    if not text.startswith("."):
        return text
    level = len(text) - len(text.lstrip("."))
    return resolve_relative(text[level:], level, package or "")


def is_import_module(call: ast.Call) -> bool:
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "import_module"
            and isinstance(f.value, ast.Name) and f.value.id == "importlib") or (
        isinstance(f, ast.Name) and f.id == "import_module")


def imports_of(module: str, source: str, is_package: bool, modules) -> list[tuple[str, int]]:
    """``(target, line)`` of every import of a module in ``modules`` by
    ``module`` (whose text is ``source``), once per target and statement."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    found = []

    def add(target, node):
        # outside sparkavg: dropped; inside, the longest prefix that is a module of ours
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != module and (target, node.lineno) not in found:
            found.append((target, node.lineno))

    dynamic = False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node)
        elif isinstance(node, ast.ImportFrom):
            base = resolve_relative(node.module or "", node.level, package) if node.level else node.module
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else base, node)
        elif isinstance(node, ast.Call) and is_import_module(node) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                add(resolve_literal(first.value, package), node)
            else:
                dynamic = True
    if dynamic:  # a name looked up in a module-level map of module names
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
                for value in node.value.values:
                    if isinstance(value, ast.Constant) and isinstance(value.value, str):
                        target = resolve_literal(value.value, package)
                        if target in modules:
                            add(target, value)
    return sorted(found, key=lambda f: f[1])


def import_graph():
    modules = all_modules()
    graph: dict[str, dict[str, list]] = {m: defaultdict(list) for m in modules}
    for module, path in modules.items():
        source = path.read_text()
        lines = source.splitlines()
        for target, line in imports_of(module, source, path.name == "__init__.py", modules):
            graph[module][target].append(f"{path.relative_to(ROOT)}:{line}: {lines[line - 1].strip()}")
    return graph


def strongly_connected(graph) -> list[set]:
    """Tarjan's components of more than one module (iterative: no recursion limit)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
    return components


def describe(graph, component) -> str:
    lines = [f"import circle among {', '.join(sorted(component))}:"]
    for module in sorted(component):
        for target in sorted(graph[module]):
            if target in component:
                lines += [f"    {module} -> {target}"] + [f"        {where}" for where in graph[module][target]]
    return "\n".join(lines)


FAKE = {"p", "p.a", "p.b", "p.c", "p.sub", "p.sub.d", "p.sub.e", "p.lazy"}


def targets(module, source, is_package=False):
    return sorted({t for t, _ in imports_of(module, textwrap.dedent(source), is_package, FAKE)})


def test_every_kind_of_import_is_an_edge():
    assert targets("p.a", """
        import os
        import p.b
        from .c import name
        """) == ["p.b", "p.c"]
    # inside functions and methods, relative two levels up
    assert targets("p.sub.d", """
        def f():
            from ..b import name
        class K:
            def m(self):
                from .. import c
        """) == ["p.b", "p.c"]
    # ``from pkg import name``: the submodule where it is one, else the package (its __init__)
    assert targets("p.a", "from p.sub import d, NAME") == ["p.sub", "p.sub.d"]
    assert targets("p.sub", "from . import e", is_package=True) == ["p.sub.e"]
    # import_module with a literal, relative to __name__; a computed name alone is no edge
    assert targets("p.sub", """
        import importlib
        importlib.import_module(".d", __name__)
        importlib.import_module("p.b")
        """, is_package=True) == ["p.b", "p.sub.d"]
    # a lazy map of module names in a module that imports by a computed name
    lazy = """
        import importlib
        _EXPORTS = {"Thing": ".d", "Other": "p.a", "Text": "not a module"}
        def __getattr__(name):
            return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
        """
    assert targets("p.sub", lazy, is_package=True) == ["p.a", "p.sub.d"]
    assert targets("p.sub", lazy.replace("_EXPORTS[name]", "'.e'"), is_package=True) == ["p.sub.e"]


def test_the_graph_of_sparkavg_has_its_hidden_edges():
    graph = import_graph()
    assert "sparkavg.nn" in graph["sparkavg.spark.executor.context"]  # inside a method
    assert "sparkavg.spark.trainer" in graph["sparkavg.spark"]  # the lazy re-export map
    assert "sparkavg.listeners.progress" in graph["sparkavg.listeners"]
    assert {"sparkavg.nn.graph", "sparkavg.torch"} <= set(graph["sparkavg.nn.loading"])  # OPTIONAL_TYPES


def test_cycle_finder_reports_a_circle():
    graph = {"a": {"b": ["a:1"]}, "b": {"c": ["b:1"]}, "c": {"a": ["c:1"]}, "d": {"a": ["d:1"]}}
    assert strongly_connected(graph) == [{"a", "b", "c"}]
    assert strongly_connected({"a": {"b": []}, "b": {}}) == []


def test_no_import_circles():
    graph = import_graph()
    components = strongly_connected(graph)
    found = {frozenset(c) for c in components}
    unexpected = [c for c in components if frozenset(c) not in KNOWN_CYCLES]
    gone = [", ".join(sorted(c)) for c in KNOWN_CYCLES if c not in found]
    assert not unexpected, "\n\n".join(describe(graph, c) for c in unexpected)
    assert not gone, f"known import circles no longer there (delete them from KNOWN_CYCLES): {gone}"
