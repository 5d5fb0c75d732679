"""Workflow: a validated graph plus the API to run, continue, restore and cancel runs.

A Workflow holds no per-run state, so one object serves many runs at once. A run is identified
by its ``run_id``; its state travels in :class:`Checkpoint` objects, which is how a paused run is
continued -- in this process or, with a durable store, in another one.
"""

from __future__ import annotations

import collections.abc
import contextlib
import functools
import json
import typing
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, is_dataclass
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, PydanticUserError, TypeAdapter, ValidationError

from ._answers import is_json_data, unknown_keys
from ._checkpoint import (
    Checkpoint,
    CheckpointChanges,
    CheckpointStore,
    RequestRecord,
    answer_digest,
    answer_has_digest,
    canonical_answer,
    integral_numbers,
)
from ._codec import (
    MAX_DEPTH,
    UNREADABLE_INT,
    JsonCodec,
    TaggedJsonCodec,
    TypeRegistry,
    decode_stored,
    is_text,
    read_back,
    stored_value_error,
    unicode_problem,
)
from ._errors import (
    CheckpointNotFoundError,
    CheckpointNotLatestError,
    DefinitionError,
    MessageNotHandledError,
    RequestAlreadyAnsweredError,
    RequestCancelledError,
    ResponseError,
    ResponseTypeError,
    RunNotResumableError,
    SerializationError,
    SignatureMismatchError,
    StoreCorruptError,
    UnknownRequestError,
    UsageError,
    shown,
)
from ._events import (
    ErrorDetails,
    RequestInfoEvent,
    WorkflowEvent,
    WorkflowRunState,
    WorkflowStartedEvent,
    WorkflowStatusEvent,
)
from ._executor import Executor
from ._identity import (
    INPUT_SOURCE,
    answer_send_id,
    branch_secret,
    derive_id,
    input_message_id,
    new_step_secret,
)
from ._journal import InMemoryJournal, cut_off_steps
from ._planner import Envelope, Send, accepts
from ._pump import Emitter, EventPump
from ._registry import display_name, schema_refusal
from ._requests import (
    EffectResolution,
    ExternalRequest,
    ExternalResponse,
    InDoubtEffect,
    RequestPort,
    RestoredRequest,
)
from ._runner import RunLoop, RunState, changes_of, new_checkpoint_id
from ._types import (
    build_matcher,
    concrete_classes,
    holds_infinity,
    holds_int,
    takes_float,
    type_name,
)

if TYPE_CHECKING:
    from ._graph import Graph

_NO_MESSAGE: Any = object()
_PAST_FLOATS = 2**1024 - 2**970
"""The smallest whole number no float holds: ``float()`` of it overflows (pydantic's reads it
as infinity); ``sys.float_info.max`` is the largest below."""
_PRIMITIVE_TYPES: dict[str, Any] = {
    t.__name__: t for t in (int, float, str, bool, bytes, list, dict, type(None))
}
_PRIMITIVE_TYPES["None"] = type(None)
_PRIMITIVE_TYPES["Any"] = Any

Responses = Mapping[str, Any] | Iterable[ExternalResponse]


@dataclass
class WorkflowRunResult:
    """What a run (or continuation) ended with."""

    run_id: str
    status: WorkflowRunState
    events: list[WorkflowEvent] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)
    pending_requests: list[ExternalRequest] = field(default_factory=list)
    checkpoint: Checkpoint | None = None
    error: ErrorDetails | None = None

    def get_outputs(self) -> list[Any]:
        return list(self.outputs)

    def get_request_info_events(self) -> list[RequestInfoEvent]:
        return [e for e in self.events if isinstance(e, RequestInfoEvent)]

    def get_final_state(self) -> WorkflowRunState:
        return self.status


class WorkflowRunStream:
    """``async for event in workflow.run_stream(...)``; ``result`` is set when it ends.

    The run executes in a task of its own. ``cancel()`` stops it at the next safe point: it
    ends CANCELLED and its pending requests are cancelled. Leaving early -- ``aclose()``,
    ``async with``, or ``break`` and dropping the stream -- stops the run at once.
    """

    def __init__(self, workflow: Workflow, prepare: Any) -> None:
        self._workflow = workflow
        self._prepare = prepare
        # what the run's task shares with the stream; the task holds no reference to the stream
        # itself, so dropping the stream really drops it (and its pump cancels the run)
        self._handle = _StreamHandle()
        self._pump: EventPump[WorkflowEvent] | None = None
        self._events: list[WorkflowEvent] = []
        self.result: WorkflowRunResult | None = None

    @property
    def _loop(self) -> RunLoop | None:
        return self._handle.loop

    @property
    def run_id(self) -> str | None:
        return self._loop.state.run_id if self._loop else None

    def cancel(self) -> None:
        if self._loop is None:
            self._handle.cancel_early = True
        else:
            self._loop.cancel()

    def __aiter__(self) -> WorkflowRunStream:
        return self

    async def __aenter__(self) -> WorkflowRunStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def __anext__(self) -> WorkflowEvent:
        if self._pump is None:
            self._pump = EventPump(_producer(self._workflow, self._prepare, self._handle))
        try:
            event = await self._pump.next()
        except StopAsyncIteration:
            if self.result is None and self._loop is not None:
                self.result = self._workflow._result(self._loop, self._events)
            raise
        self._events.append(event)
        return event

    async def aclose(self) -> None:
        if self._pump is not None:
            await self._pump.close()

    def unread(self) -> list[WorkflowEvent]:
        """Once closed, the events the run emitted that were not read (see ``Runtime``'s
        stream, which passes them on when it is cut off)."""
        return self._pump.unread if self._pump is not None else []

    def wait_for_reader(self, reader: Emitter[Any]) -> None:
        """Have the run wait for ``reader`` too (see ``BACKLOG``): the reader of a stream
        this one's events are passed on to (a ``Runtime`` stream's)."""
        self._handle.readers.append(reader)


@dataclass
class _StreamHandle:
    """The stream's run loop once it exists, whether it was closed before that, and the
    readers of streams its events are passed on to."""

    loop: RunLoop | None = None
    cancel_early: bool = False
    readers: list[Emitter[Any]] = field(default_factory=list)


def _producer(workflow: Workflow, prepare: Any, handle: _StreamHandle) -> Any:
    async def produce(emit: Any) -> None:
        loop, store = await prepare(emit)
        handle.loop = loop
        loop.readers.extend(handle.readers)
        if handle.cancel_early:
            loop.cancel()
        await workflow._drive(loop, store, emit)

    return produce


class Workflow:
    """A validated graph of executors and request ports. Build one with ``WorkflowBuilder``."""

    def __init__(
        self,
        name: str,
        graph: Graph,
        extra_types: Sequence[tuple[type, str | None]] = (),
        max_supersteps: int = 100,
        codec: JsonCodec | None = None,
    ) -> None:
        self._name = name
        self.graph = graph
        self.max_supersteps = max_supersteps
        self.registry = TypeRegistry()
        self._annotations: dict[str, Any] = dict(_PRIMITIVE_TYPES)
        self._stored_names: dict[Any, tuple[Any, str]] = {}  # annotation → (it, its name)
        seen: list[Any] = []
        # explicit names first: they settle clashes between classes the annotations name
        for cls, tag in extra_types:
            self._register(cls, tag)
            seen.append(cls)
        for node in graph.nodes.values():
            for annotation in _node_annotations(node):
                seen.append(annotation)
                self._annotate(annotation)
            for cls in getattr(node, "serializable_types", ()):
                seen.append(cls)
                self._annotate(cls)
        for cls in (InDoubtEffect, EffectResolution):  # asked by every durable run
            seen.append(cls)
            self._annotate(cls)
        for annotation in _distinct(seen):  # names settle once everything is registered
            self._name_annotation(annotation)
            # and each class in it: ``request_info(data, Decision)`` answered by a handler of
            # ``Decision | None`` failed the run as declared nowhere (outside tester 152)
            for cls in concrete_classes(annotation):
                if cls is not annotation:
                    self._name_annotation(cls)
        if codec is None:  # (another codec may store what this one cannot)
            for node in graph.nodes.values():
                for asker, answer_type in _answer_types(node):
                    self._check_answerable(asker, answer_type)
        self.codec: JsonCodec = codec or TaggedJsonCodec(self.registry)
        self._signature = graph.signature()
        self._adapters: dict[str, AnswerAdapter] = {}
        self._admitted: OrderedDict[str, tuple[Any, Any]] = OrderedDict()
        """Checkpoint id -> (a run's start message as ``admit`` encoded it, the copy it decoded
        to prove that readable): the run's first restore takes the copy instead of decoding
        the message again (an AG-UI run's is the thread's whole history)."""
        self._sound_requests: weakref.WeakValueDictionary[int, RequestRecord] = (
            weakref.WeakValueDictionary()
        )
        """Stored requests whose data this workflow decoded, by ``id``, for as long as they are
        alive: restored again -- the same record, carried from checkpoint to checkpoint in this
        process -- their data is decoded only when read (see ``RestoredRequest``)."""
        self.fallback_journal = InMemoryJournal()
        """Journal for runs whose store is not a JournalStore (lives as long as this object)."""

    def _name_annotation(self, annotation: Any) -> None:
        """Stored records name response types by their stable name (``annotation_name``);
        records written before stable names used ``type_name``: both resolve."""
        self._annotations.setdefault(self.registry.annotation_name(annotation), annotation)
        self._annotations.setdefault(type_name(annotation), annotation)

    def stored_type_name(self, annotation: Any) -> str:
        """The name a request record stores for its response type (survives module moves)."""
        try:
            kept, name = self._stored_names[annotation]
            if kept is annotation:  # (not an equal one spelt otherwise: ``str | int``)
                return name
        except (KeyError, TypeError):
            pass
        name = self.registry.annotation_name(annotation)
        with contextlib.suppress(TypeError):  # unhashable annotations are simply not cached
            self._stored_names[annotation] = (annotation, name)
        return name

    def _annotate(self, annotation: Any) -> None:
        for cls in concrete_classes(annotation):
            self.registry.register_declared(cls)

    def _check_answerable(self, asker: str, answer_type: Any) -> None:
        """``DefinitionError`` if no answer of ``answer_type`` could be stored: the run paused,
        a person was asked, and every answer was refused (outside tester 147)."""
        try:
            build_matcher(answer_type)
        except DefinitionError as exc:
            raise DefinitionError(
                f"workflow {self.name!r}: {asker} expects answers of a type no answer can be "
                f"checked against: {exc}"
            ) from None
        why = None
        unstorable = _unstorable_part(answer_type, set())
        if unstorable is not None:
            why = f"{type_name(unstorable)} holds classes or functions, which JSON cannot"
        for cls in concrete_classes(answer_type) if why is None else ():
            if getattr(cls, "_is_protocol", False):  # (runtime_checkable or not)
                why = f"{type_name(cls)} is a Protocol: an answer is stored as its fields"
                break
            refused = self.registry.why_refused(cls)
            if refused is not None:
                why = f"pydantic has no schema for {type_name(cls)} ({refused})"
                break
        if why is not None:
            raise DefinitionError(
                f"workflow {self.name!r}: {asker} expects answers of {type_name(answer_type)}, "
                f"which cannot be stored: {why}; no answer could ever be accepted. Use a "
                "pydantic model, a dataclass or JSON types"
            )

    # --- introspection --------------------------------------------------------------------------

    @property
    def signature(self) -> str:
        """The graph's fingerprint, which a stored run must match to be continued (read-only:
        one set by hand let a run continue on another graph -- outside tester 151)."""
        return self._signature

    @property
    def name(self) -> str:
        """The name runs are stored under (read-only: one changed after ``build()`` -- to a name
        the builder refuses, or after ``register`` -- stored runs no process could resume:
        outside tester 147)."""
        return self._name

    @property
    def start_executor_id(self) -> str:
        return self.graph.start_id

    @property
    def executors(self) -> list[Executor]:
        return [n for n in self.graph.nodes.values() if isinstance(n, Executor)]

    @property
    def request_ports(self) -> list[RequestPort]:
        return [n for n in self.graph.nodes.values() if isinstance(n, RequestPort)]

    def to_mermaid(self) -> str:
        return self.graph.to_mermaid()

    def to_dot(self) -> str:
        return self.graph.to_dot()

    def register_types(self, *types: type) -> Workflow:
        """Allow more classes in state and messages (same as ``WorkflowBuilder.register_types``)."""
        for t in types:
            self._register(t)
            self._name_annotation(t)
        return self

    def _register(self, cls: type, tag: str | None = None) -> None:
        """``register_types``: a class pydantic cannot describe is refused by name (it raised
        pydantic's own schema error)."""
        try:
            self.registry.register(cls, tag)
        except SerializationError:
            raise
        except Exception as exc:
            raise DefinitionError(
                f"workflow {self.name!r}: register_types({type_name(cls)}): its values cannot be "
                f"stored as JSON, pydantic has no schema for it ({schema_refusal(exc)}); convert "
                "them to a type it knows (bytes for a bytearray, say) or to a model"
            ) from exc

    def declared_answer_type(self, annotation: Any) -> Any | None:
        """The declared annotation a request expecting answers of ``annotation`` stores (its
        stored name reads back): ``annotation`` itself, or the one declared that equals it
        spelt otherwise (``str | int`` for ``int | str``, ``Literal["b", "a"]``: each failed
        the run as declared nowhere -- outside tester 151); None if none is declared."""
        try:
            if self.declares_type(self.stored_type_name(annotation)):
                return annotation
        except SerializationError:
            return None
        for declared in self._annotations.values():
            try:
                if declared == annotation:
                    return declared
            except Exception:  # (an annotation whose == fails is no spelling of another)
                continue
        return None

    def declares_type(self, name: str) -> bool:
        """Whether ``name`` (a stored type name) is one this workflow declares."""
        return name in self._annotations

    def resolve_type(self, name: str) -> Any:
        """The annotation a stored type name refers to (only names this workflow declares)."""
        try:
            return self._annotations[name]
        except KeyError:
            raise SerializationError(
                f"workflow {self.name!r} declares no type named {name!r}"
            ) from None

    # --- running --------------------------------------------------------------------------------

    async def run(
        self,
        message: Any = _NO_MESSAGE,
        *,
        responses: Responses | None = None,
        checkpoint: Checkpoint | None = None,
        checkpoint_id: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
        run_id: str | None = None,
        max_supersteps: int | None = None,
    ) -> WorkflowRunResult:
        """Run until the workflow rests (finished, paused on requests, failed or cancelled).

        Start a run with ``message``; continue one with ``checkpoint`` (or ``checkpoint_id`` and
        ``checkpoint_store``) plus ``responses`` to its pending requests. Responses are validated
        before anything runs: a refused one raises a ``ResponseError`` and changes nothing.
        """
        events: list[WorkflowEvent] = []
        loop, store = await self._prepare(
            events.append,
            message,
            responses,
            checkpoint,
            checkpoint_id,
            checkpoint_store,
            run_id,
            max_supersteps,
        )
        await self._drive(loop, store, events.append)
        return self._result(loop, events)

    def run_stream(
        self,
        message: Any = _NO_MESSAGE,
        *,
        responses: Responses | None = None,
        checkpoint: Checkpoint | None = None,
        checkpoint_id: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
        run_id: str | None = None,
        max_supersteps: int | None = None,
    ) -> WorkflowRunStream:
        """Like :meth:`run`, streaming events as they happen."""

        async def prepare(emit: Any) -> tuple[RunLoop, CheckpointStore | None]:
            return await self._prepare(
                emit,
                message,
                responses,
                checkpoint,
                checkpoint_id,
                checkpoint_store,
                run_id,
                max_supersteps,
            )

        return WorkflowRunStream(self, prepare)

    async def cancel(
        self,
        *,
        checkpoint: Checkpoint | None = None,
        checkpoint_id: str | None = None,
        checkpoint_store: CheckpointStore | None = None,
    ) -> Checkpoint:
        """Cancel a paused run: status CANCELLED, pending requests cancelled, saved if a store."""
        cp = await self._load(checkpoint, checkpoint_id, checkpoint_store)
        state = self.restore(cp)
        loop = RunLoop(self, state, lambda e: None, checkpoint_store, self.max_supersteps)
        await loop.finish_cancelled()
        return loop.ensure_checkpoint()

    async def _drive(self, loop: RunLoop, store: CheckpointStore | None, emit: Any) -> None:
        emit(WorkflowStartedEvent(loop.state.run_id))
        emit(WorkflowStatusEvent(WorkflowRunState.IN_PROGRESS))
        await loop.run()

    def result_at(self, checkpoint: Checkpoint, new_outputs: int = 0) -> WorkflowRunResult:
        """What a run that rests at ``checkpoint`` came to: its status, its pending requests
        and its last ``new_outputs`` outputs, decoded (no events: this is read back from what
        was committed, for a caller whose execution was cut off after that commit)."""
        state = self._restore(checkpoint)
        stored = checkpoint.outputs[len(checkpoint.outputs) - new_outputs :] if new_outputs else []
        return WorkflowRunResult(
            run_id=checkpoint.run_id,
            status=checkpoint.status,
            outputs=[self.codec.decode(output) for output in stored],
            pending_requests=list(state.pending.values()),
            checkpoint=checkpoint,
        )

    def _result(self, loop: RunLoop, events: list[WorkflowEvent]) -> WorkflowRunResult:
        s = loop.state
        checkpoint = loop.ensure_checkpoint()
        return WorkflowRunResult(
            run_id=s.run_id,
            status=s.status,
            events=events,
            outputs=list(loop.committed_outputs),
            pending_requests=list(s.pending.values()),
            checkpoint=checkpoint,
            error=s.error,
        )

    async def _prepare(
        self,
        emit: Any,
        message: Any,
        responses: Responses | None,
        checkpoint: Checkpoint | None,
        checkpoint_id: str | None,
        store: CheckpointStore | None,
        run_id: str | None,
        max_supersteps: int | None,
    ) -> tuple[RunLoop, CheckpointStore | None]:
        """Admit a new run or restore one and apply responses; checkpoint that starting point."""
        check_max_supersteps(max_supersteps)
        limit = max_supersteps or self.max_supersteps
        if checkpoint is None and checkpoint_id is None:
            if message is _NO_MESSAGE:
                raise UsageError("run() needs a message to start a run, or a checkpoint")
            if responses:
                raise UsageError("responses can only be given when continuing from a checkpoint")
            state = RunState(run_id=_new_run_id(run_id), secret=new_step_secret())
            self._check_start(message)
            state.inbox = [self._input_envelope(state, message)]
            loop = RunLoop(self, state, emit, store, limit)
            await loop.commit()
            return loop, store
        cp = await self._load(checkpoint, checkpoint_id, store)
        if run_id is not None and run_id != cp.run_id:  # (it was ignored: outside tester 108)
            raise UsageError(
                f"run_id {run_id!r} given with a checkpoint of run {cp.run_id!r}: a checkpoint "
                "continues its own run (fork it for a new one: Workflow.fork_checkpoint)"
            )
        if store is not None and not getattr(store, "continues_latest", False):
            # refuse before anything runs: continuing an older checkpoint would re-execute
            # journaled steps and then be refused at its first commit anyway
            latest = await store.latest(cp.run_id)
            if latest is not None and latest.checkpoint_id != cp.checkpoint_id:
                raise CheckpointNotLatestError(
                    f"run {cp.run_id!r}: checkpoint {cp.checkpoint_id} (superstep "
                    f"{cp.superstep}) is not the run's latest ({latest.checkpoint_id}, superstep "
                    f"{latest.superstep}); continue from the latest, or fork it into a new run "
                    "(Workflow.fork_checkpoint / Runtime.fork)"
                )
        state = self.restore(cp)
        if state.status in (WorkflowRunState.CANCELLED,):
            raise RunNotResumableError(f"run {state.run_id!r} was cancelled")
        if message is not _NO_MESSAGE and state.pending:
            start = self.graph.nodes[self.graph.start_id]
            if not getattr(start, "takes_input_while_waiting", True):
                # (a handoff chat's new message mid-turn failed the run for good: outside
                # tester 189) -- refused before anything runs or is stored
                waiting = ", ".join(sorted(state.pending)[:3])
                raise UsageError(
                    f"run {state.run_id!r} waits for answers to {len(state.pending)} "
                    f"request(s) ({waiting}{', ...' if len(state.pending) > 3 else ''}): "
                    f"{self.graph.start_id!r} takes a new message only once they are "
                    "answered -- answer them (responses=...), then send it"
                )
        loop = RunLoop(self, state, emit, store, limit)
        answers = self.validate_responses(state, responses or {})
        if message is not _NO_MESSAGE:
            self._check_start(message)
        if store is None and (answers or message is not _NO_MESSAGE):  # (``branch_secret``:
            # a new message makes a branch as an answer does -- outside tester 179)
            encode = self.codec.encode
            given = [(rid, answer_digest(encode(value))) for rid, _, value in answers]
            if message is not _NO_MESSAGE:
                given.append(("message", answer_digest(encode(message))))
            state.secret = branch_secret(state.secret, given)
        changed = bool(answers)
        state.status = WorkflowRunState.IN_PROGRESS
        # Where the store keeps every answer until a commit applies it (``respond``), applying
        # them needs no commit of its own: the first superstep's commit applies them, and a
        # crash before it applies them again, to the same messages. Not an answer about an
        # in-doubt step: it writes the journal, so it is committed at once, alone.
        defer = message is _NO_MESSAGE and getattr(store, "answers_stored", False)
        if defer and answers:
            settling = [a for a in answers if a[1].effect_key is not None]
            if settling:
                await self._apply_answers(loop, settling)
                await loop.commit(changes_of(requests_answered=[a[0] for a in settling]))
                answers = [a for a in answers if a[1].effect_key is None]
                changed = bool(answers)
        added: list[str] = []
        if answers:
            added = await self._apply_answers(loop, answers)
        if message is not _NO_MESSAGE:
            state.inbox.append(self._input_envelope(state, message))
            changed = True
        if changed:
            applied = changes_of(requests_added=added, requests_answered=[a[0] for a in answers])
            if defer:
                loop.unsaved = applied
            else:
                await loop.commit(applied)
        if loop.cut_off is None and store is not None:
            # the steps a continuation that stopped (a crash) left in doubt, asked about
            # before its superstep runs again (a runtime says which: ``cut_off_steps``)
            listing = getattr(loop.journal, "journal_after", None)
            if listing is not None:
                entries = await listing(loop.journal_run, cp.superstep)
                loop.cut_off = cut_off_steps(entries, state.secret, state.run_id)
        return loop, store

    def admit(
        self,
        message: Any,
        *,
        run_id: str | None = None,
        shared_state: Mapping[str, Any] | None = None,
    ) -> Checkpoint:
        """The first checkpoint of a new run: ``message`` in flight to the start executor,
        ``shared_state`` (e.g. a caller's ``function_invocation_kwargs``) already set."""
        self._check_start(message)
        state = RunState(run_id=_new_run_id(run_id), secret=new_step_secret())
        state.inbox = [self._input_envelope(state, message)]
        state.shared = {k: self.codec.encode(v) for k, v in (shared_state or {}).items()}
        checkpoint = RunLoop(
            self, state, lambda e: None, None, self.max_supersteps
        ).make_checkpoint(chained=False)
        [envelope] = state.inbox
        admitted = self._admitted
        admitted[checkpoint.checkpoint_id] = (envelope.encoded, envelope.data)
        while len(admitted) > _ADMITTED_KEPT:
            with contextlib.suppress(KeyError):  # (emptied meanwhile by another thread)
                admitted.popitem(last=False)
        return checkpoint

    def _input_envelope(self, state: RunState, message: Any) -> Envelope:
        """A start message, named by the superstep it arrives at and how many came before."""
        index = sum(1 for e in state.inbox if e.source_id == INPUT_SOURCE)
        encoded = self.codec.encode(message)
        return Envelope(
            INPUT_SOURCE,
            self.graph.start_id,
            self.codec.decode(encoded),
            None,
            input_message_id(state.superstep, index),
            encoded,
        )

    def fork_checkpoint(self, source: Checkpoint, *, new_run_id: str) -> Checkpoint:
        """A standalone copy of ``source`` as the first checkpoint of a new run.

        The fork gets its own step secret, so its request ids and idempotency keys are its own
        and its journal is empty: its side effects are new ones. Answering the fork never
        touches the original run.
        """
        self.restore(source)  # validates signature and codec
        secret = new_step_secret()
        # (a question whether one of the source's steps happened is not the fork's: its steps
        # are new, under keys of its own, and run again -- the fork asked about the source's
        # effect, by the source's key, outside tester 193)
        asked = {rid: r for rid, r in source.pending_requests.items() if r.kind != "effect"}
        rekey = {rid: derive_id(secret, "fork", new_run_id, rid) for rid in asked}
        pending = {
            rekey[rid]: record.model_copy(update={"request_id": rekey[rid]})
            for rid, record in asked.items()
        }
        status = source.status
        if status in (WorkflowRunState.FAILED, WorkflowRunState.MAX_SUPERSTEPS_REACHED):
            status = WorkflowRunState.IN_PROGRESS
        elif status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS and not pending:
            status = WorkflowRunState.IN_PROGRESS  # (its superstep runs again)
        return source.model_copy(
            update={
                "checkpoint_id": new_checkpoint_id(),
                "parent_id": None,
                "run_id": new_run_id,
                "step_secret": secret,
                "pending_requests": pending,
                "status": status,
                "changes": CheckpointChanges(),
            }
        )

    def _check_start(self, message: Any) -> None:
        start = self.graph.nodes[self.graph.start_id]
        if isinstance(start, Executor) and start.find_handler(message) is None:
            accepted = ", ".join(type_name(t) for t in start.input_types)
            raise MessageNotHandledError(
                f"workflow {self.name!r}: the start executor {start.id!r} cannot take "
                f"{type_name(type(message))} (it accepts {accepted})"
            )

    async def _load(
        self,
        checkpoint: Checkpoint | None,
        checkpoint_id: str | None,
        store: CheckpointStore | None,
    ) -> Checkpoint:
        if checkpoint is not None:
            if not isinstance(checkpoint, Checkpoint):  # (an AttributeError: tester 170)
                hint = " -- read one from its JSON with Checkpoint.from_json(text)"
                raise UsageError(
                    f"checkpoint= takes a Checkpoint, not {type_name(type(checkpoint))}"
                    + (hint if isinstance(checkpoint, str | bytes | dict) else "")
                )
            if checkpoint_id is not None:  # (the id was ignored)
                raise UsageError("give checkpoint= or checkpoint_id=, not both")
            return checkpoint
        if not isinstance(checkpoint_id, str):
            raise UsageError(
                f"checkpoint_id= is a checkpoint's id (text), not {type_name(type(checkpoint_id))}"
            )
        if store is None:
            raise UsageError("checkpoint_id needs a checkpoint_store to load it from")
        assert checkpoint_id is not None
        cp = await store.load(checkpoint_id)
        if cp is None:
            raise CheckpointNotFoundError(f"no checkpoint {checkpoint_id!r}")
        return cp

    # --- restore and responses ------------------------------------------------------------------

    def restore(self, checkpoint: Checkpoint) -> RunState:
        """Rebuild a run's live state from a checkpoint written by this same graph.

        A value in it that does not decode is a ``StoreCorruptError`` naming the run and the
        checkpoint: stored data is damaged, never a raw codec error."""
        if checkpoint.workflow_signature != self.signature:
            raise SignatureMismatchError(
                f"run {checkpoint.run_id!r} was checkpointed by workflow "
                f"{checkpoint.workflow_name!r} with signature {checkpoint.workflow_signature}, "
                f"but this workflow {self.name!r} has signature {self.signature}: the graph changed"
            )
        if checkpoint.codec != self.codec.name:
            raise SerializationError(
                f"run {checkpoint.run_id!r}: checkpoint written with codec {checkpoint.codec!r}, "
                f"this workflow uses {self.codec.name!r}"
            )
        try:
            return self._restore(checkpoint)
        except (SignatureMismatchError, StoreCorruptError):
            raise
        except (SerializationError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise stored_value_error(
                exc,
                f"run {checkpoint.run_id!r}: a value of checkpoint {checkpoint.checkpoint_id} "
                f"(superstep {checkpoint.superstep})",
            ) from exc

    def decode_stored(self, data: Any, run_id: str, record: str) -> Any:
        """Decode a value read from a store; damage is a ``StoreCorruptError`` naming the run
        and the record (``record``: e.g. "request 1f…'s data")."""
        return decode_stored(self.codec, data, run_id, record)

    def _restore(self, checkpoint: Checkpoint) -> RunState:
        decode = self.codec.decode
        where = f"of checkpoint {checkpoint.checkpoint_id} (superstep {checkpoint.superstep})"

        dec = functools.partial(_decoded_stored, decode, checkpoint.run_id, where)

        # (what a restored request keeps to decode its data: not this checkpoint)
        request_data = functools.partial(_request_data, decode, checkpoint.run_id, where)
        pending: dict[str, ExternalRequest] = {}
        sound = self._sound_requests
        for rid, r in checkpoint.pending_requests.items():
            response_type = self.resolve_type(r.response_type)
            if sound.get(id(r)) is r:
                pending[rid] = RestoredRequest.stored(
                    r.data,
                    request_data,
                    rid,
                    r.port_id,
                    response_type,
                    r.source_executor_id,
                    r.superstep,
                    checkpoint.run_id,
                    r.kind == "port",
                )
                continue
            # first met here: decoded now, so that damage is named as the run is read
            data = dec(r.data, f"the data of request {rid!r}")
            if r.kind != "effect":  # (an effect's key is in its data: always decoded)
                sound[id(r)] = r
            pending[rid] = ExternalRequest(
                request_id=r.request_id,
                port_id=r.port_id,
                data=data,
                response_type=response_type,
                source_executor_id=r.source_executor_id,
                superstep=r.superstep,
                run_id=checkpoint.run_id,
                from_port=r.kind == "port",
                effect_key=data.step_key if isinstance(data, InDoubtEffect) else None,
            )
        # (the copy ``admit`` decoded, for the message it encoded: taken once, by the first restore)
        admitted = self._admitted.pop(checkpoint.checkpoint_id, None) if self._admitted else None
        inbox = []
        for index, m in enumerate(checkpoint.messages):
            request = None
            if m.request_id is not None:
                request = self._answered_request(checkpoint, m.request_id)
            message_id = m.message_id or f"legacy.{checkpoint.superstep}.{index}"
            sender = "the run's input" if m.source_id == INPUT_SOURCE else repr(m.source_id)
            if admitted is not None and m.data is admitted[0]:
                data, admitted = admitted[1], None
            else:
                what = f"message {index} in flight ({sender} to {m.target_id!r})"
                data = dec(m.data, what)
            inbox.append(Envelope(m.source_id, m.target_id, data, request, message_id, m.data))
        return RunState(
            run_id=checkpoint.run_id,
            superstep=checkpoint.superstep,
            secret=checkpoint.step_secret,
            inbox=inbox,
            executor_states={k: dict(v) for k, v in checkpoint.executor_states.items()},
            shared=dict(checkpoint.shared_state),
            fan_in={
                g: {
                    s: [dec(m, f"a message {s!r} sent to fan-in {g!r}") for m in msgs]
                    for s, msgs in buf.items()
                }
                for g, buf in checkpoint.fan_in_buffers.items()
            },
            pending=pending,
            answered=dict(checkpoint.answered_requests),
            answered_digests=checkpoint.answered_digests,
            digests_shared=True,
            cancelled=list(checkpoint.cancelled_requests),
            encoded_outputs=list(checkpoint.outputs),
            status=checkpoint.status,
            checkpoint=checkpoint,
        )

    def _answered_request(self, checkpoint: Checkpoint, request_id: str) -> ExternalRequest:
        record = checkpoint.answered_requests.get(request_id)
        if not isinstance(record, dict) or "request" not in record:
            raise SerializationError(
                f"run {checkpoint.run_id!r}: message answers request {request_id!r}, "
                "which the checkpoint does not record"
            )
        r = record["request"]
        return ExternalRequest(
            request_id=request_id,
            port_id=r["port_id"],
            data=self.codec.decode(r["data"]),
            response_type=self.resolve_type(record["response_type"]),
            source_executor_id=r["source_executor_id"],
            superstep=r["superstep"],
            run_id=checkpoint.run_id,
            from_port=False,
        )

    def validate_responses(
        self, state: RunState, responses: Responses
    ) -> list[tuple[str, ExternalRequest, Any]]:
        """Check every answer before any is applied. Returns the new (id, request, value)s, in
        the order the requests were made; identical repeats of earlier answers are dropped
        (idempotent)."""
        items: list[Any] | None = None
        if isinstance(responses, Mapping):
            items = [ExternalResponse(k, v) for k, v in responses.items()]
        elif isinstance(responses, Iterable) and not isinstance(responses, str | bytes):
            items = list(responses)
        if items is None or not all(  # (a list of ints was an AttributeError: tester 170)
            isinstance(item, ExternalResponse) and isinstance(item.request_id, str)
            for item in items
        ):
            raise UsageError(
                f"run {state.run_id!r}: responses are a mapping of request id (text) to answer, "
                f"or ExternalResponses; got {shown(responses)}"
            )
        accepted: dict[str, tuple[str, ExternalRequest, Any]] = {}
        for response in items:
            rid = response.request_id
            if rid in accepted or state.was_answered(rid):
                try:
                    same = self._same_answer(state, rid, accepted.get(rid), response.data)
                except ResponseTypeError:
                    same = False
                if not same:
                    raise RequestAlreadyAnsweredError(
                        f"run {state.run_id!r}: request {rid!r} was already answered with a "
                        "different value; an answer cannot be changed"
                    )
                continue  # the same answer again: idempotent
            if rid in state.cancelled:
                raise RequestCancelledError(f"run {state.run_id!r}: request {rid!r} was cancelled")
            request = state.pending.get(rid)
            if request is None:
                raise UnknownRequestError(
                    f"run {state.run_id!r} has no request {rid!r} (pending: "
                    f"{', '.join(state.pending) or 'none'})"
                )
            value = self.check_answer(
                state.run_id,
                rid,
                request.port_id,
                request.data,
                request.response_type,
                response.data,
            )
            accepted[rid] = (rid, request, value)
        # in the order the requests were made, as a durable run applies stored answers: the
        # order of a dict's keys gave the same answers another outcome (outside tester 149)
        made = {rid: index for index, rid in enumerate(state.pending)}
        return sorted(accepted.values(), key=lambda answer: made[answer[0]])

    def _same_answer(
        self,
        state: RunState,
        request_id: str,
        accepted: tuple[str, ExternalRequest, Any] | None,
        data: Any,
    ) -> bool:
        """Whether ``data`` is the answer ``request_id`` already has (in this call, kept whole in
        the checkpoint, or as a digest); ``ResponseTypeError`` if it is not even of its type."""
        if accepted is not None:
            request = accepted[1]
            value = self.coerce_repeat(state.run_id, request_id, request.response_type, data)
            value = self._as_kept(request.port_id, request.data, value)
            return canonical_answer(self.codec.encode(value)) == canonical_answer(
                self.codec.encode(accepted[2])
            )
        record = state.answered.get(request_id)
        if record is not None:
            expected = self.resolve_type(record["response_type"])
            value = self.coerce_repeat(state.run_id, request_id, expected, data)
            asked = record.get("request")
            if isinstance(asked, dict) and isinstance(asked.get("port_id"), str):
                question = self.codec.decode(asked.get("data"))
                value = self._as_kept(asked["port_id"], question, value)
            # re-encoded: an answer stored by an older codec version compares equal
            previous = self.codec.encode(self.codec.decode(record["data"]))
            return canonical_answer(self.codec.encode(value)) == canonical_answer(previous)
        digest, _, type_name = state.answered_digests[request_id].partition(" ")
        value = self.coerce_repeat(state.run_id, request_id, self.resolve_type(type_name), data)
        return answer_has_digest(self.codec.encode(value), digest)

    def _as_kept(self, port_id: str, request_data: Any, value: Any) -> Any:
        """``value`` as the answering node keeps it (see ``check_answer``); as it is if the node
        refuses it (then it is no repeat of an answer it took)."""
        hook = getattr(self.graph.nodes.get(port_id), "validate_response", None)
        if hook is None:
            return value
        try:
            kept = hook(request_data, value)
        except (ResponseError, ValueError, TypeError):
            return value
        return value if kept is None else kept

    def coerce_repeat(self, run_id: str, request_id: str, expected: Any, data: Any) -> Any:
        """``coerce_response`` for an answer given again: as JSON sees it, so ``10.0`` is the
        ``10`` an ``int`` answer took (a first answer of ``10.0`` is refused as not an int;
        given again, it is the same answer, not a conflicting one)."""
        try:
            return self.coerce_response(run_id, request_id, expected, data)
        except ResponseTypeError:
            return self.coerce_response(run_id, request_id, expected, integral_numbers(data))

    def check_answer(
        self,
        run_id: str,
        request_id: str,
        port_id: str,
        request_data: Any,
        expected: Any,
        data: Any,
    ) -> Any:
        """Validate an answer: its type, then the answering node's own rules.

        An executor that answers requests (``ctx.request_info``) may define
        ``validate_response(request_data, response)`` and raise ``ValueError`` to refuse an
        answer its type allows (e.g. edited tool arguments that fail the tool's schema). It may
        return the answer as it is to be kept instead (the same decision said one way: edits
        that change nothing left out), so that the same answer written two ways is one.
        """
        value = self.coerce_response(run_id, request_id, expected, data)
        hook = getattr(self.graph.nodes.get(port_id), "validate_response", None)
        if hook is not None:
            try:
                kept = hook(request_data, value)
                if kept is not None:
                    value = kept
            except ResponseError:
                raise
            except (ValueError, TypeError) as exc:
                raise ResponseTypeError(f"run {run_id!r}, request {request_id!r}: {exc}") from exc
        node = self.graph.nodes.get(port_id)
        if isinstance(node, RequestPort):
            self._check_deliverable(run_id, request_id, node, value)
        try:
            # storable (its text valid Unicode, say), and readable back as stored: a plain
            # dataclass checks no field when it is made, so ``DC(tags={1})`` for ``tags:
            # set[str]`` was stored, and every resume then failed to read it -- the run stuck
            # for good (outside tester 100); so did a model whose validator fails on its own
            # stored form. After the node's own rules, which may mend the answer (tester 101).
            read_back(self.codec, self.codec.encode(value), "the answer")
        except SerializationError as exc:
            raise ResponseTypeError(f"run {run_id!r}, request {request_id!r}: {exc}") from exc
        return value

    def _check_deliverable(
        self, run_id: str, request_id: str, port: RequestPort, value: Any
    ) -> None:
        """A port sends an answer on to its successors: one none of them takes is refused now,
        before a person's answer is stored, not when the run goes on (where it failed the run:
        a port answering ``int | str`` into a handler of ``int`` only, say)."""
        groups = self.graph.outgoing.get(port.id, ())
        if any(g.kind == "fan_in" for g in groups):
            return  # the list it joins is checked when it is complete
        targets = [t for g in groups for t in g.targets]
        if any(accepts(self.graph, t, value) for t in targets):
            return
        raise ResponseTypeError(
            f"run {run_id!r}, request {request_id!r}: port {port.id!r} sends its answers to "
            f"{', '.join(map(repr, targets))}, and none of them takes "
            f"{display_name(type(value), self.registry)}"
        )

    def coerce_response(self, run_id: str, request_id: str, expected: Any, data: Any) -> Any:
        """Validate an answer against the expected type; JSON-shaped data is validated strictly,
        and may name only fields its type has."""
        if build_matcher(expected)(data):
            if not (holds_int(data) and takes_float(expected)):
                return data
            # else: as its type reads it, a float (a handler's ``price: float`` got the int
            # 2, which a web page sends for 2.0 -- outside tester 176)
        elif isinstance(data, BaseModel) or (is_dataclass(data) and not isinstance(data, type)):
            # (as JSON it would be its str(): pydantic would say "Input should be an object")
            raise ResponseTypeError(
                f"run {run_id!r}, request {request_id!r}: expected "
                f"{display_name(expected, self.registry)}, not "
                f"{display_name(type(data), self.registry)}: answer with the expected type, or "
                "with its fields as JSON data"
            )
        key = type_name(expected)  # module paths: two classes never share an adapter
        adapter = self._adapters.get(key)
        if adapter is None:
            adapter = self._adapters[key] = AnswerAdapter(expected)
        name = display_name(expected, self.registry)
        as_json = False
        try:
            if as_json := is_json_data(data, MAX_DEPTH):  # (a command line, a web page): strictly
                try:
                    text = json.dumps(data, ensure_ascii=False)
                except ValueError:  # (an int past Python's digit limit: no reader reads it)
                    raise ResponseTypeError(
                        f"run {run_id!r}, request {request_id!r}: the answer holds {UNREADABLE_INT}"
                    ) from None
                if not text.isascii():
                    try:  # (escaped, a lone surrogate was "Invalid JSON" to the validator)
                        text.encode("utf-8")
                    except UnicodeEncodeError as exc:
                        raise ResponseTypeError(
                            f"run {run_id!r}, request {request_id!r}: the answer cannot be "
                            f"stored: {unicode_problem(exc)}"
                        ) from None
                value = adapter.validate_json(text)
            else:  # it holds Python values (a model, bytes, a date): as its type's own
                value = adapter.validate_python(data)  # model_validate would take them
        except ValidationError as exc:
            strangers = self._strangers(expected, data)
            said = {text.partition(":")[0] for text in strangers}
            problems = "; ".join(
                [
                    f"{adapter.where(e['loc'], as_json)}: {e['msg']}"
                    for e in exc.errors()
                    # (a key a model forbids is said once, with the field meant: tester 153)
                    if not (e["type"] == "extra_forbidden" and str(e["loc"][0]) in said)
                ]
                + strangers
            )
            raise ResponseTypeError(
                f"run {run_id!r}, request {request_id!r}: expected {name}: {problems}"
            ) from exc
        except (TypeError, ValueError) as exc:
            raise ResponseTypeError(
                f"run {run_id!r}, request {request_id!r}: expected {name}, got "
                f"{display_name(type(data), self.registry)}: {exc}"
            ) from exc
        if holds_int(data, _PAST_FLOATS) and holds_infinity(value) and not holds_infinity(data):
            # a whole number no float holds, read by a float field as infinity (``10**400``:
            # outside testers 179, 180)
            raise ResponseTypeError(
                f"run {run_id!r}, request {request_id!r}: the answer holds a number too large "
                f"for a float ({name} expected)"
            )
        # a key no field takes is refused, not dropped (a typo would vanish), unless its model
        # declares its own ``extra``
        unknown = unknown_keys(value, data, hint=expected)
        if unknown:
            problems = "; ".join(
                f"{path}: {cls if isinstance(cls, str) else display_name(cls, self.registry)} "
                f"has no such field{_meant(path, cls, self.registry)}"
                for path, cls in unknown
            )
            raise ResponseTypeError(
                f"run {run_id!r}, request {request_id!r}: expected {name}: {problems}"
            )
        return value

    def _strangers(self, expected: Any, data: Any) -> list[str]:
        """The keys of ``data`` its model or dataclass has no field for, each said with the
        field meant if one is close: a typo of a required field was said only as that field
        missing (outside tester 149)."""
        keys = _keys_taken(expected, self.registry) if isinstance(data, dict) else None
        if keys is None:
            return []
        said = []
        for key in data:
            if isinstance(key, str) and key not in keys:
                named = display_name(expected, self.registry)
                said.append(f"{key}: {named} has no such field{_did_you_mean(key, keys)}")
        return said

    async def _apply_answers(
        self, loop: RunLoop, answers: list[tuple[str, ExternalRequest, Any]]
    ) -> list[str]:
        """Turn validated answers into in-flight messages; returns ids of requests this created
        (an answer routed from one port straight into another).

        Each answer's message is named after the request it answers (``r:<id>``), so the
        delivery keeps its identity whatever else is in flight. An answer about an in-doubt
        effect is written to the journal instead: the step's result, or leave to run again.
        """
        state = loop.state
        encode = self.codec.encode
        sends: list[Send] = []
        for rid, request, value in answers:
            del state.pending[rid]
            encoded = encode(value)
            record: dict[str, Any] = {
                "data": encoded,
                "response_type": self.stored_type_name(request.response_type),
            }
            if request.effect_key is not None:
                await self._resolve_effect(loop, request, value)
                state.answered[rid] = record
                continue
            # the handler gets a copy, like every message: not the caller's object, which a
            # retry would send again as the handler left it (outside tester 185)
            copy = self.codec.decode(encoded)
            if request.from_port:
                sends.append(Send(request.port_id, copy, None, answer_send_id(rid), encoded))
            else:
                record["request"] = {
                    "port_id": request.port_id,
                    "data": encode(request.data),
                    "source_executor_id": request.source_executor_id,
                    "superstep": request.superstep,
                }
                state.inbox.append(
                    Envelope(
                        request.port_id,
                        request.port_id,
                        copy,
                        request,
                        answer_send_id(rid),
                        encoded,
                    )
                )
            state.answered[rid] = record
        if not sends:
            return []
        delivery = await loop.route(sends, state.fan_in)
        loop.give_copies(delivery.inbox)
        loop.give_copies(delivery.port_messages)
        state.inbox.extend(delivery.inbox)
        state.fan_in = delivery.fan_in
        added = []
        for env in delivery.port_messages:
            request = loop.port_request(env, state.superstep)
            state.pending[request.request_id] = request
            added.append(request.request_id)
        return added

    async def _resolve_effect(self, loop: RunLoop, request: ExternalRequest, value: Any) -> None:
        """Record what a person said about an in-doubt step. The executor may turn the answer
        into its step's result type with ``resolve_in_doubt(question, resolution)``."""
        assert request.effect_key is not None
        resolution = value if isinstance(value, EffectResolution) else EffectResolution(**value)
        journal, run = loop.journal, loop.journal_run
        if not resolution.happened:
            await journal.journal_clear(run, request.effect_key)
            return
        result = resolution.result
        hook = getattr(self.graph.nodes.get(request.port_id), "resolve_in_doubt", None)
        if hook is not None:
            result = hook(request.data, resolution)
        superstep = int(request.effect_key.partition("/")[0])
        await journal.journal_put(
            run, request.effect_key, {"value": encode_checked(self, result)}, superstep
        )


_BYTES_AS_BASE64 = ConfigDict(val_json_bytes="base64", ser_json_bytes="base64")
"""(Serializing: only so that the JSON schema says base64, ``json_schema``.)"""


class AnswerAdapter:
    """How answers of one type are validated. JSON data strictly, as JSON, with bytes as the
    base64 text the wire shows them as (pydantic's default reads the text's UTF-8) wherever
    the type's own classes do not say otherwise: a pydantic model or dataclass keeps its own
    ``val_json_bytes``. A plain dataclass or TypedDict has no config of its own, and pydantic
    takes none for it at the top: it is validated as the one item of a tuple, where it takes
    the config as it does nested (tester 99: ``DC`` read its bytes as UTF-8, ``DC | None`` as
    base64). Data holding Python values is validated as the type's own ``model_validate``
    would take it."""

    def __init__(self, expected: Any) -> None:
        self._skip = 0  # (the tuple's index in an error's location)
        self._python = TypeAdapter(expected)  # (the config reads a Python str as base64 too)
        try:
            self._json = TypeAdapter(expected, config=_BYTES_AS_BASE64)
        except PydanticUserError:  # a class that may carry its own config
            if _has_own_config(expected):
                self._json = self._python
            else:
                self._json = TypeAdapter(tuple[expected], config=_BYTES_AS_BASE64)
                self._skip = 1

    def validate_json(self, text: str) -> Any:
        if self._skip:
            return self._json.validate_json(f"[{text}]", strict=True)[0]
        return self._json.validate_json(text, strict=True)

    def validate_python(self, data: Any) -> Any:
        return self._python.validate_python(data)

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of answers given as JSON (bytes as base64: pydantic says
        ``format: base64url``, and reads both alphabets)."""
        schema = self._json.json_schema()
        if not self._skip:
            return schema
        item = schema["prefixItems"][0]  # (the tuple's one item)
        return {**item, "$defs": schema["$defs"]} if "$defs" in schema else item

    def where(self, loc: tuple[int | str, ...], from_json: bool) -> str:
        """An error's location in the answer (``value``: the answer itself); ``from_json``: an
        error of :meth:`validate_json` (whose location starts at the tuple's item)."""
        return ".".join(str(part) for part in loc[self._skip if from_json else 0 :]) or "value"


def _has_own_config(cls: Any) -> bool:
    """A pydantic model, or a class that names its config (a pydantic dataclass, a class
    under ``with_config``)."""
    return (isinstance(cls, type) and issubclass(cls, BaseModel)) or hasattr(
        cls, "__pydantic_config__"
    )


def encode_checked(workflow: Workflow, value: Any) -> Any:
    encoded = workflow.codec.encode(value)
    workflow.codec.decode(encoded)
    return encoded


def _distinct(annotations: list[Any]) -> list[Any]:
    """``annotations`` without repeats of one object, first occurrences in order (a graph of
    agents mentions the same few classes hundreds of times). By identity, not equality:
    ``int | str == str | int``, yet each spelling must keep its name."""
    ids: set[int] = set()
    out: list[Any] = []
    for annotation in annotations:
        if id(annotation) not in ids:
            ids.add(id(annotation))
            out.append(annotation)
    return out


def _keys_read(cls: type, names: frozenset[str]) -> frozenset[str] | None:
    """The keys a model (or dataclass) with fields ``names`` may read: its field names and
    their plain aliases; None if it cannot be told (generated aliases, alias paths)."""
    fields = getattr(cls, "__pydantic_fields__", None) or {}
    config = getattr(cls, "model_config", None) or getattr(cls, "__pydantic_config__", {})
    if config.get("alias_generator"):
        return None
    by_name = config.get("populate_by_name") or config.get("validate_by_name")
    keys: set[str] = set()
    for name in names:
        field = fields.get(name)
        aliases = (
            [a for a in (field.alias, field.validation_alias) if a is not None] if field else []
        )
        if any(not isinstance(a, str) for a in aliases):  # (AliasChoices, AliasPath)
            return None
        if not aliases or by_name:  # (one read by its alias only: its name is no key)
            keys.add(name)
        keys.update(aliases)
    return frozenset(keys)


def _meant(path: str, cls: Any, registry: TypeRegistry) -> str:
    """The field meant by the last key of ``path``, if ``cls`` has one close to it."""
    keys = _keys_taken(cls, registry)
    return _did_you_mean(path.rpartition(".")[2], keys) if keys is not None else ""


def _keys_taken(cls: Any, registry: TypeRegistry) -> frozenset[str] | None:
    """The keys a registered model or dataclass ``cls`` reads (``_keys_read``); None when it
    is no such class, takes keys that are no field's (its own ``extra``), or cannot be told."""
    if not isinstance(cls, type):
        return None
    try:
        entry = registry.entry_for_class(cls)
    except SerializationError:
        return None
    if entry is None or not entry.names:
        return None
    # a class whose ``before`` validator reads its raw input reads what it says it does
    # (``__workflow_input_keys__``): its typos are named too (outside tester 180)
    declared = getattr(cls, "__workflow_input_keys__", None)
    config = getattr(cls, "model_config", None) or {}
    if entry.open and (declared is None or config.get("extra") == "allow"):
        return None
    keys = _keys_read(cls, entry.names)
    return keys | frozenset(declared or ()) if keys is not None else None


def _did_you_mean(key: str, keys: frozenset[str]) -> str:
    """`` (did you mean 'x'?)`` for the key of ``keys`` closest to ``key``, if one is close."""
    import difflib  # (only to suggest a key: 0.4 ms at every start otherwise)

    close = difflib.get_close_matches(key, sorted(keys - {key}), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_NOT_STORABLE = (type, collections.abc.Callable, typing.Callable)
"""Answer types of classes or functions (bare; their subscripted forms by their origin)."""


def _answer_types(node: Any) -> list[tuple[str, Any]]:
    """(who asks, answer type) for each kind of answer ``node`` takes."""
    if isinstance(node, RequestPort):
        return [(f"request port {node.id!r}", node.response_type)]
    return [
        (f"@response_handler {spec.name} of executor {node.id!r}", spec.response_type)
        for spec in node.response_handlers
    ]


def _unstorable_part(annotation: Any, seen: set[type]) -> Any | None:
    """The part of ``annotation`` no answer can hold (a class or a function), looking into
    the fields of the models and dataclasses in it too: an answer model with a ``Callable``
    field was built, and no answer could ever be given (outside tester 173)."""
    for part in _parts_of(annotation):
        if part in _NOT_STORABLE or get_origin(part) in (type, collections.abc.Callable):
            return part
        if not isinstance(part, type) or part in seen:
            continue
        seen.add(part)
        fields = getattr(part, "model_fields", None)
        if isinstance(fields, dict):  # a pydantic model: its fields' annotations, resolved
            inner = [f.annotation for f in fields.values()]
        elif is_dataclass(part):
            try:
                inner = list(typing.get_type_hints(part).values())
            except Exception:  # (a name it cannot resolve: left to the codec to say)
                continue
        else:
            continue
        for annotation_inside in inner:
            found = _unstorable_part(annotation_inside, seen)
            if found is not None:
                return found
    return None


def _parts_of(annotation: Any) -> Iterator[Any]:
    """``annotation`` and every type expression nested in it."""
    yield annotation
    if get_origin(annotation) is not Literal:
        for arg in get_args(annotation):
            if not isinstance(arg, list):  # (Callable's argument list)
                yield from _parts_of(arg)


def _node_annotations(node: Any) -> list[Any]:
    if isinstance(node, RequestPort):
        return [node.request_type, node.response_type]
    out: list[Any] = []
    for spec in node.handlers:
        out.extend([spec.message_type, *spec.output_types, *spec.workflow_output_types])
    for rspec in node.response_handlers:
        out.extend(
            [
                rspec.request_type,
                rspec.response_type,
                *rspec.output_types,
                *rspec.workflow_output_types,
            ]
        )
    return out


__all__ = ["Workflow", "WorkflowRunResult", "WorkflowRunStream"]


def check_max_supersteps(limit: int | None) -> None:
    """``UsageError`` for a superstep limit that is not a whole number of at least 1 (None:
    the workflow's own) -- checked before anything is written: a refused call changes
    nothing (outside tester 112: the run was admitted, the answer stored, then refused)."""
    if limit is None:
        return
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise UsageError(
            f"max_supersteps must be a whole number (int), not {type(limit).__name__} "
            f"({shown(limit, 40)})"
        )
    if limit < 1:
        raise UsageError(f"max_supersteps must be at least 1, not {limit}")


_ADMITTED_KEPT = 16
"""Admitted runs whose decoded start message a workflow keeps for their first execution here
(the newest; a run admitted to be executed elsewhere, or later, falls out)."""


def _decoded_stored(
    decode: Callable[[Any], Any], run_id: str, where: str, data: Any, at: str
) -> Any:
    """``data`` of a checkpoint (``where``) decoded; what does not decode is named (``at``),
    not only its checkpoint (outside tester 97)."""
    try:
        return decode(data)
    except (SerializationError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise stored_value_error(exc, f"run {run_id!r}: {at} {where}") from exc


def _request_data(
    decode: Callable[[Any], Any], run_id: str, where: str, data: Any, request_id: str
) -> Any:
    """A restored request's data, decoded (see ``RestoredRequest``), as a restore decodes it."""
    return _decoded_stored(decode, run_id, where, data, f"the data of request {request_id!r}")


def _new_run_id(run_id: str | None) -> str:
    """The id of a run being admitted: ``run_id`` if given (text, not empty), else a fresh one.
    An empty id used to make a fresh one -- a retried start with it made a second run."""
    if run_id is None:
        return uuid.uuid4().hex
    if not isinstance(run_id, str):
        raise UsageError(
            f"a run id is text (str), not {type_name(type(run_id))} ({shown(run_id)}); omit it "
            "for a fresh one"
        )
    if not run_id.strip():  # (blank: shown as nothing in every listing)
        raise UsageError("a run id cannot be empty or blank; omit it (None) for a fresh one")
    if not is_text(run_id):
        raise UsageError(f"run id {run_id!r} is not valid Unicode text (a lone surrogate)")
    if len(run_id) > MAX_RUN_ID_LENGTH:
        raise UsageError(
            f"a run id is at most {MAX_RUN_ID_LENGTH} characters, not {len(run_id):,} "
            f"({run_id[:40]!r}...)"
        )
    return run_id


MAX_RUN_ID_LENGTH = 1024
"""The longest run id a run is admitted under: every row of the run holds it (an AG-UI
thread's run id is its workflow's name, the thread id -- at most 256 characters -- and a
number)."""
