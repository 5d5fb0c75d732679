"""The SQLite store keeps its runs' latest checkpoints in memory (a resume in the same process
skips reading and parsing them), bounded by a count and by the bytes they hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.workflows import stepper_workflow
from workflow_engine import (
    Executor,
    RequestPort,
    Runtime,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.storage import SqliteStore, _sqlite

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


class Holder(Executor):
    """Keeps ``size`` characters in its state, asks, then yields their count."""

    @handler
    async def start(self, size: int, ctx: WorkflowContext[str, int]) -> None:
        await ctx.set_state("blob", "x" * size)
        await ctx.send_message("go on?")

    @handler
    async def answered(self, answer: bool, ctx: WorkflowContext[str, int]) -> None:
        await ctx.yield_output(len(await ctx.get_state("blob", "")))


def holder_workflow():
    holder = Holder("holder")
    port = RequestPort("ask", request_type=str, response_type=bool)
    return (
        WorkflowBuilder(name="holder", start=holder)
        .add_edge(holder, port)
        .add_edge(port, holder)
        .build()
    )


async def test_big_checkpoints_are_kept_up_to_a_byte_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite, "_RECENT_BYTES", 1_000_000)
    store = SqliteStore(tmp_path / "runs.db")
    rt = Runtime(store)
    rt.register(holder_workflow())
    paused = [await rt.run("holder", 300_000) for _ in range(8)]
    assert all(p.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS for p in paused)
    kept = store._recent
    assert 1 <= len(kept) <= 4, len(kept)  # 8 x 300 KB do not fit in 1 MB
    assert store._recent_bytes == sum(size for _, size in kept.values())
    assert store._recent_bytes <= 1_000_000 + 400_000  # the newest may be over alone
    # the evicted ones are read back from the file, the kept ones from memory: all resume
    for p in paused:
        request_id = p.pending_requests[0].request_id
        done = await rt.respond_and_resume(request_id, True)
        assert (done.status, done.outputs) == (WorkflowRunState.IDLE, [300_000])
    await rt.close()


async def test_small_checkpoints_are_kept_up_to_a_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite, "_RECENT_RUNS", 5)
    store = SqliteStore(tmp_path / "runs.db")
    rt = Runtime(store)
    rt.register(stepper_workflow())
    paused = [await rt.run("stepper", 1) for _ in range(12)]
    assert len(store._recent) == 5
    assert list(store._recent) == [p.run_id for p in paused[-5:]]  # the most recent ones
    for p in paused:
        done = await rt.respond_and_resume(p.pending_requests[0].request_id, {"approved": True})
        assert done.status is WorkflowRunState.IDLE
    await rt.close()
