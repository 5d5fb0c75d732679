"""Public names imported from their submodules on first use (PEP 562).

``import workflow_engine`` then costs almost nothing, and a process pays only for the parts it
uses. Each package lists its names per submodule and installs the two hooks this returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, tuple[str, ...]], namespace: dict[str, Any]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The package's ``__getattr__`` (a listed name is imported from its submodule, then kept
    in ``namespace``) and ``__dir__`` (what is loaded, and every public name)."""
    module_of = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> object:
        try:
            module = module_of[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(import_module(f".{module}", package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *namespace["__all__"]})

    return __getattr__, __dir__
