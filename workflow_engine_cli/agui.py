"""Workflows and agents over the AG-UI protocol, with durable interrupts and resume.

``add_agui_endpoint(app, target, path, store=...)`` serves a workflow, a
``workflow_factory(thread_id)`` or an agent: a client POSTs a ``RunAgentInput`` and reads a
Server-Sent-Events stream of AG-UI events. Human-in-the-loop is an interrupt: the run finishes
with ``outcome: {type: "interrupt", interrupts: [...]}``, one per pending request, and the client
resumes the same thread with ``resume`` answers (both forms of the seeds are accepted). Answers
go through the durable inbox, so a repeated resume is harmless, a conflicting one is refused, and
a thread survives a server restart: its state lives in the SQLite store, not in the process.

Thread → runs: a thread's workflow runs have ids ``<endpoint>:<thread_id>/<n>``; the newest one
is the one a resume continues. Message and tool-call ids are prefixed with the run id, so a new
run on a thread never reuses an id a client already holds.

Hostile input: a body must be ``application/json`` (415), within ``max_body_bytes`` (413), no
deeper than 64 levels and made of real text (400, see ``_input``). Interrupt ids cannot be
guessed: ``<request id>.<HMAC-SHA256 of it under the run's random 128-bit key>`` (truncated to
128 bits), the key stored with the run when the server admits it -- so an id is stable across
restarts and re-execution, but an outsider who knows the thread cannot forge one. An answer is
taken only for a request of the exact thread and endpoint it is sent to.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import anyio
from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Interrupt,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunStartedEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import TypeAdapter, ValidationError

from executors import (
    Agent,
    AgentRunUpdateEvent,
    ChatMessage,
    ToolApprovalRequestContent,
)
from executors._host import INVOCATION_KWARGS_KEY
from workflow_engine import (
    Executor,
    ExecutorCompletedEvent,
    ExecutorFailedEvent,
    ExecutorInvokedEvent,
    ExternalRequest,
    RequestInfoEvent,
    ResponseError,
    RunNotFoundError,
    RunStore,
    Runtime,
    SerializationError,
    StoreCorruptError,
    StoredRequest,
    UnknownRequestError,
    Workflow,
    WorkflowBuilder,
    WorkflowError,
    WorkflowEvent,
    WorkflowFailedEvent,
    WorkflowOutputEvent,
    WorkflowRunState,
    WorkflowStatusEvent,
)

from ._http import describe_validation, encode_event, is_json_media_type, read_body, refusal
from ._input import MAX_JSON_DEPTH, InputError, InputTooLargeError, parse_json
from ._interrupts import (
    INTERRUPT_KEY,
    ids_equal,
    interrupt_id_for,
    new_interrupt_key,
    run_key,
    split_interrupt_id,
)

log = logging.getLogger(__name__)

WorkflowFactory = Callable[[str], Workflow]
KEEPALIVE_SECONDS = 10.0
NOTHING_TO_DO = "<nothing to do>"
MAX_THREAD_ID_LENGTH = 256
APPROVAL_SCHEMA = {
    "type": "object",
    "properties": {
        "accepted": {"type": "boolean"},
        "arguments": {"type": "object"},
    },
    "required": ["accepted"],
}


class AGUIError(Exception):
    """Ends a request with ``RUN_ERROR`` carrying ``code`` (nothing was changed)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class AGUIWorkflow:
    """What an endpoint serves: one workflow for every thread, or one per thread."""

    workflow: Workflow | None = None
    workflow_factory: WorkflowFactory | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if (self.workflow is None) == (self.workflow_factory is None):
            raise ValueError("give exactly one of workflow= or workflow_factory=")

    def for_thread(self, thread_id: str) -> Workflow:
        if self.workflow is not None:
            return self.workflow
        assert self.workflow_factory is not None
        return self.workflow_factory(thread_id)

    @classmethod
    def of(cls, target: Any, workflow_factory: WorkflowFactory | None = None) -> AGUIWorkflow:
        if isinstance(target, AGUIWorkflow):
            if workflow_factory is not None:
                raise ValueError("give either a workflow or a workflow_factory, not both")
            return target
        if target is not None and workflow_factory is not None:
            raise ValueError("give either a workflow or a workflow_factory, not both")
        if target is None:
            return cls(workflow_factory=workflow_factory)
        if isinstance(target, Agent):
            host = target.as_executor(run_on_message=True)
            return cls(workflow=WorkflowBuilder(name=target.name, start=host).build())
        if isinstance(target, Workflow):
            return cls(workflow=target)
        if callable(target):
            return cls(workflow_factory=target)
        raise TypeError(f"cannot serve {type(target).__name__} over AG-UI")


# --- translating workflow events into AG-UI events ---------------------------------------------


@dataclass
class EventTranslator:
    """Keeps AG-UI's sequence rules: every message, tool call and step opened is closed."""

    scope: str = ""
    """Prefix for message and tool-call ids, so runs on one thread never reuse an id."""
    interrupt_key: str | None = None
    """The run's key: ``request_info`` events carry the interrupt id, not the request id."""
    open_steps: list[str] = field(default_factory=list)
    open_text: str | None = None
    open_calls: dict[str, str] = field(default_factory=dict)  # call id -> message id

    def translate(self, event: WorkflowEvent, codec: Any) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        if isinstance(event, ExecutorInvokedEvent):
            self.open_steps.append(event.executor_id)
            out.append(StepStartedEvent(step_name=event.executor_id))
        elif isinstance(event, ExecutorCompletedEvent | ExecutorFailedEvent):
            out += self.close_messages()
            if event.executor_id in self.open_steps:
                self.open_steps.remove(event.executor_id)
                out.append(StepFinishedEvent(step_name=event.executor_id))
        elif isinstance(event, AgentRunUpdateEvent):
            out += self._agent(event)
        elif isinstance(event, WorkflowStatusEvent):
            out.append(CustomEvent(name="status", value={"state": event.state.value}))
        elif isinstance(event, RequestInfoEvent):
            value = event.to_dict(codec)
            value["request_id"] = interrupt_id_for(event.request_id, self.interrupt_key)
            out.append(CustomEvent(name="request_info", value=value))
        elif isinstance(event, WorkflowOutputEvent):
            out.append(
                CustomEvent(
                    name="workflow_output",
                    value={"source": event.source_executor_id, "data": codec.encode(event.data)},
                )
            )
        return out

    def _agent(self, event: AgentRunUpdateEvent) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        call_id = f"{self.scope}:{event.call_id}" if event.call_id else None
        if event.kind == "text" and event.text:
            message_id = f"{self.scope}:{event.executor_id}:{event.message_id}"
            if self.open_text != message_id:
                out += self._close_text()
                self.open_text = message_id
                out.append(TextMessageStartEvent(message_id=message_id, role="assistant"))
            out.append(TextMessageContentEvent(message_id=message_id, delta=event.text))
        elif event.kind == "function_call" and call_id:
            out += self._close_text()
            if call_id not in self.open_calls:
                parent = f"{self.scope}:{event.executor_id}:{event.message_id}"
                self.open_calls[call_id] = parent
                out.append(
                    ToolCallStartEvent(
                        tool_call_id=call_id,
                        tool_call_name=event.name or "tool",
                        parent_message_id=parent,
                    )
                )
            if event.arguments_delta:
                out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=event.arguments_delta))
        elif event.kind == "message_end":
            out += self.close_messages()
        elif event.kind == "function_result" and call_id:
            content = f"Error: {event.error}" if event.error else json.dumps(event.result)
            out.append(
                ToolCallResultEvent(
                    message_id=f"result:{call_id}",
                    tool_call_id=call_id,
                    content=content,
                    role="tool",
                )
            )
        return out

    def _close_text(self) -> list[BaseEvent]:
        if self.open_text is None:
            return []
        message_id, self.open_text = self.open_text, None
        return [TextMessageEndEvent(message_id=message_id)]

    def close_messages(self) -> list[BaseEvent]:
        out = self._close_text()
        for call_id in list(self.open_calls):
            out.append(ToolCallEndEvent(tool_call_id=call_id))
        self.open_calls.clear()
        return out

    def close_all(self) -> list[BaseEvent]:
        out = self.close_messages()
        while self.open_steps:
            out.append(StepFinishedEvent(step_name=self.open_steps.pop()))
        return out


def interrupt_for(request: ExternalRequest, scope: str = "", key: str | None = None) -> Interrupt:
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
                    "arguments": call.arguments,
                }
            },
        )
    message = getattr(data, "message", None)
    return Interrupt(
        id=interrupt_id,
        reason="input_required",
        message=message if isinstance(message, str) and message else "Input required",
        response_schema=TypeAdapter(request.response_type).json_schema(),
        metadata={"request": json.loads(json.dumps(data, default=_jsonable))},
    )


def _jsonable(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump(mode="json") if dump else str(value)


# --- resume payloads ----------------------------------------------------------------------------


@dataclass
class ResumeAnswer:
    interrupt_id: str
    status: str
    payload: Any


def normalize_resume(body: dict[str, Any]) -> list[ResumeAnswer] | None:
    """Accept ``resume: [{interruptId, status, payload}]`` and ``resume: {interrupts: [{id,
    value}]}``; the second form is rewritten so ``RunAgentInput`` validates it."""
    raw = body.get("resume")
    if raw is None:
        return None
    if isinstance(raw, dict):
        items = raw.get("interrupts")
        if not isinstance(items, list):
            raise AGUIError("invalid_resume", "resume must be a list or {interrupts: [...]}")
        raw = [
            {
                "interruptId": i.get("id") if isinstance(i, dict) else None,
                "status": "resolved",
                "payload": i.get("value") if isinstance(i, dict) else None,
            }
            for i in items
        ]
        body["resume"] = raw
    if not isinstance(raw, list):
        raise AGUIError("invalid_resume", "resume must be a list of entries")
    answers = []
    for entry in raw:
        if not isinstance(entry, dict):
            raise AGUIError("invalid_resume", "each resume entry must be an object")
        interrupt_id = entry.get("interruptId", entry.get("interrupt_id"))
        status = entry.get("status", "resolved")
        if not isinstance(interrupt_id, str) or status not in ("resolved", "cancelled"):
            raise AGUIError(
                "invalid_resume",
                "each resume entry needs interruptId and status resolved|cancelled",
            )
        answers.append(ResumeAnswer(interrupt_id, status, entry.get("payload")))
    seen: set[str] = set()
    for answer in answers:
        if answer.interrupt_id in seen:  # two answers to one request: which one would count?
            raise AGUIError(
                "invalid_resume", f"interrupt {answer.interrupt_id!r} is answered twice"
            )
        seen.add(answer.interrupt_id)
    return answers


def answer_for(request: ExternalRequest, payload: Any) -> Any:
    """A resume payload as the engine's answer type expects it."""
    if isinstance(request.data, ToolApprovalRequestContent):
        if isinstance(payload, bool):
            return {"approved": payload}
        if not isinstance(payload, dict):
            raise AGUIError(
                "invalid_resume_payload",
                f"interrupt {request.request_id}: expected {{accepted: boolean, arguments?}}",
            )
        decision = payload.get("accepted", payload.get("approved"))
        if not isinstance(decision, bool):
            raise AGUIError(
                "invalid_resume_payload",
                f"interrupt {request.request_id}: 'accepted' (or 'approved') must be a boolean",
            )
        answer: dict[str, Any] = {"approved": decision}
        if payload.get("arguments") is not None:
            answer["arguments"] = payload["arguments"]
        return answer
    if isinstance(payload, str):
        return {"message": payload}
    return payload


def normalize_forwarded_props(value: Any) -> dict[str, Any]:
    """``forwardedProps`` as a plain dict of JSON values (anything else is dropped)."""
    if not isinstance(value, dict):
        return {}
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return {}


# --- the endpoint -----------------------------------------------------------------------------


@dataclass
class Turn:
    """What a request leads to once validated: the run to continue (``None``: the run was
    cancelled; ``NOTHING_TO_DO``: a repeated resume) and that run's interrupt key."""

    run_id: str | None
    key: str | None = None


class AGUIService:
    """Runs AG-UI requests for one target against a durable store."""

    def __init__(self, target: AGUIWorkflow, store: RunStore, namespace: str = "") -> None:
        self.target = target
        self.store = store
        self.namespace = namespace
        """Keeps endpoints sharing a store apart: run ids are ``<namespace>:<thread>/<n>``."""

    def thread_key(self, thread_id: str) -> str:
        return f"{self.namespace}:{thread_id}" if self.namespace else thread_id

    def owns(self, thread_id: str, run_id: str) -> bool:
        """Whether ``run_id`` is one of this endpoint's runs of exactly ``thread_id``.

        Not a prefix test: thread ``p`` must not reach the runs of thread ``p/0``
        (``<ns>:p/0/<n>``), nor another endpoint's runs of a thread with the same id.
        """
        key, slash, index = run_id.rpartition("/")
        return (
            bool(slash)
            and index.isascii()
            and index.isdigit()
            and index == str(int(index))
            and key == self.thread_key(thread_id)
        )

    def runtime_for(self, thread_id: str) -> tuple[Runtime, Workflow]:
        workflow = self.target.for_thread(thread_id)
        runtime = Runtime(self.store)
        runtime.register(workflow)
        return runtime, workflow

    async def current_run(self, thread_id: str) -> tuple[str | None, int]:
        """The thread's newest run id (or None) and the next free index."""
        latest: str | None = None
        index = 0
        key = self.thread_key(thread_id)
        while True:
            run_id = f"{key}/{index}"
            try:
                await self.store.get_run(run_id)
            except RunNotFoundError:
                return latest, index
            latest = run_id
            index += 1

    async def stream(
        self, run_input: RunAgentInput, resume: list[ResumeAnswer] | None
    ) -> AsyncIterator[BaseEvent]:
        thread_id, client_run_id = run_input.thread_id, run_input.run_id
        yield RunStartedEvent(thread_id=thread_id, run_id=client_run_id)
        translator = EventTranslator()
        try:
            runtime, workflow = self.runtime_for(thread_id)
            turn = await self._prepare(runtime, workflow, run_input, resume)
            run_id = turn.run_id
            if run_id == NOTHING_TO_DO:  # a repeated resume: already done, nothing changes
                yield RunFinishedEvent(thread_id=thread_id, run_id=client_run_id)
                return
            if run_id is None:  # cancelled
                yield RunFinishedEvent(
                    thread_id=thread_id,
                    run_id=client_run_id,
                    outcome=RunFinishedCancelledOutcome(),
                )
                return
            translator.scope = run_id
            translator.interrupt_key = turn.key
            stream = runtime.resume_stream(run_id)
            async with aclosing(stream):
                async for event in stream:
                    if isinstance(event, WorkflowFailedEvent):
                        raise AGUIError(event.error.code or "workflow_failed", event.error.message)
                    for out in translator.translate(event, workflow.codec):
                        yield out
            result = stream.result
            assert result is not None
            for out in translator.close_all():
                yield out
            if result.status is WorkflowRunState.FAILED:
                raise AGUIError("workflow_failed", f"run {run_id} failed")
            if result.pending_requests:
                interrupts = [interrupt_for(r, run_id, turn.key) for r in result.pending_requests]
                yield RunFinishedEvent(
                    thread_id=thread_id,
                    run_id=client_run_id,
                    outcome=RunFinishedInterruptOutcome(interrupts=interrupts),
                )
                return
            yield RunFinishedEvent(
                thread_id=thread_id,
                run_id=client_run_id,
                result=[workflow.codec.encode(o) for o in result.outputs] or None,
            )
        except (AGUIError, WorkflowError) as exc:
            for out in translator.close_all():
                yield out
            yield RunErrorEvent(message=str(exc), code=exc.code)
        except Exception as exc:  # a bug: the client still gets a well-formed end of stream
            log.exception("AG-UI run on thread %r failed", thread_id)
            for out in translator.close_all():
                yield out
            yield RunErrorEvent(
                message=f"internal error ({type(exc).__name__}); see the server log",
                code="internal_error",
            )

    async def _prepare(
        self,
        runtime: Runtime,
        workflow: Workflow,
        run_input: RunAgentInput,
        resume: list[ResumeAnswer] | None,
    ) -> Turn:
        """Validate everything first; only then store answers or admit a run."""
        thread_id = run_input.thread_id
        current, next_index = await self.current_run(thread_id)
        pending: dict[str, ExternalRequest] = {}
        key: str | None = None
        if current is not None:
            _, checkpoint = await self.store.get_run_and_latest(current)
            key = run_key(current, checkpoint)
            info = await runtime.get_run(current)
            if info.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS:
                pending = {interrupt_id_for(r.request_id, key): r for r in info.pending_requests}
        if resume:
            run_id = await self._resume(runtime, workflow, current, pending, resume, thread_id)
            return Turn(run_id, key)
        if pending:
            raise AGUIError(
                "interrupts_pending",
                # not the interrupt ids: whoever can post to a thread must not learn them
                f"thread {thread_id} waits for answers to {len(pending)} interrupt(s); resume "
                "them (or cancel) before sending a new message",
            )
        message = self._start_message(workflow, run_input.messages)
        key = new_interrupt_key()
        shared: dict[str, Any] = {INTERRUPT_KEY: key}
        props = normalize_forwarded_props(run_input.forwarded_props)
        if props and _accepts_kwargs(workflow):
            shared[INVOCATION_KWARGS_KEY] = props
        checkpoint = workflow.admit(
            message, run_id=f"{self.thread_key(thread_id)}/{next_index}", shared_state=shared
        )
        await self.store.admit(checkpoint)
        return Turn(checkpoint.run_id, key)

    async def _resume(
        self,
        runtime: Runtime,
        workflow: Workflow,
        current: str | None,
        pending: dict[str, ExternalRequest],
        resume: list[ResumeAnswer],
        thread_id: str,
    ) -> str | None:
        """Check every answer, then store them. Answers to interrupts that were already
        answered identically are accepted again (a repeated resume is harmless)."""
        fresh = [a for a in resume if a.interrupt_id in pending]
        repeats = [
            (a, await self._answered_before(a, thread_id))
            for a in resume
            if a.interrupt_id not in pending
        ]
        if any(a.status == "cancelled" for a in fresh):
            assert current is not None
            await runtime.cancel(current)
            return None
        prepared: list[tuple[str, Any]] = []
        # repeats first: a conflicting repeat must refuse the batch before anything is stored
        for answer, stored in repeats:
            request = self._decode_request(workflow, stored)
            prepared.append((stored.request_id, answer_for(request, answer.payload)))
        for answer in fresh:
            request = pending[answer.interrupt_id]
            value = answer_for(request, answer.payload)
            try:
                workflow.check_answer(
                    request.run_id or (current or ""),
                    request.request_id,
                    request.port_id,
                    request.data,
                    request.response_type,
                    value,
                )
            except ResponseError as exc:
                raise AGUIError("invalid_resume_payload", str(exc)) from exc
            prepared.append((request.request_id, value))
        for request_id, value in prepared:
            try:
                await runtime.respond(request_id, value)
            except ResponseError as exc:
                raise AGUIError(exc.code, str(exc)) from exc
        if current is None or not pending:
            return NOTHING_TO_DO
        return current

    async def _answered_before(self, answer: ResumeAnswer, thread_id: str) -> StoredRequest:
        """The request an interrupt that is not pending names -- only to repeat its answer.

        Refused (each with its own code, nothing changed): an id that is not a genuine
        interrupt id (``unknown_interrupt``, also for a forged MAC), an interrupt of another
        thread or endpoint (``interrupt_thread_mismatch``), a cancelled one or a cancel of an
        answered one (``interrupt_not_pending``), and one still pending in an earlier run that
        the thread has left behind (``interrupt_not_current``).
        """
        interrupt_id = answer.interrupt_id
        unknown = AGUIError(
            "unknown_interrupt", f"thread {thread_id} has no interrupt {interrupt_id!r}"
        )
        try:
            stored, run = await self.store.get_request_and_run(split_interrupt_id(interrupt_id))
        except (UnknownRequestError, RunNotFoundError):
            raise unknown from None
        _, checkpoint = await self.store.get_run_and_latest(run.run_id)
        genuine = interrupt_id_for(stored.request_id, run_key(run.run_id, checkpoint))
        if not ids_equal(genuine, interrupt_id):
            raise unknown
        if not self.owns(thread_id, stored.run_id):
            raise AGUIError(
                "interrupt_thread_mismatch",
                f"interrupt {interrupt_id!r} belongs to another thread; resume it there",
            )
        if stored.status == "cancelled" or answer.status == "cancelled":
            raise AGUIError(
                "interrupt_not_pending", f"interrupt {interrupt_id!r} is {stored.status}"
            )
        if stored.status == "pending":
            raise AGUIError(
                "interrupt_not_current",
                f"interrupt {interrupt_id!r} belongs to an earlier run of thread {thread_id} "
                "that no longer waits for it",
            )
        return stored

    @staticmethod
    def _decode_request(workflow: Workflow, stored: StoredRequest) -> ExternalRequest:
        """A stored request as the engine's type; a record that does not decode is corrupt."""
        try:
            return ExternalRequest(
                request_id=stored.request_id,
                port_id=stored.port_id,
                data=workflow.codec.decode(stored.data),
                response_type=workflow.resolve_type(stored.response_type),
                run_id=stored.run_id,
            )
        except (SerializationError, ValueError, TypeError, AttributeError, KeyError) as exc:
            raise StoreCorruptError(
                f"run {stored.run_id!r}: request {stored.request_id} is corrupt and cannot be "
                f"read: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            ) from exc

    @staticmethod
    def _start_message(workflow: Workflow, messages: Sequence[Any]) -> Any:
        chat = [_to_chat_message(m) for m in messages]
        chat = [m for m in chat if m is not None]
        start = workflow.graph.nodes[workflow.start_executor_id]
        if isinstance(start, Executor) and start.find_handler(chat) is not None and chat:
            return chat
        user = [m for m in chat if m.role == "user"]
        if not user:
            raise AGUIError("no_user_message", "the request has no user message to start a run")
        if isinstance(start, Executor) and start.find_handler(user[-1].text) is not None:
            return user[-1].text
        if isinstance(start, Executor) and start.find_handler(user[-1]) is not None:
            return user[-1]
        return user[-1].text


def _accepts_kwargs(workflow: Workflow) -> bool:
    for node in workflow.graph.nodes.values():
        agent = getattr(node, "agent", None)
        if agent is not None and any(t.accepts_invocation_kwargs for t in agent.tools.values()):
            return True
    return False


def _to_chat_message(message: Any) -> ChatMessage | None:
    role = getattr(message, "role", None)
    content = getattr(message, "content", None)
    if role not in ("user", "assistant", "system") or not isinstance(content, str):
        return None
    return ChatMessage(role=role, contents=[{"type": "text", "text": content}])  # type: ignore[list-item]


def add_agui_endpoint(
    app: FastAPI,
    target: Workflow | Agent | WorkflowFactory | AGUIWorkflow | None = None,
    path: str = "/",
    *,
    store: RunStore,
    workflow_factory: WorkflowFactory | None = None,
    max_body_bytes: int = 1_000_000,
    max_depth: int = MAX_JSON_DEPTH,
    keepalive_seconds: float = KEEPALIVE_SECONDS,
) -> AGUIService:
    """Serve ``target`` (a workflow, a ``workflow_factory(thread_id)`` or an agent) at ``path``.

    Refused before anything runs, with a JSON ``{"error": code, "message": ...}``: a body that
    is not ``application/json`` (415), larger than ``max_body_bytes`` (413), nested deeper than
    ``max_depth`` or not valid text (400), not JSON or not a valid ``RunAgentInput`` (422).
    Which origins may call is the app's policy (see ``workflow_engine_cli._server``).
    """
    namespace = path.strip("/").replace("/", "_")
    taken: set[str] | None = getattr(app.state, "agui_namespaces", None)
    if taken is None:
        taken = app.state.agui_namespaces = set()
    if namespace in taken:  # e.g. /a/b and /a_b: their threads' run ids would collide
        raise ValueError(f"another AG-UI endpoint of this app already uses run ids {namespace!r}")
    taken.add(namespace)
    service = AGUIService(AGUIWorkflow.of(target, workflow_factory), store, namespace)
    encoder = EventEncoder()

    @app.post(path)
    async def run_endpoint(request: Request) -> Any:
        if not is_json_media_type(request.headers.get("content-type")):
            return refusal(
                415,
                "unsupported_media_type",
                "send the RunAgentInput as Content-Type: application/json",
            )
        try:
            raw = await read_body(request, max_body_bytes)
            body = parse_json(raw, max_bytes=max_body_bytes, max_depth=max_depth)
            if not isinstance(body, dict):
                raise AGUIError("invalid_run_input", "the body must be a JSON object")
            resume = normalize_resume(body)
            run_input = RunAgentInput.model_validate(body)
            check_thread_id(run_input.thread_id)
        except InputError as exc:
            extra = {"limit": max_body_bytes} if isinstance(exc, InputTooLargeError) else {}
            return refusal(exc.status, exc.code, str(exc), **extra)
        except AGUIError as exc:
            return refusal(422, exc.code, str(exc))
        except ValidationError as exc:
            return refusal(422, "invalid_run_input", describe_validation(exc))

        async def sse() -> AsyncIterator[str]:
            events = service.stream(run_input, resume)
            send, receive = anyio.create_memory_object_stream[BaseEvent | None](64)

            async def pump() -> None:
                async with send, aclosing(events):
                    async for event in events:
                        await send.send(event)

            async with anyio.create_task_group() as tg:
                tg.start_soon(pump)
                async with receive:
                    while True:
                        with anyio.move_on_after(keepalive_seconds) as waited:
                            try:
                                event = await receive.receive()
                            except anyio.EndOfStream:
                                return
                        if waited.cancelled_caught:
                            yield ": keep-alive\n\n"
                            continue
                        if event is not None:
                            yield encode_event(encoder, event)

        return StreamingResponse(sse(), media_type=encoder.get_content_type())

    return service


def check_thread_id(thread_id: str) -> None:
    """A thread id becomes part of run ids: it must be non-empty and of bounded length."""
    if not thread_id:
        raise AGUIError("invalid_run_input", "threadId must not be empty")
    if len(thread_id) > MAX_THREAD_ID_LENGTH:
        raise AGUIError(
            "invalid_run_input",
            f"threadId has {len(thread_id)} characters; the limit is {MAX_THREAD_ID_LENGTH}",
        )
