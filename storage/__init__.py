"""Durable stores for workflow-engine runs: SQLite (WAL) and an in-memory twin for tests.

Both implement the kernel's ``RunStore`` contract and pass the same conformance suite. Each name
is imported on first use (PEP 562): ``import workflow_engine.storage`` loads no store, and a
process resuming runs from SQLite never loads the in-memory one.
"""

import typing as _typing

if _typing.TYPE_CHECKING:  # what type checkers and IDEs see; at run time see ``__getattr__``
    from ._location import default_db_path
    from ._memory import InMemoryRunStore
    from ._sqlite import SqliteStore

_EXPORTS: dict[str, tuple[str, ...]] = {
    "_location": ("default_db_path",),
    "_memory": ("InMemoryRunStore",),
    "_sqlite": ("SqliteStore",),
}
"""Each submodule and the public names it provides."""


__all__ = ["InMemoryRunStore", "SqliteStore", "default_db_path"]


if not _typing.TYPE_CHECKING:  # hidden from type checkers, so a misspelt name stays an error
    from workflow_engine._lazy import lazy_exports as _lazy_exports

    __getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
