"""The package list, derived so that a new subpackage can never be left out of the wheel.

Everything else is in ``pyproject.toml``. Its ``[tool.setuptools] package-dir`` maps each
root folder onto ``ttft.<folder>`` (``ttft`` itself is a PEP 420 namespace with no folder);
setuptools' own discovery runs inside each mapped folder and the names get the mapping's
prefix. It is ``find_namespace_packages``, not ``find_packages``, so that a folder is found
whether or not it has an ``__init__.py``: a subpackage someone forgot to give one still
ships, and the data folders (``engine/data``, ``reports/assets``) are packages too, as
setuptools asks of a folder that holds package data. ``tests/test_packaging.py`` checks it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from setuptools import find_namespace_packages, setup

if sys.version_info >= (3, 11):
    import tomllib
else:  # build-system requires tomli there
    import tomli as tomllib

HERE = Path(__file__).resolve().parent
# Byte-code caches are folders too; they are never packages.
NOT_PACKAGES = ["__pycache__", "*.__pycache__", "*.__pycache__.*"]


def package_dirs() -> dict[str, str]:
    """``pyproject.toml``'s mapping of package name to root folder (relative to the repo)."""
    with open(HERE / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]["package-dir"]


def derived_packages() -> list[str]:
    """Every package of the wheel: each mapped root and each package folder below it."""
    packages = []
    for name, folder in package_dirs().items():
        packages.append(name)
        found = find_namespace_packages(where=str(HERE / folder), exclude=NOT_PACKAGES)
        packages += [f"{name}.{sub}" for sub in found]
    return sorted(packages)


if __name__ == "__main__":
    setup(packages=derived_packages())
