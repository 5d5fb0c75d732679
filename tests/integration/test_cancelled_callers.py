"""A caller that gives up never leaves its run locked.

A store call that takes a run's lease may be cut off by its caller: a timeout
(``asyncio.wait_for``, ``anyio.move_on_after``), a stream closed early, a task cancelled. When
that happens while the write is under way -- another process holds the database's write lock,
so the write waits on the store's worker thread -- the lease is still written once the lock is
gone. No one executes the run then, so the store gives the lease back at once: the run can be
resumed right away, not after the lease runs out (30 s).

A consumer cancelled while it waits for a stream's next event ends the stream as it would end
an async generator: the run stops at once and its lease is released, whether or not something
still holds the cancelled task (``asyncio.gather`` callers keep them).

Each test holds the lock from a real second process.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from workflow_engine import (
    Executor,
    Runtime,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowError,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]  # real time: a lock held 1 s by another process

STEPS = 5
LOCK_SECONDS = 1.0
GIVE_UP_AFTER = 0.3
PAUSED = WorkflowRunState.IDLE_WITH_PENDING_REQUESTS

_HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=10)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


@contextmanager
def write_lock_held(db: Path, seconds: float) -> Iterator[subprocess.Popen[str]]:
    """Another process holds ``db``'s write lock for ``seconds`` (from when this yields)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(db), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        yield holder
    finally:
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()


class Step(Executor):
    """Counts to ``steps``, one superstep (and one output) per number; asks at ``ask_at``."""

    def __init__(self, ask_at: int | None = None, pause: float = 0.0, steps: int = STEPS) -> None:
        super().__init__("step")
        self.ask_at = ask_at
        self.pause = pause
        self.steps = steps

    @handler
    async def on_number(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        if self.pause:
            await anyio.sleep(self.pause)
        await ctx.yield_output(n)
        if n == self.ask_at:
            await ctx.request_info(f"go on after {n}?", bool)
        elif n < self.steps:
            await ctx.send_message(n + 1)

    @response_handler
    async def on_answer(self, question: str, go_on: bool, ctx: WorkflowContext[int, int]) -> None:
        last = int(question.split()[-1].rstrip("?"))
        if go_on:
            await ctx.send_message(last + 1)


def counting(ask_at: int | None = None, pause: float = 0.0, steps: int = STEPS) -> Workflow:
    step = Step(ask_at, pause, steps)
    return WorkflowBuilder("counting", start=step).add_edge(step, step).build()


async def released(runtime: Runtime, run_id: str, within: float = 5.0) -> float:
    """Seconds until no one holds the run's lease (fails after ``within``)."""
    start = time.monotonic()
    while (await runtime.store.get_run(run_id)).owner is not None:
        assert time.monotonic() - start < within, f"run {run_id} still leased after {within} s"
        await anyio.sleep(0.05)
    return time.monotonic() - start


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_resume_given_up_while_the_lock_is_held(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(counting)
    run_id = await runtime.start("counting", 1)
    with write_lock_held(db, LOCK_SECONDS), pytest.raises(TimeoutError):
        await asyncio.wait_for(runtime.resume(run_id), GIVE_UP_AFTER)
    await released(runtime, run_id)
    done = await runtime.resume(run_id)
    assert done.status is WorkflowRunState.IDLE and done.outputs == [1, 2, 3, 4, 5]
    await runtime.close()


async def test_a_stream_given_up_while_the_lock_is_held(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(counting)
    run_id = await runtime.start("counting", 1)
    with write_lock_held(db, LOCK_SECONDS):
        with anyio.move_on_after(GIVE_UP_AFTER):
            async with runtime.resume_stream(run_id) as stream:
                async for _ in stream:
                    pass
    await released(runtime, run_id)
    done = await runtime.resume(run_id)
    assert done.outputs == [1, 2, 3, 4, 5]
    await runtime.close()


async def given_up(call: Callable[[], Awaitable[object]], how: str) -> None:
    """``call()`` cut off after ``GIVE_UP_AFTER`` as asyncio does it (``wait_for``: the task
    cancelled once) or as anyio does (``move_on_after``: a scope cancelled until it exits)."""
    if how == "wait_for":
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(call(), GIVE_UP_AFTER)
    else:
        with anyio.move_on_after(GIVE_UP_AFTER) as scope:
            await call()
        assert scope.cancelled_caught


@pytest.mark.parametrize("how", ["wait_for", "move_on_after"])
async def test_an_answer_given_up_on_while_the_lock_is_held(tmp_path: Path, how: str) -> None:
    """``respond_and_resume`` stores the answer and takes the lease in one write: cut off, the
    answer stays stored and the lease is given back, so a plain resume applies it."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(lambda: counting(ask_at=2))
    paused = await runtime.run("counting", 1)
    (request,) = paused.pending_requests
    with write_lock_held(db, LOCK_SECONDS):
        await given_up(lambda: runtime.respond_and_resume(request.request_id, True), how)
    await released(runtime, paused.run_id)
    # the lease was taken to apply the answer (``in_progress``); nothing ran: paused, as it was
    assert (await runtime.store.get_run(paused.run_id)).status is PAUSED
    done = await runtime.resume(paused.run_id)
    assert done.outputs == [3, 4, 5]
    assert (await runtime.get_run(paused.run_id)).outputs == [1, 2, 3, 4, 5]
    await runtime.close()


@pytest.mark.parametrize("how", ["wait_for", "move_on_after"])
async def test_a_resume_to_apply_an_answer_given_up_leaves_the_run_paused(
    tmp_path: Path, how: str
) -> None:
    """Given up while the lease was being taken, nothing runs for the caller (under anyio the
    cancellation reaches it only after the shielded lease: tester 81 saw the step run then)."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(lambda: counting(ask_at=2))
    paused = await runtime.run("counting", 1)
    await runtime.respond(paused.pending_requests[0].request_id, True)
    with write_lock_held(db, LOCK_SECONDS):
        await given_up(lambda: runtime.resume(paused.run_id), how)
    await released(runtime, paused.run_id)
    assert (await runtime.store.get_run(paused.run_id)).status is PAUSED
    done = await runtime.resume(paused.run_id)
    assert done.outputs == [3, 4, 5]
    await runtime.close()


async def test_a_start_given_up_while_the_lock_is_held(tmp_path: Path) -> None:
    """``run`` writes a new run with its first superstep's commit (shielded): cut off while
    that commit waits for the lock, the superstep it ran is committed all the same -- not run
    again, not lost -- and the run is left unleased, ready to resume from there."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(counting)
    await runtime.store.open()
    with write_lock_held(db, LOCK_SECONDS), pytest.raises(TimeoutError):
        await asyncio.wait_for(runtime.run("counting", 1), GIVE_UP_AFTER)
    start = time.monotonic()
    while not (runs := await runtime.store.list_runs()):
        assert time.monotonic() - start < 5, "the admission never landed"
        await anyio.sleep(0.05)
    (run,) = runs
    await released(runtime, run.run_id)
    assert run.superstep == 1
    done = await runtime.resume(run.run_id)
    assert done.outputs == [2, 3, 4, 5]
    assert (await runtime.get_run(run.run_id)).outputs == [1, 2, 3, 4, 5]  # each once
    await runtime.close()


@pytest.mark.parametrize("keep_task", [True, False])
async def test_a_cancelled_consumer_stops_its_run(tmp_path: Path, keep_task: bool) -> None:
    """The consumer's task is cancelled while it waits for the next event: the run stops
    there and its lease is released, whether or not the cancelled task is still referenced
    (``gather(..., return_exceptions=True)`` keeps its exception, whose traceback holds the
    stream)."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(lambda: counting(pause=0.02, steps=60))
    run_id = await runtime.start("counting", 1)

    async def consume() -> None:
        async for _ in runtime.resume_stream(run_id):
            pass

    task = asyncio.get_running_loop().create_task(consume())
    await anyio.sleep(0.2)
    task.cancel()
    (outcome,) = await asyncio.gather(task, return_exceptions=True)
    assert isinstance(outcome, asyncio.CancelledError)
    if not keep_task:
        del task, outcome
    gc.collect()
    await released(runtime, run_id, within=1.0)
    at_cancel = (await runtime.store.get_run(run_id)).superstep
    assert at_cancel < 40
    await anyio.sleep(0.3)
    assert (await runtime.store.get_run(run_id)).superstep == at_cancel  # it stopped there
    done = await runtime.resume(run_id)
    assert done.status is WorkflowRunState.IDLE
    assert (await runtime.get_run(run_id)).outputs == list(range(1, 61))
    await runtime.close()


async def test_closing_right_after_giving_up_gives_the_lease_back(tmp_path: Path) -> None:
    """The caller gives up and closes the runtime while the lock is still held: closing waits
    for the write under way and gives its lease back before the store lets go, so the next
    process can resume the run at once."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(counting)
    run_id = await runtime.start("counting", 1)
    with write_lock_held(db, LOCK_SECONDS):
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(runtime.resume(run_id), GIVE_UP_AFTER)
        await runtime.close()
    later = Runtime(SqliteStore(db))
    later.register(counting)
    assert (await later.store.get_run(run_id)).owner is None
    done = await later.resume(run_id)
    assert done.outputs == [1, 2, 3, 4, 5]
    await later.close()


_FLICKER = """
import random, sqlite3, sys, time
random.seed(7)
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
print("flickering", flush=True)
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    conn.execute("BEGIN IMMEDIATE")
    time.sleep(random.uniform(0, 0.004))
    conn.execute("COMMIT")
    time.sleep(random.uniform(0, 0.002))
"""


async def test_callers_giving_up_while_a_lock_comes_and_goes(tmp_path: Path) -> None:
    """Another process takes and frees the write lock every few ms, so group commits move to
    the worker thread while their callers give up (outside tester 45: 16 of 100 runs stayed
    locked for the whole lease -- a batched write committed after its caller had gone)."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(lambda: counting(ask_at=2))
    paused = [await runtime.run("counting", 1) for _ in range(40)]
    asked = [p.pending_requests[0].request_id for p in paused]
    rng = random.Random(45)
    flicker = subprocess.Popen(
        [sys.executable, "-c", _FLICKER, str(db), "1.5"], stdout=subprocess.PIPE, text=True
    )
    assert flicker.stdout is not None and flicker.stdout.readline().strip() == "flickering"

    async def give_up_on(request_id: str) -> None:
        with contextlib.suppress(TimeoutError, WorkflowError):
            await asyncio.wait_for(
                runtime.respond_and_resume(request_id, True), rng.uniform(0, 0.03)
            )

    try:
        while flicker.poll() is None:
            await asyncio.gather(*(give_up_on(r) for r in asked))
    finally:
        flicker.wait(timeout=30)
        flicker.stdout.close()
    for p in paused:
        await released(runtime, p.run_id, within=3.0)
    for p in paused:
        info = await runtime.get_run(p.run_id)
        if info.status is not WorkflowRunState.IDLE:
            await runtime.resume(p.run_id)
        assert (await runtime.get_run(p.run_id)).outputs == [1, 2, 3, 4, 5]
    await runtime.close()


async def test_a_cancelled_consumer_gives_the_lease_back_even_inside_a_group_commit(
    tmp_path: Path,
) -> None:
    """Another task writes at every loop iteration, so the run's last write -- its lease's
    release -- joins that task's group commit. A consumer cancelled just then (at each point
    of the stream in turn) cut the release off with asyncio's own ``task.cancel()``, which a
    shield does not stop: the run stayed locked (outside tester 53: 1 run in 60-80)."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(counting(ask_at=STEPS))
    stop = False

    async def background() -> None:  # a write at every loop iteration
        while not stop:
            await runtime.start("counting", 0)
            await asyncio.sleep(0)

    writer = asyncio.ensure_future(background())
    runs = []
    for k in range(60):
        run_id = await runtime.start("counting", 1)

        async def consume(run_id: str = run_id) -> None:
            async with runtime.resume_stream(run_id) as stream:
                async for _ in stream:
                    pass

        consumer = asyncio.ensure_future(consume())
        for _ in range(k):
            await asyncio.sleep(0)
        consumer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await consumer
        runs.append(run_id)
    stop = True
    await writer
    leased = [r for r in runs if (await runtime.store.get_run(r)).owner is not None]
    assert not leased, f"{len(leased)} of {len(runs)} runs left leased"
    await runtime.close()


async def test_a_read_never_runs_on_the_loop_while_the_worker_holds_the_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's one connection is used by one thread at a time: while a write waits for a
    lock on the worker thread, every operation goes there too. A read checked that before it
    let other tasks run (after 2 ms of reads in a row), not after -- and then ran on the loop's
    thread beside the worker (outside tester 53). Observed at the one place an operation runs
    on the loop's thread."""
    from workflow_engine.storage import _sqlite

    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(counting(ask_at=1))
    run_id = (await runtime.run("counting", 1)).run_id
    store = runtime.store
    beside: list[str] = []
    on_loop = _sqlite.SqliteStore._on_loop

    def watched(self: SqliteStore, fn: object, args: tuple) -> object:
        if self._worker is not None and self._worker.pending:
            beside.append(getattr(fn, "__name__", repr(fn)))
        return on_loop(self, fn, args)  # type: ignore[arg-type]

    monkeypatch.setattr(_sqlite.SqliteStore, "_on_loop", watched)
    stop = False

    async def reader() -> None:  # reads back to back: it lets other tasks run every 2 ms
        while not stop:
            await store.get_run(run_id)

    with write_lock_held(db, LOCK_SECONDS):
        reading = asyncio.ensure_future(reader())
        await asyncio.sleep(0.05)
        await store.request_cancel(run_id)  # waits on the worker for the other process
        stop = True
        await reading
    assert not beside, f"{len(beside)} operations ran on the loop beside the worker"
    await runtime.close()


async def test_a_caller_cancelled_again_and_again_still_gives_the_lease_back(
    tmp_path: Path,
) -> None:
    """A ``resume`` cancelled, then cancelled again at every loop iteration while others'
    writes keep group commits busy: the second cancellation cut the release off (it ran
    under the effects' rule: cancelled again, stop), and the run stayed locked for 30 s with
    nothing said (outside tester 54: 44 runs in 200). The caller now stops waiting, but the
    release goes on."""
    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(counting(pause=0.002))
    stop = asyncio.Event()

    async def writer() -> None:
        while not stop.is_set():
            await runtime.resume(await runtime.start("counting", 1))

    writers = [asyncio.ensure_future(writer()) for _ in range(4)]
    runs = []
    for attempt in range(200):
        run_id = await runtime.start("counting", 1)
        resuming = asyncio.ensure_future(runtime.resume(run_id))
        await asyncio.sleep(0.001 * (attempt % 5))
        while not resuming.done():
            resuming.cancel()
            await asyncio.sleep(0)
        with contextlib.suppress(asyncio.CancelledError):
            await resuming
        runs.append(run_id)
    stop.set()
    await asyncio.gather(*writers)
    await runtime.close()  # (waits for the releases still going on)
    store = SqliteStore(tmp_path / "runs.db")
    leased = [r for r in runs if (await store.get_run(r)).owner is not None]
    assert not leased, f"{len(leased)} of {len(runs)} runs left leased"
    await store.close()


async def test_a_release_that_fails_under_a_cancellation_leaves_the_cancellation(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run cancelled while another process holds the write lock past the release's retries:
    the caller got the store's ``StoreLockedError`` in place of its cancellation (outside
    tester 54). It gets the cancellation; the failed release is logged."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db, busy_timeout=0.2))
    runtime.register(counting(pause=0.5))
    run_id = await runtime.start("counting", 1)
    resuming = asyncio.ensure_future(runtime.resume(run_id))
    await asyncio.sleep(0.1)  # the handler sleeps
    with write_lock_held(db, 8.0), caplog.at_level("WARNING", logger="workflow_engine.runtime"):
        resuming.cancel()
        with pytest.raises(asyncio.CancelledError):
            await resuming
    assert any("could not be given back" in r.getMessage() for r in caplog.records)
    await runtime.close()


async def test_a_deadline_during_a_step_is_kept_and_the_lease_given_back_after(
    tmp_path: Path,
) -> None:
    """A cancel scope (``move_on_after``) cancelled during a step while another process holds
    the write lock: the caller gets control back at once, not when the lock frees; the lease
    is given back as soon as the lock frees (not when it runs out, 30 s later), with no
    ``close()`` needed."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(counting(pause=3.0))
    run_id = await runtime.start("counting", 1)
    scope = anyio.CancelScope()
    left: list[float] = []

    async def resuming() -> None:
        with scope:
            await runtime.resume(run_id)
        left.append(time.monotonic())

    def owner() -> str | None:
        with contextlib.closing(sqlite3.connect(db)) as other:  # (a reader: the lock allows it)
            return other.execute("SELECT owner FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0]

    holding = write_lock_held(db, LOCK_SECONDS)
    async with anyio.create_task_group() as tg:
        tg.start_soon(resuming)
        await anyio.sleep(0.05)  # the lease taken, the step sleeps
        await anyio.to_thread.run_sync(holding.__enter__)
        cancelled_at = time.monotonic()
        scope.cancel()
    assert left[0] - cancelled_at < LOCK_SECONDS / 2, left[0] - cancelled_at
    assert owner() is not None  # (the lock is still held)
    await anyio.to_thread.run_sync(holding.__exit__, None, None, None)
    while owner() is not None:
        assert time.monotonic() - cancelled_at < LOCK_SECONDS + 2.0, "the lease was kept"
        await anyio.sleep(0.02)
    await runtime.close()
