"""A run started with ``Runtime.run`` (the runtime choosing its id) is written once, in the
transaction of its first superstep's commit (``admit_and_commit``), not admitted first.

What that must not change: anything that needs the run's lease before that commit -- a
journaled step, a lease renewal, a failure or the end of the execution -- writes the run first,
exactly as the old admission did; a run killed before its first commit is not written at all
(nobody was told its id), one killed after it resumes from it. A run id the caller gives is
admitted before anything runs, so an id in use is refused first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
import sniffio

from workflow_engine import (
    Executor,
    RequestPort,
    RunExistsError,
    RunInterruptedError,
    Runtime,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

ROOT = Path(__file__).resolve().parents[2]
PAUSED = WorkflowRunState.IDLE_WITH_PENDING_REQUESTS


class Begin(Executor):
    """Its message says what the first superstep does: ``block`` (forever), ``sleep:<s>``,
    ``fail``, ``journal`` (a journaled step calling ``Begin.effect``), else pass it on."""

    effect: Any = None

    @handler
    async def on_topic(self, topic: str, ctx: WorkflowContext[str]) -> None:
        if topic == "block":
            print("in-step", flush=True)
            await anyio.sleep_forever()
        if topic.startswith("sleep:"):
            await anyio.sleep(float(topic.split(":")[1]))
        if topic == "fail":
            raise RuntimeError("the first superstep fails")
        if topic == "journal":
            await ctx.run_once("charge", Begin.effect)
        await ctx.send_message(topic)


class End(Executor):
    @handler
    async def on_verdict(self, approved: bool, ctx: WorkflowContext[None, bool]) -> None:
        await ctx.yield_output(approved)


def build() -> Workflow:
    begin, end = Begin("begin"), End("end")
    port = RequestPort("review", request_type=str, response_type=bool)
    return (
        WorkflowBuilder(name="first-commit", start=begin)
        .add_edge(begin, port)
        .add_edge(port, end)
        .build()
    )


def runtime_on(db: Path, **kwargs: Any) -> Runtime:
    runtime = Runtime(SqliteStore(db, **kwargs.pop("store", {})), **kwargs)
    runtime.register(build)
    return runtime


async def finished(db: Path, run_id: str) -> list[Any]:
    """Answer the run's request (resuming it first if it was cut off) and return its outputs."""
    runtime = runtime_on(db)
    try:
        run = await runtime.store.get_run(run_id)
        if run.status is not PAUSED:
            assert (await runtime.resume(run_id)).status is PAUSED
        (request,) = await runtime.pending_requests(run_id)
        done = await runtime.respond_and_resume(request.request_id, True)
        assert done.status is WorkflowRunState.IDLE
        return (await runtime.get_run(run_id)).outputs
    finally:
        await runtime.close()


# --- in one process -----------------------------------------------------------------------------


async def test_a_fresh_run_writes_both_checkpoints_in_one_transaction(tmp_path: Path) -> None:
    runtime = runtime_on(tmp_path / "runs.db")
    await runtime.store.open()
    said: list[str] = []
    assert runtime.store._conn is not None
    runtime.store._conn.set_trace_callback(said.append)
    paused = await runtime.run("first-commit", "a topic")
    await runtime.close()
    assert paused.status is PAUSED
    assert [s for s in said if s.startswith("BEGIN")] == ["BEGIN IMMEDIATE"], said
    store = SqliteStore(tmp_path / "runs.db")
    assert [h.superstep for h in await store.history(paused.run_id)] == [0, 1]
    await store.close()
    assert await finished(tmp_path / "runs.db", paused.run_id) == [True]


async def test_a_run_id_in_use_is_refused_before_anything_runs(tmp_path: Path) -> None:
    runtime = runtime_on(tmp_path / "runs.db")
    ran: list[str] = []
    Begin.effect = lambda: _record(ran)
    await runtime.run("first-commit", "a topic", run_id="mine")
    with pytest.raises(RunExistsError, match="'mine' already exists"):
        await runtime.run("first-commit", "journal", run_id="mine")
    await runtime.close()
    assert ran == []


async def _record(ran: list[str]) -> str:
    ran.append("charged")
    return "charged"


async def test_a_journaled_first_step_writes_the_run_before_its_effect(tmp_path: Path) -> None:
    """The effect's intent is fenced by the run's lease: the run is admitted, leased, first."""
    db = tmp_path / "runs.db"
    runtime = runtime_on(db)
    seen: list[tuple[str, str | None]] = []

    async def effect() -> str:
        other = SqliteStore(db)
        try:
            (run,) = await other.list_runs()
            seen.append((run.status.value, run.owner))
        finally:
            await other.close()
        return "charged"

    Begin.effect = effect
    paused = await runtime.run("first-commit", "journal")
    await runtime.close()
    assert paused.status is PAUSED
    assert len(seen) == 1 and seen[0][0] == "in_progress" and seen[0][1] is not None, seen
    assert await finished(db, paused.run_id) == [True]


async def test_a_long_first_superstep_is_written_by_its_lease_renewal(tmp_path: Path) -> None:
    """A superstep longer than a third of the lease: the renewal writes the run (leased), so
    other processes see it executing rather than not at all; the commit then goes on under
    that lease."""
    db = tmp_path / "runs.db"
    runtime = runtime_on(db, lease_seconds=0.3)
    seen: list[Any] = []

    async def look() -> None:
        await anyio.sleep(0.25)  # the renewal is due after 0.1 s
        other = SqliteStore(db)
        try:
            seen.extend(await other.list_runs())
        finally:
            await other.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(look)
        paused = await runtime.run("first-commit", "sleep:0.5")
    await runtime.close()
    assert paused.status is PAUSED
    (run,) = seen
    assert run.run_id == paused.run_id and run.status is WorkflowRunState.IN_PROGRESS
    assert run.owner is not None and run.superstep == 0
    assert await finished(db, paused.run_id) == [True]


async def test_a_failing_first_superstep_is_recorded_failed(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    runtime = runtime_on(db)
    failed = await runtime.run("first-commit", "fail")
    assert failed.status is WorkflowRunState.FAILED
    run = await runtime.store.get_run(failed.run_id)
    await runtime.close()
    assert run.status is WorkflowRunState.FAILED and run.owner is None
    assert run.error is not None and "the first superstep fails" in str(run.error)


@pytest.mark.slow  # (about 2 s of the fast tier's minute; `make test` runs it)
async def test_a_first_superstep_cut_off_leaves_the_run_interrupted(tmp_path: Path) -> None:
    """A caller's timeout, or ``close()``, ends the execution before the first commit: the run
    is written then (unleased, in progress), as the old admission left it, and resumes."""
    db = tmp_path / "runs.db"
    runtime = runtime_on(db)
    with anyio.move_on_after(0.2):
        await runtime.run("first-commit", "sleep:0.6")
    (timed_out,) = await runtime.store.list_runs()

    async def close_soon() -> None:
        await anyio.sleep(0.2)
        await runtime.close()

    async with anyio.create_task_group() as tg:
        tg.start_soon(close_soon)
        with pytest.raises(RunInterruptedError):
            await runtime.run("first-commit", "sleep:0.6")
    store = SqliteStore(db)
    runs = await store.list_runs()
    await store.close()
    assert len(runs) == 2 and timed_out.run_id in {r.run_id for r in runs}
    for run in runs:
        assert run.status is WorkflowRunState.IN_PROGRESS, run
        assert run.owner is None and run.superstep == 0, run
        assert await finished(db, run.run_id) == [True]


@pytest.mark.slow  # real time: another process holds the lock for 2 s
async def test_a_first_commit_waiting_for_another_process_s_lock_lets_its_caller_go(
    tmp_path: Path,
) -> None:
    """The caller's deadline passes while the first commit waits for another process's write
    lock: it stops waiting (on trio once the lock frees; past the busy timeout it got the
    store's error in an exception group -- outside tester 88), and the run is written once,
    when the lock frees."""
    import time

    from test_cancelled_callers import write_lock_held

    db = tmp_path / "runs.db"
    runtime = runtime_on(db)
    await runtime.store.open()
    with write_lock_held(db, 2.0):
        start = time.monotonic()
        with anyio.move_on_after(0.2) as deadline:
            await runtime.run("first-commit", "0 pass")
        waited = time.monotonic() - start
    # (on trio the admission's write is shielded: its caller waits for the lock, then leaves)
    limit = 1.5 if sniffio.current_async_library() == "asyncio" else 4.0
    assert deadline.cancelled_caught and waited < limit, waited
    await runtime.close()
    store = SqliteStore(db)
    (run,) = await store.list_runs()
    await store.close()
    assert run.owner is None and run.status is PAUSED, run  # (its first superstep asks)


async def test_a_caller_that_gives_up_before_it_starts_writes_nothing(tmp_path: Path) -> None:
    runtime = runtime_on(tmp_path / "runs.db")
    with anyio.CancelScope() as scope:
        scope.cancel()
        await runtime.run("first-commit", "a topic")
    assert await runtime.store.list_runs() == []
    await runtime.close()


class Flaky(Executor):
    """Sleeps a while (``<seconds>`` its message), then fails -- or, with ``pass``, goes on."""

    @handler
    async def on_text(self, text: str, ctx: WorkflowContext[str]) -> None:
        seconds, _, then = text.partition(" ")
        await anyio.sleep(float(seconds))
        if then != "pass":
            raise RuntimeError("the first superstep fails")
        await ctx.send_message(text)


class Last(Executor):
    @handler
    async def on_text(self, text: str, ctx: WorkflowContext[None, str]) -> None:
        await ctx.yield_output(text)


def build_flaky() -> Workflow:
    flaky, last = Flaky("flaky"), Last("last")
    return WorkflowBuilder(name="flaky", start=flaky).add_edge(flaky, last).build()


async def test_a_renewal_stopped_while_it_writes_the_run_loses_nothing(tmp_path: Path) -> None:
    """A renewal writing the run is stopped (asyncio's own ``task.cancel()``) when the
    superstep ends: the write finished all the same, and its lease was not kept, so recording
    the failure wrote the run again -- ``RunExistsError``, the failure lost (outside tester
    82). Many short leases, first supersteps failing at scattered moments."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db), lease_seconds=0.03)  # a renewal every 10 ms
    runtime.register(build_flaky)
    rng = random.Random(82)
    outcomes: list[str] = []

    async def one(seconds: float) -> None:
        try:
            outcomes.append((await runtime.run("flaky", f"{seconds:.4f}")).status.value)
        except Exception as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")

    async with anyio.create_task_group() as tg:
        for _ in range(120):
            tg.start_soon(one, rng.random() * 0.03)
    runs = await runtime.store.list_runs()
    await runtime.close()
    assert outcomes == ["failed"] * 120, Counter(outcomes)
    assert len(runs) == 120
    assert all(r.status is WorkflowRunState.FAILED and r.owner is None for r in runs)


async def test_callers_timed_out_around_the_first_commit_leave_consistent_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``wait_for`` timing out while the first commit is being written: the commit lands, and
    the lease it took is given back by the execution, not written again or said lost."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(build_flaky)
    await runtime.store.open()
    rng = random.Random(82)

    async def one() -> None:
        limit = rng.random() * 0.004
        if sniffio.current_async_library() == "asyncio":  # asyncio's own task.cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runtime.run("flaky", "0 pass"), limit)
        else:
            with anyio.move_on_after(limit):
                await runtime.run("flaky", "0 pass")

    async with anyio.create_task_group() as tg:
        for _ in range(80):
            tg.start_soon(one)
    runs = await runtime.store.list_runs()
    assert not [r for r in caplog.records if "given back" in r.getMessage()], caplog.text
    assert all(r.owner is None for r in runs), [r for r in runs if r.owner]
    for run in runs:  # each one finishes, its first superstep not run again
        if run.status is not WorkflowRunState.IDLE:
            done = await runtime.resume(run.run_id)
            assert done.status is WorkflowRunState.IDLE
        assert (await runtime.get_run(run.run_id)).outputs == ["0 pass"]
    await runtime.close()


# --- killed ---------------------------------------------------------------------------------------

_KILLED = """
import importlib, os, signal, sys
import anyio

db, topic, run_id, kill_at = sys.argv[1], sys.argv[2], sys.argv[3] or None, int(sys.argv[4])
sys.path.insert(0, sys.argv[6])
runtime_on = importlib.import_module(sys.argv[5]).runtime_on  # (as pytest named it)
points = []

def hook(point):
    points.append(point)
    print("point", point, flush=True)
    if len(points) == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

async def main():
    runtime = runtime_on(db, store={"fault_hook": hook})
    result = await runtime.run("first-commit", topic, run_id=run_id)
    print("run", result.run_id, result.status.value, flush=True)
    await runtime.close()

anyio.run(main)
"""


def run_killed(db: Path, topic: str, run_id: str | None, kill_at: int) -> list[str]:
    """Run ``_KILLED`` in a new process; its output lines. ``kill_at`` 0: killed by us once it
    says it is inside its first superstep."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _KILLED,
            str(db),
            topic,
            run_id or "",
            str(kill_at),
            Begin.__module__,
            str(Path(__file__).parent),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.strip() == "in-step" and kill_at == 0:
            os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdout.close()
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("given_id", [False, True])
async def test_killed_inside_its_first_superstep(tmp_path: Path, given_id: bool) -> None:
    """A run the runtime named is not written until its first commit: killed before it, there
    is no run (nobody was told its id). A run named by its caller was admitted first: killed,
    it is left interrupted and resumes."""
    db = tmp_path / "runs.db"
    lines = run_killed(db, "block", "given" if given_id else None, 0)
    assert lines[-1] == "in-step", lines
    store = SqliteStore(db)
    runs = await store.list_runs()
    await store.close()
    if not given_id:
        assert runs == []
        return
    (run,) = runs
    assert run.run_id == "given" and run.status is WorkflowRunState.IN_PROGRESS


@pytest.mark.slow
async def test_killed_at_each_point_of_the_first_commit(tmp_path: Path) -> None:
    """Before its COMMIT the first commit leaves nothing; after it, the paused run, which
    finishes as an uninterrupted one does."""
    clean = run_killed(tmp_path / "clean.db", "a topic", None, -1)
    points = [line.split()[1] for line in clean if line.startswith("point ")]
    assert points == [
        "admit:before",
        "commit:before",
        "admit:inside",
        "commit:inside",
        "commit:after",
        "admit:after",
    ], clean
    for kill_at, point in enumerate(points, start=1):
        db = tmp_path / f"killed-{kill_at}.db"
        lines = run_killed(db, "a topic", None, kill_at)
        assert lines[-1] == f"point {point}", lines
        store = SqliteStore(db)
        runs = await store.list_runs()
        await store.close()
        if point.endswith((":before", ":inside")):
            assert runs == [], point
            continue
        (run,) = runs
        assert run.status is PAUSED and run.superstep == 1, point
        assert await finished(db, run.run_id) == [True]


@pytest.mark.slow  # real time: another process holds the lock past the busy timeout
async def test_a_caller_cut_off_while_the_lock_outlasts_its_busy_timeout_gets_its_cancellation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run cut off during its first (journaled) step while another process holds the write
    lock past the store's busy timeout: the run cannot be written even as interrupted. Its
    caller gets its cancellation -- on trio it got the store's ``StoreLockedError`` instead,
    saying a lease "could not be given back" where no run or lease was ever stored (outside
    tester 90, 8 of 8) -- and what failed is logged, saying the run is not stored."""
    from test_cancelled_callers import write_lock_held

    async def charge() -> str:
        await anyio.sleep(0.004)
        return "charged"

    monkeypatch.setattr(Begin, "effect", charge)
    db = tmp_path / "runs.db"
    runtime = runtime_on(db, store={"busy_timeout": 0.2})
    await runtime.store.open()
    with write_lock_held(db, 2.0), caplog.at_level("WARNING", logger="workflow_engine.runtime"):
        with anyio.move_on_after(0.005) as deadline:
            await runtime.run("first-commit", "journal")
        assert deadline.cancelled_caught
    await runtime.close()
    said = [r.getMessage() for r in caplog.records]
    assert all("could not be given back" not in m for m in said), said
    assert all("is not stored: it was cut off before its first commit" in m for m in said), said
    store = SqliteStore(db)
    assert await store.list_runs() == []
    await store.close()


@pytest.mark.slow  # real time: another process holds the lock past the busy timeout
@pytest.mark.parametrize("how", ["resume", "run"])
async def test_a_caller_cut_off_while_its_lease_waits_out_the_lock_gets_its_cancellation(
    tmp_path: Path, how: str
) -> None:
    """A ``resume`` (or a ``run`` of a given id) cut off while taking its lease waits for
    another process's lock, shielded, up to the busy timeout; the lock outlasts it. The caller
    gets its cancellation, not the store's ``StoreLockedError`` (outside tester 91: it escaped
    ``move_on_after``, 5 of 5), and the run is as it was."""
    from test_cancelled_callers import write_lock_held

    db = tmp_path / "runs.db"
    runtime = runtime_on(db, store={"busy_timeout": 0.2})
    run_id = await runtime.start("first-commit", "0 pass") if how == "resume" else "given"
    await runtime.store.open()
    with write_lock_held(db, 1.0):
        with anyio.move_on_after(0.005) as deadline:
            if how == "resume":
                await runtime.resume(run_id)
            else:
                await runtime.run("first-commit", "0 pass", run_id=run_id)
        assert deadline.cancelled_caught
    await runtime.close()
    store = SqliteStore(db)
    runs = await store.list_runs()
    await store.close()
    assert all(r.owner is None for r in runs), runs
    assert [r.run_id for r in runs] == ([run_id] if how == "resume" else []), runs


async def test_a_deadline_during_the_last_superstep_s_step_is_not_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``fail_after`` passes during a journaled step after which the run pauses: the step runs
    to its end and is recorded, then the caller gets its ``TimeoutError``. On asyncio the run
    rested without meeting the cancellation (none of its awaits suspends after the step), and
    the caller got the paused result with its deadline long past (outside tester 91, 10 of
    10)."""
    effects: list[str] = []

    async def charge() -> str:
        await anyio.sleep(0.1)
        effects.append("charged")
        return "charged"

    monkeypatch.setattr(Begin, "effect", charge)
    db = tmp_path / "runs.db"
    runtime = runtime_on(db)
    await runtime.store.open()
    with pytest.raises(TimeoutError):
        with anyio.fail_after(0.02):
            await runtime.run("first-commit", "journal")
    assert effects == ["charged"]
    (run,) = await runtime.store.list_runs()
    await runtime.close()
    assert run.owner is None, run
    assert await finished(db, run.run_id) == [True]
    assert effects == ["charged"]
