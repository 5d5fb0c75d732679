"""What goes over the wire to AG-UI clients: plain JSON with stable type names, a concise
``RUN_FINISHED.result``, self-contained resumed streams, and resumes sent the CopilotKit way.

Every case runs against a real ``workflow-engine serve`` process through a real HTTP client
(``agui_harness``), whose ``check_sequence`` holds every stream to AG-UI's sequence rules on
its own -- which is what failed before for resumed runs (a TOOL_CALL_RESULT for a call only an
earlier stream had started).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from ag_ui.core import EventType, RunFinishedEvent, RunStartedEvent
from pydantic import BaseModel

from tests.integration.agui_harness import (
    Client,
    Server,
    Stream,
    check_sequence,
    resolved,
    run_input,
    user,
)
from tests.integration.hostile_harness import store_state
from workflow_engine import EffectResolution, ExternalRequest, InDoubtEffect, TypeRegistry
from workflow_engine.executors import (
    AgentRunUpdateEvent,
    ChatMessage,
    FunctionCallContent,
    ToolApprovalRequestContent,
    ToolApprovalResponseContent,
)
from workflow_engine.executors._host import stored_message
from workflow_engine_agui._endpoint import EventTranslator
from workflow_engine_agui._http import type_label, wire_value
from workflow_engine_agui._interrupts import held_calls, interrupt_for
from workflow_engine_cli.demos.support_handoff import build_support_workflow

REFUND = "I want a refund for order 12345"
REFUND_ARGUMENTS = {"order_id": "12345", "amount": 89.99, "reason": "customer request"}
MIXED_BATCH = "Please transfer 300 to savings and show my balance"
# Where the engine's classes live: none of these may reach a client.
MODULE_PATHS = (
    "executors.",
    "workflow_engine.",
    "workflow_engine_cli.demos.",
    "storage.",
    "builtins.",
    "_handoff",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("agui-wire")
    with Server(
        db=base / "runs.db",
        log=base / "server.log",
        env={"WORKFLOW_ENGINE_DEMO_LEDGER": str(base / "ledger.jsonl")},
    ) as server:
        yield server


@pytest.fixture
def client(server: Server) -> Client:
    return Client(server.url)


def thread() -> str:
    return f"wire-{uuid.uuid4().hex[:12]}"


def ledger(server: Server, thread_id: str) -> list[dict[str, Any]]:
    path = Path(server.env["WORKFLOW_ENGINE_DEMO_LEDGER"])
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return [line for line in lines if str(line["key"]).startswith(f"support:{thread_id}/")]


def to_approval(client: Client, thread_id: str) -> tuple[Stream, Any]:
    stream = client.start("/support", thread_id, REFUND)
    [interrupt] = stream.interrupts
    assert interrupt.metadata["agent_framework"]["name"] == "submit_refund"
    return stream, interrupt


def payloads(stream: Stream) -> list[Any]:
    """Every value an application put into the stream: CUSTOM values, results, interrupts."""
    found: list[Any] = [e.value for e in stream.of(EventType.CUSTOM)]
    for e in stream.of(EventType.RUN_FINISHED):
        found.append(e.result)
        if e.outcome is not None and e.outcome.type == "interrupt":
            found += [i.model_dump(mode="json", by_alias=True) for i in e.outcome.interrupts]
    return found


def keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from keys(item)
    elif isinstance(value, list):
        for item in value:
            yield from keys(item)


def assert_plain(stream: Stream) -> None:
    """No codec marker in any payload, no module path anywhere in the stream."""
    markers = [k for k in keys(payloads(stream)) if k.startswith("$")]
    assert not markers, f"codec markers on the wire: {markers}\n{stream.describe()}"
    text = stream.raw.decode()
    leaked = [path for path in MODULE_PATHS if path in text]
    assert not leaked, f"module paths on the wire: {leaked}\n{stream.describe()}"


def tool_events(stream: Stream, tool_call_id: str) -> list[Any]:
    kinds = (
        EventType.TOOL_CALL_START,
        EventType.TOOL_CALL_ARGS,
        EventType.TOOL_CALL_END,
        EventType.TOOL_CALL_RESULT,
    )
    return [
        e
        for e in stream.events
        if e.type in kinds and getattr(e, "tool_call_id", None) == tool_call_id
    ]


def replayed_call(stream: Stream, tool_call_id: str) -> tuple[str, Any, str]:
    """(name, arguments, result) of a call a resumed stream sends again before its result."""
    start, *args, end, result = tool_events(stream, tool_call_id)
    assert start.type == EventType.TOOL_CALL_START and start.parent_message_id is None
    assert {e.type for e in args} == {EventType.TOOL_CALL_ARGS}
    assert end.type == EventType.TOOL_CALL_END and result.type == EventType.TOOL_CALL_RESULT
    return start.tool_call_name, json.loads("".join(e.delta for e in args)), result.content


# --- 1. plain JSON, stable type names -----------------------------------------------------------


def test_request_info_is_plain_json_shaped_as_agent_framework_s(client: Client) -> None:
    stream, interrupt = to_approval(client, thread())
    [info] = stream.custom("request_info")
    assert info.value == {
        "request_id": interrupt.id,
        "source_executor_id": "refund_agent",
        "request_type": "ToolApprovalRequestContent",
        "response_type": "ToolApprovalResponseContent",
        "data": {
            "type": "tool_approval_request",
            "id": f"approval_{interrupt.metadata['agent_framework']['call_id']}",
            "function_call": {
                "type": "function_call",
                "call_id": interrupt.metadata["agent_framework"]["call_id"],
                "name": "submit_refund",
                "arguments": REFUND_ARGUMENTS,
            },
        },
    }
    assert_plain(stream)


def test_an_input_required_interrupt_names_its_request_type(client: Client) -> None:
    thread_id = thread()
    _, interrupt = to_approval(client, thread_id)
    stream = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": False}))
    [question] = stream.interrupts
    assert question.reason == "input_required"
    assert question.metadata["request_type"] == "HandoffUserInputRequest"
    assert question.metadata["request"]["agent"] == "refund_agent"
    [info] = stream.custom("request_info")
    assert info.value["request_type"] == "HandoffUserInputRequest"
    assert info.value["response_type"] == "HandoffUserResponse"
    assert info.value["data"] == question.metadata["request"]
    assert_plain(stream)


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"accepted": True},
        {"message": ""},
        {"message": None, "end": False},
        {"message": "x", "end": True},
    ],
)
def test_a_reply_interrupt_refuses_an_answer_that_is_no_reply(client: Client, payload: Any) -> None:
    """Answering the customer's turn with no message (or an approval) ended their conversation
    (outside tester); now it is an ``invalid_resume_payload`` and the question still waits."""
    thread_id = thread()
    _, interrupt = to_approval(client, thread_id)
    stream = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": False}))
    [question] = stream.interrupts
    refused = client.resume("/support", thread_id, resolved(question.id, payload))
    assert refused.error_code == "invalid_resume_payload", refused.describe()
    replied = client.resume("/support", thread_id, resolved(question.id, {"message": "thanks"}))
    assert replied.last.type == EventType.RUN_FINISHED, replied.describe()


def test_the_output_is_plain_and_run_finished_carries_a_summary(client: Client) -> None:
    thread_id = thread()
    _, interrupt = to_approval(client, thread_id)
    stream = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
    assert_plain(stream)

    [output] = stream.custom("workflow_output")
    assert output.value["source"] == "handoff_coordinator"
    assert output.value["type"] == "HandoffOutcome"
    outcome = output.value["data"]
    assert outcome["status"] == "completed" and outcome["last_agent"] == "refund_agent"
    first = outcome["conversation"][0]
    assert first == {
        "role": "user",
        "contents": [{"type": "text", "text": REFUND}],
        "author_name": None,
        "message_id": None,
    }

    result = stream.finished.result
    assert result == {
        "outputs": [
            {
                "type": "HandoffOutcome",
                "data": {"status": "completed", "last_agent": "refund_agent", "turns": 2},
                "text": "Refund of 89.99 for order 12345 submitted. case complete.",
            }
        ]
    }
    assert "conversation" not in json.dumps(result)


def test_an_agent_s_result_is_its_last_answer_without_the_conversation(client: Client) -> None:
    stream = client.start("/banking", thread(), "What is my balance?")
    [summary] = stream.finished.result["outputs"]
    assert summary["type"] == "AgentResponse"
    assert summary["data"]["agent_name"] == "banking_assistant"
    assert set(summary["data"]) == {"agent_name", "pending_approvals"}
    assert "checking:" in summary["text"]
    assert_plain(stream)


def test_every_event_carries_a_timestamp_in_order(client: Client) -> None:
    stream, _ = to_approval(client, thread())
    stamps = [e.timestamp for e in stream.events]
    assert all(isinstance(t, int) for t in stamps), stamps
    assert stamps == sorted(stamps)


# --- 2. a resumed stream stands on its own ------------------------------------------------------


def test_an_approved_call_is_sent_again_before_its_result(client: Client) -> None:
    thread_id = thread()
    first, interrupt = to_approval(client, thread_id)
    stream = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
    name, arguments, result = replayed_call(stream, interrupt.tool_call_id)
    assert (name, arguments) == ("submit_refund", REFUND_ARGUMENTS)
    assert "Refund of 89.99 for order 12345 submitted." in result
    # the same id the interrupt named and the first stream started
    assert interrupt.tool_call_id in {e.tool_call_id for e in first.of(EventType.TOOL_CALL_START)}


def test_a_rejected_call_is_sent_again_before_its_error(client: Client, server: Server) -> None:
    thread_id = thread()
    _, interrupt = to_approval(client, thread_id)
    stream = client.resume(
        "/support",
        thread_id,
        {"interrupts": [{"id": interrupt.id, "value": {"approved": False}}]},
    )
    name, arguments, result = replayed_call(stream, interrupt.tool_call_id)
    assert (name, arguments) == ("submit_refund", REFUND_ARGUMENTS)
    assert result.startswith("Error:")
    assert ledger(server, thread_id) == []


def test_an_edited_call_is_sent_again_as_it_ran(client: Client, server: Server) -> None:
    thread_id = thread()
    _, interrupt = to_approval(client, thread_id)
    edit = {"accepted": True, "arguments": {"amount": 50.0}}
    stream = client.resume("/support", thread_id, resolved(interrupt.id, edit))
    _, arguments, result = replayed_call(stream, interrupt.tool_call_id)
    assert arguments == {**REFUND_ARGUMENTS, "amount": 50.0}
    assert "Refund of 50.00 for order 12345 submitted." in result
    assert [line["amount"] for line in ledger(server, thread_id)] == [50.0]


def test_the_free_calls_of_a_held_batch_are_sent_again_too(client: Client) -> None:
    thread_id = thread()
    first = client.start("/banking", thread_id, MIXED_BATCH)
    calls = {e.tool_call_name: e.tool_call_id for e in first.of(EventType.TOOL_CALL_START)}
    sent: dict[str, str] = {}
    for e in first.of(EventType.TOOL_CALL_ARGS):
        sent[e.tool_call_id] = sent.get(e.tool_call_id, "") + e.delta
    [interrupt] = first.interrupts

    stream = client.resume("/banking", thread_id, resolved(interrupt.id, {"accepted": True}))
    for name in ("transfer_money", "check_balance"):
        replayed, arguments, _ = replayed_call(stream, calls[name])
        assert replayed == name
        assert arguments == json.loads(sent[calls[name]])


def test_a_repeated_resume_sends_nothing_again(client: Client) -> None:
    thread_id = thread()
    _, interrupt = to_approval(client, thread_id)
    approve = resolved(interrupt.id, {"accepted": True})
    client.resume("/support", thread_id, approve)
    repeat = client.resume("/support", thread_id, approve)
    assert [e.type for e in repeat.events] == [EventType.RUN_STARTED, EventType.RUN_FINISHED]


# --- 3. the resume in forwardedProps.command.resume ---------------------------------------------


def test_a_resume_in_forwarded_props_approves(client: Client, server: Server) -> None:
    thread_id = thread()
    asked = user(REFUND)
    [interrupt] = client.post("/support", run_input(thread_id, [asked])).interrupts
    # CopilotKit sends the thread's messages again with the resume (the same ids)
    stream = client.resume_forwarded(
        "/support",
        thread_id,
        resolved(interrupt.id, {"accepted": True}),
        messages=[asked],
    )
    name, _, result = replayed_call(stream, interrupt.tool_call_id)
    assert name == "submit_refund" and "submitted" in result
    assert stream.finished.outcome is None or stream.finished.outcome.type == "success"
    assert len(ledger(server, thread_id)) == 1


def test_a_resume_in_forwarded_props_takes_the_dict_form_and_cancels(client: Client) -> None:
    thread_id = thread()
    _, interrupt = to_approval(client, thread_id)
    rejected = client.resume_forwarded(
        "/support", thread_id, {"interrupts": [{"id": interrupt.id, "value": {"accepted": False}}]}
    )
    [question] = rejected.interrupts
    assert question.reason == "input_required"

    cancelled = client.resume_forwarded(
        "/support", thread_id, [{"interruptId": question.id, "status": "cancelled"}]
    )
    assert cancelled.finished.outcome.type == "cancelled"


def test_a_resume_in_forwarded_props_is_checked_like_any_other(
    client: Client, server: Server
) -> None:
    thread_id, other_thread = thread(), thread()
    _, interrupt = to_approval(client, thread_id)
    _, other = to_approval(client, other_thread)
    before = store_state(server.db)

    def refused(stream: Stream, code: str) -> None:
        assert stream.error_code == code, stream.describe()
        assert [e.type for e in stream.events] == [EventType.RUN_STARTED, EventType.RUN_ERROR]

    forwarded = client.resume_forwarded
    refused(forwarded("/support", thread_id, resolved("nope", True)), "unknown_interrupt")
    refused(forwarded("/support", thread_id, resolved(other.id, True)), "interrupt_thread_mismatch")
    refused(
        forwarded("/banking", thread_id, resolved(interrupt.id, True)),
        "interrupt_thread_mismatch",
    )
    wrong = resolved(interrupt.id, {"accepted": "yes"})
    refused(forwarded("/support", thread_id, wrong), "invalid_resume_payload")
    for shape in ({"accepted": True}, "yes", [1], [{"status": "resolved"}]):
        answer = forwarded("/support", thread_id, shape)
        assert answer.status == 422 and answer.body["error"] == "invalid_resume", answer.body
    twice = [*resolved(interrupt.id, True), *resolved(interrupt.id, False)]
    assert forwarded("/support", thread_id, twice).body["error"] == "invalid_resume"
    # the same answers in both places are one resume; different ones are refused
    both = run_input(
        thread_id,
        [],
        resume=resolved(interrupt.id, {"accepted": False}),
        forwardedProps={"command": {"resume": resolved(interrupt.id, {"approved": True})}},
    )
    refused(client.post("/support", both), "invalid_resume")  # (told once the types are known)
    assert store_state(server.db) == before
    cancelled = [{"interruptId": interrupt.id, "status": "cancelled"}]
    both = run_input(
        thread_id,
        [],
        resume=resolved(interrupt.id, True),
        forwardedProps={"command": {"resume": cancelled}},
    )
    assert client.post("/support", both).body["error"] == "invalid_resume"  # (422: at once)
    assert store_state(server.db) == before

    # the same answer, written two ways (edits that change nothing are no edits)
    same = resolved(interrupt.id, {"accepted": True})
    alike = resolved(interrupt.id, {"approved": True, "arguments": {}})
    body = run_input(thread_id, [], resume=same, forwardedProps={"command": {"resume": alike}})
    stream = client.post("/support", body)
    assert "submitted" in stream.results()[interrupt.tool_call_id]
    assert len(ledger(server, thread_id)) == 1
    assert ledger(server, other_thread) == []


def test_the_same_answers_in_both_places_may_be_written_in_either_form() -> None:
    """Only byte-identical answers in both places were taken: the list form beside the dict
    form, ``approved`` beside ``accepted``, or an empty ``resume`` beside a real command were
    refused as different (outside tester). Answers that differ still are."""
    from workflow_engine_agui._http import AGUIError
    from workflow_engine_agui._interrupts import normalize_resume

    listed = [{"interruptId": "i1", "status": "resolved", "payload": {"accepted": True}}]
    as_dict = {"interrupts": [{"id": "i1", "value": {"approved": True}}]}
    for top, nested in ((listed, as_dict), ([], as_dict), (listed, {"interrupts": []})):
        body = {"resume": top, "forwardedProps": {"command": {"resume": nested}}}
        (answer,) = normalize_resume(body) or []
        assert answer.interrupt_id == "i1" and answer.status == "resolved"
        assert body["resume"][0]["interruptId"] == "i1"  # the list form, for validation
    # payloads written differently are kept to be compared once their type is known (the
    # endpoint does); other interrupts, or another status, differ at once
    no = {"interrupts": [{"id": "i1", "value": {"accepted": False}}]}
    body = {"resume": listed, "forwardedProps": {"command": {"resume": no}}}
    (answer,) = normalize_resume(body) or []
    assert answer.written_also == ({"accepted": False},)
    for nested in (
        {"interrupts": [{"id": "i2", "value": {"accepted": True}}]},
        [{"interruptId": "i1", "status": "cancelled"}],
    ):
        with pytest.raises(AGUIError, match="differ"):
            normalize_resume({"resume": listed, "forwardedProps": {"command": {"resume": nested}}})
    # only a payload written exactly alike needs no second look (``10`` and ``10.0`` are told
    # apart by the answer's type, tester 76: the endpoint tests it)
    edits = [{"interruptId": "i1", "status": "resolved", "payload": {"accepted": True}}]
    for amount, other in ((10, 10.0), (10, 10), (10, 10.5), (True, 1)):
        top = [{**edits[0], "payload": {"accepted": True, "arguments": {"amount": amount}}}]
        nested = [{**edits[0], "payload": {"accepted": True, "arguments": {"amount": other}}}]
        body = {"resume": top, "forwardedProps": {"command": {"resume": nested}}}
        (answer,) = normalize_resume(body) or []
        alike = type(amount) is type(other) and amount == other
        assert bool(answer.written_also) is not alike, (amount, other)


# --- 4. the pieces, on plain data ---------------------------------------------------------------


class Colour(Enum):
    RED = "red"


class Parcel(BaseModel):
    __workflow_type__ = "Parcel"

    sent: datetime
    price: Decimal
    tags: set[str]
    colour: Colour
    blob: bytes
    weight: float
    extra: Any = None


def test_the_wire_form_is_plain_json() -> None:
    parcel = Parcel(
        sent=datetime(2024, 5, 1, 12, tzinfo=UTC),
        price=Decimal("1.10"),
        tags={"b", "a"},
        colour=Colour.RED,
        blob=b"\xff",
        weight=float("nan"),
        extra={"when": date(2024, 5, 1), 1: (2, 3), "id": uuid.UUID(int=1)},
    )
    assert wire_value(parcel) == {
        "sent": "2024-05-01T12:00:00Z",
        "price": "1.10",
        "tags": ["a", "b"],
        "colour": "red",
        "blob": "/w==",
        "weight": None,
        "extra": {"when": "2024-05-01", "1": [2, 3], "id": str(uuid.UUID(int=1))},
    }
    json.dumps(wire_value(parcel), allow_nan=False)
    assert wire_value(object()) == "<object>"  # named, never described


def test_type_labels_are_stable_names_never_module_paths() -> None:
    registry = TypeRegistry()
    registry.register(Colour, name="Shade")

    class Local(BaseModel):
        x: int

    assert type_label(Parcel, registry) == "Parcel"  # its __workflow_type__
    assert type_label(Colour, registry) == "Shade"  # name=
    assert type_label(list[Local] | None, registry).startswith("list[")
    assert "tests." not in type_label(list[Local] | None, registry)
    assert type_label(dict[str, Any], registry) == "dict[str, Any]"
    # as Python spells it (it said "tuple[set[int], Ellipsis]": outside tester 100)
    assert type_label(tuple[set[int], ...] | None, registry) == "tuple[set[int], ...] | None"


def test_an_in_doubt_interrupt_says_its_question_and_the_key_to_look_the_effect_up_by() -> None:
    """Its message was "Input required": the question and the key were in the metadata only
    (outside tester)."""
    key = "support:t/0:" + "ab" * 16
    question = InDoubtEffect(
        executor_id="refund_agent",
        step="tool#0",
        description={"tool": "submit_refund", "arguments": REFUND_ARGUMENTS, "call_id": "c9"},
        idempotency_key=key,
    )
    request = ExternalRequest("r1", "refund_agent", question, EffectResolution)
    interrupt = interrupt_for(request, TypeRegistry(), "support:t/0")
    assert interrupt.message == (
        "Did this effect happen before the process stopped? It was the call of tool "
        f"'submit_refund' (idempotency key {key})."
    )
    assert interrupt.metadata is not None
    assert interrupt.metadata["request"]["idempotency_key"] == key
    step = InDoubtEffect(executor_id="payer", step="pay")  # a run_once step of one's own
    interrupt = interrupt_for(
        ExternalRequest("r2", "payer", step, EffectResolution), TypeRegistry()
    )
    assert interrupt.message.endswith("It was step 'pay' of 'payer'.")


def test_a_call_left_in_doubt_by_a_crash_is_sent_again_as_its_question_describes_it() -> None:
    workflow = build_support_workflow()
    checkpoint = workflow.admit(REFUND, run_id="support:t/0")
    question = InDoubtEffect(
        executor_id="refund_agent",
        step="tool#0",
        description={"tool": "submit_refund", "arguments": REFUND_ARGUMENTS, "call_id": "c9"},
    )
    request = ExternalRequest("r1", "refund_agent", question, EffectResolution)
    translator = EventTranslator(scope="support:t/0")
    translator.held = held_calls(workflow, checkpoint, [request], {})
    result = AgentRunUpdateEvent("refund_agent", "function_result", call_id="c9", result="ok")
    events = translator.translate(result)
    assert [e.type for e in events] == [
        EventType.TOOL_CALL_START,
        EventType.TOOL_CALL_ARGS,
        EventType.TOOL_CALL_END,
        EventType.TOOL_CALL_RESULT,
    ]
    start, args, _, _ = events
    assert (start.tool_call_id, start.tool_call_name) == ("support:t/0:c9", "submit_refund")
    assert json.loads(args.delta) == REFUND_ARGUMENTS
    check_sequence(
        [
            RunStartedEvent(thread_id="t", run_id="r"),
            *events,
            RunFinishedEvent(thread_id="t", run_id="r"),
        ]
    )


def test_the_other_calls_of_a_batch_cut_off_by_a_crash_are_sent_again_with_their_arguments() -> (
    None
):
    """A batch of two calls, the first approved with a reviewer's edit and run, the second cut
    off by a crash: answering the question about the second, the run reports both results --
    and the first call went out with no arguments, the question being about the other one
    only (outside tester 139). It goes out with the arguments it ran with."""
    workflow = build_support_workflow()
    admitted = workflow.admit(REFUND, run_id="support:t/0")
    refund = FunctionCallContent(call_id="c1", name="submit_refund", arguments=REFUND_ARGUMENTS)
    note = FunctionCallContent(call_id="c2", name="add_note", arguments={"text": "refunded"})
    asked = ToolApprovalRequestContent(id="approval_c1", function_call=refund)
    edit = {"amount": 50.0}
    approved = ToolApprovalResponseContent(approved=True, id="approval_c1", arguments=edit)
    conversation = [
        ChatMessage(role="assistant", contents=[refund, note]),
        ChatMessage(role="assistant", contents=[asked]),
        ChatMessage(role="user", contents=[approved]),
    ]
    states = {"refund_agent": {"conversation": [stored_message(m) for m in conversation]}}
    encoded = {
        executor: {key: workflow.codec.encode(value) for key, value in state.items()}
        for executor, state in states.items()
    }
    checkpoint = admitted.model_copy(update={"executor_states": encoded})
    question = InDoubtEffect(
        executor_id="refund_agent",
        step="tool#1",
        description={"tool": "add_note", "arguments": {"text": "refunded"}, "call_id": "c2"},
    )
    request = ExternalRequest("r1", "refund_agent", question, EffectResolution)
    translator = EventTranslator(scope="support:t/0")
    translator.held = held_calls(workflow, checkpoint, [request], {})
    for call_id, name, arguments in (
        ("c1", "submit_refund", {**REFUND_ARGUMENTS, **edit}),
        ("c2", "add_note", {"text": "refunded"}),
    ):
        result = AgentRunUpdateEvent("refund_agent", "function_result", call_id=call_id, result=1)
        start, args, _, _ = translator.translate(result)
        assert (start.tool_call_id, start.tool_call_name) == (f"support:t/0:{call_id}", name)
        assert args.type == EventType.TOOL_CALL_ARGS and json.loads(args.delta) == arguments
