"""The wheel holds every module and data file of the source tree.

The package list is derived by ``setup.py`` from ``pyproject.toml``'s ``package-dir``; these
tests check the derivation against the folders on disk and build a real wheel (setuptools
from this environment, no build isolation, so no index is needed) from a copy of the tree.
"""

from __future__ import annotations

import runpy
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
ROOTS = {"tracer", "engine", "collectors", "analysis", "reports"}


def setuptools_config() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def derived_packages() -> list[str]:
    return runpy.run_path(str(ROOT / "setup.py"), run_name="setup")["derived_packages"]()


def source_files(pattern: str) -> list[Path]:
    """Files of the mapped roots matching ``pattern``, byte-code caches left out."""
    return sorted(
        f for r in ROOTS for f in (ROOT / r).rglob(pattern) if "__pycache__" not in f.parts
    )


def package_of(folder: Path) -> str:
    """``engine/disagg`` -> ``ttft.engine.disagg``."""
    return ".".join(("ttft", *folder.relative_to(ROOT).parts))


def test_package_dir_maps_each_root_folder_under_the_namespace():
    assert setuptools_config()["package-dir"] == {f"ttft.{r}": r for r in ROOTS}
    assert "packages" not in setuptools_config()  # derived by setup.py, never listed by hand


def test_every_folder_of_python_files_is_a_package():
    folders = {package_of(f.parent) for f in source_files("*.py")}
    packages = set(derived_packages())
    assert folders - packages == set()
    assert {"ttft.engine.disagg", "ttft.engine.server", "ttft.reports.cli"} <= packages
    # The only packages without Python files are the data folders.
    assert packages - folders == {"ttft.engine.data", "ttft.reports.assets"}


def test_every_package_data_glob_matches_a_file():
    for package, globs in setuptools_config()["package-data"].items():
        if package == "*":  # every package: each root holds its own py.typed
            folders = [ROOT / r for r in ROOTS]
        else:
            folders = [ROOT.joinpath(*package.split(".")[1:])]
        for glob in globs:
            matches = [f for folder in folders for f in folder.glob(glob)]
            assert matches, f"{package}: {glob} matches no file"


def test_the_wheel_holds_every_module_and_data_file(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    for r in ROOTS:
        shutil.copytree(ROOT / r, tree / r, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "wheel"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
           "--no-index", "-q", "-w", str(out), str(tree)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode and "No module named pip" in done.stderr:
        pytest.skip("this environment has no pip")
    assert done.returncode == 0, done.stderr
    [wheel] = out.glob("ttft-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # A folder's copy: the files it held when the copy was made, others may be editing the tree.
    expected = {
        "ttft/" + f.relative_to(tree).as_posix()
        for r in ROOTS for f in (tree / r).rglob("*") if f.is_file()
    }
    assert expected - names == set()
    assert {"ttft/engine/disagg/worker.py", "ttft/engine/data/corpus.txt",
            "ttft/reports/assets/plotly-basic.min.js",
            "ttft/collectors/importers/mappings.toml", "ttft/tracer/py.typed"} <= names


def quick_start() -> list[str]:
    """The lines of README's Quick start code block."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return block.strip().splitlines()


def test_readme_quick_start_is_two_lines_and_ci_runs_each_command():
    install, test = quick_start()
    commands = install.split(" && ")
    assert commands[-1] == "ttft demo"
    assert any(c.startswith("pip install torch==") and "/whl/cpu" in c for c in commands)
    ci = (ROOT / ".ci" / "run").read_text().replace("pip install -q ", "pip install ")
    ci_lines = {line.strip() for line in ci.splitlines()}
    for command in commands[:-1]:
        assert command in ci_lines, command
    assert '(cd "$work" && ttft demo)' in ci_lines  # the demo runs in a scratch folder
    assert test in ci_lines
