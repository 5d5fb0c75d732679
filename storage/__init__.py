"""Durable stores for workflow-engine runs: SQLite (WAL) and an in-memory twin for tests.

Both implement the kernel's ``RunStore`` contract and pass the same conformance suite.
"""

from ._memory import InMemoryRunStore
from ._sqlite import SqliteStore, default_db_path

__all__ = ["InMemoryRunStore", "SqliteStore", "default_db_path"]
