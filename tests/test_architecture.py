"""The dependency rules of docs/architecture.md, checked over the source of every product
module (imports at any depth, lazy ones inside functions included):

- ``tracer`` imports no other ttft package;
- ``analysis``, ``collectors`` and ``engine`` import only ``tracer`` besides themselves;
- nothing but ``reports`` imports ``reports``;
- no module imports another package's private (``_name``) module;
- no product module is over 500 lines (a backstop: a module is one concept, split where a
  second one hides, docs/architecture.md), and every package says what it exports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("tracer", "engine", "collectors", "analysis", "reports")
ALLOWED = {
    "tracer": {"tracer"},
    "analysis": {"analysis", "tracer"},
    "collectors": {"collectors", "tracer"},
    "engine": {"engine", "tracer"},
    "reports": set(PACKAGES),
}
MAX_LINES = 500


def _modules() -> list[tuple[str, Path]]:
    return [
        (package, path)
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


def _imports(path: Path) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every ``ttft.*`` module or name an import statement
    names (``from ttft.a import b`` gives ``ttft.a`` and ``ttft.a.b``)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in out if name.split(".")[0] == "ttft"]


def _violations(package: str, path: Path) -> list[str]:
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    found = []
    for line, name in _imports(path):
        parts = name.split(".")
        if len(parts) < 2:
            continue
        target = parts[1]
        if target not in PACKAGES:
            found.append(f"{where}:{line} imports {name}: not a ttft package")
            continue
        if target not in ALLOWED[package]:
            found.append(f"{where}:{line}: {package} may not import {name}")
        private = [p for p in parts[2:] if p.startswith("_") and not p.startswith("__")]
        if target != package and private:
            found.append(f"{where}:{line} imports {name}: another package's private module")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_follow_the_dependency_rules(package):
    found = [v for pkg, path in _modules() if pkg == package for v in _violations(pkg, path)]
    assert found == []


def test_the_rules_catch_what_they_forbid(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import ttft.reports.cli\n"
        "def f():\n"
        "    from ttft.analysis._column_arrays import codes\n"
        "    from ttft.collectors import read_spans\n"
    )
    assert _violations("engine", bad) == [
        f"{bad}:1: engine may not import ttft.reports.cli",
        f"{bad}:3: engine may not import ttft.analysis._column_arrays",
        f"{bad}:3 imports ttft.analysis._column_arrays: another package's private module",
        f"{bad}:3: engine may not import ttft.analysis._column_arrays.codes",
        f"{bad}:3 imports ttft.analysis._column_arrays.codes: another package's private module",
        f"{bad}:4: engine may not import ttft.collectors",
        f"{bad}:4: engine may not import ttft.collectors.read_spans",
    ]
    assert _violations("reports", bad) == [
        f"{bad}:3 imports ttft.analysis._column_arrays: another package's private module",
        f"{bad}:3 imports ttft.analysis._column_arrays.codes: another package's private module",
    ]


def test_no_product_module_is_over_500_lines():
    long = {
        str(path.relative_to(ROOT)): n
        for _, path in _modules()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_declares_its_exports(package):
    tree = ast.parse((ROOT / package / "__init__.py").read_text())
    names = [
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    ]
    assert "__all__" in names
