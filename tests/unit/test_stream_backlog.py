"""A stream's run waits for a slow consumer: it gets at most ``BACKLOG`` events ahead.

Without a bound, a consumer slower than the run saw a 30,000-superstep run finish while it was
at superstep 4,000 -- every event held in memory, and a crash leaving all those committed
events unseen by any stream (outside tester 182)."""

from __future__ import annotations

from typing import Never

import anyio
import pytest

from workflow_engine import (
    Executor,
    RequestInfoEvent,
    RunInterruptedError,
    Runtime,
    SuperstepCompletedEvent,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowEvent,
    WorkflowOutputEvent,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine._pump import BACKLOG
from workflow_engine.storage import InMemoryRunStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

STEPS = 600


class Loop(Executor):
    """Counts to ``STEPS``, noting in ``ran`` each superstep it runs."""

    def __init__(self, executor_id: str, ran: list[int]) -> None:
        super().__init__(executor_id)
        self.ran = ran

    @handler
    async def step(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        self.ran.append(n)
        if n < STEPS:
            await ctx.send_message(n + 1)
        else:
            await ctx.yield_output(n)


def looping(ran: list[int]) -> object:
    loop = Loop("loop", ran)
    return (
        WorkflowBuilder("loop", start=loop)
        .add_edge(loop, loop)
        .with_max_supersteps(STEPS + 10)
        .build()
    )


async def slowly_read(stream: object, ran: list[int]) -> int:
    """Read every event, yielding a few times for each; the most supersteps the run was ahead
    of the last one read."""
    ahead = 0
    async for event in stream:  # type: ignore[attr-defined]
        if isinstance(event, SuperstepCompletedEvent):
            ahead = max(ahead, len(ran) - event.superstep)
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
    return ahead


async def test_a_workflow_stream_waits_for_a_slow_reader() -> None:
    ran: list[int] = []
    workflow = looping(ran)
    async with workflow.run_stream(0) as stream:  # type: ignore[attr-defined]
        ahead = await slowly_read(stream, ran)
    assert len(ran) == STEPS + 1
    assert ahead <= BACKLOG // 2, ahead  # (a superstep is several events)


async def test_a_runtime_stream_waits_for_a_slow_reader() -> None:
    ran: list[int] = []
    runtime = Runtime(InMemoryRunStore())
    runtime.register(lambda: looping(ran))
    run_id = await runtime.start("loop", 0)
    async with runtime.resume_stream(run_id) as stream:
        ahead = await slowly_read(stream, ran)
    assert stream.result is not None and stream.result.outputs == [STEPS]
    assert ahead <= BACKLOG, ahead  # (two streams in a row: the run's, and the runtime's)
    await runtime.close()


class Chatter(WorkflowEvent):
    """An event of the run's own (an agent's text as it is generated, say)."""


class AskAfter(Executor):
    """Counts to 3, then says a lot and asks a person."""

    @handler
    async def step(self, n: int, ctx: WorkflowContext[int]) -> None:
        if n < 3:
            await ctx.send_message(n + 1)
            return
        for _ in range(2 * BACKLOG):
            await ctx.add_event(Chatter())
        await ctx.request_info(f"asked at {n}", bool)

    @response_handler
    async def answered(self, asked: str, answer: bool, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(f"{asked}: {answer}")


def asking() -> object:
    ask = AskAfter("ask")
    return WorkflowBuilder("asking", start=ask).add_edge(ask, ask).build()


@pytest.mark.parametrize("close", [False, True])
async def test_a_run_at_rest_gives_its_lease_back_and_keeps_its_events_for_a_slow_reader(
    close: bool,
) -> None:
    """The run waits for its reader at a superstep's end; once at rest it gives its lease back
    at once, and every event it committed stays readable -- after ``Runtime.close()`` too.
    (The first bound waited where the runtime passes events on: a paused run kept its lease
    while its reader lagged, and a closing runtime dropped the events not passed on yet --
    outside tester 186.)"""
    runtime = Runtime(InMemoryRunStore())
    runtime.register(asking)
    run_id = await runtime.start("asking", 0)
    events = []
    async with runtime.resume_stream(run_id) as stream:
        events.append(await stream.__anext__())
        with anyio.fail_after(10):
            while True:  # (the reader reads nothing meanwhile)
                record = await runtime.store.get_run(run_id)
                if (
                    record.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
                    and not record.owner
                ):
                    break
                await anyio.sleep(0.01)
        if close:
            await runtime.close()
        events.extend([event async for event in stream])
    asked = [e for e in events if isinstance(e, RequestInfoEvent)]
    assert len(asked) == 1 and asked[0].request.data == "asked at 3"
    if not close:
        done = await runtime.respond_and_resume(asked[0].request.request_id, True)
        assert done.outputs == ["asked at 3: True"]
        await runtime.close()


class Noisy(Executor):
    """Counts on for ever, each superstep saying a lot and outputting its number."""

    def __init__(self, executor_id: str, ran: list[int]) -> None:
        super().__init__(executor_id)
        self.ran = ran

    @handler
    async def step(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        self.ran.append(n)
        for _ in range(BACKLOG):
            await ctx.add_event(Chatter())
        await ctx.yield_output(n)
        await ctx.send_message(n + 1)


def noisy(ran: list[int], limit: int = 1_000) -> object:
    step = Noisy("noisy", ran)
    return (
        WorkflowBuilder("noisy", start=step).add_edge(step, step).with_max_supersteps(limit).build()
    )


async def test_a_cancel_while_the_run_waits_for_its_reader_runs_no_more_supersteps() -> None:
    """A cancel stored while the run waited for its reader was honoured one superstep late: the
    run went on with one more, its effects included (outside tester 188)."""
    ran: list[int] = []
    runtime = Runtime(InMemoryRunStore())
    runtime.register(lambda: noisy(ran))
    run_id = await runtime.start("noisy", 0)
    async with runtime.resume_stream(run_id) as stream:
        await stream.__anext__()
        await anyio.sleep(0.05)  # (the reader reads nothing: the run waits for it)
        await runtime.cancel(run_id)
        before = len(ran)
        async for _ in stream:
            pass
    assert stream.result is not None
    assert stream.result.status is WorkflowRunState.CANCELLED
    assert len(ran) == before, (before, ran)
    await runtime.close()


async def test_a_run_at_its_superstep_limit_rests_while_its_reader_lags() -> None:
    """A run whose limit was reached waited for its reader before resting, its lease held:
    another worker got ``RunBusyError`` (outside tester 188)."""
    ran: list[int] = []
    runtime = Runtime(InMemoryRunStore())
    runtime.register(lambda: noisy(ran, limit=1))
    run_id = await runtime.start("noisy", 0)
    async with runtime.resume_stream(run_id) as stream:
        await stream.__anext__()
        with anyio.fail_after(10):
            while True:  # (the reader reads nothing meanwhile)
                record = await runtime.store.get_run(run_id)
                at_limit = record.status is WorkflowRunState.MAX_SUPERSTEPS_REACHED
                if at_limit and not record.owner:
                    break
                await anyio.sleep(0.01)
        outputs = [e.data for e in [e async for e in stream] if isinstance(e, WorkflowOutputEvent)]
    assert outputs == [0]
    await runtime.close()


async def test_close_passes_on_every_event_the_run_committed(anyio_backend: str) -> None:
    """``Runtime.close()`` cut the runtime's stream off with up to 128 events of its run not
    passed on: committed outputs were published by no stream, ever (outside tester 188).
    Those the run emitted go on before ``RunInterruptedError``. (On trio a close that cuts a
    commit off can still leave that superstep's events unsent: said in the README.)"""
    ran: list[int] = []
    runtime = Runtime(InMemoryRunStore())
    runtime.register(lambda: noisy(ran))
    run_id = await runtime.start("noisy", 0)
    seen: list[int] = []
    with pytest.raises(RunInterruptedError):
        async with runtime.resume_stream(run_id) as stream:
            async for event in stream:
                if isinstance(event, WorkflowOutputEvent):
                    seen.append(event.data)
                    if len(seen) == 5:
                        await runtime.close()
    store = runtime.store
    again = Runtime(store)
    again.register(lambda: noisy(ran, limit=3))
    async with again.resume_stream(run_id) as stream:
        rest = [e.data async for e in stream if isinstance(e, WorkflowOutputEvent)]
    everything = list(range(rest[-1] + 1))
    if anyio_backend == "asyncio":
        assert seen + rest == everything, (seen, rest)
    else:  # (at most the superstep whose commit the close cut off)
        assert len(set(everything) - set(seen + rest)) <= 1, (seen, rest)
    await again.close()
