"""``SqliteStore(path, read_only=True)``: what only reads leaves the file as it found it.

The command line's reading commands open the store so when they cannot answer from their quick
snapshot (an unknown or ambiguous id, a damaged row). Opened read-write, a store rewrote the
database header at opening (to start its WAL), upgraded an older schema, and on closing folded a
killed writer's WAL into the file and deleted it (outside tester 132) -- from a command that
says it writes nothing.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cli_harness import Cli
from tests.integration.workflows import Answer, stepper_workflow
from workflow_engine import (
    Runtime,
    StoreUnavailableError,
    UsageError,
    WorkflowRunState,
)
from workflow_engine.storage import SqliteStore
from workflow_engine.storage._schema import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

KILLED_WRITER = """
import os, signal, sys
import anyio
from tests.integration.workflows import stepper_workflow
from workflow_engine import Runtime
from workflow_engine.storage import SqliteStore

async def main(db):
    rt = Runtime(SqliteStore(db))
    rt.register(stepper_workflow)
    paused = await rt.run("stepper", 1)
    print(paused.run_id, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # its WAL stays beside the file, not folded in

anyio.run(main, sys.argv[1])
"""


def files_beside(db: Path) -> dict[str, str]:
    """Each of the database's files (itself, -wal, -shm) -> a digest of its bytes."""
    found = {}
    for suffix in ("", "-wal"):
        path = Path(f"{db}{suffix}")
        if path.exists():
            found[path.name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def killed_writer(db: Path) -> str:
    """A run paused by a process killed right after: its WAL (and -shm) left beside ``db``."""
    child = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(db)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr[-2000:]
    assert Path(f"{db}-wal").stat().st_size > 0
    return child.stdout.split()[0]


def reader(db: Path) -> Runtime:
    return runtime(db, read_only=True)


def writer(db: Path) -> Runtime:
    return runtime(db, read_only=False)


def runtime(db: Path, *, read_only: bool) -> Runtime:
    rt = Runtime(SqliteStore(db, read_only=read_only))
    rt.register(stepper_workflow)
    return rt


@pytest.mark.slow  # a real process, killed
async def test_reading_a_killed_writers_database_leaves_its_files_as_they_were(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    run_id = killed_writer(db)
    before = files_beside(db)
    rt = reader(db)
    info = await rt.get_run(run_id)  # (what the WAL holds: the run paused)
    assert info.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    assert [r.run_id for r in await rt.store.list_runs()] == [run_id]
    assert len(await rt.history(run_id)) >= 1
    [pending] = await rt.pending_requests(run_id)
    await rt.close()
    assert files_beside(db) == before  # not folded in, not deleted
    # a writer opening it later recovers that WAL as SQLite does: nothing was lost
    rt = writer(db)
    await rt.respond(pending.request_id, Answer(approved=True))
    assert (await rt.resume(run_id)).status is WorkflowRunState.IDLE
    await rt.close()


async def test_a_read_only_store_refuses_every_write_and_writes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    rt = writer(db)
    paused = await rt.run("stepper", 1)
    await rt.close()
    before = files_beside(db)
    assert list(before) == ["runs.db"]  # (closed cleanly: no WAL)
    rt = reader(db)
    request_id = paused.pending_requests[0].request_id
    with pytest.raises(UsageError, match="read_only: nothing was written"):
        await rt.respond(request_id, Answer(approved=True))
    with pytest.raises(UsageError, match="read_only"):
        await rt.run("stepper", 1)
    with pytest.raises(UsageError, match="read_only"):
        await rt.store.prune(keep_last=1)
    with pytest.raises(UsageError, match="read_only"):
        await rt.cancel(paused.run_id)
    assert (await rt.get_request(request_id)).status == "pending"
    await rt.close()
    assert files_beside(db) == before
    assert not any(p.name != "runs.db" for p in tmp_path.iterdir())  # no -wal, -shm left


async def test_a_read_only_store_does_not_upgrade_an_older_schema_nor_make_a_file(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    rt = writer(db)
    await rt.run("stepper", 1)
    await rt.close()
    with sqlite3.connect(db) as raw:  # as an older engine left it (the version alone differs)
        raw.execute("UPDATE we_schema SET version = ?", (SCHEMA_VERSION - 1,))
    raw.close()
    before = files_beside(db)
    store = SqliteStore(db, read_only=True)
    with pytest.raises(StoreUnavailableError, match="older than this workflow-engine's"):
        await store.list_runs()
    await store.close()
    assert files_beside(db) == before
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT version FROM we_schema").fetchone()[0] == SCHEMA_VERSION - 1
    raw.close()
    missing = tmp_path / "nowhere" / "runs.db"
    with pytest.raises(StoreUnavailableError, match="no database at"):
        await SqliteStore(missing, read_only=True).list_runs()
    assert not missing.parent.exists()


@pytest.mark.slow  # a real process, killed
async def test_reading_commands_leave_the_file_as_they_found_it(tmp_path: Path) -> None:
    """Through the command line, where its quick snapshot hands over to the store (an unknown
    id): on a database whose writer was killed (its WAL read where it is), and on one closed
    cleanly (no WAL made and left)."""
    cli = Cli(tmp_path / "cli")
    run_id = killed_writer(cli.db)
    before = files_beside(cli.db)
    assert "runs.db-wal" in before
    cli.expect(4, "runs", "show", "ffffffff")
    cli.expect(0, "runs", "show", run_id[:8])
    cli.expect(0, "requests", "list")
    assert files_beside(cli.db) == before
    rt = writer(cli.db)  # closed cleanly: the WAL folded in
    await rt.get_run(run_id)
    await rt.close()
    clean = files_beside(cli.db)
    assert list(clean) == ["runs.db"]
    cli.expect(4, "runs", "show", "ffffffff")
    cli.expect(0, "runs", "list")
    assert files_beside(cli.db) == clean
    assert not any(name.startswith("runs.db-") for name in os.listdir(cli.db.parent))


@pytest.mark.slow  # a real process, killed
async def test_a_wal_without_its_shm_is_read_in_place(tmp_path: Path) -> None:
    """A killed writer's WAL whose -shm was removed: the quick snapshot leaves such a file to
    the store, whose ordinary connection folded the WAL into the file on closing (outside tester
    133). Read now with a read-only connection: SQLite makes the -shm index it needs (left
    beside the file, as a killed writer's is); the file and its WAL stay as they were."""
    cli = Cli(tmp_path / "cli")
    run_id = killed_writer(cli.db)
    Path(f"{cli.db}-shm").unlink()
    before = files_beside(cli.db)
    listed = cli.json("runs", "list")
    assert [r["run_id"] for r in listed] == [run_id]
    cli.expect(4, "runs", "show", "ffffffff")
    assert files_beside(cli.db) == before
    rt = reader(cli.db)
    assert (await rt.get_run(run_id)).status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    await rt.close()
    assert files_beside(cli.db) == before
