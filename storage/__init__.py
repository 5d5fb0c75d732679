"""Durable stores for workflow-engine runs: SQLite (WAL) and an in-memory twin for tests.

Both implement the kernel's ``RunStore`` contract and pass the same conformance suite. Each name
is imported on first use (PEP 562): ``import workflow_engine.storage`` loads no store, and a
process resuming runs from SQLite never loads the in-memory one.
"""

import typing as _typing
from importlib import import_module as _import_module

if _typing.TYPE_CHECKING:  # what type checkers and IDEs see; at run time see ``__getattr__``
    from ._memory import InMemoryRunStore
    from ._sqlite import SqliteStore, default_db_path

_EXPORTS: dict[str, tuple[str, ...]] = {
    "_memory": ("InMemoryRunStore",),
    "_sqlite": ("SqliteStore", "default_db_path"),
}
"""Each submodule and the public names it provides."""

_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = ["InMemoryRunStore", "SqliteStore", "default_db_path"]


if not _typing.TYPE_CHECKING:  # hidden from type checkers, so a misspelt name stays an error

    def __getattr__(name: str) -> object:
        """A public name, imported from its submodule on first use (PEP 562) and then cached."""
        try:
            module = _MODULE_OF[name]
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = getattr(_import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
