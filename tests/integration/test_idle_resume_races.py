"""An answer or a cancel that arrives while another process holds a paused run for a resume
with nothing to run (outside tester 86: "the answer ... is stored, and that execution applies
it", and the execution ended without applying it; a cancel likewise stayed stored, the run
paused, until someone happened to resume it).

Deterministic: the resuming process is stopped just before it gives its lease back (the
store's fault hook), and the other process -- a second ``Runtime`` over its own connection to
the same file, in a thread with its own event loop -- answers or cancels then.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from tests.integration.workflows import Answer, stepper_workflow
from workflow_engine import (
    RunBusyError,
    Runtime,
    WorkflowRunResult,
    WorkflowRunState,
    WorkflowStatusEvent,
)
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


def before_the_release(
    db: Path, act: Callable[[Runtime], Awaitable[None]]
) -> tuple[Callable[[str], None], list[BaseException]]:
    """A fault hook that, the first time the store is about to give a lease back, has another
    process's runtime ``act`` on the run (in a thread, to its end); what it raised is kept."""
    raised: list[BaseException] = []
    armed = [True]

    def other_process() -> None:
        async def main() -> None:
            other = Runtime(SqliteStore(db))
            other.register(stepper_workflow)
            try:
                await act(other)
            except BaseException as exc:
                raised.append(exc)
            finally:
                await other.close()

        anyio.run(main)

    def hook(point: str) -> None:
        if point == "release:before" and armed[0]:
            armed[0] = False
            thread = threading.Thread(target=other_process)
            thread.start()
            thread.join()

    return hook, raised


async def paused_run(tmp_path: Path) -> tuple[Path, Runtime, WorkflowRunResult]:
    """A stepper run paused on its request, in a new database; its runtime."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(stepper_workflow)
    return db, runtime, await runtime.run("stepper", 1)


async def test_an_answer_stored_for_a_resume_with_nothing_to_run_is_applied_by_it(
    tmp_path: Path,
) -> None:
    db, runtime, paused = await paused_run(tmp_path)
    (request,) = paused.pending_requests

    async def answer(other: Runtime) -> None:
        await other.respond_and_resume(request.request_id, Answer(approved=True))

    hook, raised = before_the_release(db, answer)
    runtime.store.fault_hook = hook  # type: ignore[attr-defined]
    done = await runtime.resume(paused.run_id)
    # the other process was told the run is busy and that this execution applies its answer
    assert len(raised) == 1 and isinstance(raised[0], RunBusyError), raised
    assert "that execution applies it" in str(raised[0])
    assert done.status is WorkflowRunState.IDLE, done.status
    assert done.outputs == ["done: seen=[1, 2, 3, 4, 5, 6] total=21"]
    assert (await runtime.store.get_request(request.request_id)).status == "applied"
    await runtime.close()


async def test_a_cancel_stored_for_a_resume_with_nothing_to_run_cancels_the_run(
    tmp_path: Path,
) -> None:
    db, runtime, paused = await paused_run(tmp_path)
    (request,) = paused.pending_requests

    async def cancel(other: Runtime) -> None:
        info = await other.cancel(paused.run_id)
        assert info.cancel_requested  # stored for the worker that holds the run

    hook, raised = before_the_release(db, cancel)
    runtime.store.fault_hook = hook  # type: ignore[attr-defined]
    events = []
    async with runtime.resume_stream(paused.run_id) as stream:
        async for event in stream:
            events.append(event)
    assert raised == []
    assert stream.result is not None and stream.result.status is WorkflowRunState.CANCELLED
    assert isinstance(events[-1], WorkflowStatusEvent)
    assert events[-1].state is WorkflowRunState.CANCELLED
    run = await runtime.store.get_run(paused.run_id)
    assert (run.status, run.owner, run.cancel_requested) == (
        WorkflowRunState.CANCELLED,
        None,
        False,
    )
    assert (await runtime.store.get_request(request.request_id)).status == "cancelled"
    await runtime.close()


async def test_a_cancel_stored_for_a_plain_resume_with_nothing_to_run_cancels_the_run(
    tmp_path: Path,
) -> None:
    db, runtime, paused = await paused_run(tmp_path)

    async def cancel(other: Runtime) -> None:
        await other.cancel(paused.run_id)

    hook, raised = before_the_release(db, cancel)
    runtime.store.fault_hook = hook  # type: ignore[attr-defined]
    result = await runtime.resume(paused.run_id)
    assert raised == []
    assert result.status is WorkflowRunState.CANCELLED
    assert result.pending_requests == []
    assert (await runtime.get_run(paused.run_id)).status is WorkflowRunState.CANCELLED
    await runtime.close()
