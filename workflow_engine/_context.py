"""The context a handler receives: the only way an executor affects the run.

Everything a handler does through the context is collected in an :class:`ExecutorStep` and applied
at the superstep barrier (Pregel/BSP): messages are delivered in the next superstep, state writes
become visible to other executors after the barrier, requests become pending. So a superstep is
all-or-nothing, and what a checkpoint records is exactly what the next superstep sees.
"""

from __future__ import annotations

import inspect
import json
import operator
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextvars import ContextVar
from itertools import islice
from typing import TYPE_CHECKING, Annotated, Any, Generic, Never, get_origin, overload

import anyio
import sniffio
from typing_extensions import TypeVar

from ._codec import (
    _PRIMITIVES,
    TaggedJsonCodec,
    _scalar_list_copy,
    decode_stored,
    encode_checked,
    is_text,
    require_text,
    snapshot,
    starts_with,
)
from ._errors import (
    DefinitionError,
    EffectInDoubtError,
    MessageNotHandledError,
    SerializationError,
    StorageError,
    UndeclaredOutputError,
    UnknownTargetError,
    UnregisteredTypeError,
    UsageError,
)
from ._events import WorkflowEvent
from ._identity import derive_id, idempotency_key, is_input_delivery, step_key
from ._requests import ExternalRequest
from ._types import Matcher, is_assignable, type_name

if TYPE_CHECKING:
    from ._codec import JsonCodec
    from ._journal import JournalStore

TOut = TypeVar("TOut", default=Never)
TWorkflowOut = TypeVar("TWorkflowOut", default=Never)

_MISSING: Any = object()
_UNREAD: Any = object()


class StateItems(Sequence[Any]):
    """A list state read lazily (:meth:`WorkflowContext.get_state_items`): an item is decoded
    the first time it is read, then kept. So a run resumed with a conversation of thousands of
    messages decodes only the ones its handler looks at.

    Read-only. Its items may be the very objects an earlier view handed out (``reuse``): treat
    them as immutable (frozen models, say) -- unlike :meth:`WorkflowContext.get_state`, no read
    is a private copy.
    """

    __slots__ = ("_decode", "_encoded", "_source", "_values")

    def __init__(self, encoded: list[Any], decode: Callable[[Any], Any], source: tuple) -> None:
        self._encoded = encoded  # the stored encodings (never mutated)
        self._decode = decode
        self._source = source  # (codec, run, executor, key): whose decoded items may be reused
        self._values = [_UNREAD] * len(encoded)

    def __len__(self) -> int:
        return len(self._encoded)

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._encoded)))]
        value = self._values[index]
        if value is _UNREAD:
            value = self._values[index] = self._decode(self._encoded[index])
        return value

    def preload(self, appended: Sequence[Any], values: Sequence[Any]) -> None:
        """Read the items a handler just appended (``append_state(key, appended)``) as
        ``values`` -- what decoding and converting them gives, which the handler holds already
        (None where it does not) -- instead of decoding them again. Only where this view ends
        with those very objects; otherwise nothing changes."""
        k = len(appended)
        encoded = self._encoded
        start = len(encoded) - k
        if not k or k != len(values) or start < 0:
            return
        if not all(map(operator.is_, islice(encoded, start, None), appended)):
            return
        kept = self._values
        for i, value in enumerate(values, start):
            if value is not None and kept[i] is _UNREAD:
                kept[i] = value

    def _continuing(self, earlier: StateItems | None) -> StateItems:
        """This view, with the items ``earlier`` already decoded for the same stored encodings
        (a list that grew keeps its prefix: the same objects, so the check is cheap)."""
        if earlier is None or earlier._source != self._source:
            return self
        old, new = earlier._encoded, self._encoded
        n = len(old)
        if old is new:
            self._values = earlier._values
        elif n and starts_with(new, old):  # (exactly: ``True == 1``, ``-0.0 == 0.0``)
            self._values = earlier._values[:n] + self._values[n:]
        return self


class ExecutorStep:
    """What one executor did in one superstep; applied at the barrier in executor order."""

    __slots__ = (
        "answered_by",
        "appended",
        "effects",
        "emit",
        "exact_writes",
        "executor_id",
        "flat_writes",
        "in_doubt",
        "outputs",
        "requests",
        "sent",
        "shared_writes",
        "state",
        "state_writes",
    )

    def __init__(
        self, executor_id: str, state: dict[str, Any], emit: Callable[[WorkflowEvent], None]
    ) -> None:
        self.executor_id = executor_id
        self.state = state  # committed, encoded: this executor's keys
        self.emit = emit
        self.sent: list[tuple[Any, str | None, Any]] = []  # (copy, target, encoded)
        self.outputs: list[tuple[Any, Any]] = []  # (copy, encoded)
        self.state_writes: dict[str, Any] = {}
        self.shared_writes: dict[str, Any] = {}
        self.flat_writes: dict[str, Any] | None = None  # shared writes that are lists of primitives
        self.exact_writes: set[str] | None = None  # of those, the ones with no bool (see below)
        self.appended: dict[str, int] | None = None  # state key -> items kept by append_state
        self.requests: list[ExternalRequest] = []
        self.effects: set[anyio.Event] = set()  # ``run_once`` calls not yet over (their ends)
        self.in_doubt: list[EffectInDoubtError] = []
        """Steps found in doubt, even if the handler caught the error (``except Exception``)
        or a task group wrapped it: the run pauses to ask about each, all at once."""
        self.answered_by: Sequence[Any] | None = None
        """The executor's ``@response_handler`` specs (None: not known, nothing checked)."""

    async def effects_settled(self) -> None:
        """Wait until every ``run_once`` step of this invocation that is not idempotent is over
        -- its effect run and its result journaled, or refused -- even one the handler no
        longer awaits (a sibling in ``asyncio.gather`` raised, a task it started): ending the
        invocation before would leave its intent looking in doubt while the effect still runs,
        and a person asked then would truthfully say it did not happen. A cancellation arriving
        meanwhile is raised after; a second one stops waiting (as in ``run_to_its_end``)."""
        stopped: BaseException | None = None
        while self.effects:
            try:
                with anyio.CancelScope(shield=True):
                    await next(iter(self.effects)).wait()
            except BaseException as exc:  # asyncio's own cancellation (a scope's is shielded)
                if stopped is not None:
                    raise
                stopped = exc
        if stopped is not None:
            raise stopped


class StepScope:
    """Per-superstep facts every context shares (read-only for handlers)."""

    __slots__ = (
        "answer_type_declared",
        "codec",
        "flat_shared",
        "journal",
        "journal_run",
        "lease_guard",
        "run_id",
        "secret",
        "shared",
        "successors",
        "superstep",
    )

    def __init__(
        self,
        run_id: str,
        superstep: int,
        codec: JsonCodec,
        shared: dict[str, Any],
        successors: dict[str, frozenset[str]],
        journal: JournalStore,
        journal_run: str = "",
        secret: str = "",
        lease_guard: Callable[[], Awaitable[None]] | None = None,
        flat_shared: dict[str, Any] | None = None,
        answer_type_declared: Callable[[Any], Any] | None = None,
    ) -> None:
        self.run_id = run_id
        self.superstep = superstep
        self.codec = codec
        self.shared = shared  # committed, encoded
        self.successors = successors
        self.journal = journal
        self.journal_run = journal_run or run_id  # the journal's namespace for this run
        self.secret = secret  # the run's step secret (derives request ids, idempotency keys)
        self.lease_guard = lease_guard
        """Raises ``LeaseLostError`` unless this worker still holds the run (durable runs)."""
        self.answer_type_declared = answer_type_declared
        """The declared response type a stored request names for one ``request_info`` is
        given, None if the workflow cannot name it and read it back (``request_info`` refuses
        it: that answer could never be accepted)."""
        self.flat_shared = {} if flat_shared is None else flat_shared
        """Shared keys whose committed encoding (that very object) is a list of JSON
        primitives: decoding it is a plain copy (``RunState.shared_flat``)."""


class WorkflowContext(Generic[TOut, TWorkflowOut]):
    """Handed to every handler. ``TOut``: what it may send; ``TWorkflowOut``: what it may yield.

    ``WorkflowContext[int]`` sends ints; ``WorkflowContext[Never, str]`` only yields strs; a bare
    ``WorkflowContext`` does neither. Sending an undeclared type raises ``UndeclaredOutputError``.
    """

    __slots__ = (
        "_counters",
        "_delivery",
        "_handler_name",
        "_locks",
        "_scope",
        "_sends",
        "_step",
        "_yields",
    )

    def __init__(
        self,
        scope: StepScope,
        step: ExecutorStep,
        sends: Matcher,
        yields: Matcher,
        handler_name: str = "",
        delivery: str = "",
    ) -> None:
        self._scope = scope
        self._step = step
        self._sends = sends
        self._yields = yields
        self._handler_name = handler_name
        self._delivery = delivery
        self._counters: dict[str, int] | None = None
        self._locks: dict[str, anyio.Lock] | None = None

    @property
    def run_id(self) -> str:
        return self._scope.run_id

    @property
    def superstep(self) -> int:
        return self._scope.superstep

    @property
    def executor_id(self) -> str:
        return self._step.executor_id

    @property
    def successor_ids(self) -> frozenset[str]:
        """The nodes this executor has edges to (empty: its messages would go nowhere)."""
        return self._scope.successors.get(self._step.executor_id, frozenset())

    @property
    def delivery_id(self) -> str:
        """The deterministic id of the message this handler invocation is handling."""
        return self._delivery

    @property
    def from_input(self) -> bool:
        """Whether the message being handled is the run's input (given to ``run``/``start``
        from outside the workflow), not one an executor sent."""
        return is_input_delivery(self._delivery)

    def step_key(self, name: str) -> str:
        """The identity of step ``name`` of this handler invocation (see ``_identity``)."""
        if not isinstance(name, str) or not name:
            # (``1`` and ``"1"`` were one step: the second effect never ran, outside tester 166)
            raise UsageError(
                f"executor {self._step.executor_id!r}: step keys are non-empty text (str); got "
                f"{name!r} ({type_name(type(name))})"
            )
        if type(name) is not str:  # a str enum: its value ("Kind.CHARGE" made another step
            name = str.__str__(name)  # than "charge", equal to it: outside tester 173)
        if not name.isascii():  # (a lone surrogate failed a durable commit, unnamed)
            require_text((name,), f"the step key {name!r} of executor {self._step.executor_id!r}")
        scope = self._scope
        return step_key(scope.superstep, self._step.executor_id, self._delivery, name)

    def next_step_name(self, kind: str) -> str:
        """``kind#0``, ``kind#1``, ...: steps of one kind numbered in call order within this
        invocation (how agents name their model and tool calls)."""
        counters = self._counters
        if counters is None:
            counters = self._counters = {}
        n = counters.get(kind, 0)
        counters[kind] = n + 1
        return f"{kind}#{n}"

    def idempotency_key(self, name: str) -> str:
        """The key to hand an outside service for step ``name``: the same every time this
        delivery is re-executed (after a crash, in any process), different for every other
        step, run, branch and executor. ``<run id>:<opaque step id>``, so an outside system's
        log says which run asked."""
        scope = self._scope
        return idempotency_key(scope.secret, scope.run_id, self.step_key(name))

    async def run_once(
        self,
        key: str,
        func: Callable[[], Awaitable[Any]] | Callable[[], Any],
        *,
        idempotent: bool = False,
        description: Any = None,
    ) -> Any:
        """Run ``func`` once for step ``key`` of this delivery, surviving crashes and re-runs.

        ``func`` is an async function (or returns an awaitable), or a plain function: that one
        runs on the event loop's thread, so make a slow effect async.

        The step's identity is (superstep, executor, the message being handled, ``key``): the
        same delivery re-executed after a crash -- in any process, whatever answers arrived
        meanwhile -- returns the journaled result without calling ``func``; a different message,
        a later superstep (a loop) or another run is a different step and runs ``func``.

        Before calling ``func`` an *intent* is journaled. If the process dies after ``func``
        started and before its result was journaled, the effect may or may not have happened:
        on recovery an ``idempotent`` step simply runs again (with the same
        :meth:`idempotency_key`), any other step pauses the run with a request asking a person
        whether it happened (``description`` is shown to them) -- never a blind repeat.

        Two concurrent calls with one key in one invocation are one step: the second waits for
        the first and returns its result. The result must be encodable by the workflow's codec.

        A step that is not ``idempotent``, once started, runs to its end even if its caller is
        cancelled (a closed stream, a timeout): its result is recorded, then the cancellation
        goes on. And the invocation ends only once each of its steps is over, even one it no
        longer awaits (a sibling in ``asyncio.gather`` raised): an effect still running is
        never left looking in doubt.
        """
        name = self.step_key(key)
        func = _awaited(func)
        locks = self._locks
        if locks is None:
            locks = self._locks = {}
        lock = locks.get(name)
        if lock is None:
            lock = locks[name] = anyio.Lock()
        if (id(self._step), name) in _STEPS_RUNNING.get():
            raise UsageError(
                f"run_once({key!r}) of executor {self.executor_id!r} was called from within "
                "its own effect: it would wait for itself forever (give the inner step a key "
                "of its own)"
            )
        if idempotent:  # (cut off or left behind, it simply runs again: no need to wait)
            return await self._run_step_once(
                key, name, lock, func, idempotent=True, description=description
            )
        over = anyio.Event()
        effects = self._step.effects
        effects.add(over)
        try:
            return await self._run_step_once(
                key, name, lock, func, idempotent=False, description=description
            )
        finally:
            effects.discard(over)
            over.set()

    async def _run_step_once(
        self,
        key: str,
        name: str,
        lock: anyio.Lock,
        func: Callable[[], Awaitable[Any]],
        *,
        idempotent: bool,
        description: Any,
    ) -> Any:
        scope = self._scope
        journal = scope.journal
        run = scope.journal_run
        codec = scope.codec
        async with lock:
            entry = await journal.journal_get(run, name)
            if entry is not None and "value" in entry:
                # (damaged, it stops the run, named: decoded as the handler's, it failed the run
                # as if the handler had -- outside tester 211)
                return decode_stored(codec, entry["value"], scope.run_id, f"journal entry {name!r}")
            if entry is not None and not idempotent:
                # (one question for the step, however often a handler calls it again: each
                # call said it anew -- outside tester 193)
                for doubt in self._step.in_doubt:
                    if doubt.step_key == name:
                        raise doubt
                doubt = EffectInDoubtError(
                    f"run {scope.run_id!r}: step {key!r} of executor {self.executor_id!r} "
                    "started before the run stopped (a crash, a kill, an interruption) and "
                    "recorded no result",
                    step_key=name,
                    description=entry.get("intent"),
                    step=key,
                )
                self._step.in_doubt.append(doubt)
                raise doubt
            wrote_intent = False
            said = None
            try:
                if entry is None and not idempotent:
                    wrote_intent = True
                    # (executor and step named: they may hold the "/" that separates key parts)
                    said = _for_people(description)
                    intent = {"intent": said, "executor": self.executor_id, "step": key}
                    await journal.journal_intent(run, name, intent, scope.superstep)
                # last check before the effect: a worker paused past its lease (GC, SIGSTOP, a
                # slow disk) must not start it once another worker may have taken the run over
                if scope.lease_guard is not None:
                    await scope.lease_guard()
            except BaseException:
                # cancelled (a client gave up) or refused before the effect started: it is not
                # in doubt, so leave no intent that would make a person be asked about it
                if wrote_intent:
                    await _forget(journal, run, name)
                raise
            stopped: BaseException | None = None
            # (this invocation's: a task its effect starts inherits the context, and may
            # execute the same step of the run elsewhere, a simulated takeover, say)
            inside = _STEPS_RUNNING.set(_STEPS_RUNNING.get() | {(id(self._step), name)})
            try:
                if idempotent:  # (cut off, it simply runs again: no need to wait for it)
                    value = await func()
                else:
                    value, stopped = await run_to_its_end(func)
            except Exception as exc:
                # it failed cleanly (no crash): nothing is in doubt, a retry may run it again
                if not idempotent:
                    await _forget(journal, run, name)
                if isinstance(exc, EffectStopped):
                    raise exc.cancellation from exc.__cause__
                raise
            finally:
                _STEPS_RUNNING.reset(inside)
            try:
                encoded = codec.encode(value)
                codec.decode(encoded)  # an unreadable result fails now, not on replay
            except SerializationError as exc:
                # the effect happened and nothing can record it: its intent stays, so the step
                # is in doubt and a person is asked -- told here that it did run (tester 68)
                unstored = type(exc)(
                    f"run {scope.run_id!r}: step {key!r} of executor {self.executor_id!r} ran, "
                    f"but its result cannot be stored ({exc}); the step stays in doubt, and a "
                    "resume asks whether it happened: it did (answer with a result the "
                    "workflow can store)"
                )
                unstored.__dict__.update(exc.__dict__)
                if not idempotent:
                    self._unrecorded(key, name, said, unstored)
                raise unstored from exc
            # the effect happened: record it even if the caller is being cancelled right now.
            # Awaited as the effect was: a shield does not hold off asyncio's own cancellation,
            # which an ``asyncio.gather`` passes on from its host task (under load, the second
            # of two steps gathered lost its result: in doubt after ``Runtime.close()``)
            try:
                stored, late = await run_to_its_end(
                    lambda: journal.journal_put(run, name, {"value": encoded}, scope.superstep)
                )
            except EffectStopped as exc:  # the write failed while the caller was cancelled
                raise exc.cancellation from exc.__cause__
            except StorageError as exc:
                # a full disk, a lost lease: the effect happened and its result is not recorded,
                # so the step stays in doubt -- the caller is told it ran (outside tester 146)
                unrecorded = type(exc)(
                    f"run {scope.run_id!r}: step {key!r} of executor {self.executor_id!r} ran, "
                    f"but its result was not recorded ({exc}); the step stays in doubt, and a "
                    "resume asks whether it happened: it did"
                )
                unrecorded.__dict__.update(exc.__dict__)
                if not idempotent:
                    self._unrecorded(key, name, said, unrecorded)
                raise unrecorded from exc
            stopped = stopped or late
            if stopped is not None:  # the caller was cancelled while the effect ran: now
                raise stopped
        return codec.decode(stored["value"])

    def _unrecorded(self, key: str, name: str, description: Any, raised: Exception) -> None:
        """Step ``key`` ran and its result is not recorded (``raised`` tells the handler so):
        it is in doubt. Its superstep asks about it even if the handler catches ``raised``
        -- it went on as if nothing had run, and the run committed with no one asked (outside
        tester 193); a handler that lets ``raised`` through fails the run with it, and the
        resume asks."""
        doubt = EffectInDoubtError(str(raised), step_key=name, description=description, step=key)
        doubt.raised = raised
        self._step.in_doubt.append(doubt)

    async def send_message(self, message: TOut, target_id: str | None = None) -> None:
        """Send ``message`` along this executor's outgoing edges (or to one successor)."""
        if not self._sends(message):
            raise UndeclaredOutputError(
                f"executor {self.executor_id!r} sent {type_name(type(message))}, which its handler "
                f"{self._handler_name} does not declare in WorkflowContext[...]"
            )
        if target_id is not None and target_id not in self._scope.successors.get(
            self.executor_id, ()
        ):
            raise UnknownTargetError(
                f"executor {self.executor_id!r} sent to {target_id!r}, which is not one of its "
                "successors in the graph"
            )
        # snapshot now: the sender may change the object after sending it
        copy, encoded = snapshot(self._scope.codec, message)
        self._step.sent.append((copy, target_id, encoded))

    async def yield_output(self, output: TWorkflowOut) -> None:
        """Publish a workflow output: kept in the run's outputs, and streamed as a
        ``WorkflowOutputEvent`` once the superstep's commit has recorded it (an output of a
        superstep that fails, or whose commit fails, is never published)."""
        if not self._yields(output):
            raise UndeclaredOutputError(
                f"executor {self.executor_id!r} yielded {type_name(type(output))}, which its "
                f"handler {self._handler_name} does not declare as workflow output"
            )
        # snapshot now: what the event shows is what is stored, whatever happens to ``output``
        copy, encoded = snapshot(self._scope.codec, output)
        self._step.outputs.append((copy, encoded))

    async def add_event(self, event: WorkflowEvent) -> None:
        """Emit a custom event into the run's event stream."""
        if not isinstance(event, WorkflowEvent):
            raise DefinitionError(
                f"add_event expects a WorkflowEvent, got {type_name(type(event))}"
            )
        self._step.emit(event)

    # --- durable state --------------------------------------------------------------------------

    async def get_state(self, key: str, default: Any = None) -> Any:
        """This executor's durable state for ``key`` (a fresh copy; write back with set_state)."""
        step = self._step
        if type(key) is not str:  # (5 or None read as "no value": outside tester 170)
            _check_key(key, f"get_state in executor {self.executor_id!r}")
        if key in step.state_writes:
            return self._scope.codec.decode(step.state_writes[key])
        if key in step.state:
            return self._stored(step.state[key], f"state {key!r} of executor {self.executor_id!r}")
        return default

    def _stored(self, encoded: Any, what: str) -> Any:
        """Decode committed state (damage stops the run: ``StoreCorruptError``)."""
        scope = self._scope
        return decode_stored(scope.codec, encoded, scope.run_id, f"the stored {what}")

    async def set_state(self, key: str, value: Any) -> None:
        """Write this executor's durable state; committed with the superstep. The value is
        encoded (and checked decodable) now, so a later read is a copy."""
        step = self._step
        _check_key(key, f"set_state in executor {self.executor_id!r}")
        step.state_writes[key] = encode_checked(self._scope.codec, value)
        if step.appended:
            step.appended.pop(key, None)

    async def append_state(self, key: str, items: Iterable[Any]) -> None:
        """Append ``items`` to this executor's list state ``key`` (an empty list if unset).

        Only the new items are encoded (and checked), and a durable store writes only them: a
        conversation that grows by a turn costs that turn however long it already is."""
        step = self._step
        _check_key(key, f"append_state in executor {self.executor_id!r}")
        codec = self._scope.codec
        current = step.state_writes.get(key, _MISSING)
        committed = current is _MISSING  # appending to the committed list, not to a write
        if committed:
            current = step.state.get(key, _MISSING)
        if current is _MISSING:
            current = []
        new = encode_checked(codec, list(items))
        if not isinstance(codec, TaggedJsonCodec):  # no promise how another codec stores lists
            if step.appended:
                step.appended.pop(key, None)
            value = await self.get_state(key, [])
            if type(value) is not list:
                raise UsageError(
                    f"append_state: state {key!r} of executor {self.executor_id!r} is a "
                    f"{type_name(type(value))}, not a list"
                )
            step.state_writes[key] = encode_checked(codec, value + codec.decode(new))
            return
        if type(current) is not list:  # (the tagged codec stores a list as a JSON array)
            raise UsageError(
                f"append_state: state {key!r} of executor {self.executor_id!r} is not a list"
            )
        step.state_writes[key] = [*current, *new]
        if committed:  # the committed items are kept as they are: a delta stores only the rest
            if step.appended is None:
                step.appended = {}
            step.appended[key] = len(current)

    async def get_state_items(
        self,
        key: str,
        *,
        reuse: StateItems | None = None,
        convert: Callable[[Any], Any] | None = None,
    ) -> StateItems:
        """This executor's list state ``key`` (empty if unset) as a lazy, read-only
        :class:`StateItems`. ``reuse``: a view read earlier, e.g. in the previous superstep;
        items it decoded for the same stored encodings are not decoded again. ``convert``:
        applied to each decoded item when it is first read (e.g. parse a compact form)."""
        step = self._step
        codec = self._scope.codec
        encoded = step.state_writes.get(key, _MISSING)
        if encoded is _MISSING:
            encoded = step.state.get(key, [])
        what = f"state {key!r} of executor {self.executor_id!r}"
        if type(encoded) is not list or not isinstance(codec, TaggedJsonCodec):
            value = self._stored(encoded, what)
            if type(value) is not list:
                raise UsageError(f"get_state_items: {what} is a {type_name(type(value))}")
            encoded = [codec.encode(v) for v in value]
        run_id = self._scope.run_id

        def decode(data: Any) -> Any:
            value = decode_stored(codec, data, run_id, f"the stored {what}")
            return value if convert is None else convert(value)

        view = StateItems(encoded, decode, (codec, run_id, self.executor_id, key, convert))
        return view._continuing(reuse)

    async def get_shared(self, key: str, default: Any = None) -> Any:
        """Shared state as committed at the last barrier, plus this handler's own writes."""
        step = self._step
        if type(key) is not str:
            _check_key(key, f"get_shared in executor {self.executor_id!r}")
        if key in step.shared_writes:
            return self._scope.codec.decode(step.shared_writes[key])
        scope = self._scope
        encoded = scope.shared.get(key, _MISSING)
        if encoded is _MISSING:
            return default
        flat = scope.flat_shared.get(key)
        if flat is not None and flat is encoded:
            return flat.copy()  # known primitives only: what decode would return
        return self._stored(encoded, f"shared state {key!r}")

    async def set_shared(self, key: str, value: Any) -> None:
        """Write shared state; visible to every executor after the barrier. If two executors write
        the same key in one superstep, the later one in graph order wins."""
        step = self._step
        _check_key(key, f"set_shared in executor {self.executor_id!r}")
        codec = self._scope.codec
        if type(value) is list and type(codec) is TaggedJsonCodec:
            kinds = set(map(type, value))
            if kinds <= _PRIMITIVES:
                # what encode_checked returns for it; remembered so the next read skips the
                # scan, and whether it holds a bool (True == 1: then ``==`` on it is not exact)
                if step.flat_writes is None:
                    step.flat_writes = {}
                step.shared_writes[key] = step.flat_writes[key] = _scalar_list_copy(
                    value, kinds, f"shared state {key!r}"
                )
                if bool in kinds:
                    if step.exact_writes:
                        step.exact_writes.discard(key)
                else:
                    if step.exact_writes is None:
                        step.exact_writes = set()
                    step.exact_writes.add(key)
                return
        if step.flat_writes:
            step.flat_writes.pop(key, None)
        if step.exact_writes:
            step.exact_writes.discard(key)
        step.shared_writes[key] = encode_checked(codec, value)

    # --- requests -------------------------------------------------------------------------------

    async def request_info(self, request_data: Any, response_type: Any) -> str:
        """Ask the outside world; the answer arrives in this executor's ``@response_handler``.

        Returns the request id. The request is published when the superstep commits.
        """
        step = self._step
        scope = self._scope
        if get_origin(response_type) is Annotated:
            raise DefinitionError(
                f"request_info in executor {step.executor_id!r}: an Annotated answer type "
                f"({type_name(response_type)}) is not supported -- a handler's annotation loses "
                "its metadata, so its constraints would not be checked; put the constrained "
                "field in a pydantic model and ask for that"
            )
        declared = scope.answer_type_declared
        found = declared(response_type) if declared is not None else response_type
        if found is None:
            fix = (
                "annotate the answer parameter of a @response_handler with it, or call "
                "WorkflowBuilder.register_types for it"
                if isinstance(response_type, type)
                else "annotate the answer parameter of a @response_handler with this type "
                "(register_types takes classes, not type expressions)"
            )
            raise UnregisteredTypeError(
                f"request_info in executor {step.executor_id!r}: the answer type "
                f"{type_name(response_type)} appears in no annotation of this workflow, so a "
                f"stored request could not name it and its answer could never be accepted; {fix}"
            )
        handlers = step.answered_by
        if handlers is not None and not any(
            h.matches_request(request_data) and is_assignable(found, h.response_type)
            for h in handlers
        ):  # (a person was asked, and the answer failed the run: outside tester 151)
            raise MessageNotHandledError(
                f"request_info in executor {step.executor_id!r}: no @response_handler of it "
                f"takes a request of {type_name(type(request_data))} answered with "
                f"{type_name(found)}, so its answer could never be applied; declare one"
            )
        name = self.step_key(self.next_step_name("request"))
        request = ExternalRequest(
            request_id=derive_id(scope.secret, "request", scope.run_id, name),
            port_id=step.executor_id,
            data=snapshot(scope.codec, request_data)[0],  # a checked copy
            response_type=found,
            source_executor_id=step.executor_id,
            superstep=scope.superstep,
            run_id=scope.run_id,
            from_port=False,
        )
        step.requests.append(request)
        return request.request_id


def _awaited(func: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    """``func`` as an async function: a plain one's effect ran, then awaiting its result failed
    (``TypeError``) -- the step failed after its effect, and a resume ran it again (outside
    tester 109). Its result is recorded as any other's."""

    async def call() -> Any:
        result = func()
        if inspect.isawaitable(result):
            result = await result
        return result

    return call


def _check_key(key: str, where: str) -> None:
    """A state key is stored as text (a JSON object's key): a ``str`` (``UsageError``; an int
    key was committed, then read back as text -- the run unreadable after a restart: outside
    tester 108) of valid Unicode (``SerializationError``)."""
    if not isinstance(key, str):
        raise UsageError(
            f"{where}: state keys are text (str), as a checkpoint stores them; got {key!r} "
            f"({type_name(type(key))})"
        )
    if not key.isascii():
        require_text((key,), f"the state key {key!r}")


_STEPS_RUNNING: ContextVar[frozenset[tuple[int, str]]] = ContextVar(
    "steps_running", default=frozenset()
)
"""The ``run_once`` steps whose effect runs in this context (its task, and tasks it starts),
as (the invocation's ``ExecutorStep`` id, step name)."""


def _for_people(description: Any) -> Any:
    """A step's ``description`` as plain JSON, stored with its intent and shown to the person
    asked about it: a model, a dataclass, a date or a set as their JSON form; anything else
    that JSON cannot hold (NaN, a cycle) or a store cannot (text with a lone surrogate: a
    file name decoded with ``surrogateescape``) as its ``repr``. They failed durable runs only,
    with a bare "not JSON serializable" (tester 68), or a lone surrogate named nowhere (193)."""
    if description is None or isinstance(description, bool):
        return description
    if isinstance(description, int) and description.bit_length() < 10_000:
        return description  # (more digits than JSON is read with: as the rest -- tester 197)
    if isinstance(description, str) and is_text(description):
        return description
    from pydantic_core import to_jsonable_python

    try:
        plain = to_jsonable_python(description, fallback=repr)
        json.dumps(plain, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except (ValueError, TypeError, RecursionError):
        try:
            return repr(description)
        except ValueError:  # (an int past Python's digit limit: its repr raises too)
            return f"<a {type(description).__name__} that cannot be shown>"
    return plain


async def run_to_its_end(func: Callable[[], Awaitable[Any]]) -> tuple[Any, BaseException | None]:
    """``func()``'s result, awaited to its end even if the caller is cancelled meanwhile, with
    the cancellation it was sent then (to raise once the result is recorded). An effect that
    started cannot be called back: cut off, an async one would be left in doubt, and one in a
    thread (``asyncio.to_thread``) would go on unseen -- and a person asked whether it
    happened would truthfully say no, so it would run twice. A cancel scope is held off by a
    shield; asyncio's own ``task.cancel()`` cannot be, so there the effect runs in a task of
    its own, awaited again after a cancellation. A second one (Ctrl-C pressed again, an effect
    that hangs) stops waiting: the effect is cut off, and left in doubt."""
    if sniffio.current_async_library() != "asyncio":
        with anyio.CancelScope(shield=True):
            value = await func()
        return value, None
    import asyncio  # (running on it: loaded; importing the kernel does not load it)

    with anyio.CancelScope(shield=True):  # (no cancel scope's cancellation: asyncio's only)
        effect = asyncio.ensure_future(func())
        stopped: BaseException | None = None
        while not effect.done():
            try:
                await asyncio.wait((effect,))
            except asyncio.CancelledError as exc:
                if stopped is not None and not _delivered_again(stopped, exc):
                    effect.cancel()
                    raise
                stopped = stopped or exc
    failure: BaseException | None
    if effect.cancelled() and stopped is not None:
        # its task was cancelled from outside while its caller was (``asyncio.run`` cancels
        # every task on a second Ctrl-C): cut off, in doubt -- never cleared as a failure,
        # which would run it again blindly (outside tester 59)
        raise stopped
    if effect.cancelled():  # the effect cancelled itself: a failure, not a crash
        failure = RuntimeError("the effect was cancelled from within (it raised CancelledError)")
    else:
        failure = effect.exception()
    if failure is not None:
        if not isinstance(failure, Exception):
            # SystemExit, KeyboardInterrupt: the process stops inside the effect -- not a clean
            # failure, which would clear its intent and run it again without asking. It left
            # the event loop from the effect's task already; the caller, cancelled as the loop
            # is torn down, ends with that cancellation (raised again here, it was logged as a
            # "Task exception was never retrieved" traceback, tester 69)
            raise stopped if stopped is not None else failure
        if stopped is None:
            raise failure
        raise EffectStopped(stopped) from failure
    return effect.result(), stopped


async def _forget(journal: JournalStore, run: str, name: str) -> None:
    """Clear the intent of a step whose effect did not happen (or failed cleanly), to its end
    even while the caller is being cancelled: left behind, it has a person asked about an
    effect that never started. (A shield does not hold off asyncio's own cancellation, which
    an ``asyncio.gather`` passes on from its host task: ``Runtime.close()`` during eight
    gathered steps left six that never started in doubt, tester 70.) The caller raises what
    it was raising; a cancellation that arrived meanwhile is not raised instead."""
    await run_to_its_end(lambda: journal.journal_clear(run, name))


def _delivered_again(first: BaseException, then: BaseException) -> bool:
    """``then`` is ``first`` delivered once more, not a second cancellation: anyio repeats a
    cancel scope's cancellation until its tasks end, and an ``asyncio.gather`` its host task
    awaits passes each one on to the step's task (tester 68: ``Runtime.close()`` cut off
    steps started together, which are to run to their end)."""
    said = first.args[0] if first.args else None
    return (
        isinstance(said, str)
        and said.startswith("Cancelled via cancel scope ")
        and then.args[:1] == (said,)
    )


class EffectStopped(Exception):
    """An effect failed after its caller was cancelled: the cancellation is what to raise,
    once the step's intent is cleared (the failure is its ``__cause__``)."""

    def __init__(self, cancellation: BaseException) -> None:
        super().__init__("the caller was cancelled while the effect ran, and the effect failed")
        self.cancellation = cancellation
