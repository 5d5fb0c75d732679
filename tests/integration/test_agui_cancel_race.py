"""One client approves an interrupt while another cancels it, at the same moment: exactly one
of them takes effect. The cancel used to read the interrupt as pending, then cancel the run
while the approval's superstep ran -- so the approved step ran, the run came to rest, and the
run was then marked cancelled with the canceller told it worked (outside tester 107).

A real uvicorn server in this process (``in_process``), real HTTP clients in two threads.
"""

import contextlib
import threading
import uuid
from pathlib import Path
from typing import Any, Never

import anyio
import pytest
from ag_ui.core import EventType
from fastapi import FastAPI

from tests.integration.agui_harness import Client, Stream, in_process, resolved
from workflow_engine import (
    Executor,
    RunNotResumableError,
    Runtime,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowNotRegisteredError,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine.storage import SqliteStore
from workflow_engine_agui import add_agui_endpoint

pytestmark = pytest.mark.slow


class SlowApplier(Executor):
    """Asks whether to go on; the approved step takes a while (a tool call would), so that a
    cancel arriving while it runs has a window to land in."""

    @handler
    async def ask(self, question: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.request_info(question, str)

    @response_handler
    async def applied(self, question: str, answer: str, ctx: WorkflowContext[Never, str]) -> None:
        await anyio.sleep(0.05)
        await ctx.yield_output(f"done: {answer}")


def slow_workflow() -> Workflow:
    return WorkflowBuilder("slow-applier", start=SlowApplier("applier")).build()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cancel-race") / "runs.db"


@pytest.fixture(scope="module")
def client(db: Path) -> Any:
    app = FastAPI()
    store = SqliteStore(db)
    add_agui_endpoint(app, slow_workflow(), "/slow", store=store)
    with in_process(app) as port:
        yield Client(f"http://127.0.0.1:{port}")
    anyio.run(store.close)


def test_an_approval_and_a_cancel_at_once_never_both_take_effect(client: Client, db: Path) -> None:
    outcomes = []
    for _ in range(20):  # (without the fix, most rounds of 20 showed one)
        thread_id = f"race-{uuid.uuid4().hex[:12]}"
        [interrupt] = client.start("/slow", thread_id, "go on?").interrupts
        sends = {
            "approve": resolved(interrupt.id, "yes"),
            "cancel": [{"interruptId": interrupt.id, "status": "cancelled"}],
        }
        streams: dict[str, Stream] = {}
        gate = threading.Barrier(2)

        threads = [
            threading.Thread(target=_send, args=(client, thread_id, name, resume, streams, gate))
            for name, resume in sends.items()
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        status, request = anyio.run(_run_and_request, db, thread_id, interrupt.id)
        approve, cancel = streams["approve"], streams["cancel"]
        said = f"approve:\n{approve.describe()}\ncancel:\n{cancel.describe()}"
        cancelled = cancel.last.type == EventType.RUN_FINISHED
        if cancelled:  # the cancel won: nothing was applied, the approval was refused
            assert status is WorkflowRunState.CANCELLED, said
            assert request.status == "cancelled" and request.answer is None, said
            assert approve.last.type == EventType.RUN_ERROR, said
            assert approve.last.code in ("request_cancelled", "interrupt_not_pending"), said
        else:  # the approval won: the run finished on it, the cancel was refused
            assert status is WorkflowRunState.IDLE, said
            assert request.status == "applied" and request.answer == "yes", said
            assert cancel.last.code in ("interrupt_not_pending", "run_busy"), said
            assert approve.last.type == EventType.RUN_FINISHED or (
                approve.last.code == "run_busy"  # (the cancel's check held the run then)
            ), said
        outcomes.append("cancel" if cancelled else "approve")
    assert "approve" in outcomes, outcomes  # (both orders are exercised in practice)


def _send(
    client: Client,
    thread_id: str,
    name: str,
    resume: list[dict[str, Any]],
    streams: dict[str, Stream],
    gate: threading.Barrier | None,
) -> None:
    """Send ``resume`` once both senders are ready; what came back into ``streams``."""
    if gate is not None:
        gate.wait()
    streams[name] = client.resume("/slow", thread_id, resume)


async def _run_and_request(db: Path, thread_id: str, interrupt_id: str) -> tuple[Any, Any]:
    """The status of the thread's run and the interrupt's request, read by a store of its own."""
    async with SqliteStore(db) as store:
        request = await store.get_request(interrupt_id.split(".")[0])
        run = await store.get_run(request.run_id)
    return run.status, request


def test_a_cancel_sent_again_finishes_one_cut_off_half_way(client: Client, db: Path) -> None:
    """A cancel cancels the interrupt, then the run: a server that ended between the two left
    the interrupt cancelled and its run paused, still waiting for it. The client's retry of the
    same cancel cancels the run."""
    thread_id = f"race-{uuid.uuid4().hex[:12]}"
    [interrupt] = client.start("/slow", thread_id, "go on?").interrupts
    request_id = interrupt.id.split(".")[0]
    anyio.run(_cancel_request_only, db, request_id)
    status, _ = anyio.run(_run_and_request, db, thread_id, interrupt.id)
    assert status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    again = client.resume(
        "/slow", thread_id, [{"interruptId": interrupt.id, "status": "cancelled"}]
    )
    assert again.finished.outcome.type == "cancelled", again.describe()
    status, request = anyio.run(_run_and_request, db, thread_id, interrupt.id)
    assert status is WorkflowRunState.CANCELLED and request.status == "cancelled"


async def _cancel_request_only(db: Path, request_id: str) -> None:
    async with SqliteStore(db) as store:
        await store.cancel_requests([request_id])


def test_the_same_cancel_sent_twice_at_once_reports_the_cancelled_run_to_both(
    client: Client, db: Path
) -> None:
    """A cancel retried through a load balancer reaches two servers at once: the copy that
    came second was told ``run_not_resumable`` ("already cancelled") for a cancel that worked
    (outside tester 110: 6 rounds in 40)."""
    ends: list[str] = []
    for _ in range(20):
        thread_id = f"race-{uuid.uuid4().hex[:12]}"
        [interrupt] = client.start("/slow", thread_id, "go on?").interrupts
        cancel = [{"interruptId": interrupt.id, "status": "cancelled"}]
        streams: dict[str, Stream] = {}
        gate = threading.Barrier(2)
        threads = [
            threading.Thread(target=_send, args=(client, thread_id, name, cancel, streams, gate))
            for name in ("one", "two")
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for stream in streams.values():
            last = stream.last
            said = last.outcome.type if last.type == EventType.RUN_FINISHED else last.code
            assert said in ("cancelled", "run_busy"), stream.describe()
            ends.append(said)
        status, request = anyio.run(_run_and_request, db, thread_id, interrupt.id)
        assert status is WorkflowRunState.CANCELLED and request.status == "cancelled"
    assert "cancelled" in ends


def test_a_run_cancel_from_elsewhere_never_relabels_a_run_its_approval_finished(
    client: Client, db: Path
) -> None:
    """``workflow-engine cancel RUN`` (a run-level cancel) while an approval's superstep runs:
    that superstep finished the run, and the cancel honoured after it relabelled the run
    cancelled -- its effects done, its output made (outside testers 110 and 111). A finished
    run stays finished; a cancel stored meanwhile is moot."""
    outcomes = []
    for _ in range(12):
        thread_id = f"race-{uuid.uuid4().hex[:12]}"
        [interrupt] = client.start("/slow", thread_id, "go on?").interrupts
        run_id = f"slow:{thread_id}/0"
        streams: dict[str, Stream] = {}
        sender = threading.Thread(
            target=_send,
            args=(client, thread_id, "approve", resolved(interrupt.id, "yes"), streams, None),
        )
        sender.start()
        anyio.run(_cancel_when_executing, db, run_id)
        sender.join()
        status, request = anyio.run(_run_and_request, db, thread_id, interrupt.id)
        history = anyio.run(_statuses, db, run_id)
        if request.status == "applied":  # the approval's superstep ran: it finished the run
            assert status is WorkflowRunState.IDLE, (history, streams["approve"].describe())
            assert WorkflowRunState.CANCELLED not in history, history
        else:
            assert status is WorkflowRunState.CANCELLED, history
        outcomes.append(request.status)
    assert "applied" in outcomes, outcomes


async def _cancel_when_executing(db: Path, run_id: str) -> None:
    """Cancel the run (as the command line does) once a worker holds it, or it rests."""
    async with SqliteStore(db) as store:
        runtime = Runtime(store)
        for _ in range(200):
            run = await store.get_run(run_id)
            if (
                run.owner is not None
                or run.status is not WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
            ):
                break
            await anyio.sleep(0.005)
        with contextlib.suppress(RunNotResumableError, WorkflowNotRegisteredError):
            await runtime.cancel(run_id)


async def _statuses(db: Path, run_id: str) -> list[Any]:
    async with SqliteStore(db) as store:
        return [i.status for i in await store.history(run_id)]
