"""Checkpoint rows keyed by position (schema v5): a commit writes few pages, older databases are
rebuilt without losing a row, and a status the store did not write is never kept by mistake."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from tests.integration.workflows import stepper_workflow
from workflow_engine import Runtime, WorkflowRunState
from workflow_engine.storage import SqliteStore
from workflow_engine.storage._schema import SCHEMA_VERSION
from workflow_engine.storage._sql import SQL_DOOMED, SQL_INSERT_CHECKPOINT
from workflow_engine.storage._sqlite import _prune_finished

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

FRAME = 4096 + 24  # a WAL frame: one page and its header

# The checkpoints table as schema version 4 declared it: keyed by checkpoint id, with a unique
# (run_id, seq) index that every commit wrote into.
V4_CHECKPOINTS = """
CREATE TABLE checkpoints_v4_layout (
    checkpoint_id VARCHAR(64) NOT NULL, run_id VARCHAR(64) NOT NULL, seq INTEGER NOT NULL,
    superstep INTEGER NOT NULL, kind VARCHAR(16) NOT NULL, status VARCHAR(40) NOT NULL,
    codec VARCHAR(64) NOT NULL, schema_version INTEGER NOT NULL, body TEXT NOT NULL,
    created_at FLOAT NOT NULL, PRIMARY KEY (checkpoint_id),
    CONSTRAINT uq_checkpoints_run_seq UNIQUE (run_id, seq),
    FOREIGN KEY(run_id) REFERENCES runs (run_id) ON DELETE CASCADE
)"""
CHECKPOINT_COLUMNS = (
    "checkpoint_id, run_id, seq, superstep, kind, status, codec, schema_version, body, created_at"
)


def as_version_4(db: Path) -> None:
    """Rewrite a database into the layout schema version 4 wrote."""
    with sqlite3.connect(db) as raw:
        raw.execute(V4_CHECKPOINTS)
        raw.execute(
            f"INSERT INTO checkpoints_v4_layout ({CHECKPOINT_COLUMNS}) "
            f"SELECT {CHECKPOINT_COLUMNS} FROM checkpoints ORDER BY checkpoint_id"
        )
        raw.execute("DROP TABLE checkpoints")
        raw.execute("ALTER TABLE checkpoints_v4_layout RENAME TO checkpoints")
        raw.execute("DROP INDEX ix_runs_run_no")
        raw.execute("ALTER TABLE runs DROP COLUMN run_no")
        raw.execute("UPDATE we_schema SET version = 4")


async def everything_stored(store: SqliteStore, run_ids: list[str]) -> dict:
    """Each run's history and every checkpoint of it as read back, by run."""
    out = {}
    for run_id in run_ids:
        history = await store.history(run_id)
        loaded = [(await store.load(i.checkpoint_id)).model_dump() for i in history]
        out[run_id] = (list(history), loaded)
    return out


async def test_a_version_4_database_is_rebuilt_keyed_by_position(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = SqliteStore(db, snapshot_every=8, span_every=3)
    rt = Runtime(store)
    rt.register(stepper_workflow(pause_at=30, stop_at=60, name="long"))
    rt.register(stepper_workflow(pause_at=99, stop_at=12, name="short"))
    paused = [await rt.run("long", 1) for _ in range(3)]
    finished = await rt.run("short", 1)
    assert finished.status is WorkflowRunState.IDLE
    run_ids = [r.run_id for r in paused] + [finished.run_id]
    before = await everything_stored(store, run_ids)
    await rt.close()
    as_version_4(db)

    store = SqliteStore(db, snapshot_every=8, span_every=3)
    rt = Runtime(store)
    rt.register(stepper_workflow(pause_at=30, stop_at=60, name="long"))
    rt.register(stepper_workflow(pause_at=99, stop_at=12, name="short"))
    await store.open()
    assert await everything_stored(store, run_ids) == before
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT version FROM we_schema").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
        names = {row[0] for row in raw.execute("SELECT name FROM sqlite_master")}
        assert "checkpoints_v4" not in names
        assert "checkpoints_in_place" in names  # the rebuilt table refuses rows out of place
        indexes = [row[1] for row in raw.execute("PRAGMA index_list(checkpoints)")]
        assert len(indexes) == 1, indexes  # the checkpoint id's; no (run_id, seq) index
        numbers = raw.execute("SELECT run_no FROM runs ORDER BY run_no").fetchall()
        assert len({n for (n,) in numbers}) == len(run_ids) and None not in numbers

    # the runs go on where they were, and new runs number themselves after the old ones
    for run in paused:
        await rt.respond(run.pending_requests[0].request_id, {"approved": True})
        done = await rt.resume(run.run_id)
        assert done.status is WorkflowRunState.IDLE, done.error
        assert done.outputs == [f"done: seen={list(range(1, 61))} total={sum(range(1, 61))}"]
    fresh = await rt.run("long", 1)
    history = await store.history(fresh.run_id)
    assert [i.checkpoint_id for i in history] == [
        (await store.load(i.checkpoint_id)).checkpoint_id for i in history
    ]
    await rt.close()
    with sqlite3.connect(db) as raw:
        numbers = [n for (n,) in raw.execute("SELECT run_no FROM runs")]
        assert len(set(numbers)) == len(run_ids) + 1
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


async def test_pruning_a_run_removes_exactly_its_checkpoints(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = SqliteStore(db)
    rt = Runtime(store)
    rt.register(stepper_workflow(pause_at=99, stop_at=5, name="short"))
    rt.register(stepper_workflow(pause_at=3, stop_at=6))
    done = [await rt.run("short", 1) for _ in range(3)]
    kept = await rt.run("stepper", 1)
    kept_history = await store.history(kept.run_id)
    sizes = [len(await store.history(r.run_id)) for r in done]
    removed = await store.prune(finished_before=store.clock() + 1)
    assert removed == sum(sizes) == 3 * 6
    for run in done:
        assert await store.history(run.run_id) == []
    assert await store.history(kept.run_id) == kept_history
    # the next run's number may be one a pruned run had: none of its rows are left to collide
    again = await rt.run("short", 1)
    assert len(await store.history(again.run_id)) == 6
    await rt.close()


async def test_a_superstep_commit_writes_few_pages(tmp_path: Path) -> None:
    """A superstep that leaves the run's status as it was writes the run's row and the two
    b-trees of its checkpoint row: about 3.6 WAL frames per commit here, where keying rows by
    checkpoint id with a (run_id, seq) index and rewriting the status index took 5.8. Counted
    from the WAL's growth (fewer commits than the store's background WAL checkpoint interval)."""
    db = tmp_path / "runs.db"
    store = SqliteStore(db)
    rt = Runtime(store)
    rt.register(stepper_workflow(pause_at=999, stop_at=90, name="chain"))
    await store.open()
    wal = Path(f"{db}-wal")
    start = wal.stat().st_size
    result = await rt.run("chain", 1)
    assert result.status is WorkflowRunState.IDLE, result.status
    commits = len(await store.history(result.run_id))  # the admission's, then one per superstep
    frames = (wal.stat().st_size - start) / FRAME
    await rt.close()
    assert commits == 91
    assert frames / commits < 4.5, f"{frames / commits:.2f} WAL frames per commit"


async def test_a_status_changed_behind_the_store_is_written_again(tmp_path: Path) -> None:
    """The store leaves an unchanged status out of its commit only if the row still holds the
    status its last commit wrote; a row changed by someone else gets the full update."""
    db = tmp_path / "runs.db"
    seen: list[str] = []
    commits = 0

    def hook(point: str) -> None:
        nonlocal commits
        if point != "commit:before":
            return
        commits += 1
        with sqlite3.connect(db) as raw:
            (status,) = raw.execute("SELECT status FROM runs").fetchone()
            seen.append(status)
            if commits == 4:  # between two in-progress commits
                raw.execute("UPDATE runs SET status = 'failed'")

    store = SqliteStore(db, fault_hook=hook)
    rt = Runtime(store)
    rt.register(stepper_workflow(pause_at=999, stop_at=8, name="chain"))
    # (a run id of our own: the run is admitted before its first commit, which then reads it)
    result = await rt.run("chain", 1, run_id="chain-1")
    await rt.close()
    assert result.status is WorkflowRunState.IDLE
    assert seen[4] == "in_progress", seen  # the commit after the tampering wrote it again
    assert seen.count("failed") == 0, seen
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT status FROM runs").fetchone()[0] == "idle"
        (by_index,) = raw.execute(
            "SELECT count(*) FROM runs INDEXED BY ix_runs_status WHERE status = 'idle'"
        ).fetchone()
        assert by_index == 1
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


async def test_an_older_engine_cannot_write_a_row_out_of_place(tmp_path: Path) -> None:
    """An engine before schema 5 that had the file open while it was upgraded inserts checkpoint
    rows without their place (its INSERT, verbatim below); SQLite would file such a row after the
    newest run's rows. It is refused by name, and nothing is written."""
    db = tmp_path / "runs.db"
    rt = Runtime(SqliteStore(db))
    rt.register(stepper_workflow())
    older = await rt.run("stepper", 1)
    newer = await rt.run("stepper", 1)
    await rt.close()
    with sqlite3.connect(db) as raw:
        before = raw.execute("SELECT count(*) FROM checkpoints").fetchone()[0]
        with pytest.raises(sqlite3.IntegrityError, match="out of place.*older version"):
            raw.execute(  # the statement of schema 4's store
                "INSERT INTO checkpoints (checkpoint_id, run_id, seq, superstep, kind, status, "
                "codec, schema_version, body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                ("c-old", older.run_id, 9, 9, "delta", "in_progress", "json", 2, "{}", 0.0),
            )
        with pytest.raises(sqlite3.IntegrityError, match="its run does not exist"):
            raw.execute(  # this version's statement, for a run that is not there
                SQL_INSERT_CHECKPOINT,
                (
                    "c-none",
                    "no-such-run",
                    0,
                    0,
                    "snapshot",
                    "idle",
                    "json",
                    2,
                    "{}",
                    0.0,
                    None,
                    None,
                    None,
                ),
            )
        assert raw.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == before
    store = SqliteStore(db)
    assert len(await store.history(newer.run_id)) == len(await store.history(older.run_id))
    await store.close()


async def pruning_steps(db: Path, kept: int) -> tuple[int, int]:
    """SQLite VM steps (in hundreds) the store's prune takes to remove 5 finished runs from a
    database that also holds ``kept`` paused runs, and how many checkpoint rows it removed."""
    rt = Runtime(SqliteStore(db))
    rt.register(stepper_workflow(pause_at=999, stop_at=20, name="finished"))
    rt.register(stepper_workflow(pause_at=20, stop_at=999, name="paused"))
    for _ in range(5):
        await rt.run("finished", 1)
    for _ in range(kept):
        await rt.run("paused", 1)
    await rt.close()
    steps = 0

    def count() -> int:
        nonlocal steps
        steps += 1
        return 0

    raw = sqlite3.connect(db, isolation_level=None)
    raw.execute("PRAGMA foreign_keys=ON")  # as the store's connection has it
    raw.set_progress_handler(count, 100)
    finished_before, now = time.time() + 1, time.time()
    doomed = [run_id for (run_id,) in raw.execute(SQL_DOOMED, (finished_before, now))]
    raw.execute("BEGIN IMMEDIATE")
    removed = _prune_finished(raw, doomed, finished_before, now)
    raw.execute("COMMIT")
    raw.close()
    return steps, removed


async def test_pruning_runs_does_not_read_the_checkpoints_of_the_others(tmp_path: Path) -> None:
    """A checkpoint row has no foreign key to its run: without an index on ``run_id``, deleting
    each run had SQLite scan every checkpoint row for children (pruning 300 of 600 runs took
    2.9 s, not 35 ms). The cost of pruning the same runs is now the same next to 4x as many
    other checkpoint rows."""
    few, removed = await pruning_steps(tmp_path / "few.db", kept=10)
    many, removed_too = await pruning_steps(tmp_path / "many.db", kept=40)
    assert removed == removed_too == 5 * 21
    assert many < few * 1.5, (few, many)
