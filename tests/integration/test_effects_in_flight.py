"""An effect that started is seen to its end, whatever happens to the code that started it.

``ctx.run_once`` journals an intent, runs the effect, journals its result. If the invocation
ended while an effect still ran -- a sibling in ``asyncio.gather`` raised, the stream was closed,
the task was cancelled -- the intent was left without a result while the effect went on: the
retry asked a person whether it had happened, they truthfully said no, and it ran twice
(outside tester 47). Now the invocation waits for its effects, and an effect whose caller is
cancelled runs to its end and is recorded before the cancellation goes on.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Never

import anyio
import pytest

from tests.integration.gather_effects_workflow import EFFECTS
from workflow_engine import (
    Executor,
    ExecutorInvokedEvent,
    RunInterruptedError,
    Runtime,
    UsageError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.storage import SqliteStore

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.anyio

LEDGER: list[str] = []
"""What the outside world saw happen (each effect appends its name when it completes)."""
FAIL_ONCE: set[str] = set()


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def clean_ledger() -> None:
    LEDGER.clear()
    FAIL_ONCE.clear()


class TwoAtOnce(Executor):
    """Starts two effects together: ``slow`` books after 0.2 s, ``flaky`` fails the first time."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def slow() -> str:
            await asyncio.sleep(0.2)
            LEDGER.append("slow")
            return "s"

        async def flaky() -> str:
            if "flaky" not in FAIL_ONCE:
                FAIL_ONCE.add("flaky")
                raise RuntimeError("transient")
            LEDGER.append("flaky")
            return "f"

        got = await asyncio.gather(ctx.run_once("slow", slow), ctx.run_once("flaky", flaky))
        await ctx.yield_output("".join(got))


class InAThread(Executor):
    """One effect that blocks a thread for 0.3 s, then books."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        def charge() -> str:
            time.sleep(0.3)
            LEDGER.append(f"charge in {threading.current_thread().name}")
            return "charged"

        await ctx.yield_output(await ctx.run_once("charge", lambda: asyncio.to_thread(charge)))


class Hangs(Executor):
    """One effect that never ends (a call without a timeout)."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def forever() -> str:
            await asyncio.Event().wait()
            return "never"

        await ctx.yield_output(await ctx.run_once("charge", forever, description="the charge"))


class SiblingRaises(Executor):
    """``slow`` books after 0.5 s; its sibling raises at once, every time."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def slow() -> str:
            await asyncio.sleep(0.5)
            LEDGER.append("slow")
            return "s"

        async def bad() -> None:
            await asyncio.sleep(0.05)
            raise ValueError("bad input")

        await asyncio.gather(ctx.run_once("slow", slow), bad())


class CancelsItself(Executor):
    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def odd() -> str:
            LEDGER.append("odd")
            raise asyncio.CancelledError

        await ctx.yield_output(await ctx.run_once("odd", odd))


class Nested(Executor):
    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def inner() -> str:
            return "x"

        async def outer() -> str:
            return await ctx.run_once("same", inner)

        await ctx.yield_output(await ctx.run_once("same", outer))


class IdempotentLeftBehind(Executor):
    """An idempotent step that never ends, left behind when its sibling raises."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def forever() -> str:
            await asyncio.Event().wait()
            return "never"

        async def bad() -> None:
            await asyncio.sleep(0.05)
            raise ValueError("bad input")

        await asyncio.gather(ctx.run_once("read", forever, idempotent=True), bad())


def runtime(db: Path, executor: type[Executor]) -> Runtime:
    rt = Runtime(SqliteStore(db))
    rt.register(lambda: WorkflowBuilder("pay", start=executor("pay")).build())
    return rt


async def test_a_sibling_that_raises_does_not_leave_an_effect_in_doubt(tmp_path: Path) -> None:
    rt = runtime(tmp_path / "runs.db", TwoAtOnce)
    failed = await rt.run("pay", 1)
    assert failed.status is WorkflowRunState.FAILED and "transient" in str(failed.error)
    # the invocation ended only once ``slow`` had run and its result was journaled
    assert LEDGER == ["slow"]
    done = await rt.resume(failed.run_id)
    assert done.status is WorkflowRunState.IDLE, done.pending_requests  # nothing asked
    assert done.outputs == ["sf"]
    await asyncio.sleep(0.3)
    assert LEDGER == ["slow", "flaky"]  # each effect once
    await rt.close()


async def test_a_stream_closed_while_an_effect_runs_in_a_thread(tmp_path: Path) -> None:
    rt = runtime(tmp_path / "runs.db", InAThread)
    run_id = await rt.start("pay", 1)
    stream = rt.resume_stream(run_id)
    async for event in stream:
        if isinstance(event, ExecutorInvokedEvent):
            await asyncio.sleep(0.05)  # the charge is under way in its thread
            break
    await stream.aclose()  # waits for the charge to end and records it
    assert len(LEDGER) == 1
    done = await rt.resume(run_id)
    assert done.status is WorkflowRunState.IDLE, done.pending_requests  # nothing asked
    assert done.outputs == ["charged"]
    await asyncio.sleep(0.4)
    assert len(LEDGER) == 1
    await rt.close()


class GathersTwo(Executor):
    """Two effects started together in an ``asyncio.gather``, each booking after 0.3 s."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def book(name: str) -> str:
            await asyncio.sleep(0.3)
            LEDGER.append(name)
            return name

        got = await asyncio.gather(
            ctx.run_once("first", lambda: book("first")),
            ctx.run_once("second", lambda: book("second")),
        )
        await ctx.yield_output("+".join(got))


async def test_closing_the_runtime_lets_effects_started_together_finish(tmp_path: Path) -> None:
    """``Runtime.close()`` while two effects of an ``asyncio.gather`` ran: anyio delivers its
    cancellation again and again, and the gather passed each one on, which looked like a
    second Ctrl-C: both were cut off, in doubt, and a person was asked about effects no crash
    had touched (outside tester 68). They run to their end and are recorded."""
    rt = runtime(tmp_path / "runs.db", GathersTwo)
    run_id = await rt.start("pay", 1)

    async def resume() -> None:
        with contextlib.suppress(RunInterruptedError):
            await rt.resume(run_id)

    async with anyio.create_task_group() as tg:
        tg.start_soon(resume)
        await asyncio.sleep(0.1)
        await rt.close()
    assert sorted(LEDGER) == ["first", "second"]  # both ran to their end
    again = runtime(tmp_path / "runs.db", GathersTwo)
    assert (await again.get_run(run_id)).effects_in_doubt == []
    done = await again.resume(run_id)
    assert done.status is WorkflowRunState.IDLE, done.pending_requests
    assert done.outputs == ["first+second"] and sorted(LEDGER) == ["first", "second"]
    await again.close()


class GathersEight(Executor):
    """Eight quick effects started together."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def book(name: str) -> str:
            await asyncio.sleep(0.005)
            LEDGER.append(name)
            return name

        steps = [ctx.run_once(f"e{i}", lambda i=i: book(f"e{i}")) for i in range(8)]
        await ctx.yield_output("+".join(await asyncio.gather(*steps)))


@pytest.mark.slow  # (a sweep of close() moments; `make test` runs it)
async def test_closing_the_runtime_at_any_moment_leaves_no_unstarted_step_in_doubt(
    tmp_path: Path,
) -> None:
    """``Runtime.close()`` after k turns of the event loop, for every k through the gathered
    steps' start: the gather passed the close's cancellation on to steps whose intent was
    just written, and clearing it -- they never started -- was cut off, so a person was asked
    about effects that never happened (tester 70: six of eight, at k=4). Every step is done
    once, and nothing is in doubt."""
    for k in range(40):
        LEDGER.clear()
        rt = runtime(tmp_path / f"runs-{k}.db", GathersEight)
        run_id = await rt.start("pay", 1)
        task = asyncio.get_running_loop().create_task(rt.resume(run_id))
        for _ in range(k):
            await asyncio.sleep(0)
        await rt.close()
        with contextlib.suppress(RunInterruptedError, UsageError):  # (closed before it began)
            await task
        again = runtime(tmp_path / f"runs-{k}.db", GathersEight)
        assert (await again.get_run(run_id)).effects_in_doubt == [], k
        done = await again.resume(run_id)
        assert done.status is WorkflowRunState.IDLE, (k, done.pending_requests)
        assert sorted(LEDGER) == [f"e{i}" for i in range(8)], (k, LEDGER)
        await again.close()


async def test_a_cancelled_caller_waits_for_its_effect_then_stops(tmp_path: Path) -> None:
    rt = runtime(tmp_path / "runs.db", InAThread)
    run_id = await rt.start("pay", 1)
    task = asyncio.get_running_loop().create_task(rt.resume(run_id))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(LEDGER) == 1  # the cancellation went on after the charge was recorded
    done = await rt.resume(run_id)
    assert done.status is WorkflowRunState.IDLE and done.outputs == ["charged"]
    assert len(LEDGER) == 1
    await rt.close()


async def test_a_second_cancellation_stops_waiting_for_an_effect_that_hangs(
    tmp_path: Path,
) -> None:
    """The first cancellation waits for the effect; a second one (Ctrl-C pressed again) cuts it
    off, and the step is then in doubt, as after a crash."""
    rt = runtime(tmp_path / "runs.db", Hangs)
    run_id = await rt.start("pay", 1)
    task = asyncio.get_running_loop().create_task(rt.resume(run_id))
    await asyncio.sleep(0.1)
    task.cancel()
    await asyncio.sleep(0.2)
    assert not task.done()  # waiting for the effect
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    asked = await rt.resume(run_id)
    assert asked.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    (question,) = asked.pending_requests
    assert question.data.description == "the charge"
    await rt.close()


async def cut_off_as_asyncio_run_does(rt: Runtime, run_id: str) -> None:
    """Resume ``run_id`` and stop it as a second Ctrl-C does: its caller is cancelled once
    (it waits for its effects), then every task is (``asyncio.run`` tearing down)."""
    before = asyncio.all_tasks()  # (the test's own, and its runner's)
    task = asyncio.get_running_loop().create_task(rt.resume(run_id))
    await asyncio.sleep(0.1)
    task.cancel()
    await asyncio.sleep(0.05)
    for other in asyncio.all_tasks() - before:
        if other is not task:
            other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@pytest.mark.slow  # real time: effects in threads, cut off
async def test_every_task_cancelled_as_asyncio_run_does_leaves_the_effect_in_doubt(
    tmp_path: Path,
) -> None:
    """A second Ctrl-C: ``asyncio.run`` cancels every task, the effect's own among them, while
    its caller already waits for it. The effect was cut off from outside; it was taken for one
    that cancelled itself -- a clean failure, its intent cleared -- and the next resume ran it
    again without asking (outside tester 59). It is in doubt: a person is asked."""
    rt = runtime(tmp_path / "runs.db", InAThread)
    run_id = await rt.start("pay", 1)
    await cut_off_as_asyncio_run_does(rt, run_id)
    await asyncio.sleep(0.4)  # the thread books anyway: it cannot be called back
    assert len(LEDGER) == 1
    asked = await rt.resume(run_id)
    assert asked.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, asked.outputs
    assert len(LEDGER) == 1  # not run again blindly
    await rt.close()


def charge() -> str:
    """An effect that blocks a thread for 0.3 s, then books."""
    time.sleep(0.3)
    LEDGER.append("charge")
    return "charged"


class InATaskGroup(Executor):
    """Its step runs inside a task group (which wraps what it raises)."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def step() -> None:
            await ctx.yield_output(await ctx.run_once("charge", lambda: asyncio.to_thread(charge)))

        async with anyio.create_task_group() as tg:
            tg.start_soon(step)


class CatchingAll(Executor):
    """Its handler catches every exception around its step (and falls back)."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        try:
            result = await ctx.run_once("charge", lambda: asyncio.to_thread(charge))
        except Exception:
            result = "fallback"
        await ctx.yield_output(result)


class TwoInAGather(Executor):
    """Two steps at once."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        def charge(name: str) -> str:
            time.sleep(0.3)
            LEDGER.append(name)
            return name

        results = await asyncio.gather(
            *(
                ctx.run_once(name, lambda name=name: asyncio.to_thread(charge, name))
                for name in ("first", "second")
            )
        )
        await ctx.yield_output("+".join(results))


@pytest.mark.slow  # real time: effects in threads, cut off
@pytest.mark.parametrize("executor", [InATaskGroup, CatchingAll, TwoInAGather])
async def test_a_step_in_doubt_is_asked_about_however_the_handler_meets_it(
    tmp_path: Path, executor: type[Executor]
) -> None:
    """A step left in doubt, met again by a handler that runs it in a task group (which wraps
    the error: the run failed on every resume, for good), or catches every exception (the run
    went on with its fallback, no one asked): the run pauses and a person is asked (outside
    tester 60). Several steps in doubt at once are asked about at once (one per resume)."""
    rt = runtime(tmp_path / "runs.db", executor)
    run_id = await rt.start("pay", 1)
    await cut_off_as_asyncio_run_does(rt, run_id)
    await asyncio.sleep(0.4)  # the threads book anyway
    booked = len(LEDGER)
    asked = await rt.resume(run_id)
    assert asked.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, (
        asked.status,
        asked.outputs,
        asked.error,
    )
    assert len(asked.pending_requests) == booked  # every step in doubt, at once
    assert {type(r.data).__name__ for r in asked.pending_requests} == {"InDoubtEffect"}
    for request in asked.pending_requests:
        await rt.respond(request.request_id, {"happened": True, "result": "charged"})
    done = await rt.resume(run_id)
    assert done.status is WorkflowRunState.IDLE, (done.status, done.error)
    assert len(LEDGER) == booked  # nothing ran again
    await rt.close()


async def test_a_caller_cancelled_while_an_effect_is_left_behind(tmp_path: Path) -> None:
    """The sibling raised and the invocation waits for ``slow``; the caller gives up meanwhile
    (asyncio's own cancellation, which no shield stops): the wait goes on until ``slow`` is
    recorded, then the cancellation (outside tester 48: it stopped the wait, and the next
    resume asked about ``slow`` while it still ran)."""
    rt = runtime(tmp_path / "runs.db", SiblingRaises)
    run_id = await rt.start("pay", 1)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(rt.resume(run_id), 0.2)
    assert LEDGER == ["slow"]  # recorded before the cancellation went on
    again = await rt.resume(run_id)
    assert again.status is WorkflowRunState.FAILED and not again.pending_requests
    assert LEDGER == ["slow"]
    await rt.close()


async def test_an_effect_that_cancels_itself_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    rt = runtime(tmp_path / "runs.db", CancelsItself)
    failed = await rt.run("pay", 1)
    assert failed.status is WorkflowRunState.FAILED
    assert "cancelled from within" in str(failed.error)
    assert not failed.pending_requests  # nothing in doubt: it ended, by itself
    await rt.close()


async def test_a_step_called_from_within_itself_is_refused(tmp_path: Path) -> None:
    rt = runtime(tmp_path / "runs.db", Nested)
    failed = await asyncio.wait_for(rt.run("pay", 1), 5)  # it used to wait for itself forever
    assert failed.status is WorkflowRunState.FAILED
    assert "called from within its own effect" in str(failed.error)
    await rt.close()


async def test_an_idempotent_step_left_behind_is_not_waited_for(tmp_path: Path) -> None:
    rt = runtime(tmp_path / "runs.db", IdempotentLeftBehind)
    failed = await asyncio.wait_for(rt.run("pay", 1), 5)  # it used to hang
    assert failed.status is WorkflowRunState.FAILED and "bad input" in str(failed.error)
    await rt.close()


@pytest.mark.slow  # real processes, killed at random
@pytest.mark.parametrize("seed", range(6))
def test_effects_started_together_survive_sigkills(tmp_path: Path, seed: int) -> None:
    """The same under SIGKILL: a loop whose executors start two effects at once, its driving
    process killed at random moments (seeded) and every question in doubt answered truthfully
    from the ledger -- each effect is booked exactly once (outside tester 47: in 15 of 30
    seeds some were booked twice, up to 7 times)."""
    rng = random.Random(seed)
    db, ledger = tmp_path / "runs.db", tmp_path / "ledger"
    argv = [sys.executable, "-m", "tests.integration.gather_effects_workflow", str(db), str(ledger)]
    for _ in range(6):
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            _, err = proc.communicate(timeout=rng.uniform(0.15, 0.6))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            continue
        assert proc.returncode == 0, err.decode()[-2000:]
        break
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    booked = collections.Counter(line.split()[1] for line in ledger.read_text().splitlines())
    assert {label: n for label, n in booked.items() if n > 1} == {}
    assert len(booked) == EFFECTS
