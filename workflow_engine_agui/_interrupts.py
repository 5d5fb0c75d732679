"""Interrupts: how a paused run's requests are shown to AG-UI clients, and how answers return.

**Ids an outsider cannot guess, stable for as long as the request exists.** A request id is
derived from the run id and the step (so that re-executing a step finds the same request), and
a thread's run ids are predictable: ``<endpoint>:<thread>/<n>``. An interrupt id that were the
request id could be computed by any web page that knows the thread id. So the server gives each
run it admits a random 128-bit key, stored in the run's shared state (and so in every
checkpoint), and names a request to clients as::

    <request id>.<first 128 bits of HMAC-SHA256(run key, request id)>

The same request always gets the same id (after a restart, after re-execution, in another server
process on the same database), the server finds the request again from the part before the dot,
and only someone who saw the id can send it back.

**What an interrupt says** (:func:`interrupt_for`): a held tool call is ``reason: "tool_call"``
with the call in ``metadata.agent_framework``; any other request is ``"input_required"`` with
the answer's JSON schema and the request in the wire form (see ``_http``).

**Answers** (:func:`normalize_resume`) come as ``resume: [{interruptId, status, payload}]`` or
``resume: {interrupts: [{id, value}]}`` at the top level of the ``RunAgentInput``, or in the
same two forms in ``forwardedProps.command.resume`` (where CopilotKit-style clients put them).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ag_ui.core import Interrupt, ResumeEntry
from pydantic import BaseModel

from workflow_engine import (
    Checkpoint,
    ExternalRequest,
    InDoubtEffect,
    SerializationError,
    StoreCorruptError,
    TypeRegistry,
    Workflow,
)
from workflow_engine._codec import strictly_equal
from workflow_engine._workflow import AnswerAdapter
from workflow_engine.executors import (
    ChatMessage,
    FunctionCallContent,
    ToolApprovalRequestContent,
    ToolApprovalResponseContent,
    pending_batch,
    tool_call_in_doubt,
)
from workflow_engine.executors._content import edited_arguments
from workflow_engine.executors._host import read_message

from ._http import AGUIError, type_label, wire_value

INTERRUPT_KEY = "agui.interrupt_key"
"""Shared-state key of a run's random 128-bit key (hex), set when the server admits the run."""
CLIENT_RUN_KEY = "agui.client_run_id"
"""Shared state of a run an AG-UI request started: that request's ``runId`` (a request sent
again, with the same ``runId`` and message, reports the run instead of starting another)."""
CLIENT_MESSAGES_KEY = "agui.client_messages"
"""Shared state of a run an AG-UI request started: the user messages that request carried (the
thread's history then, and the one that started the run), each as ``[id, digest of its
words]``; a resume re-sending the history is told from one carrying a new message by them."""
APPROVAL_SCHEMA = {
    "type": "object",
    "properties": {
        "accepted": {"type": "boolean"},
        "arguments": {"type": "object"},
    },
    "required": ["accepted"],
}
"""The ``responseSchema`` of a tool-call interrupt (``approved`` is accepted for ``accepted``)."""


def new_interrupt_key() -> str:
    """A run's random key: 128 bits from the OS's CSPRNG."""
    return secrets.token_hex(16)


def interrupt_id_for(request_id: str, key: str | None) -> str:
    """``<request id>.<MAC>``: the MAC (HMAC-SHA256 under the run's key, 128 bits) makes the
    id unguessable; the request id in front lets the server find the request again. A run
    admitted before runs had keys keeps its request ids as interrupt ids."""
    if key is None:
        return request_id
    mac = hmac.new(bytes.fromhex(key), request_id.encode(), hashlib.sha256).hexdigest()
    return f"{request_id}.{mac[:32]}"


def split_interrupt_id(interrupt_id: str) -> str:
    """The request id an interrupt id names (to be verified with :func:`interrupt_id_for`)."""
    request_id, dot, _ = interrupt_id.rpartition(".")
    return request_id if dot else interrupt_id


def run_key(run_id: str, checkpoint: Checkpoint | None) -> str | None:
    """The run's interrupt key from its checkpoint's shared state (None: admitted without)."""
    if checkpoint is None:
        return None
    key = checkpoint.shared_state.get(INTERRUPT_KEY)
    if key is None:
        return None
    if not isinstance(key, str) or len(key) != 32 or not _is_hex(key):
        raise StoreCorruptError(
            f"run {run_id!r}: checkpoint {checkpoint.checkpoint_id} holds a malformed "
            f"{INTERRUPT_KEY!r} (not 128 bits of hex)"
        )
    return key


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def ids_equal(a: str, b: str) -> bool:
    """Constant-time comparison of two ids (any text)."""
    return hmac.compare_digest(
        a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
    )


# --- what an interrupt says ---------------------------------------------------------------------


def interrupt_for(
    request: ExternalRequest, registry: TypeRegistry, scope: str = "", key: str | None = None
) -> Interrupt:
    """The AG-UI interrupt for a pending request (``scope`` prefixes the tool-call id the same
    way the run's TOOL_CALL events were; ``key`` is the run's interrupt key)."""
    data = request.data
    interrupt_id = interrupt_id_for(request.request_id, key)
    if isinstance(data, ToolApprovalRequestContent):
        call = data.function_call
        return Interrupt(
            id=interrupt_id,
            reason="tool_call",
            message=f"Approve tool call {call.name}?",
            tool_call_id=f"{scope}:{call.call_id}" if scope else call.call_id,
            response_schema=APPROVAL_SCHEMA,
            metadata={
                "agent_framework": {
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": wire_value(call.arguments),
                }
            },
        )
    message = getattr(data, "message", None)
    if isinstance(data, InDoubtEffect):  # the question a person answers, in words
        message = _in_doubt_message(data)
    return Interrupt(
        id=interrupt_id,
        reason="input_required",
        message=message if isinstance(message, str) and message else "Input required",
        response_schema=answer_schema(request.response_type),
        metadata={"request_type": type_label(type(data), registry), "request": wire_value(data)},
    )


def answer_schema(answer_type: Any) -> dict[str, Any]:
    """The JSON schema of an answer, as answers are read: bytes outside a model as base64
    (it said ``format: binary``, which tells a client nothing of base64: outside tester 100),
    a model's own bytes fields as the model reads them."""
    return _base64_said(AnswerAdapter(answer_type).json_schema())


def _base64_said(schema: Any) -> Any:
    """Pydantic names base64 bytes ``format: base64url``; the wire shows standard base64 (and
    both are read): JSON Schema's ``contentEncoding: base64`` says so."""
    if isinstance(schema, list):
        return [_base64_said(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("format") == "base64url" and schema.get("type") == "string":
        return {"type": "string", "contentEncoding": "base64"}
    return {key: _base64_said(item) for key, item in schema.items()}


# --- how answers come back ----------------------------------------------------------------------


@dataclass
class ResumeAnswer:
    interrupt_id: str
    status: str
    payload: Any
    written_also: tuple[Any, ...] = ()
    """The same interrupt's payload in the other place (``forwardedProps.command.resume``),
    when it is written differently: the same answer or not is told once the answer's type is
    known (a bare string and ``{"message": ...}`` for a chat turn are one answer)."""
    where: str = "resume[0]"
    """The entry as the client wrote it (``forwardedProps.command.resume[2]``): what a
    refusal of it names."""


def _in_doubt_message(question: InDoubtEffect) -> str:
    """An in-doubt effect's question, with what a person looks the effect up by."""
    return f"{question.question} It was {effect_named(question)}."


def effect_named(effect: InDoubtEffect) -> str:
    """``the call of tool 'submit_refund' (idempotency key ...)``, or the step of an executor."""
    call = tool_call_in_doubt(effect)
    if call is not None:
        what = f"the call of tool {call[0]!r}"
    else:
        what = f"step {effect.step!r} of {effect.executor_id!r}"
    key = f" (idempotency key {effect.idempotency_key})" if effect.idempotency_key else ""
    return what + key


def normalize_resume(body: dict[str, Any]) -> list[ResumeAnswer] | None:
    """The answers a ``RunAgentInput`` body carries (None: it carries none), from ``resume`` or
    ``forwardedProps.command.resume``, either as ``[{interruptId, status, payload}]`` or as
    ``{interrupts: [{id, value}]}``. Both places are checked the same way; answers in both must
    answer the same interrupts the same way (a payload written differently is compared once its
    type is known: ``ResumeAnswer.written_also``), and an empty list in one place defers to the
    other. ``body["resume"]`` is rewritten to the list form, so that ``RunAgentInput``
    validates whichever was sent."""
    top, nested = _resume_places(body)
    parsed = [
        _parse_resume(raw, where)
        for raw, where in ((top, "resume"), (nested, "forwardedProps.command.resume"))
        if raw is not None
    ]
    if not parsed:
        return None
    for _, answers in parsed:  # (in each place: one was taken, the other left unchecked)
        _once_each(answers)
    if len(parsed) == 2:
        (_, top_answers), (nested_entries, nested_answers) = parsed
        if top_answers and nested_answers:
            _entries_valid(nested_entries)  # (as RunAgentInput checks the one it reads)
            _written_alike(top_answers, nested_answers)
        if not top_answers:  # an empty list next to real answers: the answers count
            parsed = parsed[1:]
    entries, answers = parsed[0]
    body["resume"] = entries
    return answers


def _once_each(answers: list[ResumeAnswer]) -> None:
    """Two answers to one request in one place: which one would count?"""
    seen: set[str] = set()
    for answer in answers:
        if answer.interrupt_id in seen:
            raise AGUIError(
                "invalid_resume", f"interrupt {answer.interrupt_id!r} is answered twice"
            )
        seen.add(answer.interrupt_id)


def _entries_valid(entries: list[Any]) -> None:
    """``forwardedProps.command.resume`` in the list form, held to what ``RunAgentInput`` asks
    of ``resume`` (an entry with no ``status`` was taken there beside a ``resume``, and
    refused alone: outside tester 102)."""
    from pydantic import TypeAdapter, ValidationError

    from ._http import describe_validation

    try:
        TypeAdapter(list[ResumeEntry]).validate_python(entries)
    except ValidationError as exc:
        said = describe_validation(exc)
        raise AGUIError("invalid_run_input", f"forwardedProps.command.resume.{said}") from None


def _resume_places(body: dict[str, Any]) -> tuple[Any, Any]:
    """The raw ``resume`` at the top level and in ``forwardedProps.command.resume``."""
    props = body.get("forwardedProps", body.get("forwarded_props"))
    command = props.get("command") if isinstance(props, dict) else None
    nested = command.get("resume") if isinstance(command, dict) else None
    return body.get("resume"), nested


def _parse_resume(raw: Any, where: str = "resume") -> tuple[list[Any], list[ResumeAnswer]]:
    """One place's answers (``where``: the place, as a refusal names it), in the list form
    and as ``ResumeAnswer``s."""
    if isinstance(raw, dict):
        items = raw.get("interrupts")
        if not isinstance(items, list):
            raise AGUIError("invalid_resume", f"{where} must be a list or {{interrupts: [...]}}")
        where += ".interrupts"
        raw = [
            {
                "interruptId": i.get("id") if isinstance(i, dict) else None,
                # (a status given is kept: a cancel written so was stored as the answer null,
                # outside tester 103; one neither resolved nor cancelled is refused below)
                "status": i.get("status", "resolved") if isinstance(i, dict) else "resolved",
                "payload": i.get("value") if isinstance(i, dict) else None,
            }
            for i in items
        ]
    if not isinstance(raw, list):
        raise AGUIError(
            "invalid_resume", f"{where} must be a list of entries or {{interrupts: [...]}}"
        )
    answers = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise AGUIError("invalid_resume", f"{where}[{i}] must be an object")
        interrupt_id = entry.get("interruptId", entry.get("interrupt_id"))
        status = entry.get("status", "resolved")
        # (which entry, and what of it: "each entry needs interruptId and status" said
        # neither -- outside tester 190)
        if not isinstance(interrupt_id, str):
            raise AGUIError(
                "invalid_resume",
                f"{where}[{i}].interruptId must be an interrupt's id (a string), not "
                f"{'missing' if interrupt_id is None else _json_kind(interrupt_id)}",
            )
        if status not in ("resolved", "cancelled"):
            raise AGUIError(
                "invalid_resume",
                f"{where}[{i}].status must be resolved or cancelled, not {_shown(status)}",
            )
        answers.append(
            ResumeAnswer(interrupt_id, status, entry.get("payload"), where=f"{where}[{i}]")
        )
    return raw, answers


def _shown(value: Any) -> str:
    """A client's value quoted in a refusal: short, its kind if it is no text."""
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:40] + "...")
    return _json_kind(value)


def _written_alike(top: list[ResumeAnswer], nested: list[ResumeAnswer]) -> None:
    """Answers in both places must answer the same interrupts the same way (resolved or
    cancelled); a payload written differently in the other place is kept beside the answer
    (``written_also``), to be compared once its type is known. Not before: read as stored
    data, ``{"$bytes": ...}`` matched its text, and ``approved`` read as ``accepted`` in an
    answer that is no approval (outside tester 102)."""
    said = {a.interrupt_id: a.status for a in top}
    if said != {a.interrupt_id: a.status for a in nested}:
        raise AGUIError(
            "invalid_resume",
            "resume and forwardedProps.command.resume differ; send the answers once",
        )
    other = {a.interrupt_id: a.payload for a in nested}
    for answer in top:
        payload = other[answer.interrupt_id]
        if answer.status == "resolved" and not strictly_equal(answer.payload, payload):
            answer.written_also = (payload,)


_APPROVAL_KEYS = frozenset(("accepted", "approved", "arguments"))


def answer_for(request: ExternalRequest, payload: Any) -> Any:
    """A resume payload as the engine's answer type expects it.

    A tool-call approval takes exactly what its ``responseSchema`` advertises: an object with
    ``accepted`` (or, the same, ``approved``: one of the two) a boolean, and optionally
    ``arguments``, an object of edits. Anything else -- a bare ``true``, both keys, other keys
    -- is refused: a payload that does not say clearly "run this call" never runs it."""
    if isinstance(request.data, ToolApprovalRequestContent):
        expected = "expected {accepted: boolean, arguments?: object}"

        def refused(problem: str) -> AGUIError:
            return AGUIError(
                "invalid_resume_payload",
                f"interrupt {request.request_id}: {problem}; {expected}",
            )

        if not isinstance(payload, dict):
            raise refused(f"the payload is {_json_kind(payload)}, not an object")
        keys = [k for k in ("accepted", "approved") if k in payload]
        if len(keys) != 1:
            raise refused("give exactly one of 'accepted' or 'approved'")
        decision = payload[keys[0]]
        if not isinstance(decision, bool):
            raise refused(f"{keys[0]!r} must be a boolean, not {_json_kind(decision)}")
        other = sorted(k for k in payload if k not in _APPROVAL_KEYS)
        if other:
            raise refused(f"unexpected key {other[0]!r}")
        answer: dict[str, Any] = {"approved": decision}
        if "arguments" in payload:
            if not isinstance(payload["arguments"], dict):
                raise refused(f"'arguments' is {_json_kind(payload['arguments'])}, not an object")
            answer["arguments"] = payload["arguments"]
        return answer
    if isinstance(payload, str) and _answered_with_a_message(request.response_type):
        return {"message": payload}  # (a chat's next message, given as the bare text)
    return payload


def _answered_with_a_message(response_type: Any) -> bool:
    """The answer is a model with a ``message`` field (the handoff's user turn): a bare string
    is that message. Any other type takes a string as itself: a ``str`` or ``bytes`` answer
    was refused, wrapped as ``{"message": ...}``, and an ``Any`` one received the wrapper
    (outside tester 99)."""
    return (
        isinstance(response_type, type)
        and issubclass(response_type, BaseModel)
        and "message" in response_type.model_fields
    )


def _json_kind(value: Any) -> str:
    """What a JSON value is, for a message: ``a boolean``, ``null``, ``an array``..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


# --- what a resumed run sends again -------------------------------------------------------------


@dataclass
class HeldCall:
    """A tool call an earlier request streamed and left waiting -- held for approval, or beside
    one in its batch -- as it will run (with a reviewer's edits)."""

    name: str
    arguments: dict[str, Any]


def held_calls(
    workflow: Workflow,
    checkpoint: Checkpoint,
    pending: Iterable[ExternalRequest],
    answers: dict[str, Any],
) -> dict[str, HeldCall]:
    """The calls a paused run holds, by call id: the call of each approval request (with the
    edits of an approving ``answers`` entry, as the agent will run it) and the other calls of
    its batch, read from the agent's conversation in ``checkpoint``; and each tool call a crash
    left in doubt, as its question describes it."""
    pending = list(pending)
    approvals = [r for r in pending if isinstance(r.data, ToolApprovalRequestContent)]
    in_doubt = [r for r in pending if isinstance(r.data, InDoubtEffect)]
    held: dict[str, HeldCall] = {}
    # the batch of each agent asking: its other calls may report results now -- those of a
    # batch cut off by a crash too, whose question is about one call (their arguments went
    # unsent: outside tester 139)
    asking = [r.source_executor_id for r in approvals] + [r.data.executor_id for r in in_doubt]
    for executor_id in dict.fromkeys(asking):
        held.update(_batch_of(workflow, checkpoint, executor_id))
    for request in in_doubt:
        described = request.data.description
        if isinstance(described, dict) and isinstance(described.get("arguments"), dict):
            call_id, tool = described.get("call_id"), described.get("tool")
            if isinstance(call_id, str) and isinstance(tool, str):
                held[call_id] = HeldCall(tool, dict(described["arguments"]))
    for request in approvals:
        guarded: FunctionCallContent = request.data.function_call
        answer = answers.get(request.request_id)  # as the client sent it, or as stored
        if isinstance(answer, dict) and answer.get("approved") is True:
            answer = ToolApprovalResponseContent.model_validate(answer)
        decision = (
            answer if isinstance(answer, ToolApprovalResponseContent) and answer.approved else None
        )
        held[guarded.call_id] = HeldCall(guarded.name, edited_arguments(guarded, decision))
    return held


def calls_in_flight(workflow: Workflow, checkpoint: Checkpoint) -> dict[str, HeldCall]:
    """The calls of the batch each agent host holds in ``checkpoint``, by call id: what a run
    cut off by a server's stop was calling, so that a result it reports when continued has
    its call -- name and arguments -- in the stream. (It decodes every conversation: only
    for a run continued after a cut.)"""
    held: dict[str, HeldCall] = {}
    for executor_id in checkpoint.executor_states:
        held.update(_batch_of(workflow, checkpoint, executor_id))
    return held


def _batch_of(workflow: Workflow, checkpoint: Checkpoint, executor_id: str) -> dict[str, HeldCall]:
    """The calls of the batch an agent host holds, by call id, from the conversation it keeps
    in its state, with the edits of the approvals answered so far ({} for an executor keeping
    none; one that does not decode is left to the restore, which reports it as corrupt)."""
    stored = checkpoint.executor_states.get(executor_id, {}).get("conversation")
    if stored is None:
        return {}
    try:
        conversation = workflow.codec.decode(stored)
        if isinstance(conversation, list):  # messages are kept as JSON text (stored_message)
            conversation = [read_message(m) for m in conversation]
    except (SerializationError, ValueError):
        return {}
    if not isinstance(conversation, list) or not all(
        isinstance(m, ChatMessage) for m in conversation
    ):
        return {}
    batch = pending_batch(conversation)
    if batch is None:
        return {}
    calls, requests, answers = batch
    decided = {}  # (an approved call runs with its reviewer's edits)
    for request in requests:
        answer = answers.get(request.id) if request.id is not None else None
        if answer is not None and answer.approved:
            decided[request.function_call.call_id] = answer
    return {
        call.call_id: HeldCall(call.name, edited_arguments(call, decided.get(call.call_id)))
        for call in calls
    }
