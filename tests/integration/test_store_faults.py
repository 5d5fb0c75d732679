"""Bad files and faults give a specific error naming what was wrong, and write nothing half."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.integration.cli_harness import ENGINE
from tests.integration.workflows import outcomes, stepper_workflow
from workflow_engine import (
    CHECKPOINT_SCHEMA_VERSION,
    CheckpointVersionError,
    Executor,
    Runtime,
    SchemaVersionError,
    StorageError,
    StoreCorruptError,
    StoreLockedError,
    StoreUnavailableError,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine.storage import SqliteStore
from workflow_engine.storage._schema import SCHEMA_VERSION
from workflow_engine.storage._sql import (
    REQUEST_STATUSES,
    SQL_DAMAGED_REQUEST,
    SQL_DAMAGED_REQUEST_OF_RUN,
)

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


def runtime(path: Path, **kwargs) -> Runtime:
    rt = Runtime(SqliteStore(path, **kwargs))
    rt.register(stepper_workflow)
    return rt


async def test_corrupted_checkpoint_record_names_run_and_record(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    rt = runtime(db)
    paused = await rt.run("stepper", 1)
    await rt.close()
    with sqlite3.connect(db) as raw:
        (checkpoint_id,) = raw.execute(
            "SELECT checkpoint_id FROM checkpoints WHERE seq = 2 AND run_id = ?", (paused.run_id,)
        ).fetchone()
        raw.execute(
            "UPDATE checkpoints SET body = '{\"superstep\": [' WHERE checkpoint_id = ?",
            (checkpoint_id,),
        )
    rt = runtime(db)
    with pytest.raises(StoreCorruptError) as info:
        await rt.resume(paused.run_id)
    assert paused.run_id in str(info.value) and checkpoint_id in str(info.value)
    assert (await rt.store.get_run(paused.run_id)).owner is None  # the lease was released
    await rt.close()


@pytest.mark.parametrize("marked", ["body", "column"])
@pytest.mark.parametrize("kind", ["snapshot", "delta"])
async def test_checkpoint_from_a_newer_engine_is_refused_by_name(
    tmp_path: Path, kind: str, marked: str
) -> None:
    """A checkpoint row whose schema_version (in its JSON body, or in the row's column alone)
    is above what this engine reads is not read as this layout (it could drop state it does
    not know): resuming names the run, the checkpoint and the versions, writes nothing and
    releases the lease."""
    db = tmp_path / "runs.db"
    rt = runtime(db)
    paused = await rt.run("stepper", 1)
    await rt.close()
    with sqlite3.connect(db) as raw:
        checkpoint_id, body = raw.execute(
            "SELECT checkpoint_id, body FROM checkpoints WHERE run_id = ? AND kind = ? "
            "ORDER BY seq DESC LIMIT 1",
            (paused.run_id, kind),
        ).fetchone()
        if marked == "body":
            data = json.loads(body)
            data["schema_version"] = 99
            raw.execute(
                "UPDATE checkpoints SET body = ? WHERE checkpoint_id = ?",
                (json.dumps(data), checkpoint_id),
            )
        else:
            raw.execute(
                "UPDATE checkpoints SET schema_version = 99 WHERE checkpoint_id = ?",
                (checkpoint_id,),
            )
        before = raw.execute("SELECT count(*) FROM checkpoints").fetchone()
    rt = runtime(db)
    with pytest.raises(CheckpointVersionError) as info:
        await rt.resume(paused.run_id)
    message = str(info.value)
    assert paused.run_id in message and checkpoint_id in message, message
    assert "schema version 99" in message and "newer workflow-engine" in message, message
    record = await rt.store.get_run(paused.run_id)
    assert record.owner is None  # the lease was released
    assert record.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    await rt.close()
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT count(*) FROM checkpoints").fetchone() == before


def _newest_row(db: Path, run_id: str) -> str:
    with sqlite3.connect(db) as raw:
        (checkpoint_id,) = raw.execute(
            "SELECT checkpoint_id FROM checkpoints WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
            (run_id,),
        ).fetchone()
    return str(checkpoint_id)


async def _paused(db: Path, run_id: str | None = None) -> tuple[str, str]:
    """A stepper run paused in ``db``: its id, and the id of its newest checkpoint row."""
    rt = runtime(db)
    paused = await rt.run("stepper", 1, run_id=run_id)
    await rt.close()
    return paused.run_id, _newest_row(db, paused.run_id)


def _set_in_body(db: Path, checkpoint_id: str, field: str, value: object) -> None:
    with sqlite3.connect(db) as raw:
        (body,) = raw.execute(
            "SELECT body FROM checkpoints WHERE checkpoint_id = ?", (checkpoint_id,)
        ).fetchone()
        data = json.loads(body)
        data[field] = value
        raw.execute(
            "UPDATE checkpoints SET body = ? WHERE checkpoint_id = ?",
            (json.dumps(data), checkpoint_id),
        )


def _set_body_version(db: Path, checkpoint_id: str, version: object) -> None:
    _set_in_body(db, checkpoint_id, "schema_version", version)


@pytest.mark.parametrize("run_id", ["resume", "4", "engine"])
async def test_a_newer_body_is_named_whatever_the_run_is_called(
    tmp_path: Path, run_id: str
) -> None:
    """A run id that happens to be a word of the refusal still gets the run and the checkpoint
    named (tester 80: ``resume`` and ``4`` got a message naming neither)."""
    db = tmp_path / "runs.db"
    _, checkpoint_id = await _paused(db, run_id)
    _set_body_version(db, checkpoint_id, 99)
    rt = runtime(db)
    with pytest.raises(CheckpointVersionError) as info:
        await rt.resume(run_id)
    message = str(info.value)
    assert message.startswith(f"run {run_id!r}: checkpoint {checkpoint_id} "), message
    assert "schema version 99, written by a newer workflow-engine" in message, message
    await rt.close()


async def test_a_refused_resume_leaves_a_paused_run_with_its_answer_as_it_was(
    tmp_path: Path,
) -> None:
    """Taking the lease to apply a stored answer marks the run in progress; when its checkpoint
    then cannot be read, nothing ran, and the run is left paused, not "interrupted" (tester 80)."""
    db = tmp_path / "runs.db"
    rt = runtime(db)
    paused = await rt.run("stepper", 1)
    await rt.respond(paused.pending_requests[0].request_id, {"approved": True})
    await rt.close()
    checkpoint_id = _newest_row(db, paused.run_id)
    _set_body_version(db, checkpoint_id, 99)
    rt = runtime(db)
    with pytest.raises(CheckpointVersionError):
        await rt.resume(paused.run_id)
    record = await rt.store.get_run(paused.run_id)
    assert record.owner is None
    assert record.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    await rt.close()
    _set_body_version(db, checkpoint_id, 4)  # fixed: it goes on with the answer it had
    rt = runtime(db)
    done = await rt.resume(paused.run_id)
    assert done.status is WorkflowRunState.IDLE, (done.status, done.error)
    await rt.close()


@pytest.mark.parametrize("version", [99.5, "ninety", b"9", -7, 0])
async def test_a_version_column_no_engine_writes_is_damage(tmp_path: Path, version) -> None:
    db = tmp_path / "runs.db"
    run_id, checkpoint_id = await _paused(db)
    with sqlite3.connect(db) as raw:
        raw.execute(
            "UPDATE checkpoints SET schema_version = ? WHERE checkpoint_id = ?",
            (version, checkpoint_id),
        )
    rt = runtime(db)
    with pytest.raises(StoreCorruptError) as info:
        await rt.resume(run_id)
    message = str(info.value)
    assert run_id in message and checkpoint_id in message and "schema_version" in message
    assert (await rt.store.get_run(run_id)).owner is None
    await rt.close()


async def test_a_damaged_body_says_which_field_is_wrong(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    run_id, checkpoint_id = await _paused(db)
    _set_in_body(db, checkpoint_id, "superstep", "three")
    rt = runtime(db)
    with pytest.raises(StoreCorruptError) as info:
        await rt.resume(run_id)
    assert "superstep: Input should be a valid integer" in str(info.value), str(info.value)
    await rt.close()


async def test_history_says_a_row_of_an_unknown_kind_is_from_a_newer_engine(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    run_id, checkpoint_id = await _paused(db)
    with sqlite3.connect(db) as raw:
        raw.execute(
            "UPDATE checkpoints SET kind = 'patch', schema_version = ? WHERE checkpoint_id = ?",
            (CHECKPOINT_SCHEMA_VERSION + 1, checkpoint_id),
        )
    store = SqliteStore(db)
    with pytest.raises(CheckpointVersionError) as info:
        await store.history(run_id)
    message = str(info.value)
    assert f"checkpoint {checkpoint_id} (#" in message and ", patch) has schema" in message
    assert (
        run_id in message
        and checkpoint_id in message
        and f"version {CHECKPOINT_SCHEMA_VERSION + 1}" in message
    )
    await store.close()


async def test_truncated_database_file_is_reported_with_its_path(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    rt = runtime(db)
    await rt.run("stepper", 1)
    await rt.close()
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"runs.db{suffix}").unlink(missing_ok=True)
    data = db.read_bytes()
    db.write_bytes(data[: len(data) // 3])
    rt = runtime(db)
    with pytest.raises((StoreCorruptError, StoreUnavailableError)) as info:
        await rt.list_runs()
    assert str(db) in str(info.value)


async def test_garbage_file_is_not_a_database(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    db.write_bytes(b"this is not sqlite, just text " * 200)
    with pytest.raises(StoreCorruptError, match="runs.db"):
        await SqliteStore(db).open()


async def with_schema_edited(tmp_path: Path, statement: str, value: Any) -> Path:
    """A database with one run, whose index ``ix_runs_status`` ``statement`` then edits in the
    schema itself (parameters: ``value``, the index's name)."""
    db = tmp_path / "runs.db"
    rt = runtime(db)
    await rt.run("stepper", 1)
    await rt.close()
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA writable_schema = ON")
    conn.execute(statement, (value, "ix_runs_status"))
    conn.commit()
    conn.close()
    return db


@pytest.mark.slow  # two command lines
async def test_a_schema_damaged_into_bytes_that_are_not_utf8_is_named_as_damage(
    tmp_path: Path,
) -> None:
    """SQLite's message about such a schema quotes the bad byte, and Python's ``sqlite3`` fails
    to decode the message (a ``UnicodeDecodeError``, not a ``sqlite3.Error``): it is damage,
    named with the file, not a bare error -- nor "internal error", exit 1, on the command line
    (outside tester 137, who met it by flipping random bytes of a database)."""
    garbled = b"CREATE INDEX x \xa9 ON runs(status)"  # (0xa9: no UTF-8 text starts so)
    db = await with_schema_edited(
        tmp_path, "UPDATE sqlite_master SET sql = CAST(? AS TEXT) WHERE name = ?", garbled
    )
    rt = runtime(db)
    with pytest.raises(StoreCorruptError, match="damaged: malformed database schema") as info:
        await rt.list_runs()
    assert str(db) in str(info.value)
    await rt.close()
    for command in (["runs", "list"], ["resume", "nosuch"]):  # (a reading, a writing one)
        argv = [str(ENGINE), *command, "--db", str(db)]
        done = await anyio.to_thread.run_sync(
            functools.partial(subprocess.run, argv, capture_output=True, text=True, timeout=60)
        )
        assert done.returncode == 6, (command, done.returncode, done.stderr)
        assert "is damaged: malformed database schema" in done.stderr, done.stderr
        assert "internal error" not in done.stderr + done.stdout


async def test_a_schema_entry_named_in_bytes_that_are_not_utf8_is_named_as_damage(
    tmp_path: Path,
) -> None:
    """SQLite reads such a name, Python's ``sqlite3`` cannot: said as damage, not as a bare
    storage error (outside tester 140)."""
    renamed = "'ix_runs_st' || CAST(X'FF' AS TEXT)"
    db = await with_schema_edited(
        tmp_path,
        f"UPDATE sqlite_master SET name = {renamed}, sql = replace(sql, ?, {renamed}) "
        "WHERE name = ?",
        "ix_runs_status",
    )
    with pytest.raises(StoreCorruptError, match="is damaged: Could not decode to UTF-8"):
        await SqliteStore(db).open()


async def test_unusable_directory_is_reported(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    store = SqliteStore(blocker / "sub" / "runs.db")
    with pytest.raises(StoreUnavailableError, match="not-a-dir"):
        await store.open()


async def test_a_directory_given_as_the_database_is_named_as_one(tmp_path: Path) -> None:
    folder = tmp_path / "runs.db"
    folder.mkdir()
    with pytest.raises(StoreUnavailableError, match="runs.db: it is a directory, not a file"):
        await SqliteStore(folder).open()
    assert list(folder.iterdir()) == []


async def test_a_read_only_directory_says_why_even_reading_needs_it(tmp_path: Path) -> None:
    """``runs list`` on a database in a directory its user cannot write: one line that says
    why a read needs it, exit 6 (root runs it without its permission override)."""
    db = tmp_path / "ro" / "runs.db"
    rt = runtime(db)
    await rt.run("stepper", 1)
    await rt.close()
    for suffix in ("-wal", "-shm"):
        db.with_name(f"runs.db{suffix}").unlink(missing_ok=True)
    argv = [str(ENGINE), "runs", "list", "--db", str(db)]
    if os.geteuid() == 0:
        argv = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *argv]
    db.parent.chmod(0o555)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    finally:
        db.parent.chmod(0o755)
    assert done.returncode == 6, done
    assert "not writable" in done.stderr and "even to read it" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and sorted(os.listdir(db.parent)) == ["runs.db"]


@pytest.mark.parametrize(
    ("schema", "table"),
    [
        (["CREATE TABLE runs(x)", "CREATE TABLE requests(id TEXT)"], "runs"),
        (["CREATE TABLE RUNS(x)", "CREATE TABLE Journal(id TEXT)"], "RUNS"),  # (case ignored)
        (["CREATE TABLE ledger(x)", "CREATE VIEW runs AS SELECT x FROM ledger"], "ledger"),
        (["CREATE TABLE ledger(x)", "CREATE INDEX checkpoints ON ledger(x)"], "ledger"),
    ],
    ids=["tables", "other-case", "view", "index"],
)
@pytest.mark.slow  # (3 s of the fast tier's minute; `make test` runs it)
async def test_another_program_s_tables_by_our_names_are_refused_untouched(
    tmp_path: Path, schema: list[str], table: str
) -> None:
    """Another program's database whose tables happen to be named ``runs`` and ``requests``:
    opening it as a store is refused by name, and the file is left exactly as it was -- its
    tables, no table of ours, not switched to WAL. It was migrated (our columns added to its
    ``runs``, stamped as ours) and then failed at every write (outside tester 86); ``serve``
    listened on it."""
    db = tmp_path / "payroll.db"
    other = sqlite3.connect(db)
    for statement in schema:
        other.execute(statement)
    other.execute(f"INSERT INTO {table} VALUES ('payroll')")
    other.commit()
    other.close()

    def schema() -> list[tuple[str, str]]:
        with sqlite3.connect(db) as conn:
            return conn.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()

    before = schema()
    with pytest.raises(StoreUnavailableError, match="another program's tables"):
        await SqliteStore(db).open()
    serve = [str(ENGINE), "serve", "--port", "0", "--db", str(db)]
    done = subprocess.run(serve, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 6, done
    assert "another program's tables" in done.stderr and "Traceback" not in done.stderr
    assert schema() == before
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert conn.execute(f"SELECT x FROM {table}").fetchall() == [("payroll",)]


async def test_lock_held_past_the_busy_timeout(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    rt = runtime(db, busy_timeout=0.2)
    paused = await rt.run("stepper", 1)
    blocker = sqlite3.connect(db, isolation_level=None, timeout=0)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(StoreLockedError, match="locked by another writer"):
            await rt.respond(paused.pending_requests[0].request_id, {"approved": True})
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    # nothing was half-written: the request is still pending and can be answered now
    (pending,) = await rt.pending_requests()
    assert pending.status == "pending"
    await rt.respond(pending.request_id, {"approved": True})
    assert (await rt.resume(paused.run_id)).status is WorkflowRunState.IDLE
    await rt.close()


async def test_database_from_a_newer_version_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = SqliteStore(db)
    await store.open()
    await store.close()
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE we_schema SET version = version + 5")
    with pytest.raises(SchemaVersionError, match="newer workflow-engine"):
        await SqliteStore(db).open()


async def test_wal_mode_and_synchronous_setting(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "runs.db", synchronous="FULL")
    await store.open()
    await store.close()
    with sqlite3.connect(tmp_path / "runs.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(ValueError, match="NORMAL or FULL"):
        SqliteStore(tmp_path / "x.db", synchronous="OFF")


async def test_older_database_is_migrated_forward(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    rt = runtime(db)
    paused = await rt.run("stepper", 1)
    await rt.close()
    with sqlite3.connect(db) as raw:  # make it look like a version-1 database (no journal)
        raw.execute("DROP TABLE journal")
        raw.execute("UPDATE we_schema SET version = 1")
    rt = runtime(db)
    await rt.respond(paused.pending_requests[0].request_id, {"approved": True})
    assert (await rt.resume(paused.run_id)).status is WorkflowRunState.IDLE
    await rt.close()
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT version FROM we_schema").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute("SELECT count(*) FROM journal").fetchone()[0] >= 0


async def test_version_2_database_gains_step_identity_columns(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    rt = runtime(db)
    paused = await rt.run("stepper", 1)
    await rt.close()
    with sqlite3.connect(db) as raw:  # as version 2 wrote it: no cancel flag, no journal step
        raw.execute("ALTER TABLE runs DROP COLUMN cancel_requested")
        raw.execute("ALTER TABLE journal DROP COLUMN superstep")
        raw.execute("UPDATE we_schema SET version = 2")
    rt = runtime(db)
    await rt.respond(paused.pending_requests[0].request_id, {"approved": True})
    assert (await rt.resume(paused.run_id)).status is WorkflowRunState.IDLE
    await rt.close()
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT version FROM we_schema").fetchone()[0] == SCHEMA_VERSION
        columns = {row[1] for row in raw.execute("PRAGMA table_info(runs)")}
        assert "cancel_requested" in columns
        columns = {row[1] for row in raw.execute("PRAGMA table_info(journal)")}
        assert "superstep" in columns


TRUNCATED_READER = """
import json, sys, time
import anyio
from workflow_engine import StorageError
from workflow_engine.storage import SqliteStore

async def main(db, run_ids):
    store = SqliteStore(db)
    errors = {}
    for run_id in run_ids:
        await store.latest(run_id)
    print("ready", flush=True)
    sys.stdin.readline()  # the file has been cut short
    for _ in range(3):
        for run_id in run_ids:
            try:
                await store.latest(run_id)
            except StorageError as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
    print(json.dumps(errors), flush=True)
    await store.close()

anyio.run(main, sys.argv[1], sys.argv[2:])
"""


async def test_a_file_cut_short_under_a_reading_process_is_an_error_not_a_crash(
    tmp_path: Path,
) -> None:
    """Another tool truncates the database while a process reads it (a restore copied over
    it): reads fail with errors the store names, or still see pages they cached; the process
    lives. A memory-mapped store died of SIGBUS here (outside tester)."""
    from tests.integration.chat_workflow import NAME, build_chat, user_message

    db = tmp_path / "cut.db"
    rt = Runtime(SqliteStore(db))
    rt.register(build_chat)
    run_ids = [(await rt.run(NAME, user_message(n) + " x" * 20_000)).run_id for n in range(40)]
    await rt.close()  # the WAL is checkpointed into the file
    size = db.stat().st_size
    assert size > 1_000_000
    reader = subprocess.Popen(
        [sys.executable, "-c", TRUNCATED_READER, str(db), *run_ids],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert reader.stdout is not None and reader.stdin is not None
    assert reader.stdout.readline().strip() == "ready"
    os.truncate(db, size // 3)
    out, err = reader.communicate("go\n", timeout=60)
    assert reader.returncode == 0, (reader.returncode, err[-2000:])
    errors = json.loads(out.strip().splitlines()[-1])
    assert set(errors) <= {"StoreCorruptError", "StorageError", "StoreUnavailableError"}, errors


async def test_a_new_file_another_program_holds_locked_is_waited_for(tmp_path: Path) -> None:
    """A database file another program created (not in WAL mode yet) and is writing: SQLite
    answers the switch to WAL with "locked" at once, without its busy wait -- the store waits
    for the lock itself, up to ``busy_timeout``, and says so honestly when it gives up."""
    db = tmp_path / "runs.db"
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")

    async def commit_later() -> None:
        await anyio.sleep(0.4)
        blocker.execute("COMMIT")

    rt = runtime(db, busy_timeout=5.0)
    start = time.monotonic()
    async with anyio.create_task_group() as tg:
        tg.start_soon(commit_later)
        paused = await rt.run("stepper", 1)
    assert 0.3 < time.monotonic() - start < 4.0
    assert paused.pending_requests
    await rt.close()
    blocker.close()

    other = tmp_path / "other.db"
    blocker = sqlite3.connect(other, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        store = SqliteStore(other, busy_timeout=0.3)
        start = time.monotonic()
        with pytest.raises(StoreLockedError, match=r"for more than 0\.3 s"):
            await store.open()
        assert time.monotonic() - start >= 0.3
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


class _Slow(Executor):
    """Sleeps ``seconds`` in its step, then passes the number on (or, at 0, yields it)."""

    @handler
    async def step(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        await anyio.sleep(0.3)
        if n:
            await ctx.send_message(n - 1)
        else:
            await ctx.yield_output(n)


@pytest.mark.slow
async def test_a_commit_a_held_lock_refuses_leaves_the_run_interrupted_to_resume(
    tmp_path: Path,
) -> None:
    """Another writer holds the lock past the busy timeout while a superstep commits: the
    caller gets ``StoreLockedError`` (once the lease is given back: that write waits the lock
    out), and the run is not the one at fault -- it is left interrupted (in progress, no
    error recorded, no live lease), and ``resume`` finishes it. The README said such a run
    was recorded FAILED (outside tester 174)."""
    db = tmp_path / "runs.db"
    slow = _Slow("slow")
    workflow = WorkflowBuilder("slow", start=slow).add_edge(slow, slow).build()
    rt = Runtime(SqliteStore(db, busy_timeout=0.3))
    rt.register(workflow)
    blocker = sqlite3.connect(db, isolation_level=None)

    async def lock_mid_step() -> None:
        await anyio.sleep(0.45)  # inside the second superstep, whose commit comes at ~0.6 s
        blocker.execute("BEGIN IMMEDIATE")
        await anyio.sleep(1.05)  # past that commit's 0.3 s wait
        blocker.execute("ROLLBACK")

    refused: list[BaseException] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(lock_mid_step)
        try:
            await rt.run("slow", 3, run_id="r")
        except StoreLockedError as exc:
            refused.append(exc)
    assert [type(e) for e in refused] == [StoreLockedError], refused
    blocker.close()
    record = await rt.store.get_run("r")
    assert record is not None
    assert record.status is WorkflowRunState.IN_PROGRESS and record.error is None
    assert record.live_owner(time.time()) is None
    done = await rt.resume("r")
    assert done.status is WorkflowRunState.IDLE and done.outputs == [0]
    await rt.close()


# --- values larger than SQLite stores ------------------------------------------------------------

LIMIT = 50_000  # SQLite's per-value limit, lowered: it stands in for the real 1,000,000,000 bytes


class _Big(Executor):
    """Yields, asks or journals a value of ``size`` characters, as the start message says."""

    @handler
    async def go(self, job: list, ctx: WorkflowContext[None, str]) -> None:
        how, size = job
        if how == "output":
            await ctx.yield_output("x" * size)
        elif how == "request":
            await ctx.request_info("y" * size, str)
        elif how == "journal":

            async def fetch() -> str:
                return "z" * size

            await ctx.run_once("fetch", fetch)
            await ctx.yield_output("journaled")
        else:  # a small request, answered with a big answer
            await ctx.request_info("a question", str)

    @response_handler
    async def answered(self, asked: str, answer: str, ctx: WorkflowContext[None, str]) -> None:
        await ctx.yield_output(answer[:10])


def _big_workflow() -> Workflow:
    return WorkflowBuilder("big", start=_Big("big")).build()


async def _limited_runtime(path: Path) -> Runtime:
    """A runtime whose store takes values of at most ``LIMIT`` bytes."""
    store = SqliteStore(path)
    rt = Runtime(store)
    rt.register(_big_workflow)
    await store.open()
    store._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, LIMIT)  # type: ignore[union-attr]
    return rt


@pytest.mark.parametrize("how", ["output", "request", "journal"])
async def test_a_value_too_big_for_sqlite_fails_its_run_by_name_and_no_other(
    tmp_path: Path, how: str
) -> None:
    rt = await _limited_runtime(tmp_path / "runs.db")
    small = [await rt.start("big", ["output", 10]) for _ in range(3)]
    big = await rt.start("big", [how, 2 * LIMIT])
    results = await outcomes([functools.partial(rt.resume, r) for r in [*small, big]])
    *fine, failed = results
    assert [r.outputs for r in fine] == [["x" * 10]] * 3  # (sharing its group commit)
    if how == "journal":  # the step's own write: the step fails (the run is recorded failed)
        assert failed.status is WorkflowRunState.FAILED, failed
        assert failed.error.code == "storage_error" and failed.error.executor_id == "big"
        message = failed.error.message
    else:  # the superstep's commit: the caller gets the store's error
        assert isinstance(failed, StorageError), failed
        message = str(failed)
    assert big in message and f"{LIMIT:,} bytes" in message
    assert "more than SQLite stores in one value" in message
    if how == "journal":
        # the step's result: it ran (outside tester 128: the message did not say so)
        assert "the result of step '1/big/" in message and "/fetch', which ran" in message
    info = await rt.get_run(big)
    assert info.status is WorkflowRunState.FAILED and info.error is not None
    assert info.error["message"] == message
    await rt.close()


async def test_an_answer_too_big_for_sqlite_is_refused_by_name_and_nothing_stored(
    tmp_path: Path,
) -> None:
    rt = await _limited_runtime(tmp_path / "runs.db")
    paused = await rt.run("big", ["answer", 0])
    (request,) = paused.pending_requests
    with pytest.raises(StorageError) as info:
        await rt.respond(request.request_id, "w" * (2 * LIMIT))
    named = f"run {paused.run_id!r}: the answer to request {request.request_id!r} is"
    assert named in str(info.value), str(info.value)
    assert (await rt.store.get_request(request.request_id)).status == "pending"
    await rt.respond(request.request_id, "a fine answer")
    assert (await rt.resume(paused.run_id)).outputs == ["a fine ans"]
    await rt.close()


async def test_an_answer_whose_row_is_too_big_for_sqlite_names_both_parts(tmp_path: Path) -> None:
    """Each value under SQLite's limit, the request's row over it: named too (it was SQLite's
    bare "string or blob too big")."""
    rt = await _limited_runtime(tmp_path / "runs.db")
    paused = await rt.run("big", ["request", LIMIT * 6 // 10])
    (request,) = paused.pending_requests
    with pytest.raises(StorageError) as info:
        await rt.respond(request.request_id, "w" * (LIMIT * 6 // 10))
    message = str(info.value)
    named = f"run {paused.run_id!r}: the answer to request {request.request_id!r}"
    assert f"{named} is 30,002 bytes" in message, message
    assert "with the request's data (30,002 bytes) and the rest of its row" in message
    assert f"more than SQLite stores in one row ({LIMIT:,} bytes)" in message
    assert (await rt.store.get_request(request.request_id)).status == "pending"
    await rt.close()


class _Raiser(Executor):
    @handler
    async def go(self, size: int, ctx: WorkflowContext[None, str]) -> None:
        raise RuntimeError("e" * size)


async def test_a_handler_error_too_long_to_store_is_recorded_cut(tmp_path: Path) -> None:
    """A failing handler whose message is longer than the store takes: the run is recorded
    FAILED with the message's start, saying how much was left out -- it was left
    ``in_progress`` (shown "interrupted"), its error unrecorded."""
    from workflow_engine._events import RECORDED_MESSAGE

    store = SqliteStore(tmp_path / "runs.db")
    rt = Runtime(store)
    rt.register(WorkflowBuilder("raiser", start=_Raiser("raiser")).build())
    await store.open()
    # the message itself (3 x the cut) would not fit; what is recorded does
    store._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 2 * RECORDED_MESSAGE)  # type: ignore[union-attr]
    result = await rt.run("raiser", 3 * RECORDED_MESSAGE)
    assert result.status is WorkflowRunState.FAILED
    assert result.error is not None and len(result.error.message) == 3 * RECORDED_MESSAGE
    info = await rt.get_run(result.run_id)
    assert info.status is WorkflowRunState.FAILED and info.error is not None
    recorded = info.error["message"]
    assert recorded.startswith("e" * RECORDED_MESSAGE)
    assert recorded.endswith(f" ... ({2 * RECORDED_MESSAGE:,} more characters not recorded)")
    # the traceback's last line repeats the message: cut too, the frames kept
    more = len("RuntimeError: ") + 3 * RECORDED_MESSAGE - 1_000
    assert info.error["traceback"].endswith(f"eee ... ({more:,} more characters)")
    assert "in go" in info.error["traceback"]
    await rt.close()


@pytest.mark.parametrize("resume", ["resume", "respond_and_resume"])
async def test_a_resume_names_a_request_of_its_run_whose_status_is_damaged(
    tmp_path: Path, resume: str
) -> None:
    """The run paused again on it as if nothing were wrong, and an answer whose row was
    damaged was ignored (outside tester 118). The resume raises before it takes the lease."""
    db = tmp_path / "runs.db"
    run_id, _ = await _paused(db)
    rt = runtime(db)
    [request] = (await rt.get_run(run_id)).pending_requests
    await rt.close()
    with sqlite3.connect(db) as raw:
        raw.execute(
            "UPDATE requests SET status = 'answerd' WHERE request_id = ?", (request.request_id,)
        )
    rt = runtime(db)
    with pytest.raises(StoreCorruptError, match=f"request '{request.request_id}' is damaged"):
        if resume == "resume":
            await rt.resume(run_id)
        else:
            await rt.respond_and_resume(request.request_id, {"approved": True})
    assert (await rt.store.get_run(run_id)).owner is None
    await rt.close()


_STATUS_VALUES = st.one_of(
    st.sampled_from(["pending", "answered", "applied", "cancelled"]),
    st.sampled_from(["", "answere", "answeredd", "applie", "appliedx", "cancelle", "pendin"]),
    st.sampled_from(["pendingz", "Pending", "answered\x00", "zzz", "\U0001f600"]),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=10),
    st.binary(max_size=6),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
)


@settings(max_examples=150, deadline=None)
@given(value=_STATUS_VALUES)
def test_the_damaged_status_look_up_finds_exactly_the_statuses_that_are_none_of_the_four(
    paused_db: tuple[Path, str], value: object
) -> None:
    """The look-up seeks the gaps of the status indexes around the four statuses (it scanned
    every request of a run before): whatever a request's status holds -- another text, text
    sorting just beside one of the four, a blob, a number -- both queries (the inbox's, of all
    runs; a run's) find it exactly when it is none of the four, among requests that are."""
    db, run_id = paused_db
    with sqlite3.connect(db) as raw:
        raw.execute("UPDATE requests SET status = ? WHERE request_id = 'target'", (value,))
        stored = raw.execute("SELECT status FROM requests WHERE request_id = 'target'").fetchone()
        damaged = stored[0] not in REQUEST_STATUSES
        for text, args in ((SQL_DAMAGED_REQUEST, ()), (SQL_DAMAGED_REQUEST_OF_RUN, (run_id,))):
            found = raw.execute(text, args).fetchall()
            assert [row[0] for row in found] == (["target"] if damaged else [])


@pytest.fixture(scope="module")
def paused_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A paused run whose requests hold each of the four statuses many times over, and one
    request (``target``) whose status a test sets."""
    db = tmp_path_factory.mktemp("statuses") / "runs.db"
    run_id, _ = anyio.run(_paused, db)
    with sqlite3.connect(db) as raw:
        columns = [row[1] for row in raw.execute("PRAGMA table_info(requests)")]
        row = dict(zip(columns, raw.execute("SELECT * FROM requests").fetchone(), strict=True))
        copies = []
        for i in range(400):
            status = sorted(REQUEST_STATUSES)[i % 4]
            copies.append({**row, "request_id": f"copy-{i}", "status": status})
        copies.append({**row, "request_id": "target"})
        marks = ", ".join("?" for _ in columns)
        raw.executemany(
            f"INSERT INTO requests ({', '.join(columns)}) VALUES ({marks})",
            [tuple(c[k] for k in columns) for c in copies],
        )
    return db, run_id
