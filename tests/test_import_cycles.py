"""No import cycles between product modules, counting every import statement: at the top,
inside functions and methods, and under ``if TYPE_CHECKING:`` (a cycle there is still two
modules that each need the other).

An edge goes from a module to each ``ttft`` module it names: ``import ttft.a.b`` and
``from ttft.a.b import name`` name ``ttft.a.b``; ``from ttft.a import b`` names the
submodule ``ttft.a.b`` when there is one, else ``ttft.a``; relative imports are resolved
the same way. A package is its ``__init__``: a package that imports its submodules and a
submodule that imports from the package (``from ttft.a import name``) form a cycle, so a
submodule imports its siblings directly. Importing ``ttft.a.b`` also runs ``ttft.a``'s
``__init__``, but that is Python's doing, not an edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tracer", "engine", "collectors", "analysis", "reports")

# Cycles known when this test was written (none now). Listed whole, so that a module
# joining one, or any other cycle, fails. Remove an entry once its cycle is broken.
KNOWN_CYCLES: set[frozenset[str]] = set()

Graph = dict[str, dict[str, list[str]]]
"""module → imported module → where (``path:line``) each import statement names it."""


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["ttft", *parts])


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> Graph:
    """Every import edge between the ``ttft`` modules of ``packages`` under ``root``."""
    paths = {_module_name(root, p): p
             for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    graph: Graph = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        edges: dict[str, list[str]] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base
                           for a in node.names]
            else:
                continue
            where = f"{path.relative_to(root).as_posix()}:{node.lineno}"
            for target in dict.fromkeys(targets):  # once per statement
                if target in paths:
                    edges.setdefault(target, []).append(where)
        graph[name] = edges
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module, and the modules that
    import themselves (Tarjan's algorithm), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def describe(graph: Graph, component: list[str]) -> str:
    """A cycle's modules and the imports that join them."""
    members = set(component)
    lines = [" <-> ".join(component)]
    for module in component:
        for target, where in sorted(graph[module].items()):
            if target in members:
                lines.append(f"    {module} -> {target} ({', '.join(where)})")
    return "\n".join(lines)


def test_no_module_is_in_an_import_cycle():
    graph = import_graph(ROOT)
    found = [c for c in cycles(graph) if frozenset(c) not in KNOWN_CYCLES]
    assert found == [], "import cycles:\n" + "\n".join(describe(graph, c) for c in found)


def test_every_known_cycle_still_exists():
    current = {frozenset(c) for c in cycles(import_graph(ROOT))}
    assert {c for c in KNOWN_CYCLES if c not in current} == set()


def test_the_graph_finds_every_kind_of_cycle(tmp_path):
    files = {
        # a function-level import closing a cycle
        "pkg/a.py": "from ttft.pkg.b import f\n",
        "pkg/b.py": "def f():\n    from ttft.pkg import a\n",
        # a package __init__ and a submodule that imports from it
        "pkg/__init__.py": "from ttft.pkg.c import g\n",
        "pkg/c.py": "from ttft.pkg import name\ndef g(): ...\n",
        # a relative import, and a TYPE_CHECKING one
        "pkg/sub/__init__.py": "",
        "pkg/sub/d.py": "from . import e\n",
        "pkg/sub/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                        "    from ttft.pkg.sub.d import D\n",
        # a module that imports itself
        "pkg/f.py": "import ttft.pkg.f\n",
        # no cycle: a chain, and an import of the package (not of a submodule) from outside
        "other/__init__.py": "",
        "other/g.py": "from ttft.other import h\nimport ttft.pkg\n",
        "other/h.py": "import json\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ("pkg", "other"))
    assert graph["ttft.other.g"] == {"ttft.other.h": ["other/g.py:1"], "ttft.pkg": ["other/g.py:2"]}
    assert cycles(graph) == [
        ["ttft.pkg", "ttft.pkg.c"],
        ["ttft.pkg.a", "ttft.pkg.b"],
        ["ttft.pkg.f"],
        ["ttft.pkg.sub.d", "ttft.pkg.sub.e"],
    ]
    assert describe(graph, ["ttft.pkg.a", "ttft.pkg.b"]) == (
        "ttft.pkg.a <-> ttft.pkg.b\n"
        "    ttft.pkg.a -> ttft.pkg.b (pkg/a.py:1)\n"
        "    ttft.pkg.b -> ttft.pkg.a (pkg/b.py:2)"
    )
