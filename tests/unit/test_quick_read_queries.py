"""The command line's quick listings read what they show, not every row of a kind: each query
they added is an index search (outside tester 122: ``requests list`` read every run in
progress, 0.9 s at 100,000 never started; ``runs list --status failed`` every answer waiting)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from workflow_engine import WorkflowRunState
from workflow_engine.storage import SqliteStore
from workflow_engine.storage._sql import (
    RUN_STATUSES,
    SQL_ANSWERED_COUNT_OF_RUN,
    SQL_ANSWERED_COUNTS,
    SQL_DAMAGED_RUN,
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


def test_the_statuses_a_damaged_run_is_told_from_are_every_run_status() -> None:
    assert set(RUN_STATUSES) == {state.value for state in WorkflowRunState}


@pytest.mark.parametrize("status", [None, "sleeping", "IDLE", "idle ", "", 7, b"idle"])
def test_a_run_of_no_status_is_found_and_one_of_a_status_is_not(
    schema: sqlite3.Connection, status: object
) -> None:
    """Among runs of every status, the one whose status is damaged (NULL, other text, a
    number, a blob) is what the gap seeks find; with none damaged, nothing is."""
    rows = [(f"r{i}", value) for i, value in enumerate(RUN_STATUSES)]
    with schema:
        schema.execute("DROP INDEX ix_runs_status")  # (a table without NOT NULL, same index)
        schema.execute("ALTER TABLE runs RENAME TO runs_declared")
        schema.execute("CREATE TABLE runs AS SELECT * FROM runs_declared WHERE 0")
        schema.execute("CREATE INDEX ix_runs_status ON runs (status)")
        for run_id, value in rows:
            schema.execute("INSERT INTO runs (run_id, status) VALUES (?, ?)", (run_id, value))
    assert schema.execute(SQL_DAMAGED_RUN).fetchone() is None
    with schema:
        schema.execute("INSERT INTO runs (run_id, status) VALUES ('bad', ?)", (status,))
    found = schema.execute(SQL_DAMAGED_RUN).fetchone()
    assert found is not None and found[0] == "bad", found
