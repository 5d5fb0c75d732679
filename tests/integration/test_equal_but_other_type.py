"""A list state whose items are replaced by equal values of another type (True == 1,
-0.0 == 0.0) must come back with those types after a restart: the delta that stores a grown
list as its new items must not keep the old items in their place."""

from __future__ import annotations

from pathlib import Path

import pytest

from workflow_engine import (
    Executor,
    RequestPort,
    Runtime,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


class Retyper(Executor):
    @handler
    async def go(self, n: int, ctx: WorkflowContext[int | str, str]) -> None:
        if n == 0:
            await ctx.set_state("xs", [1, 0.0, 5, {"k": 0}])
            await ctx.set_shared("ys", [1, 2, 3])
            await ctx.send_message(1)
        else:
            await ctx.set_state("xs", [True, -0.0, 5, {"k": False}, 9])
            await ctx.set_shared("ys", [True, 2, 3, 4])
            await ctx.send_message("ask")

    @handler
    async def answered(self, answer: bool, ctx: WorkflowContext[int, str]) -> None:
        xs, ys = await ctx.get_state("xs"), await ctx.get_shared("ys")
        await ctx.yield_output(repr((xs, ys)))


def retyper_workflow():
    e = Retyper("e")
    ask = RequestPort("ask", request_type=str, response_type=bool)
    return (
        WorkflowBuilder(name="retyper", start=e)
        .add_edge(e, e)
        .add_edge(e, ask)
        .add_edge(ask, e)
        .build()
    )


async def test_types_survive_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    rt = Runtime(SqliteStore(db))
    rt.register(retyper_workflow())
    paused = await rt.run("retyper", 0)
    await rt.close()
    rt = Runtime(SqliteStore(db))  # a new process: the state is folded from the stored rows
    rt.register(retyper_workflow())
    done = await rt.respond_and_resume(paused.pending_requests[0].request_id, True)
    await rt.close()
    assert done.outputs == ["([True, -0.0, 5, {'k': False}, 9], [True, 2, 3, 4])"]
