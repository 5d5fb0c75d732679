"""Checked by mypy in ``make test`` (not collected by pytest): names a package imports on first
use (``storage.InMemoryRunStore``) still have their real types for a type checker.

Each ``type: ignore[...]`` marks a line that must be an error; mypy runs with
``warn_unused_ignores``, so if the name degraded to ``Any`` the check fails.
"""

from __future__ import annotations

import workflow_engine.storage as storage
from workflow_engine.storage import InMemoryRunStore, SqliteStore


def stores() -> tuple[InMemoryRunStore, SqliteStore]:
    memory: InMemoryRunStore = storage.InMemoryRunStore()
    not_a_store: int = InMemoryRunStore()  # type: ignore[assignment]
    return memory, SqliteStore(":memory:" if not_a_store else "runs.db")
