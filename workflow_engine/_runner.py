"""The superstep loop: run the planned executors, apply the barrier, checkpoint, repeat.

Order inside one superstep, and why:

1. executors with messages run concurrently (one task each; a lone executor runs inline);
   their events are released in graph order, the first live, so the stream is deterministic;
2. at the barrier, effects apply in graph order: state, shared state, outputs, requests, then
   sends are routed (conditions evaluated first, then the pure planner);
3. the checkpoint is saved -- and only then are the superstep's ``WorkflowOutputEvent``s, its
   ``SuperstepCompletedEvent`` and new ``RequestInfoEvent``s published, so every output and
   request id a client can see exists in the store (events that report progress -- an executor
   invoked, an agent's streamed text -- are live).

A failing handler ends the run FAILED without touching the last checkpoint, so it stays a valid
point to retry from.
"""

from __future__ import annotations

import inspect
import logging
import os
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
import sniffio

from ._checkpoint import (
    CHECKPOINT_SCHEMA_VERSION,
    Checkpoint,
    CheckpointChanges,
    CheckpointStore,
    MessageRecord,
    RequestRecord,
    construct,
    message_prefixes,
    settle_answers,
)
from ._codec import JsonCodec, starts_with
from ._context import ExecutorStep, StepScope, WorkflowContext
from ._errors import (
    CheckpointNotFoundError,
    CheckpointStoreError,
    EffectInDoubtError,
    LeaseLostError,
    StoreCorruptError,
    StoredTypeChangedError,
    StoreUnavailableError,
    WorkflowError,
)
from ._events import (
    EffectInDoubtEvent,
    ErrorDetails,
    ExecutorCompletedEvent,
    ExecutorFailedEvent,
    ExecutorInvokedEvent,
    RequestInfoEvent,
    SuperstepCompletedEvent,
    SuperstepStartedEvent,
    WorkflowEvent,
    WorkflowFailedEvent,
    WorkflowOutputEvent,
    WorkflowRunState,
    WorkflowStatusEvent,
)
from ._executor import Executor
from ._graph import Graph
from ._identity import derive_id, idempotency_key, send_id
from ._journal import InMemoryJournal, JournalStore, keeps_journal
from ._planner import NOT_ENCODED, Envelope, Send, deliver, edge_failed, plan_superstep
from ._pump import Emitter, waits_for_its_reader
from ._requests import EffectResolution, ExternalRequest, InDoubtEffect

log = logging.getLogger("workflow_engine.runner")

_STOPS_THE_RUN = (
    LeaseLostError,
    StoreCorruptError,
    StoreUnavailableError,
    CheckpointNotFoundError,
    StoredTypeChangedError,
)
"""What a handler may meet that is not its failure: another worker owns the run now; the run's
stored state is damaged, cannot be read now, or is no longer stored (a list state read when
first needed, see ``StoredItem``); or it no longer fits the code. The superstep writes nothing
(a FAILED status would hide it) and the error stops the run's execution, saying why."""


class RunnableWorkflow(Protocol):
    """What the loop needs of a workflow (``Workflow`` provides it; the loop does not import
    it, so the two modules do not depend on each other)."""

    graph: Graph
    codec: JsonCodec
    fallback_journal: InMemoryJournal

    @property
    def name(self) -> str: ...

    @property
    def signature(self) -> str: ...

    def stored_type_name(self, annotation: Any) -> str: ...

    def declared_answer_type(self, annotation: Any) -> Any | None: ...


Emit = Callable[[WorkflowEvent], None]


_FINISHED = WorkflowRunState.IDLE
"""A run whose commit says this is done: a cancel requested meanwhile is moot."""


@dataclass
class RunState:
    """A run's live state between supersteps. Executor/shared state is kept encoded (that is
    what makes ``get_state`` return copies and a checkpoint cheap); messages stay decoded."""

    run_id: str
    superstep: int = 0
    secret: str = ""
    inbox: list[Envelope] = field(default_factory=list)
    executor_states: dict[str, dict[str, Any]] = field(default_factory=dict)
    shared: dict[str, Any] = field(default_factory=dict)
    shared_flat: dict[str, Any] = field(default_factory=dict)
    """Shared keys whose encoding (this very object in ``shared``) is a list of JSON
    primitives, so reading it is a copy with no type scan (not persisted: a cache)."""
    shared_exact: set[str] = field(default_factory=set)
    """Of those, the keys whose list holds no bool: ``==`` on it is exact (a cache too)."""
    fan_in: dict[str, dict[str, list[Any]]] = field(default_factory=dict)
    pending: dict[str, ExternalRequest] = field(default_factory=dict)
    answered: dict[str, Any] = field(default_factory=dict)
    """Answers kept whole (just applied, or still in flight); see ``Checkpoint``."""
    answered_digests: dict[str, str] = field(default_factory=dict)
    """Every other answered request, as ``"<answer digest> <response type>"``."""
    digests_shared: bool = False
    """``answered_digests`` is a checkpoint's too (checkpoints are immutable): copied before
    a digest is added. It grows with every answer a run ever took, so copying it at each
    checkpoint cost a long chat O(answers) per superstep; now O(answers) per answer."""
    cancelled: list[str] = field(default_factory=list)
    encoded_outputs: list[Any] = field(default_factory=list)
    status: WorkflowRunState = WorkflowRunState.IN_PROGRESS
    checkpoint: Checkpoint | None = None
    error: ErrorDetails | None = None

    def was_answered(self, request_id: str) -> bool:
        return request_id in self.answered or request_id in self.answered_digests

    def in_doubt(self) -> bool:
        """A step's effect is in doubt: no superstep runs until a person says what happened."""
        return bool(self.pending) and any(r.effect_key is not None for r in self.pending.values())

    def resting_status(self) -> WorkflowRunState:
        """The status this state has if the run stops here."""
        if self.inbox and not self.in_doubt():
            return WorkflowRunState.IN_PROGRESS
        if self.pending:
            return WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
        return WorkflowRunState.IDLE


class OrderedEmitter:
    """Releases concurrent executors' events in graph order: the earliest unfinished executor
    streams live, later ones are buffered until every executor before them has finished."""

    def __init__(self, emit: Emit, count: int) -> None:
        self._emit = emit
        self._head = 0
        self._buffers: list[list[WorkflowEvent]] = [[] for _ in range(count)]
        self._done = [False] * count

    def emitter(self, index: int) -> Emit:
        def emit(event: WorkflowEvent) -> None:
            if index == self._head:
                self._emit(event)
            else:
                self._buffers[index].append(event)

        return emit

    def finish(self, index: int) -> None:
        self._done[index] = True
        while self._head < len(self._done) and self._done[self._head]:
            self._head += 1
            if self._head < len(self._done):
                for event in self._buffers[self._head]:
                    self._emit(event)
                self._buffers[self._head].clear()


def new_checkpoint_id() -> str:
    """32 hex digits: the microseconds since the epoch (14), then 72 random bits.

    Time first, so ids a store indexes arrive in nearly ascending order: each insert lands on
    the index's last page instead of a random one (measured: 75 -> 54 µs for a W3 commit's
    statements in SQLite). Unique by the random part; nothing orders checkpoints by id."""
    return f"{time.time_ns() // 1000:014x}{os.urandom(9).hex()}"


def encoded_fan_in(
    fan_in: dict[str, dict[str, list[Any]]], enc: Callable[[Any], Any]
) -> dict[str, dict[str, list[Any]]]:
    """Fan-in buffers (group -> source -> messages) as a checkpoint stores them."""
    return {
        g: {src: [enc(m) for m in msgs] for src, msgs in buf.items()} for g, buf in fan_in.items()
    }


async def run_concurrently(
    calls: Sequence[tuple[Callable[..., Coroutine[Any, Any, None]], tuple[Any, ...]]],
) -> None:
    """Run the calls as concurrent tasks and wait for all of them.

    On asyncio this uses ``asyncio.TaskGroup`` directly: spawning a thousand tasks through anyio
    costs about four times as much, and it dominated fan-out supersteps. The calls never raise
    (handler errors are caught per executor), so the two behave the same.
    """
    if sniffio.current_async_library() == "asyncio":
        import asyncio  # (running on it: loaded; importing the kernel does not load it)

        async with asyncio.TaskGroup() as group:
            for func, args in calls:
                group.create_task(func(*args))
        return
    async with anyio.create_task_group() as tg:
        for func, args in calls:
            tg.start_soon(func, *args)


class RunLoop:
    """Drives one run (or one continuation of it) until it rests, fails or is cancelled."""

    def __init__(
        self,
        workflow: RunnableWorkflow,
        state: RunState,
        emit: Emit,
        store: CheckpointStore | None,
        max_supersteps: int,
    ) -> None:
        self.workflow = workflow
        self.graph = workflow.graph
        self.codec = workflow.codec
        self.state = state
        self.emit = emit
        self.store = store
        self.max_supersteps = max_supersteps
        # a cancel stored while no worker could honour it (its worker died mid-superstep): the
        # point this continuation starts from is the boundary that honours it
        self.cancel_requested = bool(getattr(store, "cancel_requested", False))
        self.cut_off: Sequence[InDoubtEffect] | None = getattr(store, "cut_off_steps", None)
        """The steps the superstep after this continuation's checkpoint journaled an intent for
        and no result, before the run stopped (a crash): asked about before it runs again (the
        runtime finds them; see ``_ask_about_cut_off``)."""
        self._cancel_scope: anyio.CancelScope | None = None
        reader = waits_for_its_reader(emit)
        self.readers: list[Emitter[Any]] = [reader] if reader is not None else []
        """The readers of the streams the run's events go to, each waited for once behind
        (see ``BACKLOG``)."""
        self._dirty = False
        self._executing = False
        self.journal: JournalStore = store if keeps_journal(store) else workflow.fallback_journal
        # Without a store nothing survives the process, and continuing one checkpoint twice is
        # legal: each continuation journals under its own namespace. With a store, history is
        # linear (a store refuses a commit that does not follow its latest checkpoint), so the
        # run id is the namespace and a re-executed superstep finds its journal.
        self.journal_run = state.run_id if store is not None else new_checkpoint_id()
        self.committed_outputs: list[Any] = []
        """Outputs of supersteps committed by this continuation (a failed one adds none)."""
        self.unsaved: CheckpointChanges | None = None
        """Changes made before the first superstep and not committed yet (answers applied where
        the store keeps them): the next commit includes them."""
        self.encoded_requests: dict[str, RequestRecord] = {}
        """Without a store: the pending requests as encoded when their superstep ended, before
        their events went out (a stream's consumer that changes a request's data in place
        changes what it was shown, not what the run asked -- outside tester 185)."""

    def ensure_checkpoint(self) -> Checkpoint:
        """The checkpoint matching the current state (built now if the run had no store)."""
        if self._dirty or self.state.checkpoint is None:
            self._dirty = False
            return self.make_checkpoint(chained=False)
        return self.state.checkpoint

    # --- checkpoints ----------------------------------------------------------------------------

    def make_checkpoint(
        self, changes: CheckpointChanges | None = None, *, chained: bool = True
    ) -> Checkpoint:
        """Snapshot the state as an immutable Checkpoint (payloads encoded by the codec).

        ``chained``: ``changes`` describe exactly what differs from the previous checkpoint, so a
        store may persist it as a delta; an unchained checkpoint is a standalone snapshot.
        """
        s = self.state
        enc = self.codec.encode
        previous = s.checkpoint if chained else None
        changes = changes or NO_CHANGES
        if s.answered:  # answers kept whole only while applied or in flight
            keep = {e.request.request_id for e in s.inbox if e.request is not None}
            keep.update(changes.requests_answered)
            if s.digests_shared and not keep.issuperset(s.answered):  # (one to add)
                s.answered_digests, s.digests_shared = dict(s.answered_digests), False
            s.answered = settle_answers(s.answered, s.answered_digests, keep)
        messages = []  # (loops, not comprehensions, on the superstep's path: see ``_barrier``)
        for e in s.inbox:
            record = construct(
                MessageRecord,
                source_id=e.source_id,
                target_id=e.target_id,
                data=enc(e.data) if e.encoded is NOT_ENCODED else e.encoded,
                request_id=e.request.request_id if e.request else None,
                message_id=e.message_id,
            )
            messages.append(record)
        if previous is not None and messages and previous.messages:
            # a list a message in flight passes on grown (a conversation): a delta stores the rest
            grown = message_prefixes(messages, previous.messages)
            if grown:
                changes = changes.model_copy(update={"message_appends": grown})
        cp = construct(
            Checkpoint,
            schema_version=CHECKPOINT_SCHEMA_VERSION,
            codec=self.codec.name,
            checkpoint_id=new_checkpoint_id(),
            parent_id=previous.checkpoint_id if previous else None,
            run_id=s.run_id,
            workflow_name=self.workflow.name,
            workflow_signature=self.workflow.signature,
            superstep=s.superstep,
            status=s.status if s.status.is_terminal else s.resting_status(),
            created_at=_now(),
            step_secret=s.secret,
            messages=messages,
            executor_states=dict(s.executor_states),
            shared_state=dict(s.shared),
            fan_in_buffers=encoded_fan_in(s.fan_in, enc) if s.fan_in else {},
            pending_requests=self._pending_records(previous),
            answered_requests=dict(s.answered),
            answered_digests=s.answered_digests,
            cancelled_requests=list(s.cancelled),
            outputs=list(s.encoded_outputs),
            changes=changes,
        )
        s.checkpoint = cp
        s.digests_shared = True
        return cp

    def _pending_records(self, previous: Checkpoint | None) -> dict[str, RequestRecord]:
        """The pending requests as a checkpoint stores them: a request pending in ``previous``
        too keeps its record there (a request never changes, and its id names it), so only
        new ones are encoded -- a run waiting on 1,000 requests encoded all of them at every
        checkpoint."""
        kept = previous.pending_requests if previous is not None else self.encoded_requests
        enc, name_of = self.codec.encode, self.workflow.stored_type_name
        records = {}
        for request_id, request in self.state.pending.items():
            records[request_id] = kept.get(request_id) or request_record(request, enc, name_of)
        return records

    async def commit(self, changes: CheckpointChanges | None = None) -> None:
        """Checkpoint into the store. A failing store stops the run loudly. Without a store the
        checkpoint is built once, when the run rests (see ``ensure_checkpoint``)."""
        if self.store is None:
            self._dirty = True
            if changes is not None and changes.requests_added:
                self.encoded_requests = self._pending_records(None)
            return
        if self.unsaved is not None:
            changes = joined_changes(self.unsaved, changes or NO_CHANGES)
            self.unsaved = None
        cp = self.make_checkpoint(changes)
        try:
            await self.store.save(cp)
        except WorkflowError:
            raise
        except Exception as exc:
            raise CheckpointStoreError(
                f"run {self.state.run_id!r}: saving the checkpoint of superstep "
                f"{cp.superstep} failed: {exc}"
            ) from exc
        journal = self.journal
        if type(journal) is InMemoryJournal:  # durable stores compact inside their commit
            journal.compact(self.journal_run, cp.superstep)
        if getattr(self.store, "cancel_requested", False) and cp.status is not _FINISHED:
            # a durable cancel request: honoured at this boundary -- unless this commit finished
            # the run, which stays finished (it was then marked cancelled after its effects
            # ran, the canceller told it worked: outside testers 110 and 111)
            self.cancel_requested = True

    # --- the loop -------------------------------------------------------------------------------

    async def run(self) -> WorkflowRunState:
        """Run supersteps until the run rests, fails, hits the limit or is cancelled.

        One cancel scope spans the run; ``cancel()`` fires it only while executors run, so a
        barrier or a store write is never interrupted half-way.
        """
        with anyio.CancelScope() as cancel_scope:
            self._cancel_scope = cancel_scope
            status = await self._supersteps()
        self._cancel_scope = None
        if self.cancel_requested:
            return await self.finish_cancelled()
        assert status is not None
        await self.commit_unsaved()  # no superstep committed them
        return status

    async def commit_unsaved(self) -> None:
        """Commit what changed before the first superstep, if that is still unsaved."""
        if self.unsaved is not None:
            await self.commit()

    async def _supersteps(self) -> WorkflowRunState | None:
        s = self.state
        steps = 0
        while s.inbox and not s.in_doubt():
            if self.cancel_requested:
                return None
            if steps >= self.max_supersteps:
                s.status = WorkflowRunState.MAX_SUPERSTEPS_REACHED
                self.emit(WorkflowStatusEvent(s.status))
                return s.status
            if self.readers and any(reader.behind for reader in self.readers):
                # before the next superstep, not after the last: a run at rest -- its limit
                # reached too -- never waits (it gives its lease back at once: outside
                # testers 186, 188)
                await self._wait_for_readers()
                if self.cancel_requested:
                    return None
            steps += 1
            if not await self.superstep():
                if self.cancel_requested:
                    return None
                await self.commit_unsaved()  # the answers are applied, as before the failure
                s.status = WorkflowRunState.FAILED
                self.emit(WorkflowStatusEvent(s.status))
                return s.status
            if self.store is not None and not self.cancel_requested:
                # a cancelled caller (``Runtime.close()``, a deadline) stops a checkpointed run
                # here, after its commit, before the next superstep or resting: on asyncio a
                # run whose awaits never suspend (its commits run on the loop) never met the
                # cancellation and went on to its end (outside testers 90 and 91). (Without a
                # store nothing is lost by running on.)
                await anyio.lowlevel.checkpoint_if_cancelled()
        if self.cancel_requested:
            return None
        s.status = s.resting_status()
        self.emit(WorkflowStatusEvent(s.status))
        return s.status

    async def _wait_for_readers(self) -> None:
        """Wait until the streams' readers have caught up (see ``BACKLOG``). A cancel another
        process stored meanwhile is asked for then, and honoured before the next superstep
        (the run went on with one more: outside tester 188)."""
        for reader in self.readers:
            await reader.caught_up()
        renew = getattr(self.store, "renew_once", None)
        if renew is not None:
            await renew()
        if getattr(self.store, "cancel_requested", False):
            self.cancel_requested = True

    async def finish_cancelled(self) -> WorkflowRunState:
        s = self.state
        # first the answers applied (their requests get their rows), then the cancelling
        await self.commit_unsaved()
        changes = changes_of(requests_cancelled=list(s.pending))
        s.cancelled.extend(s.pending)
        s.pending = {}
        s.inbox = []
        s.fan_in = {}
        s.status = WorkflowRunState.CANCELLED
        await self.commit(changes)
        self.emit(WorkflowStatusEvent(s.status))
        return s.status

    def fail(self, exc: BaseException, executor_id: str | None = None) -> None:
        details = ErrorDetails.from_exception(exc, executor_id)
        # (INFO: a server's log keeps where a run failed; a command line, which says the
        # error itself, configures no logging, and Python's last resort shows WARNING up)
        where = f" in executor {executor_id!r}" if executor_id is not None else ""
        log.info("run %r failed%s: %s", self.state.run_id, where, details.message, exc_info=exc)
        self.state.error = details
        self.emit(WorkflowFailedEvent(details))

    async def superstep(self) -> bool:
        """Run one superstep; False if it failed or was cancelled (state untouched then)."""
        s = self.state
        number = s.superstep + 1
        self.emit(SuperstepStartedEvent(number))
        if self.cut_off:
            await self._ask_about_cut_off(number)
            return True
        plan = plan_superstep(self.graph, s.inbox)
        scope = StepScope(
            s.run_id,
            number,
            self.codec,
            s.shared,
            self.graph.successors,
            self.journal,
            self.journal_run,
            s.secret,
            getattr(self.store, "ensure_held", None),
            s.shared_flat,
            self.workflow.declared_answer_type,
        )
        steps: list[ExecutorStep] = []
        failures: list[tuple[str, BaseException]] = []
        self._executing = True
        try:
            if len(plan) == 1:
                executor_id, envelopes = plan[0]
                step = ExecutorStep(executor_id, s.executor_states.get(executor_id, {}), self.emit)
                steps.append(step)
                await self._invoke(scope, step, envelopes, failures)
            else:
                ordered = OrderedEmitter(self.emit, len(plan))
                for index, (executor_id, _) in enumerate(plan):
                    state = s.executor_states.get(executor_id, {})
                    steps.append(ExecutorStep(executor_id, state, ordered.emitter(index)))

                # (a method and a loop, not a closure or a comprehension: on Python 3.11 what
                # either reads of this function's variables becomes cells that every superstep
                # allocates, each an object for the garbage collector to walk)
                calls = []
                for index, (_, envelopes) in enumerate(plan):
                    args = (scope, steps[index], envelopes, failures, ordered, index)
                    calls.append((self._invoke_ordered, args))
                await run_concurrently(calls)
        finally:
            self._executing = False
        if self.cancel_requested:  # the scope may be cancelled: await nothing more in it
            return False
        if failures:
            failures.sort(key=self._graph_position)
            for _, exc in failures:
                if isinstance(exc, _STOPS_THE_RUN):
                    raise exc
            in_doubt = [(e, x) for e, x in failures if isinstance(x, EffectInDoubtError)]
            if in_doubt:
                await self._ask_about_effects(number, in_doubt)
                return True
            executor_id, exc = failures[0]
            self.fail(exc, executor_id)
            return False
        try:
            new_requests, changes = await self._barrier(number, steps)
        except Exception as exc:
            # routing: the executor whose message it was, where the error says (a condition,
            # a message no successor takes)
            self.fail(exc, getattr(exc, "executor_id", None))
            return False
        await self.commit(changes)
        # what the commit recorded is published only now: a failed commit publishes none of it
        emit = self.emit
        for step in steps:
            for copy, _ in step.outputs:
                emit(WorkflowOutputEvent(copy, step.executor_id))
        emit(SuperstepCompletedEvent(number))
        for request in new_requests:
            emit(RequestInfoEvent(request))
        return True

    async def _ask_about_cut_off(self, number: int) -> None:
        """The steps of superstep ``number`` that the run stopped in the middle of (their intent
        journaled, no result): asked about before the superstep runs again. Re-executed, it
        asked only about those its code took again -- one a fix deployed between the crash and
        the resume renamed, or another branch skipped, was never asked about, its intent
        deleted with the superstep's commit, its effect (a charge) made again under a new name
        (outside tester 193) -- and it ran new effects before asking."""
        cut_off, self.cut_off = self.cut_off or (), ()
        in_doubt: list[tuple[str, BaseException]] = []
        for effect in cut_off:
            doubt = EffectInDoubtError(
                f"run {self.state.run_id!r}: step {effect.step!r} of executor "
                f"{effect.executor_id!r} started before the run stopped (a crash, a kill, an "
                "interruption) and recorded no result",
                step_key=effect.step_key,
                description=effect.description,
                step=effect.step,
            )
            self.emit(failed_event(effect.executor_id, doubt))
            in_doubt.append((effect.executor_id, doubt))
        in_doubt.sort(key=self._graph_position)
        await self._ask_about_effects(number, in_doubt)

    def _graph_position(self, failure: tuple[str, BaseException]) -> int:
        """Where a failed step's executor stands in the graph (failures are raised in order)."""
        # (a step cut off before a crash may be of an executor the graph no longer has)
        return self.graph.order.get(failure[0], len(self.graph.order))

    async def _invoke_ordered(
        self,
        scope: StepScope,
        step: ExecutorStep,
        envelopes: list[Envelope],
        failures: list[tuple[str, BaseException]],
        ordered: OrderedEmitter,
        index: int,
    ) -> None:
        """``_invoke``, one of a superstep's concurrent steps; then its events go out in order."""
        await self._invoke(scope, step, envelopes, failures)
        ordered.finish(index)

    async def _ask_about_effects(
        self, number: int, in_doubt: Sequence[tuple[str, BaseException]]
    ) -> None:
        """Steps whose effect may have happened before a crash: the superstep is not applied;
        the run pauses with one request per step asking a person what happened."""
        s = self.state
        added: list[ExternalRequest] = []
        for executor_id, exc in in_doubt:
            assert isinstance(exc, EffectInDoubtError)
            # the n-th time this step is in doubt (a person may say "it did not happen", and the
            # retry may be cut off again): each question gets its own id
            asked = 0
            request_id = derive_id(s.secret, "in-doubt", s.run_id, exc.step_key, "0")
            while s.was_answered(request_id) or request_id in s.cancelled:
                asked += 1
                request_id = derive_id(s.secret, "in-doubt", s.run_id, exc.step_key, str(asked))
            if request_id in s.pending or any(r.request_id == request_id for r in added):
                continue
            question = InDoubtEffect(
                executor_id=executor_id,
                step=exc.step,
                description=exc.description,
                step_key=exc.step_key,
                idempotency_key=idempotency_key(s.secret, s.run_id, exc.step_key),
            )
            added.append(
                ExternalRequest(
                    request_id=request_id,
                    port_id=executor_id,
                    data=question,
                    response_type=EffectResolution,
                    source_executor_id=executor_id,
                    superstep=number,
                    run_id=s.run_id,
                    from_port=False,
                    effect_key=exc.step_key,
                )
            )
        for request in added:
            s.pending[request.request_id] = request
        await self.commit(changes_of(requests_added=[r.request_id for r in added]))
        for request in added:
            self.emit(RequestInfoEvent(request))

    async def _invoke(
        self,
        scope: StepScope,
        step: ExecutorStep,
        envelopes: list[Envelope],
        failures: list[tuple[str, BaseException]],
    ) -> None:
        executor_id = step.executor_id
        node = self.graph.nodes[executor_id]
        assert isinstance(node, Executor)
        step.answered_by = node.response_handlers
        step.emit(ExecutorInvokedEvent(executor_id))
        try:
            for env in envelopes:
                request = env.request
                if request is not None:
                    rspec = node.find_response_handler(request.data, env.data)
                    ctx: WorkflowContext[Any, Any] = WorkflowContext(
                        scope, step, rspec.sends, rspec.yields, rspec.name, env.message_id
                    )
                    await rspec.func(node, request.data, env.data, ctx)
                    continue
                spec = node.require_handler(env.data)
                if spec.takes_context:
                    ctx = WorkflowContext(
                        scope, step, spec.sends, spec.yields, spec.name, env.message_id
                    )
                    if spec.bound:
                        await spec.func(node, env.data, ctx)
                    else:
                        await spec.func(env.data, ctx)
                elif spec.bound:
                    await spec.func(node, env.data)
                else:
                    await spec.func(env.data)
        except Exception as exc:
            failure: Exception | None = exc
            step.emit(failed_event(executor_id, exc))
        else:
            failure = None
        finally:
            if step.effects:  # effects the handler started and no longer awaits
                await step.effects_settled()
        # a step found in doubt pauses the run even if the handler caught its error or a task
        # group wrapped it (the run failed for good, or went on, with no one asked: outside
        # tester 60); and each one found -- siblings in a gather too -- is asked at once
        in_doubt = []  # (a loop: see ``_barrier``)
        for doubt in step.in_doubt:
            # (one whose error the handler let through fails the run: see ``_unrecorded``)
            if doubt is not failure and (doubt.raised is None or doubt.raised is not failure):
                in_doubt.append(doubt)
        if failure is not None:
            failures.append((executor_id, failure))
        elif not in_doubt:
            step.emit(ExecutorCompletedEvent(executor_id))
            return
        for doubt in in_doubt:  # each said, as each is asked about (tester 70: one of two was)
            step.emit(failed_event(executor_id, doubt))
            failures.append((executor_id, doubt))

    async def _barrier(
        self, number: int, steps: Sequence[ExecutorStep]
    ) -> tuple[list[ExternalRequest], CheckpointChanges]:
        """Apply every effect of the superstep; compute everything before mutating the state."""
        s = self.state
        executor_states = s.executor_states
        shared = s.shared
        flat = s.shared_flat
        state_keys: dict[str, list[str]] = {}
        state_appends: dict[str, dict[str, int]] = {}
        shared_keys: list[str] = []
        exact: set[str] = set()  # written shared keys whose new list holds no bool
        new_outputs: list[Any] = []
        encoded_outputs: list[Any] = []
        new_requests: list[ExternalRequest] = []
        sends: list[Send] = []
        for step in steps:  # already in graph order
            if step.state_writes:
                if executor_states is s.executor_states:
                    executor_states = dict(executor_states)
                executor_states[step.executor_id] = {**step.state, **step.state_writes}
                state_keys[step.executor_id] = list(step.state_writes)
                grown = appended_prefixes(step.state, step.state_writes, step.appended)
                if grown:
                    state_appends[step.executor_id] = grown
            if step.shared_writes:
                if shared is s.shared:
                    shared = dict(shared)
                    flat = dict(flat)
                shared.update(step.shared_writes)
                if step.flat_writes:
                    flat.update(step.flat_writes)
                for k in step.shared_writes:
                    if k not in shared_keys:
                        shared_keys.append(k)
                for k in step.shared_writes:  # the later writer's list decides
                    if step.exact_writes and k in step.exact_writes:
                        exact.add(k)
                    else:
                        exact.discard(k)
            for copy, encoded in step.outputs:  # snapshots taken (and checked) at yield time
                new_outputs.append(copy)
                encoded_outputs.append(encoded)
            new_requests.extend(step.requests)
            source = step.executor_id
            for ordinal, (message, target, encoded) in enumerate(step.sent):
                sends.append(
                    Send(source, message, target, send_id(number, ordinal, source), encoded)
                )
        # (loops, not comprehensions: on Python 3.11 the variables a comprehension reads
        # become cells, objects allocated at every call of the function that holds them)
        shared_appends = {}
        if shared_keys:
            written = {}
            for k in shared_keys:
                written[k] = shared[k]
            shared_appends = appended_prefixes(s.shared, written, exact=exact & s.shared_exact)
        delivery = await self.route(sends, s.fan_in)
        self.give_copies(delivery.inbox)
        self.give_copies(delivery.port_messages)
        for env in delivery.port_messages:
            new_requests.append(self.port_request(env, number))
        # -- commit point: nothing below can fail --
        s.superstep = number
        s.executor_states = executor_states
        s.shared = shared
        if flat is not s.shared_flat:  # keep only what is still the committed encoding
            kept_flat = {}
            for k, v in flat.items():
                if shared.get(k) is v:
                    kept_flat[k] = v
            s.shared_flat = kept_flat
        if shared_keys:
            s.shared_exact = (s.shared_exact - set(shared_keys)) | exact
        s.inbox = delivery.inbox
        s.fan_in = delivery.fan_in
        s.encoded_outputs.extend(encoded_outputs)
        self.committed_outputs.extend(new_outputs)
        for request in new_requests:
            s.pending[request.request_id] = request
        changes = changes_of(
            executor_state_keys=state_keys,
            executor_state_appends=state_appends,
            shared_state_keys=shared_keys,
            shared_state_appends=shared_appends,
            outputs_added=len(new_outputs),
            requests_added=[r.request_id for r in new_requests],
        )
        return new_requests, changes

    def give_copies(self, envelopes: list[Envelope]) -> None:
        """Each receiver gets its own copy of its message (a receiver that mutates it affects
        no sibling, exactly as after a restore). A sent message is already a private snapshot
        decoded from what the checkpoint stores: its first receiver takes that one, every
        other receiver a fresh decode."""
        encode = self.codec.encode
        decode = self.codec.decode
        handed: set[int] = set()
        for env in envelopes:
            if env.encoded is NOT_ENCODED:  # a fan-in batch: assembled here, encode it once
                env.encoded = encode(env.data)
                env.data = decode(env.encoded)
            elif id(env.data) in handed:
                env.data = decode(env.encoded)
            else:
                handed.add(id(env.data))

    def port_request(self, env: Envelope, superstep: int) -> ExternalRequest:
        """The request a message delivered to a RequestPort becomes; its id derives from the
        delivery's id, so it is unique in the run and the same on re-execution."""
        port = self.graph.nodes[env.target_id]
        s = self.state
        return ExternalRequest(
            request_id=derive_id(s.secret, "port", s.run_id, env.message_id),
            port_id=env.target_id,
            data=env.data,
            response_type=port.response_type,  # type: ignore[union-attr]
            source_executor_id=env.source_id,
            superstep=superstep,
            run_id=self.state.run_id,
            from_port=True,
        )

    async def route(self, sends: list[Send], fan_in: dict[str, dict[str, list[Any]]]) -> Any:
        """Evaluate edge conditions (possibly async user code), then let the planner route."""
        verdicts: list[dict[str, Any]] = []
        conditional = self.graph.conditional
        for send in sends:
            groups = conditional.get(send.source_id)
            verdict: dict[str, Any] = {}
            for g in groups or ():
                try:
                    if g.kind == "single":
                        verdict[g.id] = bool(await _call(g.condition, send.data))
                    else:
                        verdict[g.id] = await _choose_case(g.cases, len(g.targets), send.data)
                except Exception as exc:
                    kind = "condition" if g.kind == "single" else "switch-case conditions"
                    raise edge_failed(f"the {kind} of the edge", g, send.source_id, exc) from exc
            verdicts.append(verdict)
        return deliver(self.graph, sends, verdicts, fan_in)

    def cancel(self) -> None:
        self.cancel_requested = True
        if self._executing and self._cancel_scope is not None:
            self._cancel_scope.cancel()


NO_CHANGES = CheckpointChanges()


def failed_event(executor_id: str, exc: BaseException) -> ExecutorFailedEvent:
    """The event for a handler's error: a step found in doubt is said as such (the run asks
    about it next), any other error as a failure."""
    details = ErrorDetails.from_exception(exc, executor_id)
    if isinstance(exc, EffectInDoubtError):
        return EffectInDoubtEvent(executor_id, details, exc.step_key)
    return ExecutorFailedEvent(executor_id, details)


def appended_prefixes(
    old: dict[str, Any],
    writes: dict[str, Any],
    kept: dict[str, int] | None = None,
    exact: set[str] | frozenset[str] = frozenset(),
) -> dict[str, int]:
    """Keys whose new (encoded) value is a list that extends the old one: key -> how many items
    it kept. A conversation that grows by a turn is then stored as the turn, not again whole.

    ``kept``: keys known to extend (``append_state``), with the count. ``exact``: keys whose
    old and new lists hold no bool, so ``==`` proves their items equal; any other list's items
    must be the same objects or equal with their types (``True == 1``, but a delta that kept
    the ``1`` would bring back ``1`` where the run had ``True``)."""
    out: dict[str, int] = {}
    for key, new in writes.items():
        if kept is not None and key in kept:
            if kept[key]:
                out[key] = kept[key]
            continue
        before = old.get(key)
        if type(new) is list and type(before) is list and before:
            n = len(before)
            if key in exact:
                if len(new) >= n and new[:n] == before:
                    out[key] = n
            elif starts_with(new, before):
                out[key] = n
    return out


def changes_of(
    *,
    executor_state_keys: dict[str, list[str]] | None = None,
    executor_state_appends: dict[str, dict[str, int]] | None = None,
    shared_state_keys: list[str] | None = None,
    shared_state_appends: dict[str, int] | None = None,
    outputs_added: int = 0,
    requests_added: list[str] | None = None,
    requests_answered: list[str] | None = None,
    requests_cancelled: list[str] | None = None,
) -> CheckpointChanges:
    return construct(
        CheckpointChanges,
        executor_state_keys=executor_state_keys or {},
        executor_state_appends=executor_state_appends or {},
        shared_state_keys=shared_state_keys or [],
        shared_state_appends=shared_state_appends or {},
        outputs_added=outputs_added,
        requests_added=requests_added or [],
        requests_answered=requests_answered or [],
        requests_cancelled=requests_cancelled or [],
        message_appends=[],  # (make_checkpoint finds them)
    )


def joined_changes(first: CheckpointChanges, then: CheckpointChanges) -> CheckpointChanges:
    """The changes of two steps committed as one: ``first`` only applied answers (it changes
    requests, nothing else)."""
    assert not (first.executor_state_keys or first.shared_state_keys or first.outputs_added)
    return then.model_copy(
        update={
            name: [*getattr(first, name), *getattr(then, name)]
            for name in ("requests_added", "requests_answered", "requests_cancelled")
        }
    )


def request_record(
    request: ExternalRequest, encode: Callable[[Any], Any], name_of: Callable[[Any], str]
) -> RequestRecord:
    return construct(
        RequestRecord,
        request_id=request.request_id,
        port_id=request.port_id,
        source_executor_id=request.source_executor_id,
        kind=request.kind,
        data=encode(request.data),
        response_type=name_of(request.response_type),
        superstep=request.superstep,
    )


async def _call(predicate: Any, message: Any) -> Any:
    result = predicate(message)
    if inspect.isawaitable(result):
        result = await result
    return result


async def _choose_case(cases: Sequence[Any], n_targets: int, message: Any) -> int | None:
    for index, predicate in enumerate(cases):
        if await _call(predicate, message):
            return index
    return len(cases) if n_targets > len(cases) else None


_now = time.time
