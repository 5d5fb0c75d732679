"""Looking runs and requests up by a prefix of their id (what the command line does with any
unique prefix) is a range of the id's index: exactly the ids that start with the prefix, in
order, whatever characters they hold -- next to the last code point, around the surrogates
that are not text, with a prefix that is a whole id or longer than every id."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workflow_engine import Executor, Runtime, WorkflowBuilder, WorkflowContext, handler
from workflow_engine.storage import SqliteStore
from workflow_engine.storage._records import ids_beside
from workflow_engine.storage._sql import SQL_RUN_IDS, SQL_RUN_IDS_BESIDE, following, prefix_query
from workflow_engine_cli._ids import short_ids

# characters next to the edges the successor of a prefix has to step over
EDGES = ["\x00", "\x7f", "\x80", "\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0010ffff"]
IDS = st.text(
    st.one_of(
        st.sampled_from([*EDGES, "a", "b", "0", "f"]), st.characters(exclude_categories=("Cs",))
    ),
    min_size=1,
    max_size=6,
)


class _Echo(Executor):
    @handler
    async def on_text(self, text: str, ctx: WorkflowContext[None, str]) -> None:
        await ctx.yield_output(text)


@pytest.fixture(scope="module")
def runs_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[sqlite3.Connection]:
    """A store's database with one real run, whose row the examples copy under other ids."""
    db = tmp_path_factory.mktemp("prefixes") / "runs.db"

    async def one_run() -> None:
        runtime = Runtime(SqliteStore(db))
        runtime.register(WorkflowBuilder("echo", start=_Echo("echo")).build())
        await runtime.run("echo", "hi")
        await runtime.close()

    anyio.run(one_run)
    with sqlite3.connect(db, isolation_level=None) as conn:
        yield conn


@settings(max_examples=200, deadline=None)
@given(ids=st.lists(IDS, unique=True, max_size=12), data=st.data())
def test_a_prefix_finds_exactly_the_ids_that_start_with_it(
    runs_db: sqlite3.Connection, ids: list[str], data: st.DataObject
) -> None:
    conn = runs_db
    columns = [row[1] for row in conn.execute("PRAGMA table_info(runs)")]
    template = dict(
        zip(columns, conn.execute("SELECT * FROM runs LIMIT 1").fetchone(), strict=True)
    )
    conn.execute("BEGIN")
    try:
        conn.execute("DELETE FROM runs WHERE run_id != ?", (template["run_id"],))
        for number, run_id in enumerate(ids, start=2):
            row = {**template, "run_id": run_id, "run_no": number}
            marks = ", ".join("?" for _ in columns)
            conn.execute(f"INSERT INTO runs VALUES ({marks})", [row[c] for c in columns])
        every = sorted([*ids, template["run_id"]])
        prefixes = [run_id[:cut] for run_id in ids for cut in range(1, len(run_id) + 1)]
        prefix = data.draw(st.sampled_from(prefixes) if prefixes else IDS, label="prefix")
        for given_prefix in (prefix, prefix + "\U0010ffff", ""):
            text, params = prefix_query(SQL_RUN_IDS, given_prefix)
            found = [row[0] for row in conn.execute(text, params)]
            assert found == [i for i in every if i.startswith(given_prefix)]
    finally:
        conn.execute("ROLLBACK")


@given(prefix=IDS)
def test_the_successor_of_a_prefix_follows_every_text_that_starts_with_it(prefix: str) -> None:
    after = following(prefix)
    if after is None:
        assert set(prefix) == {"\U0010ffff"}
        return
    assert after > prefix and not after.startswith(prefix)
    assert prefix + "\U0010ffff" * 3 < after  # (the greatest texts that start with it)
    assert all(not 0xD800 <= ord(c) <= 0xDFFF for c in after)


def test_a_prefix_look_up_reads_a_range_of_the_index(tmp_path: Path) -> None:
    """Not the whole index: an unknown id given to the command line read every run's id."""
    conn = sqlite3.connect(tmp_path / "plan.db")
    conn.execute("CREATE TABLE runs (run_id VARCHAR(64) NOT NULL, PRIMARY KEY (run_id))")
    text, params = prefix_query(SQL_RUN_IDS, "1dd0")
    plan = " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {text}", params))
    assert "run_id>? AND run_id<?" in plan, plan


@settings(max_examples=200, deadline=None)
@given(
    ids=st.lists(st.text("ab:/0", min_size=1, max_size=12), unique=True, min_size=1, max_size=30),
    data=st.data(),
)
def test_short_ids_from_the_ids_beside_the_shown_ones_are_those_among_all(
    ids: list[str], data: st.DataObject
) -> None:
    """A table reads only the stored ids next to the ones it shows; each shown id's shortest
    unique prefix among those is its shortest unique prefix among every id stored."""
    shown = data.draw(st.lists(st.sampled_from(ids), unique=True, min_size=1), label="shown")
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE runs (run_id VARCHAR(64) NOT NULL, PRIMARY KEY (run_id))")
    conn.executemany("INSERT INTO runs VALUES (?)", [(i,) for i in ids])
    among_all = short_ids(ids)
    beside = short_ids(ids_beside(conn, SQL_RUN_IDS_BESIDE, shown))
    assert {i: beside[i] for i in shown} == {i: among_all[i] for i in shown}
