"""Leaving a stream early stops the run cleanly: no more supersteps, the lease ends at once."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path
from typing import Any

import anyio
import pytest

from workflow_engine import (
    Executor,
    Runtime,
    SuperstepCompletedEvent,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

executed: list[int] = []


class Counter(Executor):
    @handler
    async def count(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        executed.append(n)
        await anyio.sleep(0.01)
        if n < 20:
            await ctx.send_message(n + 1)
        else:
            await ctx.yield_output(n)


def build() -> Any:
    counter = Counter("counter")
    return WorkflowBuilder(name="counter", start=counter).add_edge(counter, counter).build()


async def test_leaving_run_stream_early_stops_the_run() -> None:
    executed.clear()
    async with aclosing(build().run_stream(1)) as stream:
        async for event in stream:
            if isinstance(event, SuperstepCompletedEvent) and event.superstep == 2:
                break
    seen = len(executed)
    await anyio.sleep(0.1)  # were the run still going, it would count on meanwhile
    assert len(executed) == seen <= 3


async def test_leaving_a_durable_stream_early_releases_the_lease(tmp_path: Path) -> None:
    executed.clear()
    db = tmp_path / "runs.db"
    first = Runtime(SqliteStore(db), lease_seconds=60)
    first.register(build)
    run_id = await first.start("counter", 1)
    async with aclosing(first.resume_stream(run_id)) as stream:
        async for event in stream:
            if isinstance(event, SuperstepCompletedEvent) and event.superstep == 2:
                break
    second = Runtime(SqliteStore(db), lease_seconds=60)
    second.register(build)
    done = await second.resume(run_id)  # at once: no 60-second wait for an abandoned lease
    assert done.status is WorkflowRunState.IDLE and done.outputs == [20]
    await first.close()
    await second.close()


async def test_breaking_out_and_dropping_a_stream_stops_the_run() -> None:
    """``break`` without ``aclose()``: dropping the stream cancels the run in its own task (no
    cancel scope left from another task, no CancelledError leaking into the caller)."""
    executed.clear()
    async for event in build().run_stream(1):
        if isinstance(event, SuperstepCompletedEvent):
            break
    seen = len(executed)
    await anyio.sleep(0.15)  # the caller's own awaits are not cancelled
    assert len(executed) == seen <= 2


async def test_breaking_out_of_a_durable_stream_releases_the_lease(tmp_path: Path) -> None:
    executed.clear()
    db = tmp_path / "runs.db"
    first = Runtime(SqliteStore(db), lease_seconds=60)
    first.register(build)
    run_id = await first.start("counter", 1)
    async for event in first.resume_stream(run_id):
        if isinstance(event, SuperstepCompletedEvent):
            break
    await anyio.sleep(0.05)  # the dropped stream's task releases the lease
    info = await first.get_run(run_id)  # the caller's next await works
    assert info.status is not WorkflowRunState.IDLE
    done = await first.resume(run_id)
    assert done.status is WorkflowRunState.IDLE and done.outputs == [20]
    await first.close()
