"""Leases and SQLite's one write lock (outside tester 84).

A lease runs from when it is written, not from when its write was asked for: a write that meets
another process's write lock waits for it (up to ``busy_timeout``), and the lease it writes -- a
commit's, a renewal's, an admission's -- must still last its full length from the moment it is
stored. Counted from before the wait, it ran out early, and another process took over a run
whose owner was alive and executing it (a lock held 1.5 s of a 2 s lease).

And a process polling a run that another live worker holds does not take the write lock for
each attempt: it reads the lease first, so the holder's own writes (its renewals) are not kept
waiting by the pollers.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.workflows import following, stepper_workflow
from workflow_engine import Checkpoint, Lease, RunBusyError
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

LEASE = 30.0
HOLD = 0.6
"""How long the other process keeps the write lock (well within ``busy_timeout``)."""

LOCKER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print(time.time(), flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


@contextmanager
def locked_by_another_process(db: Path) -> Iterator[float]:
    """Another process holds the database's write lock for ``HOLD`` seconds from the time
    yielded (its ``time.time()`` once it had the lock)."""
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(db), str(HOLD)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert locker.stdout is not None
        yield float(locker.stdout.readline())
    finally:
        locker.wait(timeout=30)
        if locker.stdout is not None:
            locker.stdout.close()


def stored_expiry(db: Path, run_id: str) -> float:
    with sqlite3.connect(db) as conn:
        (expires,) = conn.execute(
            "SELECT lease_expires_at FROM runs WHERE run_id = ?", (run_id,)
        ).fetchone()
    return float(expires)


Operation = Callable[[SqliteStore, Checkpoint], Awaitable[tuple[float, Lease]]]
"""Writes a lease while another process holds the lock: (when it took the lock, the lease)."""


async def _commit(store: SqliteStore, first: Checkpoint) -> tuple[float, Lease]:
    lease = await store.admit_and_acquire(first, "host-a:1:x", LEASE)
    with locked_by_another_process(store.path) as locked_at:
        return locked_at, await store.commit(lease, following(first, "c1"))


async def _renew(store: SqliteStore, first: Checkpoint) -> tuple[float, Lease]:
    lease = await store.admit_and_acquire(first, "host-a:1:x", LEASE)
    with locked_by_another_process(store.path) as locked_at:
        return locked_at, await store.renew(lease)


async def _admit_and_acquire(store: SqliteStore, first: Checkpoint) -> tuple[float, Lease]:
    with locked_by_another_process(store.path) as locked_at:
        return locked_at, await store.admit_and_acquire(first, "host-a:1:x", LEASE)


async def _admit_and_commit(store: SqliteStore, first: Checkpoint) -> tuple[float, Lease]:
    with locked_by_another_process(store.path) as locked_at:
        lease = await store.admit_and_commit(first, following(first, "c1"), "host-a:1:x", LEASE)
        return locked_at, lease


async def _acquire(store: SqliteStore, first: Checkpoint) -> tuple[float, Lease]:
    await store.admit(first)
    with locked_by_another_process(store.path) as locked_at:
        return locked_at, await store.acquire(first.run_id, "host-a:1:x", LEASE)


@pytest.mark.parametrize(
    "operation", [_commit, _renew, _admit_and_acquire, _admit_and_commit, _acquire]
)
async def test_a_lease_written_after_a_wait_for_the_lock_lasts_from_then(
    tmp_path: Path, operation: Operation
) -> None:
    db = tmp_path / "runs.db"
    store = SqliteStore(db)
    try:
        first = stepper_workflow().admit(1, run_id="r")
        locked_at, lease = await operation(store, first)
        expires = stored_expiry(db, "r")
        # written once the other process let go of the lock, at least HOLD after it took it
        assert expires >= locked_at + HOLD + LEASE, (expires - locked_at, HOLD + LEASE)
        assert lease.expires_at == expires  # what the holder counts on is what is stored
    finally:
        await store.close()


async def test_a_poller_refused_once_reads_the_lease_before_taking_the_lock(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    holder = SqliteStore(db)
    poller = SqliteStore(db, busy_timeout=0.05)  # it would give up on a held lock at once
    try:
        first = stepper_workflow().admit(1, run_id="r")
        lease = await holder.admit_and_acquire(first, "host-a:1:x", LEASE)
        with pytest.raises(RunBusyError, match="being executed"):
            await poller.acquire("r", "host-b:2:y", LEASE)
        with locked_by_another_process(db):
            # refused by what it reads, not by a lock it waited for (StoreLockedError)
            for _ in range(3):
                with pytest.raises(RunBusyError, match="being executed"):
                    await poller.acquire("r", "host-b:2:y", LEASE)
                with pytest.raises(RunBusyError, match="being executed"):
                    await poller.acquire_latest("r", "host-b:2:y", LEASE)
        # released, the run is the poller's at its next attempt: what it read is not kept
        await holder.release(lease)
        taken = await poller.acquire("r", "host-b:2:y", LEASE)
        assert taken.owner == "host-b:2:y"
    finally:
        await holder.close()
        await poller.close()


async def test_a_prune_with_nothing_to_delete_does_not_take_the_write_lock(
    tmp_path: Path,
) -> None:
    """It looks first, in a read: it held the write lock for its whole scan of every run,
    even with nothing to delete, and stalled every writer (0.2 s at 100,000 runs, outside
    tester 119). With something to delete it does take the lock (the second half: the test
    would see it, since the store here gives up on a held lock at once)."""
    from workflow_engine import Runtime, StoreLockedError

    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db, busy_timeout=0.05))
    runtime.register(lambda: stepper_workflow(name="stepper"))
    try:
        finished = await runtime.run("stepper", 1)
        await runtime.respond(finished.pending_requests[0].request_id, {"approved": True})
        await runtime.resume(finished.run_id)
        await runtime.run("stepper", 1)  # paused
        with locked_by_another_process(db):
            assert await runtime.store.prune(finished_before=0.0, keep_last=1_000) == 0
            with pytest.raises(StoreLockedError):
                await runtime.store.prune(keep_last=1)
        assert (await runtime.get_run(finished.run_id)).status.value == "idle"
        assert await runtime.store.prune(keep_last=1) > 0
    finally:
        await runtime.close()


PRUNE_WRITER = """
import asyncio, json, sys, time
from tests.integration.workflows import stepper_workflow
from workflow_engine import Runtime
from workflow_engine.storage import SqliteStore

async def main(db, seconds):
    runtime = Runtime(SqliteStore(db, busy_timeout=0.5))
    runtime.register(lambda: stepper_workflow(name="stepper"))
    errors, slowest, runs = [], 0.0, 0
    await runtime.run("stepper", 1)
    print("ready", flush=True)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        try:
            await runtime.run("stepper", 1)
            runs += 1
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        slowest = max(slowest, time.monotonic() - began)
        await asyncio.sleep(0.005)
    await runtime.close()
    print(json.dumps({"errors": errors, "slowest": slowest, "runs": runs}), flush=True)

asyncio.run(main(sys.argv[1], float(sys.argv[2])))
"""


@pytest.mark.slow  # (a second process and 1.2 s of pruning, on each async library)
async def test_a_long_prune_lets_other_processes_write_between_its_slices(
    tmp_path: Path,
) -> None:
    """A prune deletes in write transactions of about 0.1 s, with a pause between them: in
    one, a prune of 100,000 runs held the lock 6 s, and a run started meanwhile in another
    process failed as locked (outside tester 215). Here each run's deletion is made slow (a
    slow disk, through the store's fault hook): 60 runs take 1.2 s, more than the other
    process's ``busy_timeout`` of 0.5 s."""
    from workflow_engine import Runtime

    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(lambda: stepper_workflow(name="stepper"))
    for _ in range(60):
        paused = await runtime.run("stepper", 1)
        await runtime.respond(paused.pending_requests[0].request_id, {"approved": True})
        await runtime.resume(paused.run_id)
    await runtime.close()

    def slow_disk(point: str) -> None:
        if point == "prune:run":
            time.sleep(0.02)

    writer = subprocess.Popen(
        [sys.executable, "-c", PRUNE_WRITER, str(db), "2.0"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "ready"
        pruner = SqliteStore(db, fault_hook=slow_disk)
        try:
            began = time.monotonic()
            deleted = await pruner.prune(finished_before=time.time())
            took = time.monotonic() - began
        finally:
            await pruner.close()
        report = json.loads(writer.stdout.readline())
    finally:
        writer.wait(timeout=60)
        if writer.stdout is not None:
            writer.stdout.close()
    assert deleted > 60 and took > 1.2
    assert report["errors"] == [] and report["runs"] > 10, report
    assert report["slowest"] < 0.5, report
