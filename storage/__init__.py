"""Durable stores for workflow-engine runs: SQLite (WAL) and an in-memory twin for tests.

Both implement the kernel's ``RunStore`` contract and pass the same conformance suite.
``InMemoryRunStore`` is imported on first use (a process resuming runs from SQLite never needs it).
"""

import typing as _typing

from ._sqlite import SqliteStore, default_db_path

if _typing.TYPE_CHECKING:
    from ._memory import InMemoryRunStore

__all__ = ["InMemoryRunStore", "SqliteStore", "default_db_path"]


def __getattr__(name: str) -> object:
    """Names imported on first use (PEP 562)."""
    if name == "InMemoryRunStore":
        from ._memory import InMemoryRunStore

        globals()[name] = InMemoryRunStore
        return InMemoryRunStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
