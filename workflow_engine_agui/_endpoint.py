"""Workflows and agents over the AG-UI protocol, with durable interrupts and resume.

``add_agui_endpoint(app, target, path, store=...)`` serves a workflow, a
``workflow_factory(thread_id)`` or an agent: a client POSTs a ``RunAgentInput`` and reads a
Server-Sent-Events stream of AG-UI events. Human-in-the-loop is an interrupt: the run finishes
with ``outcome: {type: "interrupt", interrupts: [...]}``, one per pending request, and the client
resumes the same thread with ``resume`` answers (see ``_interrupts``: both forms of the seeds, at
the top level or in ``forwardedProps.command.resume``). Answers go through the durable inbox, so
a repeated resume is harmless, a conflicting one is refused, and a thread survives a server
restart: its state lives in the SQLite store, not in the process.

Thread → runs: a thread's workflow runs have ids ``<endpoint>:<thread_id>/<n>``; the newest one
is the one a resume continues. Message and tool-call ids are prefixed with the run id, so a new
run on a thread never reuses an id a client already holds.

Each request's stream stands on its own (AG-UI's sequence rules hold within it, which is what
validators check): a resumed run that reports the result of a tool call an earlier request
streamed -- the approved or rejected call, and the free calls of its batch -- first sends that
call again (``TOOL_CALL_START``/``ARGS``/``END``, same ``toolCallId``, no ``parentMessageId``:
its message went out with the earlier request). Values go out in the wire form of ``_http``:
plain JSON, types named by their stable names; ``RUN_FINISHED.result`` is a summary of the
outputs, never a conversation. Every event carries a ``timestamp`` (milliseconds since 1970).

Hostile input: a body must be ``application/json`` (415), within ``max_body_bytes`` (413), no
deeper than 64 levels and made of real text (400, see ``_input``). Interrupt ids cannot be
guessed (see ``_interrupts``), and an answer is taken only for a request of the exact thread and
endpoint it is sent to.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import anyio
from ag_ui.core import (
    BaseEvent,
    CustomEvent,
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
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import ValidationError

from workflow_engine import (
    Checkpoint,
    Executor,
    ExecutorCompletedEvent,
    ExecutorFailedEvent,
    ExecutorInvokedEvent,
    ExternalRequest,
    InDoubtEffect,
    RequestAlreadyAnsweredError,
    RequestInfoEvent,
    ResponseError,
    RunExistsError,
    RunNotFoundError,
    RunNotResumableError,
    RunRecord,
    RunStore,
    Runtime,
    SerializationError,
    StoreCorruptError,
    StoredRequest,
    SuperstepStartedEvent,
    TypeRegistry,
    UnknownRequestError,
    Workflow,
    WorkflowError,
    WorkflowEvent,
    WorkflowFailedEvent,
    WorkflowOutputEvent,
    WorkflowRunState,
    WorkflowStatusEvent,
)
from workflow_engine._checkpoint import canonical_answer
from workflow_engine._codec import strictly_equal
from workflow_engine._identity import INPUT_SOURCE
from workflow_engine._input import (
    MAX_JSON_DEPTH,
    InputError,
    InputTooLargeError,
    is_blank,
    parse_json,
)
from workflow_engine._redaction import cleaned_piece, pieces, shortened_values_cleaned
from workflow_engine._store import default_owner, forget_ended_owner, holder_of, owner_ended
from workflow_engine.executors import (
    Agent,
    AgentRunUpdateEvent,
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    TextContent,
    ToolApprovalResponseContent,
)
from workflow_engine.executors._content import model_call_id
from workflow_engine.executors._host import INVOCATION_KWARGS_KEY
from workflow_engine.executors._tools import call_arguments

from ._http import (
    MESSAGE_CHARS,
    AGUIError,
    ClientGoneError,
    bounded,
    describe_validation,
    encode_event,
    is_json_media_type,
    object_fields,
    read_body,
    refusal,
    type_label,
    wire_value,
)
from ._interrupts import (
    CLIENT_MESSAGES_KEY,
    CLIENT_RUN_KEY,
    INTERRUPT_KEY,
    HeldCall,
    ResumeAnswer,
    answer_for,
    calls_in_flight,
    effect_named,
    held_calls,
    ids_equal,
    interrupt_for,
    interrupt_id_for,
    new_interrupt_key,
    normalize_resume,
    run_key,
    split_interrupt_id,
)

__all__ = ["AGUIError", "AGUIService", "AGUIWorkflow", "add_agui_endpoint"]

log = logging.getLogger(__name__)
_LONGEST_WORD = 16_384
_SPACE = re.compile(r"\s")
_READ_AT_MOST = 65_536
_WORKER_TOKEN = re.compile(r"(another worker|another execution in this process) \([^()]*\)")
"""A lease's holder as ``holder_of`` names it: the token in brackets is the server's to know."""
WorkflowFactory = Callable[[str], Workflow]
KEEPALIVE_SECONDS = 10.0
NOTHING_TO_DO = "<nothing to do>"
MAX_ID_LENGTH = 256
"""The most characters of a thread, run, message or interrupt id a request may name."""
MAX_UNREAD_EVENTS = 2_000
"""Events a stream holds for a client that does not read them before it is cut off: the run
goes on, its events are no longer kept for that client."""
STALLED_SECONDS = 2.0
"""How long a client with ``max_unread_events`` unread may take none of them before it is cut
off: one that reads at full speed but behind a burst (6,000 chunks of one reply, through a
middleware) is not (outside tester 203) -- unless it falls ``_BEHIND_AT_MOST`` times as far
behind."""
_BEHIND_AT_MOST = 100
"""A client reading, but this many times ``max_unread_events`` behind, is cut off all the same
(what the server holds for it is bounded): 20 times cut off a client reading at full speed
behind a reply of 150,000 chunks, the server's own sending the bottleneck (tester 204)."""


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
            return cls(workflow=target.as_workflow())
        if isinstance(target, Workflow):
            return cls(workflow=target)
        if callable(target):
            return cls(workflow_factory=target)
        raise TypeError(f"cannot serve {type(target).__name__} over AG-UI")


@dataclass
class _Turns:
    """A thread's requests deciding one at a time (``AGUIService._deciding``)."""

    lock: anyio.Lock
    waiting: int = 0


@dataclass
class _Begun:
    """A request validated, what it gives stored, its run's execution started (or what it
    was refused with)."""

    runtime: Runtime | None = None
    workflow: Workflow | None = None
    turn: Turn | None = None
    execution: MemoryObjectReceiveStream[Any] | None = None
    error: Exception | None = None


@dataclass
class _Ended:
    """The end of a run's execution, after its last event: its result, or what it raised."""

    result: Any = None
    error: Exception | None = None


def receive_closed(send: MemoryObjectSendStream[Any]) -> bool:
    """Whether the reading end of ``send``'s stream is gone (the client went away)."""
    return send.statistics().open_receive_streams == 0


# --- translating workflow events into AG-UI events ---------------------------------------------


@dataclass
class EventTranslator:
    """Keeps AG-UI's sequence rules within one request's stream: every message, tool call and
    step opened is closed, and every tool call reported on was started in this stream."""

    registry: TypeRegistry = field(default_factory=TypeRegistry)
    """Names types for clients (the served workflow's registry)."""
    scope: str = ""
    """Prefix for message and tool-call ids, so runs on one thread never reuse an id."""
    interrupt_key: str | None = None
    """The run's key: ``request_info`` events carry the interrupt id, not the request id."""
    held: dict[str, HeldCall] = field(default_factory=dict)
    """Calls of an earlier request this one may report results of (by the agent's call id)."""
    open_steps: list[str] = field(default_factory=list)
    open_text: str | None = None
    open_calls: list[str] = field(default_factory=list)
    started_calls: set[str] = field(default_factory=set)
    started_text: set[str] = field(default_factory=set)
    superstep: int = 0
    replies: dict[str, str] = field(default_factory=dict)
    """The model reply under way of each agent (until its ``message_end``) -> its id here."""
    reply_ids: set[str] = field(default_factory=set)
    """Every reply's id this stream gave."""

    def translate(self, event: WorkflowEvent) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        if isinstance(event, SuperstepStartedEvent):
            self.superstep = event.superstep
        elif isinstance(event, ExecutorInvokedEvent):
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
            out.append(CustomEvent(name="request_info", value=self._request_info(event.request)))
        elif isinstance(event, WorkflowOutputEvent):
            value = {
                "source": event.source_executor_id,
                "type": type_label(type(event.data), self.registry),
                "data": wire_value(event.data),
            }
            out.append(CustomEvent(name="workflow_output", value=value))
        return out

    def _request_info(self, request: ExternalRequest) -> dict[str, Any]:
        """The ``request_info`` payload, shaped as Agent Framework's (ids are interrupt ids)."""
        return {
            "request_id": interrupt_id_for(request.request_id, self.interrupt_key),
            "source_executor_id": request.source_executor_id,
            "request_type": type_label(type(request.data), self.registry),
            "response_type": type_label(request.response_type, self.registry),
            "data": wire_value(request.data),
        }

    def _agent(self, event: AgentRunUpdateEvent) -> list[BaseEvent]:
        out: list[BaseEvent] = []
        call_id = f"{self.scope}:{event.call_id}" if event.call_id else None
        replied = event.kind in ("text", "function_call", "message_end")
        message_id = self._reply_id(event) if replied else ""
        if event.kind == "text" and event.text:
            if self.open_text != message_id:
                out += self._close_text()
                self.open_text = message_id
                self.started_text.add(message_id)
                out.append(TextMessageStartEvent(message_id=message_id, role="assistant"))
            out.append(TextMessageContentEvent(message_id=message_id, delta=event.text))
        elif event.kind == "function_call" and call_id:
            out += self._close_text()
            if call_id not in self.started_calls:
                # a parent only if this stream sent it: a client cannot resolve any other id
                parent = message_id if message_id in self.started_text else None
                out.append(self._start_call(call_id, event.name or "tool", parent))
            if event.arguments_delta:
                out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=event.arguments_delta))
        elif event.kind == "message_end":
            out += self.close_messages()
        elif event.kind == "function_result" and event.call_id and call_id:
            if call_id not in self.started_calls:
                out += self._replay(event.call_id, call_id, event.name)
            elif call_id in self.open_calls:
                out += self._end_call(call_id)
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

    def _reply_id(self, event: AgentRunUpdateEvent) -> str:
        """A model reply's ``messageId``: the run's, the superstep's and the model server's
        id -- some servers reuse theirs (Ollama draws ``chatcmpl-N`` from 999), and two
        replies under one id were one message to a client that finds messages by id
        (outside tester 190) -- numbered on if the superstep had one by that id already.
        The same events give the same ids (a superstep streamed again after a failure)."""
        raw = event.executor_id  # (one reply until its end, whatever ids its chunks carry:
        # a server may give each chunk its own, or none -- outside tester 195)
        reply = self.replies.get(raw)
        if reply is None:
            base = f"{self.scope}:{event.executor_id}:{self.superstep}:{event.message_id}"
            reply, n = base, 1
            while reply in self.reply_ids:
                n += 1
                reply = f"{base}#{n}"
            self.replies[raw] = reply
            self.reply_ids.add(reply)
        if event.kind == "message_end":
            del self.replies[raw]
        return reply

    def _replay(self, agent_call_id: str, call_id: str, name: str | None) -> list[BaseEvent]:
        """An earlier request's call, sent again so that its result has a call in this stream."""
        held = self.held.get(agent_call_id)
        out = self._close_text()
        out.append(self._start_call(call_id, held.name if held else name or "tool", None))
        if held is not None:
            delta = json.dumps(wire_value(held.arguments))
            out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=delta))
        return out + self._end_call(call_id)

    def _start_call(self, call_id: str, name: str, parent: str | None) -> ToolCallStartEvent:
        self.started_calls.add(call_id)
        self.open_calls.append(call_id)
        return ToolCallStartEvent(
            tool_call_id=call_id, tool_call_name=name, parent_message_id=parent
        )

    def _end_call(self, call_id: str) -> list[BaseEvent]:
        self.open_calls.remove(call_id)
        return [ToolCallEndEvent(tool_call_id=call_id)]

    def _close_text(self) -> list[BaseEvent]:
        if self.open_text is None:
            return []
        message_id, self.open_text = self.open_text, None
        return [TextMessageEndEvent(message_id=message_id)]

    def close_messages(self) -> list[BaseEvent]:
        out = self._close_text()
        for call_id in list(self.open_calls):
            out += self._end_call(call_id)
        return out

    def close_all(self) -> list[BaseEvent]:
        out = self.close_messages()
        while self.open_steps:
            out.append(StepFinishedEvent(step_name=self.open_steps.pop()))
        return out


def run_result(outputs: Sequence[Any], registry: TypeRegistry) -> dict[str, Any] | None:
    """``RUN_FINISHED.result``: ``{"outputs": [...]}``, each output of the run summarized by
    :func:`summarize_output` (None when the run yielded none)."""
    if not outputs:
        return None
    return {"outputs": [summarize_output(o, registry) for o in outputs]}


def summarize_output(value: Any, registry: TypeRegistry) -> dict[str, Any]:
    """An output as ``RUN_FINISHED.result`` carries it: ``{"type": <stable name>, "data": <the
    wire form>, "text": <its text>}`` -- like a ``workflow_output`` event, but without the
    fields that hold a conversation (a list of chat messages: the stream sent those message by
    message), and with the value's ``text`` when it has one (a conversation: its last assistant
    text, and no data)."""
    if _is_conversation(value):
        return {"type": type_label(list[ChatMessage], registry), "text": _last_text(value)}
    summary: dict[str, Any] = {"type": type_label(type(value), registry)}
    fields = object_fields(value)
    if fields is None:
        summary["data"] = wire_value(value)
    else:
        summary["data"] = {k: wire_value(v) for k, v in fields.items() if not _is_conversation(v)}
    text = getattr(value, "text", None)
    if isinstance(text, str):
        summary["text"] = text
    return summary


def _is_conversation(value: Any) -> bool:
    """A non-empty list of chat messages."""
    if not isinstance(value, list) or not value:
        return False
    return all(isinstance(m, ChatMessage) for m in value)


def _last_text(conversation: list[ChatMessage]) -> str:
    return next((m.text for m in reversed(conversation) if m.role == "assistant" and m.text), "")


# --- forwarded props -----------------------------------------------------------------------------


def normalize_forwarded_props(value: Any) -> dict[str, Any]:
    """``forwardedProps`` as a plain dict of JSON values (anything else is dropped)."""
    if not isinstance(value, dict):
        return {}
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return {}


# --- the endpoint -----------------------------------------------------------------------------


async def _effects_in_doubt(runtime: Runtime, run_id: str) -> list[CustomEvent]:
    return _in_doubt_events((await runtime.get_run(run_id)).effects_in_doubt)


def _in_doubt_events(effects: list[InDoubtEffect]) -> list[CustomEvent]:
    """A cancelled run's steps that started before it stopped and recorded no result, one
    ``effects_in_doubt`` event for them all: the cancel came before anyone was asked whether
    they happened, and only the outside service can say (by each one's idempotency key)."""
    if not effects:
        return []
    value = [wire_value(e.model_dump(mode="json")) for e in effects]
    return [CustomEvent(name="effects_in_doubt", value=value)]


@dataclass
class Turn:
    """What a request leads to once validated: the run to continue (``None``: the run was
    cancelled; ``NOTHING_TO_DO``: a resume on a thread without a run), that run's interrupt
    key, and the tool calls earlier requests streamed that it may report results of."""

    run_id: str | None
    key: str | None = None
    held: dict[str, HeldCall] = field(default_factory=dict)
    placeholder: str | None = None
    """The owner a run this request admitted was born leased to (see ``_prepare``)."""
    cancelled: str | None = None
    """With ``run_id`` None: the run the client's cancel ended."""
    replay: bool = False
    """The request that started ``run_id``, or the resume that took it to where it rests, sent
    again (a client retrying): nothing runs; the run's state is reported as it is (its
    interrupts, its result)."""


@dataclass(frozen=True)
class _Heard:
    """What one run of a thread received from its client: the messages its starting request
    carried (None: it did not record them) and the answers given as words."""

    created_at: float
    carried: list[Any] | None
    answers: list[Any]

    def size(self) -> int:
        """About the bytes it holds: a carried message is a list of two strings (about 200
        bytes beside its id's characters)."""
        carried = self.carried or ()
        return sum(200 + len(str(m[0] or "")) for m in carried) + 100 * len(self.answers)


_HEARD_KEPT = 10_000
"""Finished runs whose ``_Heard`` a server keeps."""
_HEARD_BYTES = 64 * 1024 * 1024
"""About the most bytes those ``_Heard`` hold: a full-history client records every message of
the thread with each run, so a thread of 10,000 messages kept 2.3 MB more with each run, and
10,000 runs could hold gigabytes (outside tester 202)."""
_STARTED_BY_KEPT = 10_000
"""Runs whose starting request's ``runId`` a server keeps (``AGUIService._started_by``)."""


def _run_index(run_id: str) -> int:
    """The number a thread's run id ends with (``<key>/<n>``)."""
    return int(run_id.rpartition("/")[2])


_START_LEASE_SECONDS = 30.0
"""How long a run this server admitted stays leased to it before its execution takes it (a
server that dies in between leaves it to another after this long, or at once on this host)."""


class AGUIService:
    """Runs AG-UI requests for one target against a durable store."""

    def __init__(
        self,
        target: AGUIWorkflow,
        store: RunStore,
        namespace: str = "",
        run_state: Mapping[str, Any] | None = None,
        max_unread_events: int = MAX_UNREAD_EVENTS,
    ) -> None:
        self.target = target
        self.store = store
        self.max_unread_events = max_unread_events
        """Events a client may leave unread before its stream is cut off (see ``_execute``)."""
        self.namespace = namespace
        """Keeps endpoints sharing a store apart: run ids are ``<namespace>:<thread>/<n>``."""
        self.run_state = dict(run_state or {})
        """Shared state every new run starts with (e.g. a record of the model it runs on)."""
        self._starting: set[str] = set()
        """Runs this server admitted, or is resuming or continuing after a stop, whose execution
        has not taken their lease yet: in that moment a run looks as if a server stop had cut
        it off."""
        self._executions: collections.Counter[str] = collections.Counter()
        """Runs this server is executing (``_execute``: in ``_started``), each with how many
        executions of it (see ``_being_started``)."""
        self._turns: dict[str, _Turns] = {}
        """Threads whose requests are deciding now (``_deciding``), each with its lock."""
        self._executing: dict[asyncio.Task[None], anyio.CancelScope] = {}
        """Runs being executed (``_execute``), each with the scope ``interrupt`` cancels: held
        here so that a task is never collected."""
        self._heard_of: collections.OrderedDict[str, _Heard] = collections.OrderedDict()
        self._heard_bytes = 0  # (what they hold, about: ``_HEARD_BYTES``)
        """Finished runs' ``_Heard``, by run id (least recently used first)."""
        self._started_by: collections.OrderedDict[str, str] = collections.OrderedDict()
        """The AG-UI ``runId`` of the request that started a run here, by the id of the run's
        first checkpoint (never reused: a run id can be, once pruned). A new message's request,
        under a runId of its own, is then told from a retry without reading that checkpoint,
        which holds the thread's whole history (the newest first)."""

    def thread_key(self, thread_id: str) -> str:
        """What the thread's run ids start with: ``<namespace>:<thread>``. An endpoint at
        ``/`` has no namespace: its thread ``t`` is ``t``, but a thread id holding ``:`` is
        kept apart with a leading ``:`` -- as ``support:T`` it was the ``/support`` endpoint's
        thread ``T``, whose interrupts a client of ``/`` could then answer."""
        if self.namespace:
            return f"{self.namespace}:{thread_id}"
        return f":{thread_id}" if ":" in thread_id else thread_id

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

    async def thread_runs(self, thread_id: str) -> list[str]:
        """The thread's run ids, oldest first: one read of the ids that start with its key
        (a look-up per run before: a thread's every request cost as many as it had runs)."""
        key = self.thread_key(thread_id)
        runs = [r for r in await self.store.run_ids(f"{key}/") if self.owns(thread_id, r)]
        return sorted(runs, key=_run_index)

    async def current_run(self, thread_id: str) -> tuple[str | None, int]:
        """The thread's newest run id (or None) and the next index: after the newest, so that
        a run's id is never taken again while any of the thread's runs are kept (a prune that
        removed the first ones made the look-up from index 0 start the thread over)."""
        runs = await self.thread_runs(thread_id)
        if not runs:
            return None, 0
        return runs[-1], _run_index(runs[-1]) + 1

    async def stream(
        self, run_input: RunAgentInput, resume: list[ResumeAnswer] | None
    ) -> AsyncGenerator[BaseEvent, None]:
        """The request's AG-UI events, each stamped with the time it was produced."""
        async with aclosing(self._events(run_input, resume)) as events:
            async for event in events:
                if event.timestamp is None:
                    event.timestamp = time.time_ns() // 1_000_000
                yield event

    async def _events(
        self, run_input: RunAgentInput, resume: list[ResumeAnswer] | None
    ) -> AsyncGenerator[BaseEvent, None]:
        thread_id, client_run_id = run_input.thread_id, run_input.run_id
        translator = EventTranslator()
        # what the request asks to be stored -- answers, a new run -- is stored, and its
        # execution started, whatever the client does meanwhile: one that hangs up stops
        # reading, not its request (outside tester 87: an approval cut off half-way was never
        # applied, and its thread refused every message after it as busy)
        with anyio.CancelScope(shield=True):
            begun = await self._begin(run_input, resume, translator)
        execution = begun.execution
        try:
            yield RunStartedEvent(thread_id=thread_id, run_id=client_run_id)
            async for out in self._relayed(run_input, begun, translator):
                yield out
        finally:
            if execution is not None:  # (left before the relay took it: it runs on unread)
                execution.close()

    async def _begin(
        self,
        run_input: RunAgentInput,
        resume: list[ResumeAnswer] | None,
        translator: EventTranslator,
    ) -> _Begun:
        """Validate the request, store what it gives, and start the run it continues."""
        begun = _Begun()
        try:
            runtime, workflow = self.runtime_for(run_input.thread_id)
            translator.registry = workflow.registry
            async with self._deciding(run_input.thread_id):
                turn = await self._prepare(runtime, workflow, run_input, resume)
                begun.runtime, begun.workflow, begun.turn = runtime, workflow, turn
                if turn.run_id not in (None, NOTHING_TO_DO) and not turn.replay:
                    assert turn.run_id is not None
                    begun.execution = self._execute(runtime, turn.run_id, turn.placeholder)
        except Exception as exc:  # said after RUN_STARTED, as every refusal is
            begun.error = exc
        return begun

    @asynccontextmanager
    async def _deciding(self, thread_id: str) -> AsyncIterator[None]:
        """The thread's requests decide one after another here: each reads the thread's run,
        then stores answers, admits a run or marks one as starting. One that read while another
        was between the two was answered with what was true a moment before -- a continuation
        of a run cut off refused as busy because a new message was checking it, a new message
        told the run was cut off while its continuation was being decided (outside tester
        124). Another server on the database still races: the store's leases decide there."""
        turn = self._turns.get(thread_id)
        if turn is None:
            turn = self._turns[thread_id] = _Turns(anyio.Lock())
        turn.waiting += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.waiting -= 1
            if not turn.waiting:
                del self._turns[thread_id]

    async def _relayed(
        self, run_input: RunAgentInput, begun: _Begun, translator: EventTranslator
    ) -> AsyncGenerator[BaseEvent, None]:
        """What the request's stream says after RUN_STARTED: the run's events, then how it
        ended (or the request's refusal)."""
        thread_id, client_run_id = run_input.thread_id, run_input.run_id
        try:
            if begun.error is not None:
                raise begun.error
            runtime, workflow, turn = begun.runtime, begun.workflow, begun.turn
            assert runtime is not None and workflow is not None and turn is not None
            run_id = turn.run_id
            if run_id == NOTHING_TO_DO:  # a resume on a thread without a run
                log.info("thread %r: a resume with no run to go to", thread_id)
                yield RunFinishedEvent(thread_id=thread_id, run_id=client_run_id)
                return
            if turn.replay and run_id is not None:
                async for out in self._replayed(runtime, workflow, run_input, turn):
                    yield out
                return
            if run_id is None:  # cancelled
                log.info("thread %r: run %r cancelled", thread_id, turn.cancelled)
                if turn.cancelled is not None:
                    for said in await _effects_in_doubt(runtime, turn.cancelled):
                        yield said
                yield RunFinishedEvent(
                    thread_id=thread_id,
                    run_id=client_run_id,
                    outcome=RunFinishedCancelledOutcome(),
                )
                return
            translator.scope = run_id
            translator.interrupt_key = turn.key
            translator.held = turn.held
            log.debug("thread %r: running %r", thread_id, run_id)
            execution = begun.execution
            assert execution is not None
            result = None
            relayed = False  # an event of this execution reached the client
            async with execution:
                async for item in execution:
                    if isinstance(item, _Ended):
                        if isinstance(item.error, RunNotResumableError) and not relayed:
                            # another request (another server) took the run to where it rests
                            # between our check and our start -- the same resume sent to two
                            # servers at once: report that run, as a resume sent again would
                            log.info("thread %r: run %r rests already", thread_id, run_id)
                            again = Turn(run_id, turn.key, replay=True)
                            async for out in self._replayed(runtime, workflow, run_input, again):
                                yield out
                            return
                        if item.error is not None:
                            raise item.error
                        result = item.result
                        break
                    if isinstance(item, WorkflowFailedEvent):
                        error = item.error
                        raise AGUIError(error.code or "workflow_failed", error.message)
                    for out in translator.translate(item):
                        relayed = True
                        yield out
            if result is None:  # its task was cancelled: the server is shutting down
                raise AGUIError("run_interrupted", f"run {run_id} was stopped with the server")
            for out in translator.close_all():
                yield out
            if result.status is WorkflowRunState.FAILED:
                raise AGUIError("workflow_failed", f"run {run_id} failed")
            if result.status is WorkflowRunState.CANCELLED:  # e.g. `workflow-engine cancel`
                log.info("thread %r: run %r was cancelled while it ran", thread_id, run_id)
                for said in await _effects_in_doubt(runtime, run_id):
                    yield said
                yield RunFinishedEvent(
                    thread_id=thread_id,
                    run_id=client_run_id,
                    outcome=RunFinishedCancelledOutcome(),
                )
                return
            if result.pending_requests:
                interrupts = [
                    interrupt_for(r, workflow.registry, run_id, turn.key)
                    for r in result.pending_requests
                ]
                log.info(
                    "thread %r: run %r paused with %d interrupt(s)",
                    thread_id,
                    run_id,
                    len(interrupts),
                )
                yield RunFinishedEvent(
                    thread_id=thread_id,
                    run_id=client_run_id,
                    outcome=RunFinishedInterruptOutcome(interrupts=interrupts),
                )
                return
            log.info("thread %r: run %r finished", thread_id, run_id)
            yield RunFinishedEvent(
                thread_id=thread_id,
                run_id=client_run_id,
                result=run_result(result.outputs, workflow.registry),
            )
        except (AGUIError, WorkflowError) as exc:
            text = str(exc)
            # (the message may quote what a client sent: %r keeps its line breaks off the log)
            log.warning("thread %r: RUN_ERROR %s: %r", thread_id, exc.code, bounded(text))
            for out in translator.close_all():
                yield out
            told = self._for_clients(text)
            yield RunErrorEvent(message=told, code=exc.code)
        except Exception as exc:  # a bug: the client still gets a well-formed end of stream
            log.exception("AG-UI run on thread %r failed", thread_id)
            for out in translator.close_all():
                yield out
            yield RunErrorEvent(
                message=f"internal error ({type(exc).__name__}); see the server log",
                code="internal_error",
            )

    def _for_clients(self, whole: str) -> str:
        """An error's message as any client may read it: without what only the server's
        operator needs -- a worker's token (its host and process id) and the database's path,
        which the log keeps (outside tester 190) -- and cut to ``MESSAGE_CHARS``.

        Cleaned, then cut: cut first, a URL's password could be left half (tester 199). The
        message may quote what a client sent, a megabyte (tester 207), so it is cleaned a piece
        at a time -- a word, or words a query string wrapped onto the next line goes on across
        (``pieces``) -- until what is shown is cleaned: a window of the text cleaned whole let
        a client end it inside the server's own URL, before its ``@``, and read the password a
        character at a time (outside tester 209). What is read is bounded all the same -- a
        word of a megabyte held the loop a second (outside tester 210) -- by whole pieces: one
        longer than ``_LONGEST_WORD`` is said by its length, and none is read past
        ``_READ_AT_MOST`` characters (the log keeps the text whole)."""
        message = shortened_values_cleaned(_WORKER_TOKEN.sub(r"\1", whole))
        path = getattr(self.store, "path", None)
        if path is not None:
            named = str(path)
            message = message.replace(f"database {named}", "database")
            message = message.replace(named, "the database")
        shown: list[str] = []
        size = read = cleaned_size = 0
        for text, end in pieces(message, _LONGEST_WORD):
            if text.isspace():
                cleaned = text
            elif len(text) > _LONGEST_WORD and not _SPACE.search(text):  # (not read: below)
                cleaned = f"[{len(text):,} characters without a space]"
            elif len(text) > _LONGEST_WORD:  # (lines that run on: nothing after is read)
                cleaned = f"[more than {_LONGEST_WORD:,} characters of lines that run on]"
            else:
                cleaned = cleaned_piece(text)
                cleaned_size += len(text)
            shown.append(cleaned)
            size, read = size + len(cleaned), end
            if size > MESSAGE_CHARS or cleaned_size > _READ_AT_MOST:
                break
        return bounded("".join(shown), left_out=len(message) - read)

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
        checkpoint: Checkpoint | None = None
        record: RunRecord | None = None
        if current is not None:
            record, checkpoint = await self.store.get_run_and_latest(current)
            key = run_key(current, checkpoint)
            # only a run resting on requests has any to answer: reading a run as users see it
            # decodes its outputs, and a thread's finished run holds its whole conversation
            # (at message 500 of a full-history client, 1,000 messages decoded for nothing)
            if record.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS:
                info = await runtime.get_run(current)
                # a run this workflow cannot decode is stranded: none of its requests can be
                # answered
                if info.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS and info.decoded:
                    pending = {
                        interrupt_id_for(r.request_id, key): r for r in info.pending_requests
                    }
        if resume:
            # from the moment its answers are stored until its execution takes the lease, the
            # run is this request's: a message sent meanwhile found it resting with answers
            # waiting and no one on it -- as if cut off by a server stop (outside tester 63)
            marked = current if current is not None and current not in self._starting else None
            if marked is not None:
                self._starting.add(marked)
            executes = False  # this request executes ``marked`` (its execution unmarks it)
            try:
                turn = await self._resumed(
                    runtime, workflow, record, checkpoint, key, pending, resume, run_input
                )
                executes = turn.run_id == current and not turn.replay
                return turn
            finally:
                if marked is not None and not executes:
                    self._starting.discard(marked)  # refused, failed, or not run here
        return await self._started_turn(
            runtime, workflow, run_input, record, checkpoint, key, pending, next_index
        )

    async def _resumed(
        self,
        runtime: Runtime,
        workflow: Workflow,
        record: RunRecord | None,
        checkpoint: Checkpoint | None,
        key: str | None,
        pending: dict[str, ExternalRequest],
        resume: list[ResumeAnswer],
        run_input: RunAgentInput,
    ) -> Turn:
        """``_prepare`` for a resume: its answers stored, what the thread's run does next."""
        thread_id = run_input.thread_id
        current = record.run_id if record is not None else None
        run_id, answers, applied = await self._resume(
            runtime, workflow, record, pending, resume, thread_id, run_input.messages
        )
        if applied:
            # the resume that took a run to where it rests, sent again (a client retrying
            # after a lost response): report that run -- its interrupts, its result -- as
            # a repeated start does; it used to finish with nothing to say
            assert run_id is not None
            if run_id != current:
                _, checkpoint = await self.store.get_run_and_latest(run_id)
                key = run_key(run_id, checkpoint)
            return Turn(run_id, key, replay=True)
        if run_id is None:  # the client cancelled an interrupt: the run ended cancelled
            return Turn(None, key, cancelled=current)
        held: dict[str, HeldCall] = {}
        if run_id == current and checkpoint is not None:
            # the answers the run applies now, whoever stored them: an edit stored by the
            # command line, resent by this client, was streamed as the model's arguments
            # (tester 76)
            stored, stored_answers = await self._answered(workflow, run_id)
            held = held_calls(
                workflow,
                checkpoint,
                [*pending.values(), *stored],
                {**answers, **stored_answers},
            )
            if not pending:  # a run cut off, continued: the calls it was making
                held = {**calls_in_flight(workflow, checkpoint), **held}
        return Turn(run_id, key, held)

    async def _started_turn(
        self,
        runtime: Runtime,
        workflow: Workflow,
        run_input: RunAgentInput,
        record: RunRecord | None,
        checkpoint: Checkpoint | None,
        key: str | None,
        pending: dict[str, ExternalRequest],
        next_index: int,
    ) -> Turn:
        """``_prepare`` for a new message: the run it starts (admitted, leased to this server),
        or the thread's run it continues or reports."""
        thread_id = run_input.thread_id
        current = record.run_id if record is not None else None
        cut_off = record is not None and await self._cut_off(record)
        chat = _chat_of(run_input.messages)  # (once: a client sends the thread's history)
        try:
            message: Any = self._start_message(workflow, [c for _, c in chat])
            refused = None
        except AGUIError as exc:  # (said once no pending interrupt is what to say instead)
            message, refused = None, exc
        newest = run_input.messages[-1] if run_input.messages else None
        if getattr(newest, "role", None) == "user" and _to_chat_message(newest) is None:
            # the message sent now says nothing (blank, an image alone): the thread's earlier
            # ones were answered again by a new run (outside tester 157)
            message, refused = (
                None,
                AGUIError(
                    "no_user_message",
                    f"thread {thread_id}: the newest message has no words (blank, or no text "
                    "part); there is nothing to answer",
                ),
            )
        if not cut_off and (
            await self._retried(workflow, record, run_input, message, chat)
            or (
                message is not None
                and await self._retried(
                    workflow, record, run_input, _before_replies(workflow, chat), chat
                )
            )
        ):
            # the request that started the thread's newest run, sent again (a client retrying
            # after a lost response): report that run, do not start it a second time
            assert record is not None
            return Turn(record.run_id, key, replay=True)
        if pending:
            raise AGUIError(
                "interrupts_pending",
                # not the interrupt ids: whoever can post to a thread must not learn them
                f"thread {thread_id} waits for answers to {len(pending)} interrupt(s); resume "
                "them (or cancel) before sending a new message",
            )
        if refused is not None:
            raise refused
        if record is not None and (
            self._being_started(record) or record.live_owner(time.time()) is not None
        ):
            raise AGUIError(
                "run_busy",
                f"thread {thread_id}: its run {current} is being executed; send a new message "
                "once it has paused or finished",
            )
        if record is not None and cut_off:
            # the server stopped while this thread's run worked (or before it applied answers):
            # the same request again continues that run; another message would leave it behind.
            # Starting from its decision: a message after it found the run cut off, no one on
            # it, and was told so while this request continued it (outside tester 123)
            if await self._started_with(workflow, record.run_id, message):
                self._starting.add(record.run_id)
                held: dict[str, HeldCall] = {}
                if checkpoint is not None:  # the calls it was making, with the answers it
                    # was applying (a reviewer's edits: outside tester 140), as a resume has
                    stored, stored_answers = await self._answered(workflow, record.run_id)
                    held = {
                        **calls_in_flight(workflow, checkpoint),
                        **held_calls(workflow, checkpoint, stored, stored_answers),
                    }
                return Turn(record.run_id, key, held)
            if record.status is WorkflowRunState.IN_PROGRESS:
                what = "was cut off when the server stopped"
            else:  # (resting, with answers stored that it has not applied: tester 190)
                what = (
                    "has answers to its interrupts stored that it has not applied yet (given "
                    "elsewhere -- the command line, another server -- or by a request cut off "
                    "when a server stopped)"
                )
            raise AGUIError(
                "run_interrupted",
                f"thread {thread_id}: its run {current} {what}; send the request that started "
                "it (or the resume it was given) again to continue it, before a new message",
            )
        key = new_interrupt_key()
        shared: dict[str, Any] = {
            **self.run_state,
            INTERRUPT_KEY: key,
            CLIENT_RUN_KEY: run_input.run_id,
        }
        shared[CLIENT_MESSAGES_KEY] = [
            [message_id, _digest(text)] for message_id, text in _users_of(chat)
        ]
        props = normalize_forwarded_props(run_input.forwarded_props)
        if props and _accepts_kwargs(workflow):
            shared[INVOCATION_KWARGS_KEY] = props
        checkpoint = workflow.admit(
            message, run_id=f"{self.thread_key(thread_id)}/{next_index}", shared_state=shared
        )
        # born leased, to an owner that only this server knows is over: another server sees
        # the run being executed (not cut off), and this request's execution takes it at once
        placeholder = default_owner()
        try:
            await self.store.admit_and_acquire(checkpoint, placeholder, _START_LEASE_SECONDS)
        except RunExistsError:  # another request on this thread admitted it a moment ago
            raise AGUIError(
                "run_busy",
                f"thread {thread_id}: another request has just started a run on it; send a new "
                "message once that run has paused or finished",
            ) from None
        owner_ended(placeholder)
        self._starting.add(checkpoint.run_id)
        started_by = self._started_by
        started_by[checkpoint.checkpoint_id] = run_input.run_id
        while len(started_by) > _STARTED_BY_KEPT:
            started_by.popitem(last=False)
        return Turn(checkpoint.run_id, key, placeholder=placeholder)

    async def _resume(
        self,
        runtime: Runtime,
        workflow: Workflow,
        record: RunRecord | None,
        pending: dict[str, ExternalRequest],
        resume: list[ResumeAnswer],
        thread_id: str,
        messages: Sequence[Any] = (),
    ) -> tuple[str | None, dict[str, Any], bool]:
        """Check every answer, then store them; the run to continue, the answers stored by
        request id, and whether they were all given and applied before (the run to report,
        not to continue). Answers to interrupts that were already answered identically are
        accepted again (a repeated resume is harmless)."""
        current = record.run_id if record is not None else None
        fresh = [a for a in resume if a.interrupt_id in pending]
        repeats = [
            (a, await self._answered_before(a, thread_id, workflow))
            for a in resume
            if a.interrupt_id not in pending
        ]
        # the run the answers go to: a new user message sent along would be lost (a resume
        # continues a run; it starts nothing): refused before anything is stored
        target = current if fresh or not repeats else repeats[0][1].run_id
        if target is not None and messages:
            # what the person typed now (a repeat's answer is stored already; a cancel and a
            # tool call's approval are no words of theirs, tester 73)
            given = [
                a.payload
                for a in fresh
                if a.status != "cancelled" and _typed(pending[a.interrupt_id].response_type)
            ]
            unseen = await self._unseen_message(workflow, thread_id, messages, given)
            if unseen is not None:
                shown = unseen if len(unseen) <= 60 else unseen[:57] + "..."
                raise AGUIError(
                    "message_in_resume",
                    f"thread {thread_id}: this resume also carries a new user message "
                    f"({shown!r}) that run {target} never received; a resume only answers "
                    "interrupts, so nothing was stored: resume without it, then send the "
                    "message once the run has paused or finished",
                )
        # every answer checked, a cancel's batch too (it let a conflicting or invalid answer
        # through), then stored at once: all of them or none (stored one by one, two requests
        # at once could each leave half of theirs: outside tester 103)
        prepared: list[tuple[str, Any]] = []
        for answer, stored in repeats:
            if answer.status == "cancelled":
                continue  # the same cancel again: nothing to store
            request = self._decode_request(workflow, stored)
            try:
                value = answer_for(request, answer.payload)
            except AGUIError as exc:
                # a payload no request would take, to one already answered: what matters is
                # that it is not that answer (as for the engine's respond), not its form
                raise AGUIError(
                    RequestAlreadyAnsweredError.code,
                    f"interrupt {answer.interrupt_id} was already answered with a different "
                    f"value; an answer cannot be changed ({exc})",
                ) from exc
            if answer.written_also:
                kept = _checked_answer(workflow, request, current, value)
                self._one_answer(workflow, request, current, answer, kept)
            prepared.append((stored.request_id, value))
        given_before = len(prepared)
        for answer in fresh:
            if answer.status == "cancelled":
                continue
            request = pending[answer.interrupt_id]
            value = answer_for(request, answer.payload)
            kept = _checked_answer(workflow, request, current, value)
            if answer.written_also:
                self._one_answer(workflow, request, current, answer, kept)
            prepared.append((request.request_id, value))
        cancelling = any(a.status == "cancelled" for a in fresh)
        # (beside a cancel, only the repeats: each the answer stored before, or refused)
        batch = prepared[:given_before] if cancelling else prepared
        if batch:
            try:
                await runtime.respond_all(dict(batch))
            except ResponseError as exc:
                raise AGUIError(exc.code, str(exc)) from exc
        if cancelling:
            assert current is not None
            dismissed = [
                pending[a.interrupt_id].request_id for a in fresh if a.status == "cancelled"
            ]
            try:
                # only if still unanswered: an approval stored meanwhile by another client
                # wins, and one arriving after is refused (outside tester 107)
                await runtime.cancel(current, unless_answered=dismissed)
            except RequestAlreadyAnsweredError as exc:
                raise AGUIError(
                    "interrupt_not_pending",
                    f"thread {thread_id}: an interrupt to cancel was answered meanwhile, so "
                    f"run {current} was not cancelled ({exc})",
                ) from exc
            except RunNotResumableError:
                # the same cancel, sent at once to another server (a retry through a load
                # balancer), cancelled the run first: reported as done, as a repeat is
                # (it was run_not_resumable, outside tester 110)
                if (await self.store.get_run(current)).status is not WorkflowRunState.CANCELLED:
                    raise
            return None, {}, False
        if record is None:
            return NOTHING_TO_DO, {}, False
        # all of it given before: the run those answers went to, to report
        repeated = repeats[0][1].run_id if repeats and not fresh else None
        if repeated is not None and repeated != record.run_id:
            # an earlier run's resume sent again: report that run -- never the thread's newer
            # one, whose interrupt a retrying client would otherwise show (and approve) instead
            return repeated, {}, True
        if fresh or await self._cut_off(record):
            return record.run_id, dict(prepared), False
        holder = record.live_owner(time.time())
        if holder is not None:
            raise AGUIError(
                "run_busy",
                f"thread {thread_id}: its run {record.run_id} is being executed by "
                f"{holder_of(holder)}; the answers are stored and that execution applies them",
            )
        if record.status is WorkflowRunState.FAILED:
            # sent again: the failed superstep is retried
            return record.run_id, dict(prepared), False
        if repeated is not None:
            return repeated, {}, True
        return NOTHING_TO_DO, {}, False

    @staticmethod
    def _one_answer(
        workflow: Workflow,
        request: ExternalRequest,
        current: str | None,
        answer: ResumeAnswer,
        kept: Any,
    ) -> None:
        """An answer written differently in ``resume`` and ``forwardedProps.command.resume``
        (``kept``: the first place's, checked): the same answer once its type reads both (each
        valid on its own), or refused."""
        for payload in answer.written_also:
            also = _checked_answer(workflow, request, current, answer_for(request, payload))
            if _seen_as(workflow, also) != _seen_as(workflow, kept):
                raise AGUIError(
                    "invalid_resume",
                    f"resume and forwardedProps.command.resume give interrupt "
                    f"{answer.interrupt_id} different answers; send the answers once",
                )

    async def _retried(
        self,
        workflow: Workflow,
        record: RunRecord | None,
        run_input: RunAgentInput,
        message: Any,
        chat: list[tuple[Any, ChatMessage]],
    ) -> bool:
        """Whether this request is the one that started ``record`` (the thread's newest run),
        sent again, while that run rests (the caller has ruled out a run cut off by a server
        stop); ``run_busy`` while it is still executing. ``record`` may be older than the
        interrupts the caller read: a copy sent at once with the first, read as executing, then
        found paused, was told ``interrupts_pending`` (outside tester 107). So a run read as
        executing is read again. ``message``: what this request would start a run with (None:
        nothing, it holds no user message)."""
        if record is None or message is None:
            return False
        if not await self._started_with(workflow, record.run_id, message, run_input.run_id):
            return False
        heard = await self._heard(workflow, record.run_id)
        if heard is not None and heard.carried is not None:
            # the same words are not the same request: each user message must be one that
            # request sent, by its id (the same words under a new id are a new message, as
            # in a resume: they got the run's report, its interrupt ids -- outside tester 157)
            index = _carried_index(heard.carried)
            if not all(_is_carried(i, _digest(text), index) for i, text in _users_of(chat)):
                return False
        run_id = record.run_id
        if self._being_started(record) or record.live_owner(time.time()) is not None:
            again = await self.store.get_run(run_id)
            if self._being_started(again) or again.live_owner(time.time()) is not None:
                raise AGUIError(
                    "run_busy",
                    f"thread {run_input.thread_id}: this request started run {run_id}, which is "
                    "still being executed; send it again once the run has paused or finished",
                )
        return True

    async def _started_with(
        self, workflow: Workflow, run_id: str, message: Any, client_run_id: str | None = None
    ) -> bool:
        """Whether ``message`` is the one that started run ``run_id`` (a request sent again) --
        and, given ``client_run_id``, in a request with that AG-UI ``runId``."""
        history = await self.store.history(run_id)
        if not history or history[0].seq != 0:  # its start was pruned: cannot tell
            return False
        if client_run_id is not None:
            started_by = self._started_by.get(history[0].checkpoint_id)
            if started_by is not None and started_by != client_run_id:
                return False
        first = await self.store.load(history[0].checkpoint_id)
        if client_run_id is not None:
            stored = first.shared_state.get(CLIENT_RUN_KEY)
            if stored is None or not strictly_equal(stored, workflow.codec.encode(client_run_id)):
                return False
        started = [m.data for m in first.messages if m.source_id == INPUT_SOURCE]
        return len(started) == 1 and strictly_equal(started[0], workflow.codec.encode(message))

    async def _unseen_message(
        self, workflow: Workflow, thread_id: str, messages: Sequence[Any], given: list[Any]
    ) -> str | None:
        """The text of a user message in the client's ``messages`` that no run of the thread
        received; None when they all were, or when that cannot be told (runs started before
        runs recorded their messages).

        A client re-sends the thread's history with a resume. Each user message in it is one
        a request that started a run of the thread carried (the same ``id``, saying the same
        words: an edited one is new, tester 71), or the person's answer to a question shown as
        a message: the words of an answer given, now (``given``) or before, each answer
        standing for one message (tester 72: one answer covered any number). Every run of the
        thread counts: a client may start a run with its new message alone, and re-send the
        whole history later (tester 73)."""
        users = _user_messages(messages)
        if not users:
            return None
        carried: list[list[Any]] = []
        answers: list[Any] = list(given)
        recorded = False
        runs = await self.thread_runs(thread_id)
        for run_id in runs:
            heard = await self._heard(workflow, run_id)
            if heard is None:  # (removed meanwhile)
                continue
            if heard.carried is not None:
                recorded = True
                carried.extend(heard.carried)
            answers.extend(heard.answers)
        if not recorded:
            return None
        if runs and _run_index(runs[0]) > 0:
            # the thread's first runs were pruned: what they received is not known, so the
            # history before the first message a kept run received is taken as theirs (it was
            # refused as new -- and the pending approval with it: outside tester 120)
            users = users[_first_received(users, carried) :]
        return _not_received(users, carried, answers)

    async def _heard(self, workflow: Workflow, run_id: str) -> _Heard | None:
        """What run ``run_id`` received from the client (None: no such run). A finished run's
        is kept, known by when the run was created: it does not change, and folding every run
        of a long thread again at each of its resumes cost 0.3 s at 800 runs (tester 119)."""
        kept = self._heard_of.get(run_id)
        if kept is not None:  # (the run alone is read to check it; the fold only without)
            try:
                run = await self.store.get_run(run_id)
            except RunNotFoundError:
                return None
            if kept.created_at == run.created_at:
                self._heard_of.move_to_end(run_id)
                return kept
        try:
            run, latest = await self.store.get_run_and_latest(run_id)
        except RunNotFoundError:
            return None
        stored = latest.shared_state.get(CLIENT_MESSAGES_KEY) if latest else None
        requests = await self.store.list_requests(run_id, status=None)
        heard = _Heard(
            run.created_at,
            workflow.codec.decode(stored) if stored is not None else None,
            [r.answer for r in requests if _typed(r.response_type)],
        )
        if run.status in (WorkflowRunState.IDLE, WorkflowRunState.CANCELLED):
            before = self._heard_of.pop(run_id, None)
            if before is not None:
                self._heard_bytes -= before.size()
            self._heard_of[run_id] = heard
            self._heard_bytes += heard.size()
            while len(self._heard_of) > _HEARD_KEPT or (
                self._heard_bytes > _HEARD_BYTES and len(self._heard_of) > 1
            ):
                _, gone = self._heard_of.popitem(last=False)
                self._heard_bytes -= gone.size()
        return heard

    async def _replayed(
        self, runtime: Runtime, workflow: Workflow, run_input: RunAgentInput, turn: Turn
    ) -> AsyncIterator[BaseEvent]:
        """Where a run this request already started or resumed rests: its interrupts, its
        result."""
        run_id = turn.run_id
        assert run_id is not None
        info = await runtime.get_run(run_id)
        thread_id, client_run_id = run_input.thread_id, run_input.run_id
        log.info("thread %r: a request already applied to run %r, again", thread_id, run_id)
        if info.status is WorkflowRunState.FAILED:
            # what failed, not only that it did (outside tester 63)
            error = info.error or {}
            said = f": {error.get('message')}" if error.get("message") else ""
            raise AGUIError(error.get("code") or "workflow_failed", f"run {run_id} failed{said}")
        if info.status is WorkflowRunState.CANCELLED:
            for event in _in_doubt_events(info.effects_in_doubt):
                yield event
            outcome: Any = RunFinishedCancelledOutcome()
            yield RunFinishedEvent(thread_id=thread_id, run_id=client_run_id, outcome=outcome)
        elif info.pending_requests and info.decoded:
            interrupts = [
                interrupt_for(r, workflow.registry, run_id, turn.key) for r in info.pending_requests
            ]
            outcome = RunFinishedInterruptOutcome(interrupts=interrupts)
            yield RunFinishedEvent(thread_id=thread_id, run_id=client_run_id, outcome=outcome)
        else:
            result = run_result(info.outputs, workflow.registry)
            yield RunFinishedEvent(thread_id=thread_id, run_id=client_run_id, result=result)

    def _execute(
        self, runtime: Runtime, run_id: str, placeholder: str | None
    ) -> MemoryObjectReceiveStream[WorkflowEvent | _Ended]:
        """Execute the run in a task of its own, not in the request's: its events, then an
        ``_Ended``, arrive on the returned stream. A client that goes away (a closed tab, a
        dropped connection) stops reading, not the run: an approved tool call finishes and
        the run goes on to its next pause or end, as it does when the server is stopped
        gracefully. It used to be cancelled mid-step, its tool call left in doubt. A client
        connected but not reading is left behind the same way once ``max_unread_events`` wait
        for it and it took none for ``STALLED_SECONDS``: every event of the run was kept for
        it (a run of 60 MB of events finished while its client read nothing, the server
        holding them all); its stream then ends with ``RUN_ERROR`` (``client_too_slow``)
        after what it holds."""
        send, receive = anyio.create_memory_object_stream[WorkflowEvent | _Ended](math.inf)
        limit = self.max_unread_events

        # ``interrupt`` cancels this scope, not the task: a task cancelled before it began
        # never ran its body, so its client waited for an end that never came, its run kept
        # as starting (outside tester 87: a second Ctrl-C 10 ms after the first hung `serve`)
        scope = anyio.CancelScope()

        async def execute() -> None:
            stream = runtime.resume_stream(run_id)
            ended = _Ended()
            pace = _ClientPace(limit)
            why: str | None = None  # why the client was left behind: no event kept since
            with send, self._started(run_id, placeholder):
                try:
                    with scope:
                        async with aclosing(stream):
                            async for event in stream:
                                self._starting.discard(run_id)  # its first event: lease taken
                                if why is None:
                                    unread = send.statistics().current_buffer_used
                                    why = pace.left_behind(unread)
                                    if why is not None:
                                        log.warning(
                                            "run %r: its client left %d events unread; the "
                                            "run goes on without its stream",
                                            run_id,
                                            unread,
                                        )
                                        continue
                                    with suppress(anyio.BrokenResourceError):  # no one reads
                                        send.send_nowait(event)
                                        pace.sent += 1
                        ended.result = stream.result
                except Exception as exc:  # the relay reports it (RUN_ERROR)
                    ended.error = exc
                if why is not None and ended.error is None:
                    ended.error = AGUIError(
                        "client_too_slow",
                        f"this stream {why} of run {run_id}, which went on without it (not "
                        "every event was sent); post to the thread again to read where the "
                        "run rests",
                    )
                if receive_closed(send):
                    if ended.error is not None:
                        said = str(ended.error)
                        log.warning("run %r ended, unseen by its client: %r", run_id, said)
                else:
                    with suppress(anyio.BrokenResourceError):
                        send.send_nowait(ended)

        task = asyncio.get_running_loop().create_task(execute())
        self._executing[task] = scope
        task.add_done_callback(lambda done: self._executing.pop(done, None))
        return receive

    def interrupt(self) -> int:
        """Stop every run this endpoint is executing now, where it is, instead of waiting for
        its next pause (a forced stop: a second Ctrl-C). Each run keeps its last checkpoint,
        gives its lease back and is continued by the next request for its thread; a tool call
        under way is asked about then if it did not finish. Each connected client gets
        ``RUN_ERROR`` (``run_interrupted``). Call it on the event loop's thread; ``drain``
        then returns once they have stopped. Returns how many runs were told to stop."""
        scopes = [scope for task, scope in self._executing.items() if not task.done()]
        for scope in scopes:
            scope.cancel()
        return len(scopes)

    def executing(self) -> int:
        """How many runs this endpoint is executing now."""
        return sum(not task.done() for task in self._executing)

    async def drain(self) -> None:
        """Wait for every run this endpoint is executing (see ``_execute``) to end."""
        while self._executing:
            pending = list(self._executing)
            log.info("waiting for %d run(s) to reach a pause or their end", len(pending))
            await asyncio.wait(pending)

    @contextmanager
    def _started(self, run_id: str, placeholder: str | None) -> Iterator[None]:
        """The run's execution is under way (or over): it no longer waits to take its lease."""
        self._executions[run_id] += 1
        try:
            yield
        finally:
            self._executions[run_id] -= 1
            if not self._executions[run_id]:
                del self._executions[run_id]
            self._starting.discard(run_id)
            if placeholder is not None:
                forget_ended_owner(placeholder)

    def _being_started(self, run: RunRecord) -> bool:
        """Whether ``run`` is one this server is starting or executing: busy, whatever the
        record says. One read before the run's execution took the lease -- a new run's, leased
        to an owner said to be over at once so that its execution may take it; a resumed
        run's, resting with answers waiting -- looked, once the execution was under way (no
        longer starting), like a run left by a server stop: a new message was told
        ``run_interrupted``."""
        return run.run_id in self._starting or run.run_id in self._executions

    async def _cut_off(self, run: RunRecord) -> bool:
        """Whether the thread's run stopped before it applied the answers it was given (the
        server was killed or restarted): left in the middle of a superstep, or resting with
        answers waiting -- and no live worker is on it. The same request again continues it;
        otherwise a repeated resume changes nothing."""
        if run.live_owner(time.time()) is not None:
            return False  # being executed: that worker applies the answers
        if run.status is WorkflowRunState.IN_PROGRESS:
            return True
        if run.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS:
            return bool(await self.store.list_requests(run.run_id, status="answered"))
        return False

    async def _answered_before(
        self, answer: ResumeAnswer, thread_id: str, workflow: Workflow
    ) -> StoredRequest:
        """The request an interrupt that is not pending names -- only to repeat its answer.

        Refused (each with its own code, nothing changed): an id that is not a genuine
        interrupt id (``unknown_interrupt``, also for a forged MAC), an interrupt of another
        thread or endpoint (``interrupt_thread_mismatch``), a cancelled one (but for the same
        cancel again, a repeat) or a cancel of an answered one (``interrupt_not_pending``), one
        still pending in a run that a changed graph stranded (``run_stranded``: the workflow
        was changed since the run started, so it cannot continue), and one still pending in an
        earlier run that the thread has left behind (``interrupt_not_current``).
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
                f"interrupt {interrupt_id!r} belongs to another thread or another endpoint; "
                "resume it on the thread and at the endpoint that asked it",
            )
        stranded = stored.status == "pending" and run.workflow_signature != workflow.signature
        if stored.status == "cancelled" and answer.status == "cancelled":
            return stored  # a cancel sent again: the run it ended is reported
        if not stranded and (stored.status == "cancelled" or answer.status == "cancelled"):
            said = f"interrupt {interrupt_id!r} is {stored.status}"
            if run.status is WorkflowRunState.CANCELLED:
                runtime, _ = self.runtime_for(thread_id)
                effects = (await runtime.get_run(run.run_id)).effects_in_doubt
                if effects:  # what nobody was asked about before the cancel (tester 65)
                    said += (
                        f": run {run.run_id} was cancelled while these effects were in doubt "
                        "(started, no result recorded): "
                        + "; ".join(effect_named(e) for e in effects)
                    )
            raise AGUIError("interrupt_not_pending", said)
        if stranded:
            raise AGUIError(
                "run_stranded",
                f"interrupt {interrupt_id!r} belongs to run {run.run_id!r}, which workflow "
                f"{run.workflow_name!r} started before its graph changed (signature "
                f"{run.workflow_signature}, now {workflow.signature}): the run is stranded and "
                "cannot continue; send a new message to start a new run on this thread",
            )
        if stored.status == "pending":
            raise AGUIError(
                "interrupt_not_current",
                f"interrupt {interrupt_id!r} belongs to an earlier run of thread {thread_id} "
                "that no longer waits for it",
            )
        return stored

    async def _answered(
        self, workflow: Workflow, run_id: str
    ) -> tuple[list[ExternalRequest], dict[str, Any]]:
        """The run's requests answered and not applied yet, and their answers as stored."""
        requests: list[ExternalRequest] = []
        answers: dict[str, Any] = {}
        for stored in await self.store.list_requests(run_id=run_id, status="answered"):
            requests.append(self._decode_request(workflow, stored))
            answers[stored.request_id] = workflow.decode_stored(
                stored.answer, run_id, f"the answer to request {stored.request_id}"
            )
        return requests, answers

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
    def _start_message(workflow: Workflow, chat: list[ChatMessage]) -> Any:
        """What a new message starts the run with: the client's chat messages, or the last
        user message (as text or a message), as the start executor takes it."""
        start = workflow.graph.nodes[workflow.start_executor_id]
        user = [m for m in chat if m.role == "user"]
        if not user:  # (an assistant's words alone are no request to answer)
            raise AGUIError("no_user_message", "the request has no user message to start a run")
        if isinstance(start, Executor) and start.find_handler(chat) is not None:
            return chat
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


def _not_received(
    users: list[tuple[str | None, str]], carried: list[list[Any]], answers: list[Any]
) -> str | None:
    """The first of ``users`` (id, text) that is neither one of the ``carried`` messages
    (``[id, digest]``, see ``_is_carried``) nor the words of one of ``answers`` (JSON data,
    stored or as given), each answer taken once."""
    index = _carried_index(carried)
    by_id = index[0]
    left = collections.Counter(_digest(text) for text in _texts_in(answers))
    for message_id, text in users:
        digest = _digest(text)
        if message_id and message_id in by_id:
            if by_id[message_id] != digest:
                return text  # the same message, edited: not what the run received
            continue
        if _is_carried(message_id, digest, index):
            continue
        if left[digest] > 0:
            left[digest] -= 1
            continue
        return text
    return None


def _checked_answer(
    workflow: Workflow, request: ExternalRequest, current: str | None, value: Any
) -> Any:
    """``value`` as the request's run keeps it, validated (``Workflow.check_answer``)."""
    try:
        return workflow.check_answer(
            request.run_id or (current or ""),
            request.request_id,
            request.port_id,
            request.data,
            request.response_type,
            value,
        )
    except ResponseError as exc:
        raise AGUIError("invalid_resume_payload", str(exc)) from exc


def _seen_as(workflow: Workflow, answer: Any) -> str:
    """An answer as the store compares answers: two written alike are the same answer."""
    return canonical_answer(workflow.codec.encode(answer))


def _typed(response_type: Any) -> bool:
    """Whether an answer of this type is words a person typed (a tool call's approval is not:
    its arguments are the call's)."""
    approval = ToolApprovalResponseContent
    return response_type is not approval and response_type != approval.__qualname__


CarriedIndex = tuple[dict[str, str], set[str], set[str]]


def _carried_index(carried: list[list[Any]]) -> CarriedIndex:
    """The ``carried`` messages (``[id, digest]``) by id, the digests of those without one, and
    the digests of those with one."""
    by_id = {m[0]: m[1] for m in carried if m[0]}
    return by_id, {m[1] for m in carried if not m[0]}, set(by_id.values())


def _is_carried(message_id: str | None, digest: str, index: CarriedIndex) -> bool:
    """Whether a user message (its id, its words' digest) is one of the carried messages: by
    its id, saying the same words; by its words, where one of the two has no id (a client
    that sends ids sometimes: outside tester 127). The same words under another id are
    another message."""
    by_id, without_id, with_id = index
    if message_id and message_id in by_id:
        return by_id[message_id] == digest
    return digest in without_id or (not message_id and digest in with_id)


def _first_received(users: list[tuple[str | None, str]], carried: list[list[Any]]) -> int:
    """The position of the first of ``users`` that is one of the ``carried`` messages (as
    ``_not_received`` matches them); 0 if none is (a history that holds none of them says
    nothing of where the pruned runs' part ends: all of it is checked)."""
    index = _carried_index(carried)
    for position, (message_id, text) in enumerate(users):
        if _is_carried(message_id, _digest(text), index):
            return position
    return 0


def _user_messages(messages: Sequence[Any]) -> list[tuple[str | None, str]]:
    """The client's user messages with text, as (id, text); an empty id counts as none, and
    a message with no words (an image with an empty text part) as no text (tester 73)."""
    return _users_of(_chat_of(messages))


def _users_of(chat: list[tuple[Any, ChatMessage]]) -> list[tuple[str | None, str]]:
    """``_user_messages`` of messages already read as chat (``_chat_of``)."""
    out: list[tuple[str | None, str]] = []
    for message, said in chat:
        if said.role == "user" and said.text.strip():
            given = getattr(message, "id", None)
            out.append((given if isinstance(given, str) and given else None, said.text))
    return out


def _before_replies(workflow: Workflow, chat: list[tuple[Any, ChatMessage]]) -> Any:
    """What the request would start a run with without the messages after its last user
    message -- the assistant's replies (and their tools' results) a client kept from the
    stream of the run that request started, sent again with it by a client retrying after a
    connection that dropped mid-stream. None: there are none, or no user message."""
    last_user = max((i for i, (_, said) in enumerate(chat) if said.role == "user"), default=None)
    if last_user is None or last_user == len(chat) - 1:
        return None
    try:
        return AGUIService._start_message(workflow, [c for _, c in chat[: last_user + 1]])
    except AGUIError:
        return None


def _chat_of(messages: Sequence[Any]) -> list[tuple[Any, ChatMessage]]:
    """The client's messages that say something -- text, tool calls, tool results -- each with
    its chat message (``_to_chat_message``)."""
    names: dict[str, str] = {}  # tool call id → the tool's name, for the results after it
    chat = [(m, c) for m in messages if (c := _to_chat_message(m, names)) is not None]
    if names or any(said.role == "tool" for _, said in chat):
        return _results_after_their_calls(chat)
    return chat


def _calls_told_apart(chat: list[tuple[Any, ChatMessage]]) -> list[tuple[Any, ChatMessage]]:
    """``chat`` with a call that reuses an earlier call's id for another call (another tool or
    other arguments: a model server numbering its calls from 0 in each reply) given an id of
    its own, and the results paired with the calls of an id in order: the later call and its
    result were read as a copy of the first and left out (outside tester 159). A copy of the
    same call keeps its id (it is read once, see ``_results_after_their_calls``) -- and so does
    the copy a resumed stream sends of a call a reviewer edited, which holds the arguments the
    call ran with: calls of one tool under one id that have fewer results than calls are read
    as one call, as it ran last (it was read as a second call with no result, a transfer that
    never happened: outside tester 168)."""
    as_ran = _edited_copies(chat)
    variants: dict[str, list[tuple[str, str]]] = {}  # id -> the different calls under it
    answered: dict[str, int] = {}  # id -> results met
    out: list[tuple[Any, ChatMessage]] = []
    for message, said in chat:
        renamed = False
        contents = []
        for content in said.contents:
            if isinstance(content, FunctionCallContent) and content.call_id in as_ran:
                ran = as_ran[content.call_id]
                if content.arguments != ran:
                    content = content.model_copy(update={"arguments": ran})
                    renamed = True
            elif isinstance(content, FunctionCallContent):
                seen = variants.setdefault(content.call_id, [])
                call = (content.name, json.dumps(content.arguments, sort_keys=True, default=str))
                if call not in seen:
                    seen.append(call)
                k = seen.index(call)
                if k:
                    content = content.model_copy(
                        update={"call_id": model_call_id(f"{content.call_id}_{k}")}
                    )
                    renamed = True
            elif isinstance(content, FunctionResultContent):
                k = answered.get(content.call_id, 0)
                answered[content.call_id] = k + 1
                if 0 < k < len(variants.get(content.call_id, ())):
                    content = content.model_copy(
                        update={"call_id": model_call_id(f"{content.call_id}_{k}")}
                    )
                    renamed = True
            contents.append(content)
        out.append((message, said.model_copy(update={"contents": contents}) if renamed else said))
    return out


def _edited_copies(chat: list[tuple[Any, ChatMessage]]) -> dict[str, dict[str, Any]]:
    """The call ids the history holds several calls of one tool under, with fewer results
    than calls: a call and the copy a resumed stream sent of it as a reviewer edited it. Each
    -> the arguments of its last copy (those it ran with)."""
    calls: dict[str, list[FunctionCallContent]] = {}
    results: dict[str, int] = {}
    for _, said in chat:
        for content in said.contents:
            if isinstance(content, FunctionCallContent):
                calls.setdefault(content.call_id, []).append(content)
            elif isinstance(content, FunctionResultContent):
                results[content.call_id] = results.get(content.call_id, 0) + 1
    out: dict[str, dict[str, Any]] = {}
    for call_id, copies in calls.items():
        if len(copies) < 2 or len({c.name for c in copies}) > 1:
            continue
        different = {json.dumps(c.arguments, sort_keys=True, default=str) for c in copies}
        if len(different) > 1 and results.get(call_id, 0) < len(different):
            out[call_id] = copies[-1].arguments
    return out


def _results_after_their_calls(
    chat: list[tuple[Any, ChatMessage]],
) -> list[tuple[Any, ChatMessage]]:
    """``chat`` with each tool call's result right after the message making it, as a model
    takes them: a result sent later in the history is moved there, a call the history holds no
    result for gets one saying so (the client never saw its result: a run cut off, a client
    that keeps no results), and a result of no call in the history is left out -- a model's
    API refuses a conversation otherwise, and a client sends the same history again with every
    message, so the thread would fail for good."""
    chat = _calls_told_apart(chat)
    results: dict[str, tuple[Any, ChatMessage]] = {}
    for message, said in chat:
        if said.role == "tool":
            for result in said.function_results:
                results.setdefault(result.call_id, (message, said))
    out: list[tuple[Any, ChatMessage]] = []
    placed: set[int] = set()
    made: set[str] = set()  # the call ids met: a call sent again is left out
    for message, said in chat:
        if said.role == "tool":
            continue
        calls = said.function_calls
        if any(call.call_id in made for call in calls) or len(calls) > len(
            {c.call_id for c in calls}
        ):
            # a call the history holds twice: a client that adds the call a resumed stream
            # sends again as a message of its own (AG-UI's reference client does) -- the model
            # got the second copy without a result, and its API refused the thread for good
            # (outside tester 150)
            kept = []
            for content in said.contents:
                if isinstance(content, FunctionCallContent):
                    if content.call_id in made:
                        continue
                    made.add(content.call_id)
                kept.append(content)
            if not kept:
                continue
            said = said.model_copy(update={"contents": kept})
            calls = said.function_calls
        made.update(call.call_id for call in calls)
        out.append((message, said))
        for call in calls:
            found = results.get(call.call_id)
            if found is None:
                missing = FunctionResultContent(
                    call_id=call.call_id,
                    name=call.name,
                    error="no result: the conversation holds none for this call",
                )
                out.append((message, ChatMessage(role="tool", contents=[missing])))
            elif id(found[1]) not in placed:
                placed.add(id(found[1]))
                out.append(found)
    return out


def _digest(text: str) -> str:
    """What a message says, whitespace aside (a client may join or split its text parts
    otherwise when it sends it again: "Thank" + "s!"), as 16 hex digits."""
    words = "".join(text.split()).encode("utf-8", "surrogatepass")
    return hashlib.sha256(words).hexdigest()[:16]


def _texts_in(values: Any) -> list[str]:
    """Every string in ``values`` (JSON data, stored or as a client sent it); the codec's
    markers (``$type`` and its names) and a content's ``type`` tag are not text anyone
    typed."""
    found: list[str] = []
    stack = [values]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, list | tuple):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(v for k, v in value.items() if k not in ("$type", "type"))
    return found


def _to_chat_message(message: Any, names: dict[str, str] | None = None) -> ChatMessage | None:
    """A client's message as a chat message: its text, given as a string or as text parts
    (other parts -- images, audio -- are not read), an assistant's tool calls, a tool's
    result (named after the call ``names`` has seen; each call read is added to it); None for
    a message that says none of these. The calls and results were left out: the model saw
    none of the thread's earlier tool use (outside tester 148)."""
    role = getattr(message, "role", None)
    content = getattr(message, "content", None)
    if isinstance(content, list):
        texts = [part.text for part in content if getattr(part, "type", None) == "text"]
        content = "\n".join(texts) if texts else None
    if role == "tool":
        call_id = getattr(message, "tool_call_id", None)
        if not isinstance(call_id, str):
            return None
        call_id = model_call_id(call_id)
        name = (names or {}).get(call_id, "")
        error = getattr(message, "error", None)
        result = FunctionResultContent(
            call_id=call_id, name=name, result=_result_of(content), error=error if error else None
        )
        return ChatMessage(role="tool", contents=[result])
    if role == "developer":  # (OpenAI's newer name for system instructions: it was dropped)
        role = "system"
    if role not in ("user", "assistant", "system"):
        return None
    contents: list[Any] = []
    if isinstance(content, str) and not is_blank(content):
        # (a user's blank message -- spaces, a zero-width space -- says nothing: it started a
        # run and reached the model, outside tester 150; a blank system or assistant text
        # reached it as an empty message, which some models' APIs refuse: tester 157)
        contents.append(TextContent(text=content))
    for call in (getattr(message, "tool_calls", None) or ()) if role == "assistant" else ():
        call_id = model_call_id(call.id)
        contents.append(
            FunctionCallContent(
                call_id=call_id, name=call.function.name, arguments=_arguments(call)
            )
        )
        if names is not None:
            names[call_id] = call.function.name
    return ChatMessage(role=role, contents=contents) if contents else None


def _result_of(content: Any) -> Any:
    """A tool message's content as the result it stands for: the stream sends a result as its
    JSON text (``TOOL_CALL_RESULT``), so text read back as JSON is that value -- the model
    saw a string result quoted (outside tester 150); other text is the result itself."""
    if not isinstance(content, str):
        return content
    try:
        return parse_json(content, what="a tool result")
    except InputError:
        return content


def _arguments(call: Any) -> dict[str, Any]:
    """A client's tool call's arguments (JSON text), read as a model's are (``call_arguments``):
    the object they are (``{}`` for none), or -- malformed, not an object, nesting past 64
    levels, a NaN, a lone surrogate -- their text, kept as such. The stream sends such a call
    of the model's as the text the model gave, and the client sends it back with the thread's
    history: refused, it ended the thread for good (outside tester 187); read otherwise, it
    would not be the call the conversation holds."""
    text = call.function.arguments
    return call_arguments(text) if text and text.strip() else {}


def check_tool_calls(messages: Sequence[Any]) -> None:
    """An assistant's tool call with no id is refused (422): its result could not name it."""
    for i, message in enumerate(messages):
        if getattr(message, "role", None) != "assistant":
            continue
        for j, call in enumerate(getattr(message, "tool_calls", None) or ()):
            if not call.id:
                raise AGUIError(
                    "invalid_run_input", f"messages[{i}].toolCalls[{j}] has an empty id"
                )


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
    run_state: Mapping[str, Any] | None = None,
    max_unread_events: int = MAX_UNREAD_EVENTS,
) -> AGUIService:
    """Serve ``target`` (a workflow, a ``workflow_factory(thread_id)`` or an agent) at ``path``.

    Refused before anything runs, with a JSON ``{"error": code, "message": ...}``: a body that
    is not ``application/json`` (415), larger than ``max_body_bytes`` (413), nested deeper than
    ``max_depth`` or not valid text (400), not JSON or not a valid ``RunAgentInput`` (422).
    ``run_state``: shared state each new run starts with (JSON-encodable by the workflow).
    ``max_unread_events``: how far a client may fall behind its run's events before its stream
    ends (``RUN_ERROR`` ``client_too_slow``; the run goes on, and the thread says where it
    rests).
    Which origins may call is the app's policy (see ``workflow_engine_cli._server``).
    """
    namespace = path.strip("/").replace("/", "_")
    if ":" in namespace:  # ``a:b`` and ``a``'s thread ``b:...`` would name the same runs
        raise ValueError(f"an AG-UI endpoint's path may not hold ':' ({path!r})")
    taken: set[str] | None = getattr(app.state, "agui_namespaces", None)
    if taken is None:
        taken = app.state.agui_namespaces = set()
    if namespace in taken:  # e.g. /a/b and /a_b: their threads' run ids would collide
        raise ValueError(f"another AG-UI endpoint of this app already uses run ids {namespace!r}")
    taken.add(namespace)
    if max_unread_events < 1:
        raise ValueError(f"max_unread_events must be at least 1, not {max_unread_events}")
    service = AGUIService(
        AGUIWorkflow.of(target, workflow_factory), store, namespace, run_state, max_unread_events
    )
    encoder = EventEncoder()

    @app.post(path)
    async def run_endpoint(request: Request) -> Any:
        given = request.headers.get("content-type")
        codings = [c.strip().lower() for c in request.headers.getlist("content-encoding")]
        encoding = next((c for c in codings if c != "identity"), "identity")
        if encoding != "identity":  # (a body is never decompressed: a gzip bomb does nothing)
            return refusal(
                415,
                "unsupported_content_encoding",
                f"send the body uncompressed (Content-Encoding {encoding[:40]!r} is not read)",
            )
        if len(request.headers.getlist("content-type")) > 1:  # (the first one was read: a
            # JSON type then text/plain went through -- outside tester 171)
            return refusal(
                415,
                "unsupported_media_type",
                "a request names one Content-Type (application/json); this one names several",
            )
        if not is_json_media_type(given):
            said = f"this request says {given[:80]!r}" if given else "this request names none"
            return refusal(
                415,
                "unsupported_media_type",
                f"send the RunAgentInput as Content-Type: application/json, in UTF-8 ({said})",
            )
        try:
            raw = await read_body(request, max_body_bytes)
            body = parse_json(raw, max_bytes=max_body_bytes, max_depth=max_depth)
            if not isinstance(body, dict):
                raise AGUIError("invalid_run_input", "the body must be a JSON object")
            resume = normalize_resume(body)
            run_input = RunAgentInput.model_validate(body)
            check_ids(run_input, resume or ())
        except ClientGoneError as exc:  # no one to answer: said in the log, once
            log.info("%s: %r", path, str(exc))
            return refusal(exc.status, exc.code, str(exc))
        except InputError as exc:
            extra = {"limit": max_body_bytes} if isinstance(exc, InputTooLargeError) else {}
            return refusal(exc.status, exc.code, str(exc), **extra)
        except AGUIError as exc:
            return refusal(422, exc.code, str(exc))
        except ValidationError as exc:
            return refusal(422, "invalid_run_input", describe_validation(exc))

        async def sse() -> AsyncIterator[str]:
            events = service.stream(run_input, resume)
            relayed: asyncio.Queue[BaseEvent | None] = asyncio.Queue(64)  # None: its end
            # (cancelled as a scope, not as a task: what the request stores is shielded from
            # a client that hangs up meanwhile, and asyncio's ``task.cancel()`` is not)
            relaying = anyio.CancelScope()

            async def pump() -> None:
                with relaying:
                    async with aclosing(events):
                        async for event in events:
                            await relayed.put(event)
                    await relayed.put(None)

            # a task of its own, not a task group held across this generator's ``yield``s: a
            # middleware (``serve --token``'s, any ``@app.middleware("http")``) drops it when
            # the client hangs up, to be closed from another task, and leaving the group
            # there raised "exit cancel scope in a different task" -- a traceback in the log
            # for about every other closed tab (outside tester 202). (An asyncio queue, not a
            # memory stream: a dropped generator's stream warned that it was left open.)
            pumping = asyncio.get_running_loop().create_task(pump())
            pumping.add_done_callback(_said_if_it_failed)
            try:
                while True:
                    with anyio.move_on_after(keepalive_seconds) as waited:
                        event = await relayed.get()
                    if waited.cancelled_caught:
                        if pumping.done() and relayed.empty():
                            return  # (it failed: said in the log)
                        yield ": keep-alive\n\n"
                        continue
                    if event is None:
                        return
                    yield encode_event(encoder, event)
            finally:
                relaying.cancel()  # (the run goes on: it executes in a task of its own)

        return StreamingResponse(
            sse(),
            media_type=encoder.get_content_type(),
            # a proxy must pass each event on as it comes, not hold the stream to cache it
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    _drain_at_shutdown(app, service)
    return service


class _ClientPace:
    """How far a stream's client is behind its run's events (see ``_execute``)."""

    __slots__ = ("limit", "reading_at", "sent", "taken")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sent = 0  # events sent to the client's stream
        self.taken = 0  # of them, taken by the client when last looked at
        self.reading_at = time.monotonic()  # when it was last seen taking one

    def left_behind(self, unread: int) -> str | None:
        """Why the client is to be left behind with ``unread`` events waiting for it -- it took
        none of ``limit`` for ``STALLED_SECONDS``, or fell ``_BEHIND_AT_MOST`` times as far
        behind; None: it keeps up."""
        if unread < self.limit:
            return None
        now = time.monotonic()
        if self.sent - unread != self.taken:  # it reads: not stalled
            self.taken, self.reading_at = self.sent - unread, now
        if now - self.reading_at >= STALLED_SECONDS:
            return f"took none of {unread} unread events for {STALLED_SECONDS:g} s"
        if unread >= _BEHIND_AT_MOST * self.limit:
            return f"fell {unread} events behind"
        return None


def _said_if_it_failed(task: asyncio.Task[None]) -> None:
    """A stream's relay that raised (a bug: the service turns every failure into events)."""
    if not task.cancelled() and (failure := task.exception()) is not None:
        log.error("an AG-UI stream's relay failed", exc_info=failure)


def _drain_at_shutdown(app: FastAPI, service: AGUIService) -> None:
    """Make the app's shutdown wait for the runs this endpoint executes for clients that went
    away, before the app's own shutdown (which may close the store): a graceful stop
    (SIGTERM, Ctrl-C) lets them reach their next pause or end, as uvicorn lets a connected
    client's request finish. They were cancelled mid-call, their tool calls left in doubt."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app_: Any) -> AsyncIterator[Any]:
        async with inner(app_) as state:
            try:
                yield state
            finally:
                await service.drain()

    app.router.lifespan_context = lifespan


def check_ids(run_input: RunAgentInput, resume: Sequence[ResumeAnswer] = ()) -> None:
    """A thread id becomes part of run ids: it must be non-empty. It, the ``runId`` (stored
    with the run) and the messages' ids (compared, echoed) are of bounded length: a 100,000
    character ``runId`` was taken (outside tester 107)."""
    if not run_input.thread_id:
        raise AGUIError("invalid_run_input", "threadId must not be empty")
    named = [("threadId", run_input.thread_id), ("runId", run_input.run_id)]
    named += [(f"messages[{i}].id", m.id) for i, m in enumerate(run_input.messages)]
    # an interrupt id is a request id, a dot and a MAC: one far longer is no interrupt id, and
    # was echoed whole in the error that said so (outside tester 111)
    named += [(f"{a.where}.interruptId", a.interrupt_id) for a in resume]
    for name, value in named:
        if isinstance(value, str) and len(value) > MAX_ID_LENGTH:
            raise AGUIError(
                "invalid_run_input",
                f"{name} has {len(value)} characters; the limit is {MAX_ID_LENGTH}",
            )
    check_tool_calls(run_input.messages)  # (first: the next reads the messages)
    _refuse_conflicting_ids(run_input.messages)


def _refuse_conflicting_ids(messages: Sequence[Any]) -> None:
    """Two user messages of a request by one id that say different things (whitespace aside,
    as a thread tells its messages apart): the run would keep one of them and refuse the other
    later, as a message it never received (outside tester 136). The same message sent twice,
    or spelt otherwise (its text in parts, its keys in another order), is left be, as are
    other roles' messages and wordless ones: the thread keeps no id of theirs (a client may
    give a user's message and its reply one id: outside tester 141)."""
    ids = [getattr(message, "id", None) for message in messages]
    counted = collections.Counter(i for i in ids if isinstance(i, str) and i)
    repeated = {message_id for message_id, count in counted.items() if count > 1}
    first: dict[str, tuple[int, str]] = {}  # id → where its words were first, their digest
    for i, message_id in enumerate(ids):
        if message_id not in repeated:  # (words are read only for an id met again)
            continue
        said = _said_by_user(messages[i])
        if said is None:
            continue
        digest = _digest(said)
        j, before = first.setdefault(message_id, (i, digest))
        if before != digest:
            raise AGUIError(
                "invalid_run_input",
                f"messages[{i}] and messages[{j}] have the same id ({message_id!r}) but say "
                "different things: each message of a thread needs an id of its own",
            )


def _said_by_user(message: Any) -> str | None:
    """The words of a user's message (None: another role's, or no words)."""
    if getattr(message, "role", None) != "user":
        return None
    said = _to_chat_message(message)
    if said is None or said.role != "user" or not said.text.strip():
        return None
    return said.text
