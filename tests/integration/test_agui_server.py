"""End to end: ``workflow-engine serve`` as a real process, spoken to over AG-UI like a client.

Every stream is read line by line from a live server, every event validated against the
ag-ui-protocol models and every stream against AG-UI's sequence rules (see ``agui_harness``).
One shared server serves the cases that need no configuration of their own; each case uses its
own thread ids.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from ag_ui.core import EventType

from tests.integration.agui_harness import (
    Client,
    Server,
    Stream,
    cli,
    free_port,
    resolved,
    run_input,
    server_env,
    user,
)
from workflow_engine.storage import SqliteStore

# Subprocesses of the CLI or a server: `make test` runs these, `make test-fast` does not.
pytestmark = pytest.mark.slow

REFUND = "I want a refund for order 12345"
APPROVAL_SCHEMA = {
    "type": "object",
    "properties": {"accepted": {"type": "boolean"}, "arguments": {"type": "object"}},
    "required": ["accepted"],
}
REFUND_ARGUMENTS = {"order_id": "12345", "amount": 89.99, "reason": "customer request"}
NOT_SUBMITTED = "Okay, I did not submit the refund."
MAX_BODY = 64_000


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One default server (loopback, no token, no CORS) with a demo ledger."""
    base = tmp_path_factory.mktemp("agui")
    ledger = base / "ledger.jsonl"
    server = Server(
        db=base / "runs.db",
        log=base / "server.log",
        args=["--max-body-bytes", str(MAX_BODY)],
        env={"WORKFLOW_ENGINE_DEMO_LEDGER": str(ledger)},
    )
    with server:
        yield server


@pytest.fixture
def client(shared: Server) -> Client:
    return Client(shared.url)


def thread() -> str:
    return f"thread-{uuid.uuid4().hex[:12]}"


def ledger_lines(server: Server, thread_id: str) -> list[dict[str, object]]:
    path = Path(server.env["WORKFLOW_ENGINE_DEMO_LEDGER"])
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    # run ids are "<endpoint>:<thread>/<n>"; the idempotency key is "<run id>:<call id>"
    return [line for line in lines if str(line["key"]).startswith(f"support:{thread_id}/")]


def to_approval(client: Client, thread_id: str) -> Stream:
    """Start the support demo and run it to its approval interrupt for submit_refund."""
    stream = client.start("/support", thread_id, REFUND)
    [interrupt] = stream.interrupts
    assert interrupt.reason == "tool_call"
    assert interrupt.metadata["agent_framework"]["name"] == "submit_refund"
    return stream


def assert_success(stream: Stream) -> None:
    outcome = stream.finished.outcome
    assert outcome is None or outcome.type == "success", stream.describe()


# --- 1. the support demo up to the approval interrupt -------------------------------------------


def test_support_demo_streams_up_to_an_approval_interrupt(client: Client) -> None:
    thread_id = thread()
    stream = client.start("/support", thread_id, REFUND)

    steps = [e.step_name for e in stream.of(EventType.STEP_STARTED)]
    assert {"triage_agent", "refund_agent"} <= set(steps)
    assert steps.index("triage_agent") < steps.index("refund_agent")
    starts = stream.of(EventType.TEXT_MESSAGE_START)
    assert starts and all(e.role == "assistant" for e in starts)
    assert len(stream.of(EventType.TEXT_MESSAGE_CONTENT)) > len(starts)  # streamed in pieces
    assert "refunds specialist" in stream.text()
    assert stream.tool_names() == [
        "handoff_to_refund_agent",
        "lookup_order_details",
        "submit_refund",
    ]
    calls = {e.tool_call_name: e.tool_call_id for e in stream.of(EventType.TOOL_CALL_START)}
    arguments: dict[str, str] = {}
    for e in stream.of(EventType.TOOL_CALL_ARGS):
        arguments[e.tool_call_id] = arguments.get(e.tool_call_id, "") + e.delta
    assert json.loads(arguments[calls["submit_refund"]]) == REFUND_ARGUMENTS
    assert {e.tool_call_id for e in stream.of(EventType.TOOL_CALL_END)} == set(calls.values())
    results = stream.results()
    assert calls["lookup_order_details"] in results
    assert calls["submit_refund"] not in results  # waits for approval
    assert stream.custom("status")
    [request_info] = stream.custom("request_info")

    [interrupt] = stream.interrupts
    assert interrupt.reason == "tool_call"
    assert interrupt.tool_call_id == calls["submit_refund"]
    assert interrupt.message == "Approve tool call submit_refund?"
    assert interrupt.response_schema == APPROVAL_SCHEMA
    assert interrupt.response_schema["properties"]["accepted"] == {"type": "boolean"}
    framework = interrupt.metadata["agent_framework"]
    assert framework["name"] == "submit_refund"
    assert framework["arguments"] == REFUND_ARGUMENTS
    assert request_info.value["request_id"] == interrupt.id


# --- 2. approve (list form) and reject (dict form) ----------------------------------------------


def test_approve_with_the_list_form_submits_the_refund(client: Client, shared: Server) -> None:
    thread_id = thread()
    [interrupt] = to_approval(client, thread_id).interrupts

    stream = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
    assert "Refund of 89.99 for order 12345 submitted." in stream.results()[interrupt.tool_call_id]
    assert stream.custom("workflow_output")
    assert_success(stream)
    assert "case complete." in stream.text()
    assert len(ledger_lines(shared, thread_id)) == 1


def reject(client: Client, thread_id: str) -> Stream:
    """Reject the refund with the dict form of ``resume``: ends in an input_required interrupt."""
    [interrupt] = to_approval(client, thread_id).interrupts
    stream = client.resume(
        "/support",
        thread_id,
        {"interrupts": [{"id": interrupt.id, "value": {"approved": False}}]},
    )
    assert stream.results()[interrupt.tool_call_id].startswith("Error:")
    assert NOT_SUBMITTED in stream.text()
    [question] = stream.interrupts
    assert question.reason == "input_required"
    assert question.id != interrupt.id
    assert NOT_SUBMITTED in (question.message or "")
    schema = question.response_schema
    assert schema is not None and schema["type"] == "object"
    assert {"message", "end"} <= set(schema["properties"])
    return stream


def test_reject_with_the_dict_form_then_answer_with_a_string(
    client: Client, shared: Server
) -> None:
    thread_id = thread()
    [question] = reject(client, thread_id).interrupts

    stream = client.resume("/support", thread_id, resolved(question.id, "No, thanks"))
    assert_success(stream)
    assert "case complete." in stream.text()
    assert ledger_lines(shared, thread_id) == []


def test_reject_then_end_the_conversation(client: Client, shared: Server) -> None:
    thread_id = thread()
    [question] = reject(client, thread_id).interrupts

    stream = client.resume("/support", thread_id, resolved(question.id, {"end": True}))
    assert_success(stream)
    assert ledger_lines(shared, thread_id) == []


# --- 3. cancel ----------------------------------------------------------------------------------


def test_cancel_then_a_new_message_starts_a_new_run(client: Client, shared: Server) -> None:
    thread_id = thread()
    [interrupt] = to_approval(client, thread_id).interrupts

    cancel = [{"interruptId": interrupt.id, "status": "cancelled"}]
    stream = client.resume("/support", thread_id, cancel)
    assert stream.finished.outcome.type == "cancelled"

    late = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
    assert late.error_code == "interrupt_not_pending"
    assert ledger_lines(shared, thread_id) == []

    again = client.start("/support", thread_id, "I want a refund for order 67890")
    [fresh] = again.interrupts
    assert fresh.id != interrupt.id
    assert fresh.metadata["agent_framework"]["arguments"]["order_id"] == "67890"
    done = client.resume("/support", thread_id, resolved(fresh.id, {"accepted": True}))
    assert_success(done)
    assert [line["order_id"] for line in ledger_lines(shared, thread_id)] == ["67890"]


def test_a_new_run_on_a_thread_uses_fresh_message_and_tool_call_ids(client: Client) -> None:
    """AG-UI clients keep one message list per thread, keyed by messageId / toolCallId: a
    second conversation on the same thread must not reuse the first one's ids."""
    thread_id = thread()
    first = to_approval(client, thread_id)
    [interrupt] = first.interrupts
    client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
    second = client.start("/support", thread_id, "I want a refund for order 67890")

    def ids(stream: Stream) -> set[str]:
        return {e.message_id for e in stream.of(EventType.TEXT_MESSAGE_START)} | {
            e.tool_call_id for e in stream.of(EventType.TOOL_CALL_START)
        }

    reused = ids(first) & ids(second)
    assert not reused, f"ids reused within thread {thread_id}: {sorted(reused)}"


# --- 4. a server restart between interrupt and resume -------------------------------------------


def paused_then_stopped(tmp_path: Path) -> tuple[Server, str, Any]:
    """A server of its own (with a ledger) that ran a thread to its approval, then stopped:
    the server, the thread and its interrupt."""
    server = Server(
        db=tmp_path / "runs.db",
        log=tmp_path / "server.log",
        env={"WORKFLOW_ENGINE_DEMO_LEDGER": str(tmp_path / "ledger.jsonl")},
    )
    thread_id = thread()
    with server:
        [interrupt] = to_approval(Client(server.url), thread_id).interrupts
    assert server.proc is None
    return server, thread_id, interrupt


def approve_from_the_command_line(
    server: Server, thread_id: str, edits: dict[str, Any] | None = None
) -> list[str]:
    """Store the approval of the one pending request (with a reviewer's ``edits``) while no
    server runs (as a server killed after storing it, before applying it, leaves it); the
    CLI's arguments for that database."""
    engine = [*cli(), "--db", str(server.db)]
    listed = subprocess.run(
        [*engine, "requests", "list", "--json"], capture_output=True, text=True, check=True
    )
    [request] = json.loads(listed.stdout)
    edited = ["--arguments", json.dumps(edits)] if edits else []
    subprocess.run([*engine, "respond", request["request_id"], "--approve", *edited], check=True)
    assert not ledger_lines(server, thread_id)  # stored, not applied
    return engine


def test_a_thread_survives_a_server_restart(tmp_path: Path) -> None:
    server, thread_id, interrupt = paused_then_stopped(tmp_path)
    with server:  # a new process (and port) on the same database
        client = Client(server.url)
        stream = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
        assert "submitted" in stream.results()[interrupt.tool_call_id]
        assert_success(stream)
        assert "case complete." in stream.text()
    assert len(ledger_lines(server, thread_id)) == 1


def test_a_resume_resent_after_the_server_stopped_short_continues_the_run(
    tmp_path: Path,
) -> None:
    """The server stored the answer but stopped before applying it (killed, restarted: here the
    answer is stored from the command line while no server runs). The client, never told how
    its resume ended, sends it again to the new server: that continues the run, once (outside
    tester: an empty RUN_FINISHED, and the approved refund never happened)."""
    server, thread_id, interrupt = paused_then_stopped(tmp_path)
    approve_from_the_command_line(server, thread_id)
    with server:
        client = Client(server.url)
        stream = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
        assert_success(stream)
        assert "submitted" in stream.results()[interrupt.tool_call_id]
        assert "case complete." in stream.text()
        again = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
        assert_success(again)
        assert not again.of(EventType.TOOL_CALL_RESULT)  # done: the repeat changes nothing
    assert len(ledger_lines(server, thread_id)) == 1


_CUT_AFTER_THE_TOOL = """
import os, signal, sys, anyio
from workflow_engine import Runtime
from workflow_engine.storage import SqliteStore
from workflow_engine_cli._registry import register

seen = []

def hook(point):
    seen.append(point)
    if point == "commit:before" and "journal:after" in seen:  # the tool ran, was recorded
        os.kill(os.getpid(), signal.SIGKILL)

async def main():
    runtime = Runtime(SqliteStore(sys.argv[1], fault_hook=hook))
    register(runtime, [(await runtime.store.get_run(sys.argv[2])).workflow_name])
    await runtime.resume(sys.argv[2])

anyio.run(main)
"""


def test_a_resume_continuing_a_run_cut_off_after_its_tool_ran_sends_the_call_whole(
    tmp_path: Path,
) -> None:
    """The server applied the approval, the tool ran and its result was recorded, and the
    server stopped before the superstep's commit. The client sends its resume again: the
    continued run reports the tool's result (recorded: it does not run again) after the call
    -- its start, its arguments, its end. The arguments were missing: the call was no longer
    held by a pending request (outside tester 58)."""
    from tests.integration.test_agui_wire import replayed_call

    server, thread_id, interrupt, _, _ = approved_then_killed(tmp_path, _CUT_AFTER_THE_TOOL)
    assert len(ledger_lines(server, thread_id)) == 1  # the refund happened, once
    with server:
        client = Client(server.url)
        stream = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
        assert_success(stream)
        name, arguments, result = replayed_call(stream, interrupt.tool_call_id)
        assert (name, arguments) == ("submit_refund", REFUND_ARGUMENTS)
        assert "Refund of 89.99 for order 12345 submitted." in result
        assert "case complete." in stream.text()
    assert len(ledger_lines(server, thread_id)) == 1


def approved_then_killed(tmp_path: Path, script: str) -> tuple[Server, str, Any, str, list[str]]:
    """A thread whose approval was stored while no server ran, then applied by ``script``,
    which kills its process at a chosen point: the server (stopped), the thread, its approval
    interrupt, the run and the command line's arguments for the database."""
    server, thread_id, interrupt = paused_then_stopped(tmp_path)
    engine = approve_from_the_command_line(server, thread_id)
    [run] = json.loads(
        subprocess.run(
            [*engine, "runs", "list", "--json"], capture_output=True, text=True, check=True
        ).stdout
    )
    cut = subprocess.run(
        [sys.executable, "-c", script, str(server.db), run["run_id"]],
        env={**os.environ, **server.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cut.returncode == -signal.SIGKILL, (cut.returncode, cut.stderr[-2000:])
    return server, thread_id, interrupt, run["run_id"], engine


def assert_the_refund_in_doubt(stream: Any, run_id: str) -> str:
    """``stream`` says the refund is in doubt, then ends cancelled; the key it gives."""
    assert stream.status == 200, stream.describe()
    [said] = stream.custom("effects_in_doubt")
    [effect] = said.value
    assert effect["executor_id"] == "refund_agent"
    assert effect["description"]["tool"] == "submit_refund"
    assert effect["idempotency_key"].startswith(f"{run_id}:")
    assert stream.last.type == EventType.RUN_FINISHED
    assert stream.last.outcome.type == "cancelled", stream.describe()
    return str(effect["idempotency_key"])


def test_a_run_cancelled_with_its_refund_in_doubt_tells_the_client(tmp_path: Path) -> None:
    """The approved refund started and the process was killed before it recorded a result;
    then the run was cancelled (from the command line) before anyone was asked whether the
    refund happened. The client sending its resume again is told which call is in doubt and
    the key to look it up by, before the cancelled outcome (outside tester 65: the run just
    ended cancelled)."""
    server, thread_id, interrupt, run_id, engine = approved_then_killed(
        tmp_path, _CUT_AFTER_THE_INTENT
    )
    subprocess.run([*engine, "cancel", run_id], check=True, capture_output=True)
    with server:
        client = Client(server.url)
        approved = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
        assert approved.error_code == "interrupt_not_pending", approved.describe()
        message = approved.last.message
        assert "was cancelled while these effects were in doubt" in message
        assert "the call of tool 'submit_refund' (idempotency key " in message
        cancel = [{"interruptId": interrupt.id, "status": "cancelled"}]
        key = assert_the_refund_in_doubt(client.resume("/support", thread_id, cancel), run_id)
        assert key in message
    assert not ledger_lines(server, thread_id)  # killed before the ledger was written


def test_a_client_cancelling_the_question_about_its_refund_is_told_it_stays_in_doubt(
    tmp_path: Path,
) -> None:
    """The client is asked whether the cut-off refund happened and cancels that question: the
    run ends cancelled with the refund in doubt, and that client (not only one sending the
    cancel again) is told so (outside tester 66)."""
    server, thread_id, interrupt, run_id, _ = approved_then_killed(tmp_path, _CUT_AFTER_THE_INTENT)
    with server:
        client = Client(server.url)
        asked = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
        [question] = asked.interrupts
        assert "Did this effect happen" in question.message, asked.describe()
        cancel = [{"interruptId": question.id, "status": "cancelled"}]
        key = assert_the_refund_in_doubt(client.resume("/support", thread_id, cancel), run_id)
        assert key in question.message
    assert not ledger_lines(server, thread_id)


_CUT_AFTER_THE_INTENT = _CUT_AFTER_THE_TOOL.replace(
    'point == "commit:before" and "journal:after" in seen', 'point == "intent:after"'
)


def test_a_thread_whose_run_was_cut_off_continues_it_before_a_new_message(
    tmp_path: Path,
) -> None:
    """A thread's run left unfinished by a server that stopped (here: its answer stored while no
    server ran): another message is refused by name, and the request that started the run, sent
    again, continues it -- instead of a second run beside one left behind for good (outside
    tester: a first message re-sent after a SIGKILL started a new run)."""
    server, thread_id, _ = paused_then_stopped(tmp_path)
    engine = approve_from_the_command_line(server, thread_id)
    with server:
        client = Client(server.url)
        other = client.start("/support", thread_id, "Where is my parcel?")
        assert other.error_code == "run_interrupted", other.describe()
        again = client.start("/support", thread_id, REFUND)
        assert_success(again)
        assert "case complete." in again.text()
    runs = json.loads(
        subprocess.run(
            [*engine, "runs", "list", "--json"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert [r["status"] for r in runs] == ["idle"]
    assert len(ledger_lines(server, thread_id)) == 1


def test_a_cut_off_run_continued_by_its_start_sends_its_call_as_the_reviewer_edited_it(
    tmp_path: Path,
) -> None:
    """Continued by the request that started it, a run that was applying an approval with a
    reviewer's edits sent the call with the model's arguments, then the result of the edited
    call (outside tester 140): the answers it applies are read, as a resume reads them."""
    from tests.integration.test_agui_wire import replayed_call

    server, thread_id, interrupt = paused_then_stopped(tmp_path)
    approve_from_the_command_line(server, thread_id, edits={"amount": 50.0})
    with server:
        again = Client(server.url).start("/support", thread_id, REFUND)
        assert_success(again)
        name, arguments, result = replayed_call(again, interrupt.tool_call_id)
    assert (name, arguments) == ("submit_refund", {**REFUND_ARGUMENTS, "amount": 50.0})
    assert "Refund of 50" in result, result
    assert len(ledger_lines(server, thread_id)) == 1


# --- 5. exactly-once answers --------------------------------------------------------------------


def test_a_repeated_resume_is_harmless_and_a_conflicting_one_is_refused(
    client: Client, shared: Server
) -> None:
    thread_id = thread()
    [interrupt] = to_approval(client, thread_id).interrupts
    approve = resolved(interrupt.id, {"accepted": True})
    assert_success(client.resume("/support", thread_id, approve))

    repeat = client.resume("/support", thread_id, approve)
    assert_success(repeat)
    assert not repeat.of(EventType.RUN_ERROR)
    assert not repeat.of(EventType.TOOL_CALL_RESULT)  # nothing ran again
    assert len(ledger_lines(shared, thread_id)) == 1

    conflict = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": False}))
    assert conflict.error_code == "request_conflict"
    # a payload no approval would take is not that answer either: a conflict, not "fix your
    # payload" (outside tester 64)
    for malformed in (True, {"accepted": True, "approved": True}, {"arguments": {}}):
        refused = client.resume("/support", thread_id, resolved(interrupt.id, malformed))
        assert refused.error_code == "request_conflict", refused.describe()
    assert len(ledger_lines(shared, thread_id)) == 1


# --- 6. bad input changes nothing ---------------------------------------------------------------


def test_bad_input_is_refused_and_the_interrupt_stays_resumable(
    client: Client, shared: Server
) -> None:
    thread_id = thread()
    [interrupt] = to_approval(client, thread_id).interrupts
    other_thread = thread()
    [other] = to_approval(client, other_thread).interrupts

    def refused(stream: Stream, code: str) -> None:
        assert stream.error_code == code, stream.describe()
        assert [e.type for e in stream.events] == [EventType.RUN_STARTED, EventType.RUN_ERROR]

    refused(client.start("/support", thread_id, "Hello?"), "interrupts_pending")
    unknown = resolved("no-such-interrupt", {"accepted": True})
    refused(client.resume("/support", thread_id, unknown), "unknown_interrupt")
    foreign = resolved(other.id, {"accepted": True})
    refused(client.resume("/support", thread_id, foreign), "interrupt_thread_mismatch")
    for payload in ({"accepted": "yes"}, {"accepted": True, "arguments": {"amount": -1}}):
        wrong = resolved(interrupt.id, payload)
        refused(client.resume("/support", thread_id, wrong), "invalid_resume_payload")

    # HTTP level: refused before any stream starts.
    malformed = client.post("/support", b'{"threadId": "' + thread_id.encode())
    assert malformed.status == 422 and not malformed.events
    no_run_id = {"threadId": thread_id, "messages": [], "resume": resolved(interrupt.id, True)}
    assert client.post("/support", no_run_id).status == 422
    odd_resume = run_input(thread_id, [], resume={"accepted": True})
    assert client.post("/support", odd_resume).body["error"] == "invalid_resume"
    too_large = run_input(thread_id, [user("x" * MAX_BODY)])
    over = client.post("/support", too_large)
    assert over.status == 413 and not over.events

    assert ledger_lines(shared, thread_id) == []
    stream = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
    assert "submitted" in stream.results()[interrupt.tool_call_id]
    assert_success(stream)
    assert len(ledger_lines(shared, thread_id)) == 1
    # the other thread's interrupt was not touched either
    stream = client.resume("/support", other_thread, resolved(other.id, {"accepted": False}))
    assert NOT_SUBMITTED in stream.text()


def test_a_refused_resume_batch_stores_none_of_its_answers(client: Client) -> None:
    """A batch answering the pending question and (conflictingly) an old interrupt is refused
    as a whole: the pending question may still be answered differently afterwards."""
    thread_id = thread()
    [approval] = to_approval(client, thread_id).interrupts
    rejected = client.resume("/support", thread_id, resolved(approval.id, {"accepted": False}))
    [question] = rejected.interrupts

    batch = [
        *resolved(question.id, "No, thanks"),
        *resolved(approval.id, {"accepted": True}),  # conflicts with the rejection
    ]
    assert client.resume("/support", thread_id, batch).error_code == "request_conflict"

    stream = client.resume("/support", thread_id, resolved(question.id, {"end": True}))
    assert_success(stream)


def test_a_resume_carrying_a_new_user_message_is_refused_and_stores_nothing(
    client: Client, shared: Server
) -> None:
    """A resume continues a run; a message the person typed alongside it was dropped without
    a word (outside tester 68). It is refused, naming the message, before any answer is
    stored -- also one with the same words as the first (tester 70: told apart by its id),
    one put before the history, and the first message edited (tester 71); the history a
    client re-sends with a resume is no new message."""
    thread_id = thread()
    asked = user(REFUND)
    [interrupt] = client.post("/support", run_input(thread_id, [asked])).interrupts
    history = [asked, {"id": "a-1", "role": "assistant", "content": "Let me check."}]
    approve = resolved(interrupt.id, {"accepted": True})

    typed = user("Actually, make it 20 dollars")
    edited = {**asked, "content": "No wait, refund order 99999 instead"}
    for sent, said in (
        ([*history, typed], typed["content"]),
        ([*history, user(REFUND)], REFUND),  # the same words again (tester 70)
        ([typed, *history], typed["content"]),  # before the history (tester 71)
        ([edited, history[1]], edited["content"]),  # the first message, edited (tester 71)
    ):
        for stream in (
            client.post("/support", run_input(thread_id, sent, resume=approve)),
            client.resume_forwarded("/support", thread_id, approve, messages=sent),
        ):
            assert stream.error_code == "message_in_resume", stream.describe()
            assert said in stream.last.message
            assert [e.type for e in stream.events] == [
                EventType.RUN_STARTED,
                EventType.RUN_ERROR,
            ]
    # its id, reused (tester 72), beside the message itself: one id for two messages (136)
    sent = [{**typed, "id": asked["id"]}, *history]
    for stream in (
        client.post("/support", run_input(thread_id, sent, resume=approve)),
        client.resume_forwarded("/support", thread_id, approve, messages=sent),
    ):
        assert stream.status == 422 and not stream.events, stream.describe()
        assert stream.body["error"] == "invalid_run_input", stream.body
        assert f"have the same id ({asked['id']!r})" in stream.body["message"], stream.body
    # the call's own arguments sent back with the approval are no words the person typed
    # (tester 73: "customer request" then passed as an answer shown as a message)
    echoed = resolved(interrupt.id, {"accepted": True, "arguments": REFUND_ARGUMENTS})
    said = user("customer request")
    refused = client.post("/support", run_input(thread_id, [*history, said], resume=echoed))
    assert refused.error_code == "message_in_resume", refused.describe()
    assert ledger_lines(shared, thread_id) == []

    # a picture with an empty text part says nothing: not read (tester 73: refused as new)
    picture = {
        "id": "p-1",
        "role": "user",
        "content": [
            {"type": "text", "text": ""},
            {
                "type": "image",
                "source": {"type": "data", "value": "iVBORw0KGgo=", "mimeType": "image/png"},
            },
        ],
    }
    stream = client.post("/support", run_input(thread_id, [*history, picture], resume=approve))
    assert "submitted" in stream.results()[interrupt.tool_call_id]
    assert_success(stream)
    assert len(ledger_lines(shared, thread_id)) == 1


def test_a_resume_re_sending_the_first_message_with_or_without_its_id_is_no_new_message(
    client: Client, shared: Server
) -> None:
    """A client that gives ids sometimes: the message that started the run, re-sent with a
    resume without the id it first had, or with one it first lacked, is that message, known
    by its words -- it was refused as a new message (outside tester 127). Under another id,
    the same words are a new message still."""
    for first_id, again_id in (("p-3", ""), ("", "p-3"), ("p-3", "p-3"), ("", "")):
        thread_id = thread()
        first = {"id": first_id, "role": "user", "content": REFUND}
        [interrupt] = client.post("/support", run_input(thread_id, [first])).interrupts
        again = {**first, "id": again_id}
        approve = resolved(interrupt.id, {"accepted": True})
        if first_id:
            other = {**first, "id": "p-4"}
            refused = client.post("/support", run_input(thread_id, [other], resume=approve))
            assert refused.error_code == "message_in_resume", refused.describe()
        stream = client.post("/support", run_input(thread_id, [again], resume=approve))
        assert_success(stream)
        assert len(ledger_lines(shared, thread_id)) == 1, (first_id, again_id)


def second_run_paused(client: Client, thread_id: str) -> tuple[Any, Any, Any]:
    """The thread's first run finished (a refund approved), its second paused at its approval:
    the two user messages that started them, and the second's interrupt."""
    first = user(REFUND)
    [interrupt] = client.post("/support", run_input(thread_id, [first])).interrupts
    approve = resolved(interrupt.id, {"accepted": True})
    assert_success(client.post("/support", run_input(thread_id, [first], resume=approve)))
    second = user("Please send a replacement for order 12345")
    [again] = client.post("/support", run_input(thread_id, [second])).interrupts
    return first, second, again


def refused_as_new(
    client: Client,
    thread_id: str,
    history: list[dict[str, str]],
    slipped: dict[str, str],
    approve: Any,
) -> None:
    """A resume with ``history``, which holds ``slipped``, is refused as carrying it new."""
    refused = client.post("/support", run_input(thread_id, history, resume=approve))
    assert refused.error_code == "message_in_resume", refused.describe()
    assert slipped["content"] in refused.last.message


def test_a_later_run_of_a_thread_refuses_a_message_put_into_its_history(client: Client) -> None:
    """The thread's second run, paused: a message put between earlier ones of the history it
    re-sends was taken, and dropped (tester 72); the thread's history is fine, also when the
    run was started with its new message alone (tester 73: refused)."""
    thread_id = thread()
    first, second, again = second_run_paused(client, thread_id)
    approve = resolved(again.id, {"accepted": True})
    slipped = user("Please also refund my order 99999")
    refused_as_new(client, thread_id, [first, slipped, second], slipped, approve)
    assert_success(client.post("/support", run_input(thread_id, [first, second], resume=approve)))


def test_a_thread_whose_first_runs_were_pruned_goes_on_from_its_newest(
    client: Client, shared: Server
) -> None:
    """A thread's runs are found by one read of the ids with its key, not looked up from
    ``/0`` on until one is missing (a request cost a look-up per run of the thread: 0.25 s at
    800 runs, outside tester 119). Looked up so, a thread whose first run was pruned had no
    current run: its pending approval could no longer be given, and its next run took ``/0``
    again. A history re-sent with the approval holds messages only the pruned run received:
    taken as theirs, not as new."""
    thread_id = thread()
    first, second, again = second_run_paused(client, thread_id)

    async def prune_finished() -> int:
        async with SqliteStore(shared.db) as store:
            removed = await store.prune(finished_before=time.time() + 1)
            assert f"support:{thread_id}/0" not in await store.run_ids(f"support:{thread_id}/")
            return removed

    assert anyio.run(prune_finished) > 0
    approve = resolved(again.id, {"accepted": True})
    # the history re-sent with the approval: its first message went to the pruned run, and
    # was refused as new (outside tester 120); one after the kept run's still is
    slipped = user("Please also refund my order 99999")
    refused_as_new(client, thread_id, [first, second, slipped], slipped, approve)
    assert_success(client.post("/support", run_input(thread_id, [first, second], resume=approve)))
    third = client.start("/support", thread_id, "I want a refund for order 67890")
    assert third.interrupts  # a run of its own, after the newest

    async def thread_runs() -> list[str]:
        async with SqliteStore(shared.db) as store:
            return list(await store.run_ids(f"support:{thread_id}/"))

    assert anyio.run(thread_runs) == [f"support:{thread_id}/1", f"support:{thread_id}/2"]


def test_an_answer_shown_as_a_message_in_the_history_is_no_new_message(client: Client) -> None:
    """A client shows the person's answer to a question as a user message, and re-sends it
    with the history: it was refused as a new message (tester 70)."""
    thread_id = thread()
    asked = user(REFUND)
    [interrupt] = client.post("/support", run_input(thread_id, [asked])).interrupts
    reply = {"id": "a-1", "role": "assistant", "content": "I'll hand you over."}
    rejected = client.post(
        "/support",
        run_input(thread_id, [asked, reply], resume=resolved(interrupt.id, {"accepted": False})),
    )
    [question] = rejected.interrupts
    answer = user("No, thanks")
    history = [asked, reply, answer]  # the answer, shown as it is given
    stream = client.post(
        "/support", run_input(thread_id, history, resume=resolved(question.id, "No, thanks"))
    )
    assert_success(stream)
    assert "case complete." in stream.text()
    # and once more, with the history as it stands after it: a repeat, reported
    again = client.post(
        "/support", run_input(thread_id, history, resume=resolved(question.id, "No, thanks"))
    )
    assert_success(again)


# --- 7. security: token, public bind, CORS ------------------------------------------------------

ORIGIN = "http://app.example"
PREFLIGHT = {
    "origin": ORIGIN,
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization,content-type",
}


def test_token_and_cors_origin(tmp_path: Path) -> None:
    args = ["--token", "secret", "--cors-origin", ORIGIN]
    with Server(db=tmp_path / "runs.db", log=tmp_path / "server.log", args=args) as server:
        anonymous = Client(server.url)
        body = run_input(thread(), [user("Hello")])
        refused = anonymous.post("/support", body)
        assert refused.status == 401
        assert refused.headers["www-authenticate"].startswith("Bearer ")
        for header in ("Bearer wrong", "secret", "Basic c2VjcmV0", "Bearer secretx"):
            answer = anonymous.post("/support", body, headers={"authorization": header})
            assert answer.status == 401, header
        assert Client(server.url, token="wrong").post("/banking", body).status == 401

        stream = Client(server.url, token="secret").post("/support", body)
        assert stream.status == 200
        spaced = {"authorization": "Bearer  secret"}  # (RFC 9110: 1*SP; tester 179)
        assert (
            anonymous.post("/support", run_input(thread(), [user("Hi")]), headers=spaced).status
            == 200
        )
        assert stream.finished.outcome.type == "interrupt"  # triage asks what it can do

        preflight = httpx.options(f"{server.url}/support", headers=PREFLIGHT)
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in preflight.headers["access-control-allow-methods"]
        stream = Client(server.url, token="secret").post(
            "/support",
            run_input(thread(), [user("Hello")]),
            headers={"origin": ORIGIN, "authorization": "Bearer secret"},
        )
        assert stream.headers["access-control-allow-origin"] == ORIGIN
        assert stream.finished.outcome.type == "interrupt"

        stranger = httpx.options(
            f"{server.url}/support", headers={**PREFLIGHT, "origin": "http://evil.example"}
        )
        assert "access-control-allow-origin" not in stranger.headers


def test_no_cors_headers_by_default(client: Client, shared: Server) -> None:
    preflight = httpx.options(f"{shared.url}/support", headers=PREFLIGHT)
    assert "access-control-allow-origin" not in preflight.headers
    # a page of a site that was not allowed is refused (see test_agui_hostile.py)
    refused = client.post(
        "/support", run_input(thread(), [user("Hello")]), headers={"origin": ORIGIN}
    )
    assert refused.status == 403 and refused.body["error"] == "origin_not_allowed"
    assert "access-control-allow-origin" not in refused.headers
    # no Origin (curl, a server-side AG-UI runtime) and the server's own origin are fine
    for headers in ({}, {"origin": shared.url}):
        stream = client.post("/support", run_input(thread(), [user("Hello")]), headers=headers)
        assert stream.finished.outcome.type == "interrupt"
        assert "access-control-allow-origin" not in stream.headers


def test_a_public_bind_without_a_token_is_refused(tmp_path: Path) -> None:
    port = str(free_port())
    command = [*cli(), "serve", "--host", "0.0.0.0", "--port", port, "--db", str(tmp_path / "db")]
    done = subprocess.run(
        command, env=server_env(), capture_output=True, text=True, timeout=15, check=False
    )
    assert done.returncode != 0
    message = " ".join((done.stderr + done.stdout).split())
    assert "0.0.0.0" in message and "--token" in message, message
    assert "AG-UI endpoints" not in message


# --- 8. the banking agent: a mixed batch --------------------------------------------------------


def test_banking_mixed_batch_waits_for_the_guarded_call(client: Client) -> None:
    thread_id = thread()
    stream = client.start(
        "/banking", thread_id, "Please transfer 300 to savings and show my balance"
    )
    assert stream.tool_names() == ["transfer_money", "check_balance"]
    assert not stream.results()  # the free call waits with the guarded one
    [interrupt] = stream.interrupts
    assert interrupt.reason == "tool_call"
    assert interrupt.message == "Approve tool call transfer_money?"
    assert interrupt.metadata["agent_framework"]["name"] == "transfer_money"
    calls = {e.tool_call_name: e.tool_call_id for e in stream.of(EventType.TOOL_CALL_START)}
    assert interrupt.tool_call_id == calls["transfer_money"]

    done = client.resume("/banking", thread_id, resolved(interrupt.id, {"accepted": True}))
    results = done.results()
    assert set(results) == {calls["transfer_money"], calls["check_balance"]}
    assert "Moved 300.00 EUR from checking to savings." in results[calls["transfer_money"]]
    assert "checking:" in results[calls["check_balance"]]
    assert_success(done)


def test_the_command_line_continues_a_banking_run_the_server_started(
    client: Client, shared: Server
) -> None:
    """Runs of ``/banking`` are stored as workflow ``banking_assistant``, which the command
    line did not build: ``respond``, ``resume`` and ``cancel`` on them exited 4, "not one the
    command line builds" (outside tester 104)."""
    thread_id = thread()
    stream = client.start("/banking", thread_id, "Please transfer 300 to savings")
    [interrupt] = stream.interrupts
    request_id = interrupt.id.split(".")[0]  # (an interrupt id is the request's, signed)
    db = ["--db", str(shared.db)]
    env = {**os.environ, **server_env()}

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cli(), *args, *db], capture_output=True, text=True, env=env, timeout=60, check=False
        )

    answered = command("respond", request_id, "--approve")
    assert answered.returncode == 0, answered
    listed = command("runs", "list", "--json")
    assert listed.returncode == 0, listed
    # (a run the server started is named after its thread)
    [run_id] = [r["run_id"] for r in json.loads(listed.stdout) if thread_id in r["run_id"]]
    done = command("resume", run_id)
    assert done.returncode == 0 and "finished" in done.stdout, done
    assert "Moved 300.00 EUR from checking to savings." in done.stdout, done.stdout


# --- 9. forwardedProps --------------------------------------------------------------------------


def test_forwarded_props_are_accepted_and_not_passed_to_the_model(client: Client) -> None:
    for props in ({"tenant": "acme"}, "acme", ["acme"]):
        stream = client.start("/banking", thread(), "What is my balance?", forwardedProps=props)
        assert stream.tool_names() == ["check_balance"]
        assert_success(stream)
        assert "checking:" in stream.text()
        wire = " ".join(e.model_dump_json() for e in stream.events)
        assert "acme" not in wire and "tenant" not in wire


def test_an_edit_stored_elsewhere_then_resent_streams_the_edited_arguments(
    client: Client, shared: Server
) -> None:
    """The command line stored an approval with edited arguments; the client resent the same
    answer (``5`` for ``5.0``): the run refunded 5.00, but the stream's ``TOOL_CALL_ARGS`` said
    the model's 89.99 (tester 76). It says the arguments the call runs with."""
    thread_id = thread()
    [interrupt] = to_approval(client, thread_id).interrupts
    engine = [*cli(), "--db", str(shared.db)]
    edited = {**REFUND_ARGUMENTS, "amount": 5.0}
    listed = subprocess.run(
        [*engine, "requests", "list", "--json"], capture_output=True, text=True, check=True
    )
    [request_id] = [
        r["request_id"]
        for r in json.loads(listed.stdout)
        if interrupt.id.startswith(r["request_id"])
    ]
    stored = subprocess.run(
        [*engine, "respond", request_id, "--approve", "--arguments", json.dumps(edited)],
        capture_output=True,
        text=True,
    )
    assert stored.returncode == 0 and "answer stored" in stored.stdout, stored
    again = {"accepted": True, "arguments": {**REFUND_ARGUMENTS, "amount": 5}}
    stream = client.resume("/support", thread_id, resolved(interrupt.id, again))
    assert "Refund of 5.00 for order 12345 submitted." in stream.results()[interrupt.tool_call_id]
    sent = "".join(
        e.delta
        for e in stream.of(EventType.TOOL_CALL_ARGS)
        if e.tool_call_id == interrupt.tool_call_id
    )
    assert json.loads(sent) == edited, stream.describe()
    assert_success(stream)
    assert [line["amount"] for line in ledger_lines(shared, thread_id)] == [5.0]
