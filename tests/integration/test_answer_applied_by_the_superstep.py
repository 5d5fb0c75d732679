"""A resume applies stored answers in its first superstep's commit: no commit of its own.

``respond`` stores the answer durably; it stays ``answered`` until a commit applies it. So the
runtime's resume writes one transaction fewer (``answer``, then ``resume + complete``), and a
crash before that commit leaves the answer waiting, to be applied again (the SIGKILL sweeps in
``test_crash_safety.py`` / ``test_side_effects_crash.py`` cover every point). What a person
sees must not lag behind: while the run executes that superstep its status is ``in_progress``.
A failing superstep still leaves the answer applied. ``Workflow.run`` given answers directly
(no store keeps them) still commits them first.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from workflow_engine import (
    Executor,
    InMemoryCheckpointStore,
    RequestPort,
    Runtime,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


class Start(Executor):
    @handler
    async def on_topic(self, topic: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(f"a note about {topic}")


class End(Executor):
    """Publishes on approval; waits for ``gate`` first if one is set; fails on ``boom``."""

    def __init__(self, id: str, gate: anyio.Event | None = None) -> None:
        super().__init__(id)
        self.gate = gate
        self.started = anyio.Event()

    @handler
    async def on_verdict(self, approved: bool, ctx: WorkflowContext[None, str]) -> None:
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        if not approved:
            raise RuntimeError("boom: the reviewer said no")
        await ctx.yield_output("published")


def review(end: End):
    start = Start("start")
    port = RequestPort("review", request_type=str, response_type=bool)
    return WorkflowBuilder("review", start=start).add_edge(start, port).add_edge(port, end).build()


def request_rows(db: Path) -> list[tuple[str, str]]:
    """(request id, status) of every request, read from the file by another connection."""
    with sqlite3.connect(db) as conn:
        return list(conn.execute("SELECT request_id, status FROM requests"))


async def paused_run(db: Path, end: End) -> tuple[Runtime, str, str]:
    runtime = Runtime(SqliteStore(db))
    runtime.register(review(end))
    paused = await runtime.run("review", "supersteps")
    assert paused.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    return runtime, paused.run_id, paused.pending_requests[0].request_id


async def test_resume_to_the_end_writes_one_checkpoint(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    runtime, run_id, request_id = await paused_run(db, End("end"))
    before = await runtime.store.history(run_id)
    result = await runtime.respond_and_resume(request_id, True)
    assert result.status is WorkflowRunState.IDLE and result.outputs == ["published"]
    after = await runtime.store.history(run_id)
    assert len(after) == len(before) + 1, [(h.superstep, h.status) for h in after]
    latest = await runtime.store.latest(run_id)
    assert latest is not None and request_id in latest.answered_requests
    assert not latest.pending_requests
    assert request_rows(db) == [(request_id, "applied")]
    await runtime.close()


async def test_the_run_shows_in_progress_while_it_applies_the_answer(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    gate = anyio.Event()
    end = End("end", gate)
    runtime, run_id, request_id = await paused_run(db, end)
    onlooker = Runtime(SqliteStore(db))  # another connection: what a CLI or a console reads
    onlooker.register(review(End("end")))
    assert [r.request_id for r in (await onlooker.get_run(run_id)).pending_requests] == [request_id]
    await runtime.respond(request_id, True)
    assert request_rows(db) == [(request_id, "answered")]
    assert (await onlooker.get_run(run_id)).pending_requests == []  # it waits for no one now
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.resume, run_id)
        await end.started.wait()
        run = await onlooker.get_run(run_id)
        assert run.status is WorkflowRunState.IN_PROGRESS and run.pending_requests == []
        assert request_rows(db) == [(request_id, "answered")]  # applied by the coming commit
        gate.set()
    run = await onlooker.get_run(run_id)
    assert run.status is WorkflowRunState.IDLE and run.outputs == ["published"]
    assert request_rows(db) == [(request_id, "applied")]
    await onlooker.close()
    await runtime.close()


async def test_a_failing_superstep_leaves_the_answer_applied(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    runtime, run_id, request_id = await paused_run(db, End("end"))
    result = await runtime.respond_and_resume(request_id, False)
    assert result.status is WorkflowRunState.FAILED
    assert "boom" in (result.error.message if result.error else "")
    latest = await runtime.store.latest(run_id)
    assert latest is not None and request_id in latest.answered_requests
    assert not latest.pending_requests  # the answer is applied: in flight, not asked again
    assert request_rows(db) == [(request_id, "applied")]
    run = await runtime.store.get_run(run_id)
    assert run.status is WorkflowRunState.FAILED
    await runtime.close()


async def test_answers_given_to_workflow_run_are_committed_first() -> None:
    store = InMemoryCheckpointStore()
    workflow = review(End("end"))
    paused = await workflow.run("supersteps", checkpoint_store=store)
    request_id = paused.pending_requests[0].request_id
    before = len(await store.list(paused.run_id))
    done = await workflow.run(
        checkpoint=paused.checkpoint, responses={request_id: True}, checkpoint_store=store
    )
    assert done.outputs == ["published"]
    # nothing else keeps these answers: the checkpoint that applies them comes first
    assert len(await store.list(paused.run_id)) == before + 2
