"""``Runtime.close()`` while runs execute: they stop, their leases are given back at once.

A server shutting down closes its runtime with runs still executing. Each of those runs is
interrupted where it is -- a step already under way (a tool or model call) runs to its end and
is recorded first -- and its lease is given back before the store closes, so another process
can resume it at once instead of waiting for the lease to run out (30 s). The callers are told
(``RunInterruptedError``, naming the run); resuming continues each run exactly.
"""

from __future__ import annotations

import ast
import contextlib
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from workflow_engine import (
    Executor,
    RunInterruptedError,
    Runtime,
    UsageError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

STEPS = 5

_CLOSE_WHILE_RUNNING = """
import asyncio, sys
sys.path.insert(0, sys.argv[2])
from test_cancelled_callers import counting
from workflow_engine import Runtime
from workflow_engine.storage import SqliteStore

async def main():
    runtime = Runtime(SqliteStore(sys.argv[1]))
    runtime.register(counting(pause=0.002))
    runs = [await runtime.start("counting", 1) for _ in range(100)]
    running = [asyncio.ensure_future(runtime.resume(r)) for r in runs]
    await asyncio.sleep(0.01)
    await runtime.close()  # a server shutting down while runs execute
    got = await asyncio.gather(*running, return_exceptions=True)
    print(sorted({type(g).__name__ for g in got}), flush=True)
    sys.stdin.read()  # alive (its leases would be live) until the test is done looking

asyncio.run(main())
"""


@pytest.mark.slow
def test_closing_while_runs_execute_gives_their_leases_back_at_once(tmp_path: Path) -> None:
    """While the closing process still lives, no run is leased any more, and another process
    resumes every interrupted run to its exact end. Before, the runs were told the store was
    closed and their leases lapsed for other processes only after 30 s (outside tester 55);
    earlier still, the process could die of a segmentation fault (outside tester 54)."""
    from test_cancelled_callers import counting

    db = tmp_path / "runs.db"
    for _ in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", _CLOSE_WHILE_RUNNING, str(db), str(Path(__file__).parent)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            said = child.stdout.readline()
            assert child.poll() is None, child.stderr.read() if child.stderr else ""
            # runs that had not finished were told so; none was told the store closed under it
            assert set(ast.literal_eval(said)) <= {"RunInterruptedError", "WorkflowRunResult"}, said
            assert "RunInterruptedError" in said, said

            async def finish() -> None:
                runtime = Runtime(SqliteStore(db))
                runtime.register(counting(pause=0.002))
                for record in await runtime.list_runs():
                    assert record.owner is None, f"run {record.run_id} is still leased"
                    if record.status is not WorkflowRunState.IDLE:
                        result = await runtime.resume(record.run_id)  # no RunBusyError
                        assert result.status is WorkflowRunState.IDLE, result.status
                    info = await runtime.get_run(record.run_id)
                    assert info.outputs == list(range(1, STEPS + 1))
                await runtime.close()

            anyio.run(finish)
        finally:
            assert child.stdin is not None
            child.stdin.close()
            assert child.wait(timeout=60) == 0
            stderr = child.stderr.read() if child.stderr else ""
            # nothing to say of each lease (outside tester 55: a warning per run flooded a
            # server's log at shutdown)
            assert "could not be given back" not in stderr, stderr[-500:]
            assert "not released" not in stderr, stderr[-500:]
            for stream in (child.stdout, child.stderr):
                if stream is not None:
                    stream.close()


class Paying(Executor):
    """Pays once (a journaled step that takes a while), then counts on to ``STEPS``."""

    def __init__(self, log: list[str], started: anyio.Event | None = None) -> None:
        super().__init__("payer")
        self.log = log
        self.started = started

    @handler
    async def on_number(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        if n == 2:

            async def pay() -> str:
                self.log.append("paid")
                if self.started is not None:
                    self.started.set()
                await anyio.sleep(0.3)
                self.log.append("receipt")
                return "receipt-1"

            await ctx.run_once("pay", pay, description="pay the invoice")
        await anyio.sleep(0.05)  # a step that waits (a run whose steps never wait may end first)
        await ctx.yield_output(n)
        if n < STEPS:
            await ctx.send_message(n + 1)


def looping(name: str, node: Any):  # type: ignore[no-untyped-def]
    """A workflow of one executor that sends itself the next message."""
    return WorkflowBuilder(name, start=node).add_edge(node, node).build()


def paying(log: list[str], started: anyio.Event | None = None):  # type: ignore[no-untyped-def]
    return looping("paying", Paying(log, started))


def paying_runtime(db: Path) -> tuple[Runtime, list[str], anyio.Event]:
    """A runtime with ``paying`` registered, the payments' log, and the event set once the
    (first) payment started."""
    log: list[str] = []
    started = anyio.Event()
    runtime = Runtime(SqliteStore(db))
    runtime.register(paying(log, started))
    return runtime, log, started


async def closed_during(
    runtime: Runtime, execute: Callable[[], Awaitable[Any]], started: anyio.Event
) -> list[RunInterruptedError]:
    """Close ``runtime`` once ``started`` is set while ``execute()`` runs; what it was told."""
    told: list[RunInterruptedError] = []

    async def executing() -> None:
        try:
            await execute()
        except RunInterruptedError as exc:
            told.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(executing)
        await started.wait()
        await runtime.close()
    return told


@pytest.mark.slow  # real time: steps that wait while closing begins
@pytest.mark.parametrize("streaming", [False, True])
async def test_a_step_under_way_finishes_and_is_recorded_before_the_run_stops(
    tmp_path: Path, streaming: bool
) -> None:
    """Closed while a payment is under way: the payment ends and its result is journaled, the
    caller (or the stream's consumer) is told the run was interrupted, and the run, resumed at
    once elsewhere, neither pays again nor asks a person whether it paid."""
    db = tmp_path / "runs.db"
    runtime, log, started = paying_runtime(db)
    run_id = await runtime.start("paying", 1)

    async def execute() -> None:
        if streaming:
            async with runtime.resume_stream(run_id) as stream:
                async for _ in stream:
                    pass
        else:
            await runtime.resume(run_id)

    told = await closed_during(runtime, execute, started)
    assert log == ["paid", "receipt"], log
    assert len(told) == 1 and told[0].run_id == run_id, told  # type: ignore[attr-defined]
    message = str(told[0])
    assert run_id in message and "resume it" in message, message

    later = Runtime(SqliteStore(db))
    later.register(paying(log))
    assert (await later.get_run(run_id)).status is WorkflowRunState.IN_PROGRESS
    result = await later.resume(run_id)  # at once: the lease was given back
    assert result.status is WorkflowRunState.IDLE, (result.status, result.pending_requests)
    assert (await later.get_run(run_id)).outputs == list(range(1, STEPS + 1))
    assert log == ["paid", "receipt"], log  # paid once, never asked about
    await later.close()


class PaysLast(Executor):
    """Counts to ``STEPS``, paying in the last superstep, which ends the run."""

    def __init__(self, log: list[str], started: anyio.Event) -> None:
        super().__init__("payer")
        self.log, self.started = log, started

    @handler
    async def on_number(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        if n == STEPS:

            async def pay() -> str:
                self.log.append("paid")
                self.started.set()
                await anyio.sleep(0.3)
                return "receipt-1"

            await ctx.run_once("pay", pay, description="pay the invoice")
        await ctx.yield_output(n)
        if n < STEPS:
            await ctx.send_message(n + 1)


@pytest.mark.slow  # real time: a step under way while closing begins
@pytest.mark.parametrize("streaming", [False, True])
async def test_a_run_that_comes_to_rest_as_it_closes_is_reported_as_it_rests(
    tmp_path: Path, streaming: bool, anyio_backend: str
) -> None:
    """Closed while the step that ends the run is under way: that superstep's commit makes
    the run finished -- and its caller was told it was interrupted, with no result, though
    nothing was left to resume (outside tester 112: 20 finished runs of 20 said so)."""
    db = tmp_path / "runs.db"
    log: list[str] = []
    started = anyio.Event()
    runtime = Runtime(SqliteStore(db))
    runtime.register(looping("pays-last", PaysLast(log, started)))
    run_id = await runtime.start("pays-last", 1)
    got: list[Any] = []

    async def execute() -> None:
        if streaming:
            async with runtime.resume_stream(run_id) as stream:
                async for _ in stream:
                    pass
            got.append(stream.result)
        else:
            got.append(await runtime.resume(run_id))

    told = await closed_during(runtime, execute, started)
    later = Runtime(SqliteStore(db))
    now = (await later.get_run(run_id)).status
    await later.close()
    assert log == ["paid"], log
    # what the caller is told is what the store says
    if told:
        assert now is WorkflowRunState.IN_PROGRESS and got == [], (told, now)
    else:
        [result] = got
        assert result is not None and result.status is WorkflowRunState.IDLE, result
        assert result.outputs[-1] == STEPS and now is WorkflowRunState.IDLE
    if anyio_backend == "asyncio" and not streaming:
        # the commit ending the run is made on the loop, before any cancellation point
        assert told == [], (told, now)


@pytest.mark.slow  # real time: steps that wait while closing begins
async def test_nothing_starts_once_closing_began(tmp_path: Path) -> None:
    """A run started or resumed while (or after) the runtime closes is refused, saying why --
    not half-started, not leased."""
    db = tmp_path / "runs.db"
    runtime, log, started = paying_runtime(db)
    waiting = await runtime.start("paying", 1)
    busy = await runtime.start("paying", 1)
    refused: list[str] = []

    async def execute() -> None:
        with pytest.raises(RunInterruptedError):
            await runtime.resume(busy)

    async with anyio.create_task_group() as tg:
        tg.start_soon(execute)
        await started.wait()
        tg.start_soon(runtime.close)
        await anyio.sleep(0.05)  # close() waits for the payment under way
        for attempt in (
            lambda: runtime.resume(waiting),
            lambda: runtime.run("paying", 1),
        ):
            with pytest.raises(UsageError) as caught:
                await attempt()
            refused.append(str(caught.value))
    assert refused[0] == f"the runtime is closed: run {waiting!r} was not resumed", refused
    assert refused[1].startswith("the runtime is closed: run ") and "not started" in refused[1]
    await runtime.close()  # again: nothing to do

    later = Runtime(SqliteStore(db))
    later.register(paying(log))
    records = {r.run_id: r for r in await later.list_runs()}
    assert set(records) == {waiting, busy}, "a refused run was admitted"
    assert all(r.owner is None for r in records.values())
    t0 = time.monotonic()
    for run_id in (waiting, busy):
        assert (await later.resume(run_id)).status is WorkflowRunState.IDLE
    assert time.monotonic() - t0 < 5
    await later.close()


@pytest.mark.slow  # real time: steps that wait while closing begins
async def test_closing_from_two_tasks_at_once_both_return(tmp_path: Path) -> None:
    """A server's shutdown hook and a signal handler both close the runtime: both calls
    return once the runs are stopped (the first waited forever: outside tester 56)."""
    runtime, log, started = paying_runtime(tmp_path / "runs.db")
    run_ids = [await runtime.start("paying", 1) for _ in range(3)]
    told: list[str] = []

    async def resume(run_id: str) -> None:
        try:
            await runtime.resume(run_id)
        except RunInterruptedError as exc:
            told.append(exc.run_id)

    async with anyio.create_task_group() as tg:
        for run_id in run_ids:
            tg.start_soon(resume, run_id)
        await started.wait()
        with anyio.fail_after(10):
            async with anyio.create_task_group() as closers:
                closers.start_soon(runtime.close)
                await anyio.sleep(0.01)
                closers.start_soon(runtime.close)
            await runtime.close()  # once more, after: nothing to do
    assert sorted(told) == sorted(run_ids), told
    # every payment that started (at least the first; the others may not have begun yet)
    # ended before the runs stopped
    assert 1 <= log.count("paid") == log.count("receipt") <= 3, log


@pytest.mark.slow
async def test_runs_taking_their_lease_when_closing_begins_give_it_back(tmp_path: Path) -> None:
    """Closing while resumes wait for another process's write lock to take their leases: once
    the lock is gone, each takes its lease and gives it back at once, its caller told the run
    was interrupted. Before, close() closed the store under them: they were told "the store
    is closed" and their leases stayed, live, for 30 s (outside tester 56)."""
    from test_cancelled_callers import write_lock_held

    db = tmp_path / "runs.db"
    runtime, _, _ = paying_runtime(db)
    run_ids = [await runtime.start("paying", 1) for _ in range(5)]
    told: dict[str, BaseException] = {}

    async def resume(run_id: str) -> None:
        try:
            await runtime.resume(run_id)
        except Exception as exc:
            told[run_id] = exc

    with write_lock_held(db, 1.0):
        async with anyio.create_task_group() as tg:
            for run_id in run_ids:
                tg.start_soon(resume, run_id)
            await anyio.sleep(0.2)
            await runtime.close()
    assert sorted(told) == sorted(run_ids), told
    for run_id, exc in told.items():
        assert isinstance(exc, RunInterruptedError) and exc.run_id == run_id, repr(exc)
    other = SqliteStore(db)  # another connection, while this process lives
    for run_id in run_ids:
        assert (await other.get_run(run_id)).owner is None, f"run {run_id} is still leased"
    await other.close()


class PayingUnderALock(Executor):
    """Pays, and while paying another process takes the database's write lock (``lock()``
    returns once it is held) and keeps it past the store's busy timeout."""

    def __init__(self, log: list[str], lock: object) -> None:
        super().__init__("payer")
        self.log = log
        self.lock = lock

    @handler
    async def on_number(self, n: int, ctx: WorkflowContext[None, str]) -> None:
        async def pay() -> str:
            self.log.append("paid")
            await anyio.to_thread.run_sync(self.lock)  # type: ignore[arg-type]
            return "receipt-1"

        await ctx.yield_output(await ctx.run_once("pay", pay, description="pay the invoice"))


@pytest.mark.slow
def test_a_step_result_waits_out_a_lock_held_past_the_busy_timeout(tmp_path: Path) -> None:
    """The effect happened; the write lock another process held past the busy timeout (0.3 s
    here, 1.2 s held) refused its result: the step was left looking in doubt, and resuming
    asked a person whether the payment happened (outside tester 56). The result is now
    written once the lock is gone, and the run ends without a question."""
    from test_cancelled_callers import write_lock_held

    db = tmp_path / "runs.db"
    log: list[str] = []
    holders: list[Any] = []

    def lock() -> None:
        holding = write_lock_held(db, 1.2)
        holders.append(holding)
        holding.__enter__()  # returns once the other process holds the lock

    node = PayingUnderALock(log, lock)
    workflow = WorkflowBuilder("pay-under-lock", start=node).build()

    async def main() -> None:
        runtime = Runtime(SqliteStore(db, busy_timeout=0.3))
        runtime.register(workflow)
        result = await runtime.run("pay-under-lock", 1)
        assert result.status is WorkflowRunState.IDLE, (result.status, result.error)
        assert result.outputs == ["receipt-1"] and log == ["paid"], (result.outputs, log)
        await runtime.close()

    try:
        anyio.run(main)
    finally:
        for holding in holders:
            holding.__exit__(None, None, None)


async def test_once_closed_nothing_uses_the_store_again(tmp_path: Path) -> None:
    """After close(), a call that would write (or read) is refused with a UsageError naming
    what was not done -- the closed store is not opened again behind the caller's back (it
    was: start, respond and fork wrote to it; outside tester 56)."""
    db = tmp_path / "runs.db"
    runtime, _, _ = paying_runtime(db)
    run_id = await runtime.start("paying", 1)
    await runtime.close()
    wal = db.with_name(db.name + "-wal")
    assert not wal.exists()
    calls = {
        "start": (lambda: runtime.start("paying", 1), "run of workflow 'paying' was not started"),
        "respond": (
            lambda: runtime.respond("r1", True),
            "this answer to request 'r1' was not stored",
        ),
        "fork": (lambda: runtime.fork(run_id, 0), f"run {run_id!r} was not forked"),
        "get_run": (lambda: runtime.get_run(run_id), f"run {run_id!r} was not read"),
        "cancel": (lambda: runtime.cancel(run_id), f"run {run_id!r} was not cancelled"),
    }
    for name, (call, said) in calls.items():
        with pytest.raises(UsageError) as caught:
            await call()
        assert str(caught.value) == f"the runtime is closed: {said}", name
    assert not wal.exists(), "the closed store was opened again"


@pytest.mark.slow
async def test_a_cancel_under_way_when_closing_begins_says_what_it_did(tmp_path: Path) -> None:
    """A cancel waiting for another process's write lock when closing begins completes, and
    says so -- it ended by reading the run back through a call refused once closing began,
    so its caller was told "was not read" of a run it had cancelled (outside tester 57)."""
    from test_cancelled_callers import counting, write_lock_held

    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(counting(ask_at=1))
    paused = await runtime.run("counting", 1)
    assert paused.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    got: list[Any] = []

    async def cancel() -> None:
        got.append(await runtime.cancel(paused.run_id))

    with write_lock_held(db, 1.0):
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel)
            await anyio.sleep(0.2)
            await runtime.close()
    assert got and got[0].status is WorkflowRunState.CANCELLED, got


class AskingTwice(Executor):
    """Asks two questions at once; the first answer takes a while (a journaled step)."""

    def __init__(self, during: Any = None) -> None:
        super().__init__("asker")
        self.during = during

    @handler
    async def on_start(self, n: int, ctx: WorkflowContext[None, str]) -> None:
        await ctx.request_info("first?", str)
        await ctx.request_info("second?", str)

    @response_handler
    async def on_answer(self, question: str, answer: str, ctx: WorkflowContext[None, str]) -> None:
        async def act() -> str:
            if question == "first?" and self.during is not None:
                await self.during()
            return f"{question} {answer}"

        await ctx.yield_output(await ctx.run_once(question, act))


@pytest.mark.slow  # real time: steps that wait while closing begins
async def test_answers_waiting_when_closing_begins_are_not_shown_as_pending(
    tmp_path: Path,
) -> None:
    """An answer stored (by another process) while the run executed would be applied by a
    catch-up resume; closing stops that, and the caller is told the run was interrupted --
    it got a paused result listing the answered request as pending (outside tester 57)."""
    db = tmp_path / "runs.db"
    holder: dict[str, Any] = {}

    async def during() -> None:  # the first answer's step: meanwhile the second is answered
        other = Runtime(SqliteStore(db))
        other.register(asking_twice())
        await other.respond(holder["second"], "no")
        await other.close()
        holder["answered"].set()  # the test closes the runtime now
        await anyio.sleep(0.05)

    def asking_twice(during: Any = None) -> Any:
        node = AskingTwice(during)
        return WorkflowBuilder("asking", start=node).build()

    runtime = Runtime(SqliteStore(db))
    runtime.register(asking_twice(during))
    holder["runtime"] = runtime
    paused = await runtime.run("asking", 1)
    first, second = (r.request_id for r in paused.pending_requests)
    holder["second"] = second
    holder["answered"] = anyio.Event()
    caught: list[RunInterruptedError] = []

    async def answer_first() -> None:
        try:
            await runtime.respond_and_resume(first, "yes")
        except RunInterruptedError as exc:
            caught.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(answer_first)
        await holder["answered"].wait()
        await runtime.close()
    assert caught, "the caller was not told"
    assert caught[0].run_id == paused.run_id
    assert "recorded" not in str(caught[0])

    later = Runtime(SqliteStore(db))
    later.register(asking_twice())
    done = await later.resume(paused.run_id)
    assert done.status is WorkflowRunState.IDLE, done.status
    assert (await later.get_run(paused.run_id)).outputs == ["first? yes", "second? no"]
    await later.close()


async def test_close_from_within_a_run_is_refused_and_the_runtime_still_closes(
    tmp_path: Path,
) -> None:
    """A handler closing its own runtime would wait for its own run: refused, saying why
    (it was cancelled, leaving the runtime refusing every call with its store open: outside
    tester 57); the runtime closes from outside as usual."""
    said: list[str] = []
    holder: dict[str, Runtime] = {}

    class Closing(Executor):
        @handler
        async def on_start(self, n: int, ctx: WorkflowContext[None, int]) -> None:
            try:
                await holder["runtime"].close()
            except UsageError as exc:
                said.append(str(exc))
            await ctx.yield_output(n)

    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    holder["runtime"] = runtime
    runtime.register(WorkflowBuilder("closing", start=Closing("closer")).build())
    result = await runtime.run("closing", 7)
    assert result.status is WorkflowRunState.IDLE and result.outputs == [7]
    assert said and "from within a run" in said[0], said
    assert await runtime.list_runs()  # still open
    await runtime.close()
    with pytest.raises(UsageError):
        await runtime.list_runs()


@pytest.mark.slow  # real time: steps that wait while closing begins
async def test_a_run_failing_because_the_runtime_closes_is_interrupted_not_failed(
    tmp_path: Path,
) -> None:
    """A step that uses the runtime while it closes is refused; the run is interrupted (to
    be resumed), not recorded FAILED (outside tester 57)."""
    db = tmp_path / "runs.db"
    holder: dict[str, Any] = {"go": anyio.Event(), "started": anyio.Event()}

    class UsingTheRuntime(Executor):
        @handler
        async def on_start(self, n: int, ctx: WorkflowContext[None, str]) -> None:
            async def start_another() -> str:
                holder["started"].set()
                await holder["go"].wait()
                return await holder["runtime"].start("using", 0)

            await ctx.yield_output(await ctx.run_once("start", start_another))

    def using() -> Any:
        return WorkflowBuilder("using", start=UsingTheRuntime("user")).build()

    runtime = Runtime(SqliteStore(db))
    runtime.register(using())
    holder["runtime"] = runtime
    run_id = await runtime.start("using", 1)
    async with anyio.create_task_group() as tg:

        async def resume() -> None:
            with pytest.raises(RunInterruptedError):
                await runtime.resume(run_id)

        tg.start_soon(resume)
        await holder["started"].wait()
        tg.start_soon(runtime.close)
        await anyio.sleep(0.05)
        holder["go"].set()
    later = Runtime(SqliteStore(db))
    later.register(using())
    assert (await later.get_run(run_id)).status is WorkflowRunState.IN_PROGRESS
    await later.close()


@pytest.mark.slow
async def test_an_answer_taking_its_lease_when_closing_begins_leaves_the_run_as_it_was(
    tmp_path: Path,
) -> None:
    """respond_and_resume waiting for another process's lock when closing begins: its answer
    is stored, its run given back at once, still waiting (not left looking interrupted:
    outside tester 57)."""
    from test_cancelled_callers import counting, write_lock_held

    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(counting(ask_at=1))
    paused = await runtime.run("counting", 1)
    request_id = paused.pending_requests[0].request_id
    told: list[BaseException] = []

    async def answer() -> None:
        try:
            await runtime.respond_and_resume(request_id, True)
        except RunInterruptedError as exc:
            told.append(exc)

    with write_lock_held(db, 1.0):
        async with anyio.create_task_group() as tg:
            tg.start_soon(answer)
            await anyio.sleep(0.2)
            await runtime.close()
    assert told, "the caller was not told"
    other = SqliteStore(db)
    record = await other.get_run(paused.run_id)
    assert record.owner is None
    assert record.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, record.status
    assert (await other.get_request(request_id)).status == "answered"
    await other.close()


async def test_callers_cut_off_while_the_store_opens_leave_no_run_leased(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A new database is opened on the store's worker thread. A caller cut off meanwhile (a
    timeout) leaves the worker to finish; the connection it made is then closed -- not the
    one the run's next write opened in between. That one was closed under the run: its lease
    could not be given back ("the store is closed") and stayed taken after ``close()``
    (outside tester 89, 4 of 40 runs). Deadlines from 0.5 ms to 20 ms, each on a new file,
    cut the run while its store opens (its first step's ``run_once`` reads the journal at
    once), during that step, or at its first commit."""
    leased = []
    for n in range(40):
        db = tmp_path / f"runs-{n}.db"
        runtime = Runtime(SqliteStore(db))
        runtime.register(stepping())
        with anyio.move_on_after((n + 1) * 0.0005):
            await runtime.run("stepping", 0.004)
        await runtime.close()
        with contextlib.closing(sqlite3.connect(db)) as conn:
            rows = conn.execute("SELECT run_id, owner FROM runs").fetchall()
        leased += [run_id for run_id, owner in rows if owner is not None]
    assert not leased, f"{len(leased)} of 40 runs left leased after close()"
    assert "could not be given back" not in caplog.text
    assert "not released" not in caplog.text


class Stepping(Executor):
    """One journaled step that takes ``seconds``, then a pause for an answer."""

    def __init__(self) -> None:
        super().__init__("stepping")

    @handler
    async def on_seconds(self, seconds: float, ctx: WorkflowContext[float]) -> None:
        await ctx.run_once("step", lambda: anyio.sleep(seconds))
        await ctx.request_info("go on?", bool)

    @response_handler
    async def on_answer(self, question: str, go_on: bool, ctx: WorkflowContext[float]) -> None:
        pass


def stepping():  # type: ignore[no-untyped-def]
    return WorkflowBuilder("stepping", start=Stepping()).build()


class Charging(Executor):
    """Charges once (a journaled step that takes a while), then counts on to ``STEPS`` without
    ever waiting: no await of its supersteps suspends (their commits run on the loop)."""

    def __init__(self, ran: list[int], started: anyio.Event) -> None:
        super().__init__("charger")
        self.ran = ran
        self.started = started

    @handler
    async def on_number(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        self.ran.append(n)
        if n == 1:

            async def charge() -> str:
                self.started.set()
                await anyio.sleep(0.2)
                return "charged"

            await ctx.run_once("charge", charge)
        await ctx.yield_output(n)
        if n < STEPS:
            await ctx.send_message(n + 1)


async def test_closing_during_a_step_stops_a_run_whose_supersteps_never_wait(
    tmp_path: Path,
) -> None:
    """Closed during a payment, a run whose next supersteps never suspend stops at the
    superstep boundary after it: on asyncio the cancellation was never delivered (it waits for
    the task to suspend), so the run went on to its end, and its caller got its result instead
    of ``RunInterruptedError`` (outside tester 90, 20 of 20)."""
    db = tmp_path / "runs.db"
    ran: list[int] = []
    started = anyio.Event()
    runtime = Runtime(SqliteStore(db))
    runtime.register(looping("charging", Charging(ran, started)))
    await runtime.store.open()
    told = await closed_during(runtime, lambda: runtime.run("charging", 1), started)
    assert len(told) == 1, told
    assert ran == [1], f"supersteps started after close(): {ran[1:]}"
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT status, superstep, owner FROM runs").fetchall()
    assert rows in ([("in_progress", 0, None)], [("in_progress", 1, None)]), rows


async def answered_while_closing(runtime: Runtime, paused: list[Any], delay: float) -> dict:
    """Answer each paused run at once (a refusal: the run ends in that superstep), close the
    runtime ``delay`` seconds later; what each caller was told, by run."""
    told: dict[str, Any] = {}

    async def answer(run: Any) -> None:
        (asked,) = run.pending_requests
        try:
            told[run.run_id] = await runtime.respond_and_resume(
                asked.request_id, {"approved": False, "note": "no"}
            )
        except RunInterruptedError as exc:
            told[run.run_id] = exc

    async with anyio.create_task_group() as tg:
        for run in paused:
            tg.start_soon(answer, run)
        await anyio.sleep(delay)
        await runtime.close()
    return told


@pytest.mark.slow  # real time: closes a few milliseconds into the runs
async def test_what_each_caller_is_told_is_what_its_run_became(tmp_path: Path) -> None:
    """Paused runs answered at once, the runtime closed a few milliseconds later: each caller
    told "interrupted" has a run that did not finish, and each caller given a result has the
    run its result says. On trio a finished run's caller was told it was interrupted (its
    commit's end was given up on: outside tester 114, 1 to 3 runs of 4)."""
    from tests.integration.workflows import stepper_workflow

    for delay in (0.002, 0.004, 0.006, 0.008):
        db = tmp_path / f"runs-{delay}.db"
        runtime = Runtime(SqliteStore(db))
        runtime.register(stepper_workflow)
        paused = [await runtime.run("stepper", 1) for _ in range(6)]
        told = await answered_while_closing(runtime, paused, delay)
        later = Runtime(SqliteStore(db))
        for run_id, said in told.items():
            now = (await later.get_run(run_id)).status
            if isinstance(said, RunInterruptedError):
                assert now is not WorkflowRunState.IDLE, (delay, run_id, now)
            else:
                assert said.status is now, (delay, run_id, said.status, now)
        await later.close()
