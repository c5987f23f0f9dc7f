"""Lazy exports for a package's ``__init__`` (PEP 562): a public name whose module pulls a
heavy dependency (the OpenTelemetry SDK, torch, gRPC) is imported on first access, so
importing the package stays cheap."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``.

    Args:
        package: the package's ``__name__``.
        exports: public name → the module that defines it.

    Returns:
        ``__getattr__`` imports the name's module on first access and caches the name in
        the package (raising ``AttributeError`` for any other name, so ``from package
        import submodule`` still imports the submodule); ``__dir__`` lists the package's
        names with the lazy ones.
    """

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__
