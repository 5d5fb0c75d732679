"""A stream's run waits for a slow consumer: it gets at most ``BACKLOG`` events ahead.

Without a bound, a consumer slower than the run saw a 30,000-superstep run finish while it was
at superstep 4,000 -- every event held in memory, and a crash leaving all those committed
events unseen by any stream (outside tester 182)."""

from __future__ import annotations

import anyio
import pytest

from workflow_engine import (
    Executor,
    Runtime,
    SuperstepCompletedEvent,
    WorkflowBuilder,
    WorkflowContext,
    handler,
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
