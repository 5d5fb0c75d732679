"""Fixtures for tests against real stores: every test gets its own fresh SQLite file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from workflow_engine import RunStore
from workflow_engine.storage import InMemoryRunStore, SqliteStore


@pytest.fixture(params=["memory", "sqlite", "sqlite-snapshot-every-2"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RunStore]:
    """Each RunStore implementation; the conformance suite runs once per store."""
    if request.param == "memory":
        s: RunStore = InMemoryRunStore()
    elif request.param == "sqlite":
        s = SqliteStore(tmp_path / "runs.db")
    else:
        s = SqliteStore(tmp_path / "runs.db", snapshot_every=2)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "runs.db")
    try:
        yield s
    finally:
        await s.close()
