"""The command line's quick listings read what they show, not every row of a kind: each query
they added is an index search (outside tester 122: ``requests list`` read every run in
progress, 0.9 s at 100,000 never started; ``runs list --status failed`` every answer waiting)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from workflow_engine.storage import SqliteStore
from workflow_engine.storage._sql import (
    SQL_ANSWERED_COUNT_OF_RUN,
    SQL_ANSWERED_COUNTS,
    SQL_RUNS_JOURNALED_PAST,
    SQL_RUNS_WITH_PENDING,
)


@pytest.fixture
def schema(tmp_path: Path) -> sqlite3.Connection:
    """A connection to a store's empty database (its tables and indexes as created)."""
    db = tmp_path / "plan.db"

    async def create() -> None:
        async with SqliteStore(db):
            pass

    anyio.run(create)
    return sqlite3.connect(db)


@pytest.mark.parametrize(
    ("query", "params"),
    [
        (SQL_RUNS_JOURNALED_PAST, ()),
        (SQL_RUNS_WITH_PENDING, ()),
        (SQL_ANSWERED_COUNTS, ()),
        (SQL_ANSWERED_COUNT_OF_RUN, ("r",)),
    ],
    ids=["journaled past", "with pending", "answered counts", "answered of a run"],
)
def test_each_query_searches_an_index(
    schema: sqlite3.Connection, query: str, params: tuple
) -> None:
    plan = [row[3] for row in schema.execute(f"EXPLAIN QUERY PLAN {query}", params)]
    assert not [step for step in plan if step.startswith("SCAN")], plan
    assert any("INDEX" in step for step in plan), plan
