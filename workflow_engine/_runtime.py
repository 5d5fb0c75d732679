"""Runtime: durable runs over a :class:`RunStore` and a set of registered workflows.

Any process that registers the same workflows against the same store can answer and resume any
run: ``start`` admits a run durably, ``respond`` puts an answer in the store's inbox (whether or
not a process is executing the run), ``resume`` takes the run's lease, restores the latest
checkpoint, delivers the stored answers and continues, committing every superstep under the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import logging
import sys
import time
import uuid
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import anyio
import sniffio

from ._checkpoint import Checkpoint
from ._errors import (
    CheckpointNotFoundError,
    CheckpointStoreError,
    DefinitionError,
    LeaseLostError,
    RequestAlreadyAnsweredError,
    RequestCancelledError,
    ResponseTypeError,
    RunBusyError,
    RunInterruptedError,
    RunNotResumableError,
    SerializationError,
    SignatureMismatchError,
    StorageError,
    StoreCorruptError,
    StoredTypeChangedError,
    StoreLockedError,
    UsageError,
    WorkflowError,
    WorkflowNotRegisteredError,
    shown,
)
from ._events import ErrorDetails, WorkflowEvent, WorkflowRunState, WorkflowStatusEvent
from ._executor import Executor
from ._journal import JournalStore, keeps_journal
from ._pump import EventPump, waits_for_its_reader
from ._requests import ExternalResponse, InDoubtEffect
from ._run_info import (
    RunInfo,
    decoding_workflow,
    effects_cut_off,
    may_have_effects_in_doubt,
    run_info_of,
)
from ._store import (
    LARGEST_COUNT,
    AnswerOutcome,
    CheckpointInfo,
    Lease,
    RunRecord,
    RunStore,
    StoredRequest,
    default_owner,
    holder_of,
    owner_ended,
)
from ._workflow import Workflow, WorkflowRunResult, check_max_supersteps

WorkflowFactory = Callable[[], Workflow]


@dataclass
class PendingRequest:
    """An inbox entry with its data decoded (for approval UIs and the CLI)."""

    request_id: str
    run_id: str
    workflow_name: str
    port_id: str
    data: Any
    response_type: str
    status: str
    created_at: float


log = logging.getLogger("workflow_engine.runtime")

_T = TypeVar("_T")
_P = ParamSpec("_P")

_EXECUTING_FOR: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar(
    "_EXECUTING_FOR", default=frozenset()
)
"""The runtimes (``id``) whose run the current task executes (its handlers inherit it)."""


def _interrupted(run_id: str, *, answers_waiting: bool = False) -> RunInterruptedError:
    if answers_waiting:
        what = (
            "the runtime was closed before the run applied the answers stored while it "
            "executed. Resume it, in this or any process, to apply them"
        )
    else:
        what = (
            "the runtime was closed while it executed. It stopped at its last committed "
            "superstep and its lease was given back: resume it, in this or any process, to "
            "continue"
        )
    return RunInterruptedError(f"run {run_id!r} was interrupted: {what}", run_id=run_id)


_RESTING = frozenset(
    {WorkflowRunState.IDLE, WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, WorkflowRunState.CANCELLED}
)


def _error_read(task: asyncio.Future[Any]) -> None:
    """Mark ``task``'s error as read (its awaiter raises it; one that left does not)."""
    if not task.cancelled():
        task.exception()


class _LeasedStore:
    """The CheckpointStore the runner writes to: every save is a fenced commit under the lease,
    and every journal write is fenced by the same lease.

    ``release_on_rest``: the caller guarantees that nothing is written after a checkpoint in
    which the run rests (no one can cancel the run loop), so that commit may also end the lease
    -- one transaction instead of two.

    While a run executes, :meth:`keep_alive` renews the lease in the background. If another
    worker took the run over (our lease expired), ``lost`` turns true: the next journaled
    step refuses to start and the next commit is refused, so nothing happens twice. A cancel
    requested durably by another process shows up as ``cancel_requested`` after a commit or a
    renewal; the run loop honours it at the next superstep boundary.
    """

    def __init__(
        self,
        store: RunStore,
        lease: Lease,
        journal: JournalStore,
        *,
        lease_seconds: float = 30.0,
        release_on_rest: bool = False,
        workflow: Workflow | None = None,
    ) -> None:
        self.store = store
        self.lease = lease
        self._journal = journal  # the store itself if it is a JournalStore, else the fallback
        self._fenced = journal is store
        self.lease_seconds = lease_seconds
        self.release_on_rest = release_on_rest
        self.released = False
        self.lost = False
        self.continues_latest = True
        """The runtime hands the runner the run's latest checkpoint (no need to check it)."""
        self.answers_stored = True
        """Every answer the runner applies is stored (``respond``) and stays ``answered`` until a
        commit applies it: the runner may apply answers in its first superstep's commit."""
        self.cancel_requested = lease.cancel_requested
        self.answers_waiting = False
        self.cancel_waiting = False
        """The release found a cancel requested that no commit took up (nothing ran after it
        was stored): the rested run is cancelled next, as its requester was promised."""
        self.before: RunRecord | None = None
        """The run as it was before this lease was taken (its status and error)."""
        self.applying = False
        """The lease was taken to apply answers to a paused run, which the store marked
        ``in_progress`` as it took it (see ``RunStore.acquire_latest``)."""
        self.cut_off_steps: Sequence[InDoubtEffect] | None = None
        """The steps the run stopped in the middle of (their intent journaled, no result): the
        runner asks about them before its next superstep (``RunLoop.cut_off``); None: not
        looked for (a new run)."""
        self.committed = False
        """A checkpoint was committed under this lease."""
        self.workflow = workflow
        """The workflow whose run it is (what a result read back from a commit decodes with)."""
        self.last_committed: Checkpoint | None = None
        """The latest checkpoint committed under this lease."""
        self.outputs_committed = 0
        """How many outputs the commits under this lease added."""
        self.admission: Checkpoint | None = None
        """The run's first checkpoint, not written yet (``Runtime.run``): the first commit
        writes it too (``admit_and_commit``), so that a run started and executed at once
        writes once. ``lease`` is then the one that admission takes. Anything else that needs
        the lease first (a journaled step, a renewal, a status, a release) admits the run
        then (``admitted``), as ``admit_and_acquire`` would have before the superstep."""
        self._admitting: anyio.Event | None = None
        """Set once the admission's write under way ends (its waiters go on then)."""
        self._admission_task: asyncio.Task[None] | None = None
        """That write on asyncio (held here: the loop keeps only a weak reference to it)."""

    async def admitted(self) -> Lease:
        """The lease, once the run is written: a pending admission is written now."""
        if self.admission is not None:
            await self._admit(
                lambda admission: self.store.admit_and_acquire(
                    admission, self.lease.owner, self.lease_seconds
                )
            )
        return self.lease

    async def _admit(
        self,
        write: Callable[[Checkpoint], Awaitable[Lease]],
        then: Callable[[Lease], None] | None = None,
    ) -> bool:
        """``write(admission)``, the one write of the pending admission, then ``then(lease)``;
        False (nothing done) if it is written already or being written by another call,
        which this one waits for (a renewal and a journaled step may both ask).

        Nothing cuts the write off half-way -- neither a cancel scope nor asyncio's own
        ``task.cancel()`` (a renewal stopped, a ``wait_for`` timing out), which a shield does
        not hold off: on asyncio it runs in a task of its own. So the lease it took always
        reaches this sink, and the execution's release; a caller cancelled meanwhile only
        stops waiting (outside tester 82: the write committed, its lease was never kept, and
        the run was written a second time -- ``RunExistsError``)."""
        admitting = self._admitting
        if admitting is not None:
            with anyio.CancelScope(shield=True):
                await admitting.wait()
            return False
        admission = self.admission
        if admission is None:
            return False
        done = self._admitting = anyio.Event()
        if sniffio.current_async_library() != "asyncio":
            with anyio.CancelScope(shield=True):
                await self._write_admission(write, then, admission, done)
            return True
        written = self._write_admission(write, then, admission, done)
        task = self._admission_task = asyncio.ensure_future(written)
        # (its error is its awaiter's; one cancelled meanwhile has left, so it is read here)
        task.add_done_callback(_error_read)
        await asyncio.shield(task)
        return True

    async def _write_admission(
        self,
        write: Callable[[Checkpoint], Awaitable[Lease]],
        then: Callable[[Lease], None] | None,
        admission: Checkpoint,
        done: anyio.Event,
    ) -> None:
        """``_admit``'s write (a method, not a closure: see ``Runtime._execute_from``)."""
        try:
            lease = await write(admission)
        finally:
            self._admitting = None
            done.set()
        self.admission = None
        self._took(lease)
        if then is not None:
            then(lease)

    def abandon_admission(self) -> None:
        """Nothing ran: the run is not written at all (its caller gave up first)."""
        if self.admission is not None:
            self.admission = None
            self.released = True

    async def ensure_held(self) -> None:
        """Raise ``LeaseLostError`` unless this worker still holds the run. An expired lease
        (the process was paused past it) is renewed first -- a fenced write, so it fails if
        another worker took the run meanwhile."""
        if self.admission is not None:
            await self.admitted()
            return
        if not self.lost:
            clock = getattr(self.store, "clock", time.time)
            if clock() < self.lease.expires_at or await self.renew_once():
                return
        raise LeaseLostError(
            f"run {self.lease.run_id!r}: this worker lost its lease to another; the step is not "
            "started"
        )

    def _took(self, lease: Lease) -> None:
        self.lease = lease
        if lease.cancel_requested:
            self.cancel_requested = True
        self.answers_waiting = lease.answers_waiting

    async def save(self, checkpoint: Checkpoint) -> None:
        # A caller cancelled mid-commit may never learn the new lease version; releasing is
        # fenced by the owner token alone (unique per execution), so the lease still ends.
        try:
            release = self.release_on_rest and checkpoint.status in _RESTING
            if self.admission is not None:
                if await self._admit_with(checkpoint, release):
                    return
                await self.admitted()  # (written by another call meanwhile, or to try again)
            if release:
                self._took(await self.store.commit_and_release(self.lease, checkpoint))
                self._committed(checkpoint)
                self.released = not self.lease.cancel_requested  # kept to honour a cancel
                return
            self._took(await self.store.commit(self.lease, checkpoint))
            self._committed(checkpoint)
        except RunBusyError:
            self.lost = True
            raise

    def _committed(self, checkpoint: Checkpoint) -> None:
        self.committed = True
        self.last_committed = checkpoint
        self.outputs_committed += checkpoint.changes.outputs_added

    async def _admit_with(self, checkpoint: Checkpoint, release: bool) -> bool:
        """Write the pending admission with ``checkpoint`` in one transaction; False if the
        admission was written by another operation meanwhile (then commit after it)."""

        # (partials, not closures: see ``Runtime._execute_from``)
        write = functools.partial(self._admission_committed, checkpoint, release)
        return await self._admit(write, functools.partial(self._admitted_with, checkpoint, release))

    def _admission_committed(
        self, checkpoint: Checkpoint, release: bool, admission: Checkpoint
    ) -> Awaitable[Lease]:
        """The write of ``_admit_with``: the admission and ``checkpoint`` in one transaction."""
        owner, seconds = self.lease.owner, self.lease_seconds
        return self.store.admit_and_commit(admission, checkpoint, owner, seconds, release=release)

    def _admitted_with(self, checkpoint: Checkpoint, release: bool, lease: Lease) -> None:
        """After ``_admit_with``'s write: ``checkpoint`` committed; released if it rests."""
        self._committed(checkpoint)
        self.released = release and not lease.cancel_requested

    async def keep_alive(self) -> None:
        """Renew the lease every third of its length until cancelled (runs beside the run)."""
        while await self.renew_once(sleep=True):
            pass

    async def renew_once(self, *, sleep: bool = False) -> bool:
        """Renew the lease once (after a third of its length, with ``sleep``); False once
        there is nothing more to renew (released, or lost to another worker)."""
        if sleep:
            await anyio.sleep(self.lease_seconds / 3)
        if self.released or self.lost:
            return False
        if self.admission is not None:
            await self.admitted()  # (a lease taken now: nothing to renew yet)
            return True
        lease = self.lease
        try:
            renewed = await self.store.renew(lease)
        except RunBusyError:
            if self.lease is lease:  # not a commit racing us: another worker took over
                self.lost = True
                return False
            return True
        if self.lease is lease:
            self._took(renewed)
        elif renewed.cancel_requested:
            self.cancel_requested = True
        return True

    async def load(self, checkpoint_id: str) -> Checkpoint:
        return await self.store.load(checkpoint_id)

    async def latest(self, run_id: str) -> Checkpoint | None:
        return await self.store.latest(run_id)

    async def list(self, run_id: str) -> Sequence[Checkpoint]:
        return [await self.store.load(i.checkpoint_id) for i in await self.store.history(run_id)]

    async def delete(self, checkpoint_id: str) -> None:
        raise RunNotResumableError("checkpoints of a durable run are deleted with prune()")

    # the journal: reads are plain, writes are fenced by the lease when the store keeps it

    async def journal_get(self, run_id: str, key: str) -> Any | None:
        return await self._journal.journal_get(run_id, key)

    async def journal_intent(self, run_id: str, key: str, entry: Any, superstep: int) -> None:
        if self._fenced:
            lease = await self.admitted()
            await self.store.journal_intent(run_id, key, entry, superstep, lease=lease)
        else:
            await self._journal.journal_intent(run_id, key, entry, superstep)

    async def journal_put(self, run_id: str, key: str, value: Any, superstep: int) -> Any:
        """Record a step's result -- patiently: the effect happened, and a result not recorded
        leaves the step looking in doubt (a person is asked whether it ran) -- so a write lock
        another process holds past the store's busy timeout is waited out a while longer."""
        if self._fenced:
            await self.admitted()
            return await _patient(
                lambda: self.store.journal_put(run_id, key, value, superstep, lease=self.lease)
            )
        return await self._journal.journal_put(run_id, key, value, superstep)

    async def journal_clear(self, run_id: str, key: str) -> None:
        if self._fenced:
            lease = await self.admitted()
            await self.store.journal_clear(run_id, key, lease=lease)
        else:
            await self._journal.journal_clear(run_id, key)


MAX_LEASE_SECONDS = 1e9
"""The longest lease (about 31 years): a lease ends at a time a store can hold (``Runtime``)."""

_LOCK_RETRY_PAUSES = (0.05, 0.2, 0.5, 1.0, 2.0)
"""Pauses between attempts at a write that must not be lost to a lock another process holds
past the store's busy timeout (each attempt waits that long: ~30 s in all with 5 s)."""


async def _patient(write: Callable[[], Awaitable[_T]]) -> _T:
    """``write()``, tried again after each of ``_LOCK_RETRY_PAUSES`` while the store says it
    is locked (``StoreLockedError``); the last refusal is raised."""
    for pause in _LOCK_RETRY_PAUSES:
        try:
            return await write()
        except StoreLockedError:
            await anyio.sleep(pause)
    return await write()


def _while_open(
    what: str,
) -> Callable[[Callable[_P, Awaitable[_T]]], Callable[_P, Awaitable[_T]]]:
    """A ``Runtime`` method that uses the store: refused once ``close()`` began (a
    ``UsageError`` saying ``what`` -- formatted with the call's arguments -- was not done);
    ``close()`` waits for the calls under way."""

    # the id the call acts on, named in ``what``: checked to be text before anything else --
    # SQLite compares a number with text as text, so ``get_run(5)`` read run "5", and
    # ``fork(5)`` made a new run from it (outside tester 114)
    id_name = (
        "run_id"
        if "{run_id" in what
        else "request_id"
        if "{request_id" in what
        else "name"  # (a workflow's name: a list of one was a bare TypeError -- tester 143)
        if "{name" in what
        else None
    )

    def wrap(method: Callable[_P, Awaitable[_T]]) -> Callable[_P, Awaitable[_T]]:
        @functools.wraps(method)
        async def call(*args: _P.args, **kwargs: _P.kwargs) -> _T:
            runtime: Runtime = args[0]  # type: ignore[assignment]
            if id_name is not None:
                given = kwargs[id_name] if id_name in kwargs else args[1] if len(args) > 1 else ""
                plain = check_id(given, id_name, method.__name__)
                if plain is not given:  # (a str subclass, as plain text)
                    if id_name in kwargs:
                        kwargs[id_name] = plain
                    else:
                        args = (args[0], plain, *args[2:])  # type: ignore[assignment]
            if runtime._closing:
                named = inspect.signature(method).bind(*args, **kwargs).arguments
                raise UsageError(f"the runtime is closed: {what.format(**named)}")
            runtime._calls += 1
            try:
                return await method(*args, **kwargs)
            except StoreLockedError:
                # a caller that gave up while a shielded write waited out another process's
                # lock gets its cancellation, not the lock's error (nothing was done for it:
                # outside tester 91)
                await _cancellation_if_any()
                raise
            finally:
                runtime._call_over()

        return call

    return wrap


def check_id(given: Any, name: str, call: str) -> str:
    """``given`` as plain text; ``UsageError`` for a run or request id (or a workflow's name)
    that is not text (``get_run(5)``). A ``str`` subclass comes back a ``str``: its own repr
    and hash are the caller's, which may fail the error that names it (outside tester 144)."""
    if not isinstance(given, str):
        raise UsageError(
            f"{call}: {name} must be text (str), not {type(given).__name__} ({shown(given, 60)})"
        )
    return str.__str__(given)


_UNFINISHED = (
    WorkflowRunState.IN_PROGRESS,
    WorkflowRunState.IDLE_WITH_PENDING_REQUESTS,
    WorkflowRunState.MAX_SUPERSTEPS_REACHED,
    WorkflowRunState.FAILED,
)
"""What ``stranded_runs`` looks at: every status but finished and cancelled."""


class Runtime:
    """Owns a run store and the registered workflows; the API for durable runs."""

    def __init__(
        self, store: RunStore, *, owner: str | None = None, lease_seconds: float = 30.0
    ) -> None:
        if (
            isinstance(lease_seconds, bool)
            or not isinstance(lease_seconds, int | float)
            or not 0 < lease_seconds <= MAX_LEASE_SECONDS
        ):
            # (0 or less: every worker's lease had lapsed at once, its run taken over mid-step
            # and the renewals spinning -- outside tester 112; 1e12: a lease ending past the
            # year 9999, which the store then read as damage, every listing with it -- 144)
            raise UsageError(
                f"lease_seconds must be a positive number of seconds, at most "
                f"{MAX_LEASE_SECONDS:,.0f}, not {shown(lease_seconds, 40)}"
            )
        if owner is not None and (not isinstance(owner, str) or not owner.strip()):
            raise UsageError(f"owner must be non-empty text, not {shown(owner, 40)}")
        if not all(callable(getattr(store, op, None)) for op in _STORE_OPERATIONS):
            # (a path given for a store was taken, and every later call was a bare
            # AttributeError, close() too: outside tester 155)
            raise UsageError(
                f"Runtime takes a run store -- SqliteStore(path) or InMemoryRunStore() -- not "
                f"{type(store).__name__} ({shown(store, 60)})"
            )
        self.store = store
        self.owner = owner or default_owner()
        self.lease_seconds = lease_seconds
        self._factories: dict[str, WorkflowFactory] = {}
        self._workflows: dict[str, Workflow] = {}
        self._releasing: set[asyncio.Task[None]] = set()  # leases being given back
        self._unreleased: dict[str, Lease] = {}  # leases the store could not take back
        self._executing: set[anyio.CancelScope] = set()  # runs executing here (close stops them)
        self._calls = 0  # calls using the store now (``close()`` waits for them)
        self._calls_over: list[anyio.Event] = []  # set when they are all over
        self._closing = False  # ``close()`` began: no call may start
        self._close_done: anyio.Event | None = None  # a ``close()`` under way, set when over
        self._closed = False  # a ``close()`` closed the store

    def _sink(self, wf: Workflow, lease: Lease, *, streaming: bool = False) -> _LeasedStore:
        """What the runner commits to under ``lease`` (journal: the store's, if it keeps one).
        Without a stream no one can cancel the run loop, so a resting commit ends the lease."""
        store = self.store
        journal: Any = store if keeps_journal(store) else wf.fallback_journal
        return _LeasedStore(
            store,
            lease,
            journal,
            lease_seconds=self.lease_seconds,
            release_on_rest=not streaming,
            workflow=wf,
        )

    async def _release(self, sink: _LeasedStore) -> None:
        """End the lease (unless the last commit did), even when the caller is cancelled --
        by a cancel scope, or by asyncio's own ``task.cancel()``, which a shield does not
        stop (a stream whose consumer was cancelled: its release, waiting for a group commit,
        was cut off and the run stayed locked; outside tester 53).

        On asyncio the release runs in a task of its own, awaited to its end; a cancellation
        that arrives meanwhile is raised after it. Cancelled again, the caller stops waiting,
        but the release goes on (it is never cut off; ``close()`` waits for it). A cancel
        scope delivers its cancellation again at every turn of the loop, so a caller past its
        deadline waits one turn at most: a release waiting for another process's lock ends
        after the caller left. A release that fails while the caller's own exception (a
        cancellation) is under way is logged, and that exception goes on: the store's error
        replaced it (outside tester 54). On trio the release is awaited, shielded."""
        if sink.released:
            return
        under_way = sys.exc_info()[1]  # (called from a ``finally``: what is propagating)
        if sniffio.current_async_library() != "asyncio":
            try:
                await self._release_now(sink)  # (shielded: trio cancels no one's wait)
            except Exception as exc:
                if under_way is None:
                    raise
                if isinstance(under_way, anyio.get_cancelled_exc_class()):
                    # the caller's cancellation goes on, as on asyncio (it got the store's
                    # error instead, about a lease never taken: outside tester 90)
                    log.warning("a run was not released after its caller left: %s", exc)
            return
        releasing = asyncio.ensure_future(self._release_now(sink))
        self._releasing.add(releasing)
        releasing.add_done_callback(self._releasing.discard)
        stopped: BaseException | None = None
        while not releasing.done():
            try:
                await asyncio.wait((releasing,))
            except asyncio.CancelledError as exc:
                if stopped is not None:  # cancelled again: stop waiting; the release goes on
                    releasing.add_done_callback(_said_if_failed)
                    raise
                stopped = exc
        failure = releasing.exception()
        if failure is not None and under_way is None and stopped is None:
            raise failure
        if failure is not None and (
            stopped is not None or isinstance(under_way, asyncio.CancelledError)
        ):
            _said_if_failed(releasing)  # (the caller's cancellation goes on)
        # (under another exception -- the store closed under the run, say -- that one says it)
        if stopped is not None:
            raise stopped

    async def _release_now(self, sink: _LeasedStore) -> None:
        """A store briefly locked by another process is retried for a while, so a passing
        lock does not leave the run locked for the whole lease."""
        with anyio.CancelScope(shield=True):
            stored = False
            try:
                # a run whose first superstep did not commit is written now (interrupted, to
                # be resumed), as if it had been admitted before it
                await sink.admitted()
                stored = True
                ended = await _patient(lambda: self.store.release(sink.lease))
                if ended is not None:  # (a store of the older contract says nothing)
                    sink.answers_waiting = sink.answers_waiting or ended.answers_waiting
                    sink.cancel_waiting = ended.cancel_requested
            except Exception as exc:
                # not released (a lock held past the retries, a full disk): the stored lease
                # still names this execution, which is over -- this process need not wait for
                # it to run out
                owner_ended(sink.lease.owner)
                run_id = sink.lease.run_id
                if not isinstance(exc, StorageError):
                    raise
                if stored:  # given back at close() if the store takes it by then (198)
                    self._unreleased[run_id] = sink.lease
                # (an error that names the run says it already; a run id found anywhere in
                # the text -- "200" in a database's path -- is not one: outside tester 200)
                if repr(run_id) in str(exc):
                    raise
                left = max(0.0, sink.lease.expires_at - time.time())
                said = (
                    f"run {run_id!r}: its lease could not be given back, so other processes "
                    f"can take the run once it runs out (in {left:.0f} s): {exc}"
                    if stored
                    else f"run {run_id!r} is not stored: it was cut off before its first "
                    f"commit, and writing it as interrupted failed: {exc}"
                )
                restated = type(exc)(said)
                restated.__dict__.update(exc.__dict__)
                raise restated from exc

    def _lease_owner(self) -> str:
        """A distinct owner token per execution, so two tasks of one process cannot both hold
        a run; its ``host:pid`` prefix lets a store see when the owner process died."""
        return f"{self.owner}:{uuid.uuid4().hex[:8]}"

    # --- registration ---------------------------------------------------------------------------

    def register(self, workflow: Workflow | WorkflowFactory, name: str | None = None) -> str:
        """Register a workflow (or a function building one) under its name; returns the name.

        Runs are stored with their workflow's name and found again by it, so ``name``, if
        given, must be that name; another graph under a name already registered is refused
        (the runs stored by the first would resume on the second)."""
        if name is not None:
            name = check_id(name, "name", "register")
        given: Any = workflow
        if isinstance(given, type) and issubclass(given, Executor):  # (tester 155)
            raise UsageError(
                f"register: give a Workflow, or a function that builds one, not the executor "
                f"class {given.__name__}: build a workflow that starts with it "
                f"(WorkflowBuilder(name, start={given.__name__}(...)).build())"
            )
        if isinstance(workflow, Workflow):
            built = workflow
        elif callable(workflow):
            built = workflow()
            if not isinstance(built, Workflow):
                raise DefinitionError(f"{shown(workflow)} did not return a Workflow")
        else:
            raise UsageError(
                f"register: give a Workflow, or a function that builds one, not "
                f"{type(workflow).__name__} ({shown(workflow, 60)})"
            )
        if name is not None and name != built.name:
            raise DefinitionError(
                f"cannot register workflow {built.name!r} as {name!r}: its runs are stored and "
                f"resumed by its own name; build it with WorkflowBuilder(name={name!r}) instead"
            )
        known = self._workflows.get(built.name)
        if known is not None and known.signature != built.signature:
            raise DefinitionError(
                f"a different workflow named {built.name!r} is already registered (signature "
                f"{known.signature}; this one {built.signature}): give each graph its own name"
            )
        self._workflows[built.name] = built
        return built.name

    @property
    def workflow_names(self) -> list[str]:
        return sorted(self._workflows)

    def workflow(self, name: str) -> Workflow:
        name = check_id(name, "name", "workflow")
        try:
            return self._workflows[name]
        except KeyError:
            error = WorkflowNotRegisteredError(
                f"no workflow named {name!r} is registered (registered: "
                f"{', '.join(self.workflow_names) or 'none'})"
            )
            error.workflow_name = name
            raise error from None

    def _workflow_for(self, run: RunRecord) -> Workflow:
        wf = self.workflow(run.workflow_name)
        if wf.signature != run.workflow_signature:
            raise SignatureMismatchError(
                f"run {run.run_id!r} was stored by workflow {run.workflow_name!r} with signature "
                f"{run.workflow_signature}, but the registered graph has signature "
                f"{wf.signature}: the graph changed, so this run is stranded"
            )
        return wf

    # --- starting and resuming ------------------------------------------------------------------

    @_while_open("run of workflow {name!r} was not started")
    async def start(self, name: str, message: Any, *, run_id: str | None = None) -> str:
        """Admit a run durably (nothing executes yet) and return its id."""
        wf = self.workflow(name)
        checkpoint = wf.admit(message, run_id=run_id)
        await self.store.admit(checkpoint)
        return checkpoint.run_id

    @_while_open("run of workflow {name!r} was not started")
    async def run(
        self,
        name: str,
        message: Any,
        *,
        run_id: str | None = None,
        max_supersteps: int | None = None,
    ) -> WorkflowRunResult:
        """Admit and execute a run until it rests (finished, paused, failed...).

        A run whose id the runtime chooses is written with its first superstep's commit (one
        transaction, not two); a run id you give is admitted first, so that an id in use is
        refused (``RunExistsError``) before anything runs."""
        check_max_supersteps(max_supersteps)
        wf = self.workflow(name)
        checkpoint = wf.admit(message, run_id=run_id)
        owner = self._lease_owner()
        if run_id is None:  # a fresh uuid: no other run has it
            sink = self._sink(wf, Lease(checkpoint.run_id, owner, 1, 0.0))
            sink.admission = checkpoint
        else:
            # one transaction admits the run already leased to us: nothing to read back
            with anyio.CancelScope(shield=True):  # the lease must reach the ``finally`` below
                lease = await self.store.admit_and_acquire(checkpoint, owner, self.lease_seconds)
            sink = self._sink(wf, lease)
        # (a partial, not a closure: see ``_execute_from``)
        drive = functools.partial(self._drive, wf, sink, checkpoint, [], max_supersteps)
        result = await self._executing_then_released(sink, drive)
        return await self._go_on(result, sink, max_supersteps)

    @_while_open("run {run_id!r} was not resumed")
    async def resume(self, run_id: str, *, max_supersteps: int | None = None) -> WorkflowRunResult:
        """Continue a run from its latest checkpoint with every stored answer, until it rests.

        Answers stored while the run executed (their ``respond`` found it busy) are applied
        too: a run never rests waiting for an answer it already has. A lease lost on the way
        (this worker paused past it, another took the run) raises ``LeaseLostError``, also
        while applying those."""
        check_max_supersteps(max_supersteps)
        acquired = await self._acquire(run_id)
        result = await self._resume_leased(run_id, acquired, max_supersteps)
        return await self._go_on(result, acquired[1], max_supersteps)

    async def _resume_leased(
        self,
        run_id: str,
        acquired: tuple[Workflow, _LeasedStore, tuple[Checkpoint | None, Sequence[StoredRequest]]],
        max_supersteps: int | None,
    ) -> WorkflowRunResult:
        """Continue a run whose lease ``acquired`` holds, until it rests; the lease ends."""
        wf, sink, loaded = acquired
        execute = functools.partial(self._execute_from, wf, sink, loaded, max_supersteps)
        return await self._executing_then_released(sink, execute)

    async def _execute_from(
        self,
        wf: Workflow,
        sink: _LeasedStore,
        loaded: tuple[Checkpoint | None, Sequence[StoredRequest]],
        max_supersteps: int | None,
    ) -> WorkflowRunResult:
        """A leased run from where ``loaded`` says (its checkpoint, the answers it applies),
        until it rests. (Passed on as a partial, not a closure: a closure's variables are cells
        of the function that makes it, objects that every garbage collection walks while the
        run waits for its commits -- with thousands of runs in flight, half the CPU.)"""
        checkpoint, answers = await self._start_point(wf, sink, loaded)
        return await self._drive(wf, sink, checkpoint, answers, max_supersteps)

    async def _executing_then_released(
        self, sink: _LeasedStore, execute: Callable[[], Awaitable[WorkflowRunResult]]
    ) -> WorkflowRunResult:
        """``execute()`` under ``sink``'s lease, which ends after it, whatever happens. Until
        then ``close()`` may cancel it (``self._executing``): it is then interrupted, its lease
        given back, and ``RunInterruptedError`` raised."""
        scope = anyio.CancelScope()
        if self._closing:  # (closing began while the lease was taken)
            scope.cancel()
        self._executing.add(scope)
        inside = _EXECUTING_FOR.set(_EXECUTING_FOR.get() | {id(self)})
        try:
            try:
                try:
                    await anyio.lowlevel.checkpoint_if_cancelled()
                except BaseException:
                    # the caller gave up while the lease was being taken (shielded, so that it
                    # reaches this ``finally``): nothing runs for it, and the run is left as
                    # the lease found it (a run not written yet is not written at all)
                    sink.abandon_admission()
                    await self._restore_status(sink)
                    raise
                with scope:
                    try:
                        return await execute()
                    except (StoreCorruptError, StoredTypeChangedError):
                        # a stored value the code cannot read, met mid-superstep: if nothing
                        # was committed, the run is left as it was, not looking interrupted
                        # (a resume would only meet it again: outside tester 97)
                        if not sink.committed:
                            await self._restore_status(sink)
                        raise
                # (here only when ``close()`` cancelled it)
                rested, outputs = sink.last_committed, sink.outputs_committed
                if rested is None or rested.status not in _RESTING:
                    rested = await self._rested_unseen(sink)
                    if rested is not None:
                        outputs += rested.changes.outputs_added
                wf = sink.workflow
                if rested is not None and rested.status in _RESTING and wf is not None:
                    # its last commit made it rest (finished, paused) before the cancel reached
                    # it: its caller gets that, not "interrupted" of a run that is not (outside
                    # testers 112 and 114: 20 finished runs of 20 said so)
                    return wf.result_at(rested, outputs)
                if not sink.committed:  # interrupted before anything ran: as it was
                    await self._restore_status(sink)
            finally:
                await self._release(sink)
        finally:
            _EXECUTING_FOR.reset(inside)
            self._executing.discard(scope)
        raise _interrupted(sink.lease.run_id)

    async def _rested_unseen(self, sink: _LeasedStore) -> Checkpoint | None:
        """The run's latest checkpoint if a commit under ``sink``'s lease made it rest though
        the cancel kept this call from seeing that commit end (on trio a store call is given
        up on while its write goes on); else None."""
        with anyio.CancelScope(shield=True), contextlib.suppress(WorkflowError):
            _, latest = await self.store.get_run_and_latest(sink.lease.run_id)
            if latest is None or latest.status not in _RESTING:
                return None
            before = sink.before
            if before is not None and latest.checkpoint_id == before.latest_checkpoint_id:
                return None  # (nothing committed since the lease was taken)
            return latest
        return None

    async def _restore_status(self, sink: _LeasedStore) -> None:
        """Give the run back the status it had before ``sink``'s lease (nothing ran under it):
        it is not left looking interrupted. Taken for any other reason than to apply answers,
        the lease did not change it, and the run is not written: a refused resume made it the
        run updated last (outside tester 206)."""
        before = sink.before
        if before is not None and sink.applying:
            with anyio.CancelScope(shield=True), contextlib.suppress(WorkflowError):
                sink.lease = await self.store.set_status(sink.lease, before.status, before.error)

    async def _go_on(
        self, result: WorkflowRunResult, sink: _LeasedStore, max_supersteps: int | None
    ) -> WorkflowRunResult:
        """Resume again while the run rested with answers already waiting for it; cancel it
        if a cancel was stored for it meanwhile."""
        for _ in range(_MAX_CATCH_UPS):
            if sink.cancel_waiting and not self._closing:
                return _joined(result, await self._cancel_stored(result.run_id))
            if not sink.answers_waiting or result.status is not _WAITING:
                break
            if self._closing:  # its result would list requests already answered
                raise _interrupted(result.run_id, answers_waiting=True)
            try:
                acquired = await self._acquire(result.run_id)
            except RunBusyError:
                break  # another worker took the run meanwhile: it applies them
            # a lease lost from here on is this call's to report, as in any resume
            sink = acquired[1]
            result = _joined(
                result, await self._resume_leased(result.run_id, acquired, max_supersteps)
            )
        return result

    def resume_stream(self, run_id: str, *, max_supersteps: int | None = None) -> RuntimeRunStream:
        """Like :meth:`resume`, streaming the run's events."""
        check_id(run_id, "run_id", "resume_stream")
        check_max_supersteps(max_supersteps)
        return RuntimeRunStream(self, run_id, max_supersteps)

    async def _acquire(
        self, run_id: str, *, cancelling: bool = False, streaming: bool = False
    ) -> tuple[Workflow, _LeasedStore, tuple[Checkpoint | None, Sequence[StoredRequest]]]:
        """Check the run can be resumed (or cancelled) and take its lease -- one transaction that
        also returns the latest checkpoint and the answered requests."""

        chosen, check = self._resumable(run_id, cancelling=cancelling)
        # shielded: if the caller gives up while the store takes the lease, the lease still
        # reaches us -- and our caller's ``finally`` releases it -- instead of being orphaned
        with anyio.CancelScope(shield=True):
            _, lease, checkpoint, answered = await self.store.acquire_latest(
                run_id, self._lease_owner(), self.lease_seconds, check
            )
        wf, before = chosen
        sink = self._sink(wf, lease, streaming=streaming)
        sink.before = before
        sink.applying = bool(answered) and before.status is _WAITING
        return wf, sink, (checkpoint, answered)

    def _resumable(
        self, run_id: str, *, cancelling: bool = False
    ) -> tuple[list[Any], Callable[[RunRecord], None]]:
        """The check a store runs before it hands out the run's lease (the run's workflow is
        registered, with the same graph; the run is not finished), and where it puts the
        run's workflow."""
        chosen: list[Any] = []  # the run's workflow, then the run as it was before the lease

        def check(run: RunRecord) -> None:
            # (set, not appended: a store may run its write again -- a group commit SQLite
            # ended as a whole is written again one write at a time -- and two runs' worth
            # failed every caller with a ValueError, the lease taken: outside tester 196)
            chosen[:] = (self._workflow_for(run), run)
            if run.status in (WorkflowRunState.IDLE, WorkflowRunState.CANCELLED):
                if cancelling:
                    raise RunNotResumableError(f"run {run_id!r} is already {_ended_as(run)}")
                # ("is idle" read as waiting: outside testers 153, 177)
                raise RunNotResumableError(
                    f"run {run_id!r} is already {_ended_as(run)}; nothing to resume"
                )

        return chosen, check

    async def _start_point(
        self,
        wf: Workflow,
        sink: _LeasedStore,
        loaded: tuple[Checkpoint | None, Sequence[StoredRequest]],
    ) -> tuple[Checkpoint, list[ExternalResponse]]:
        """``_resume_point`` under the lease ``sink`` holds. Refused there (a stored answer
        that no longer decodes, a missing checkpoint), the run gets back the status it had
        before the lease: nothing ran, so it is not left looking interrupted."""
        try:
            checkpoint, answers = await self._resume_point(wf, sink.lease.run_id, loaded)
            # the steps the run stopped in the middle of: its runner asks about them before
            # anything runs again, on every path that continues it (``resume_stream`` -- the
            # command line's and the AG-UI server's -- ran them first: outside tester 194)
            before = sink.before
            sink.cut_off_steps = ()
            if before is not None and may_have_effects_in_doubt(before, time.time()):
                sink.cut_off_steps = await _effects_cut_off(self.store, checkpoint)
            return checkpoint, answers
        except Exception:
            await self._restore_status(sink)
            raise

    async def _resume_point(
        self,
        wf: Workflow,
        run_id: str,
        loaded: tuple[Checkpoint | None, Sequence[StoredRequest]],
    ) -> tuple[Checkpoint, list[ExternalResponse]]:
        """The latest checkpoint and the stored answers to its pending requests, in the order
        the requests were made (not the order or time they were answered): the same answers
        give the same messages in the same order, however they arrived."""
        checkpoint, answered = loaded
        if checkpoint is None:
            raise CheckpointNotFoundError(f"run {run_id!r} has no checkpoint")
        _require_declared(wf, checkpoint)
        by_id = {r.request_id: r for r in answered}
        answers = [
            ExternalResponse(
                rid,
                wf.decode_stored(
                    by_id[rid].answer, run_id, f"the stored answer to request {rid!r}"
                ),
            )
            for rid in checkpoint.pending_requests
            if rid in by_id
        ]
        return checkpoint, answers

    async def _drive(
        self,
        wf: Workflow,
        sink: _LeasedStore,
        checkpoint: Checkpoint,
        answers: list[ExternalResponse],
        max_supersteps: int | None,
    ) -> WorkflowRunResult:
        """Run to rest without streaming (events collected), renewing the lease beside it."""
        run = functools.partial(
            wf.run,
            checkpoint=checkpoint,
            responses=answers,
            checkpoint_store=sink,
            max_supersteps=max_supersteps,
        )
        if sniffio.current_async_library() != "asyncio":
            async with _kept_alive(sink), self._store_failure_recorded(sink):
                result = await run()
        else:
            # what those two context managers do, inline: each is a generator and its frame
            # per run, objects that every garbage collection walks while the run waits
            keeper = _RenewalTimer(sink, asyncio.get_running_loop())
            try:
                try:
                    result = await run()
                except (StorageError, CheckpointStoreError) as exc:
                    await self._record_store_failure(sink, exc)
                    raise
            finally:
                keeper.stop()
        await self._record_outcome(sink, result)
        return result

    @asynccontextmanager
    async def _store_failure_recorded(self, sink: _LeasedStore) -> AsyncIterator[None]:
        """A commit the store refused for a reason of its own (a full disk, a value too big for
        it) leaves the run FAILED with that error, if the store still takes that one small
        write -- not ``in_progress``, looking cut off by a crash, with nothing said. Resuming
        retries from the last checkpoint. The error is raised all the same; a lease lost, a
        locked or damaged store are not failures of the run and change nothing here."""
        try:
            yield
        except (StorageError, CheckpointStoreError) as exc:
            await self._record_store_failure(sink, exc)
            raise

    async def _record_store_failure(
        self, sink: _LeasedStore, exc: StorageError | CheckpointStoreError
    ) -> None:
        """``_store_failure_recorded``'s work, for the store's error ``exc``."""
        if type(exc) in (StorageError, CheckpointStoreError):
            # its code (storage_error) is what the caller is raised, too
            error = ErrorDetails.from_exception(exc).as_record()
            with anyio.CancelScope(shield=True), contextlib.suppress(WorkflowError):
                lease = await sink.admitted()
                sink.lease = await self.store.set_status(lease, WorkflowRunState.FAILED, error)

    async def _record_outcome(self, sink: _LeasedStore, result: WorkflowRunResult) -> None:
        """A run that stopped FAILED or at its superstep limit records that (and the error).
        One that failed while the runtime closes is interrupted instead, its failure not
        recorded: the closing may be its cause (a handler that used the runtime), and
        resuming runs the failing superstep again anyway."""
        if result.status is WorkflowRunState.FAILED and self._closing:
            raise _interrupted(result.run_id)
        if result.status in (WorkflowRunState.FAILED, WorkflowRunState.MAX_SUPERSTEPS_REACHED):
            error = result.error.as_record() if result.error is not None else None
            lease = await sink.admitted()
            sink.lease = await self.store.set_status(lease, result.status, error)

    @_while_open("run {run_id!r} was not resumed")
    async def _execute(
        self,
        run_id: str,
        max_supersteps: int | None,
        holder: _Outcome,
        emit: Callable[[WorkflowEvent], None],
    ) -> None:
        for catch_up in range(_MAX_CATCH_UPS):
            if catch_up and self._closing:
                raise _interrupted(run_id, answers_waiting=True)
            try:
                wf, sink, loaded = await self._acquire(run_id, streaming=True)
            except RunBusyError:
                if catch_up == 0:
                    raise
                return  # another worker took the run: it applies the waiting answers

            async def execute(
                wf: Workflow = wf,
                sink: _LeasedStore = sink,
                loaded: tuple[Checkpoint | None, Sequence[StoredRequest]] = loaded,
            ) -> WorkflowRunResult:
                checkpoint, answers = await self._start_point(wf, sink, loaded)
                stream = wf.run_stream(
                    checkpoint=checkpoint,
                    responses=answers,
                    checkpoint_store=sink,
                    max_supersteps=max_supersteps,
                )
                reader = waits_for_its_reader(emit)
                if reader is not None:  # the run waits for this stream's reader too
                    stream.wait_for_reader(reader)
                async with _kept_alive(sink), self._store_failure_recorded(sink), stream:
                    try:
                        async for event in stream:
                            # (never waiting here: a run at rest gives its lease back at
                            # once -- outside tester 186)
                            emit(event)
                    except BaseException:
                        # cut off (``close()``, a deadline): what the run emitted and this
                        # did not pass on yet goes on all the same -- committed outputs were
                        # lost for good (outside tester 188)
                        with contextlib.suppress(
                            anyio.BrokenResourceError, anyio.ClosedResourceError
                        ):
                            for event in stream.unread():  # (unless the reader is gone too)
                                emit(event)
                        raise
                result = stream.result
                assert result is not None
                await self._record_outcome(sink, result)
                return result

            result = await self._executing_then_released(sink, execute)
            holder.result = result if holder.result is None else _joined(holder.result, result)
            if sink.cancel_waiting and not self._closing:
                ended = await self._cancel_stored(run_id)
                holder.result = _joined(holder.result, ended)
                if ended.status is WorkflowRunState.CANCELLED:
                    emit(WorkflowStatusEvent(ended.status))
                return
            if not sink.answers_waiting or result.status is not _WAITING:
                return

    # --- answers --------------------------------------------------------------------------------

    @_while_open("this answer to request {request_id!r} was not stored")
    async def respond(self, request_id: str, data: Any) -> AnswerOutcome:
        """Store an answer durably after validating it against the request's response type.

        Unknown id → ``UnknownRequestError``; an identical repeat → ``DUPLICATE`` (no-op); a
        different answer to an answered request → ``RequestAlreadyAnsweredError``.
        """
        _, encoded = await self._checked_answer(request_id, data)
        return await self.store.answer(request_id, encoded)

    @_while_open("these answers were not stored")
    async def respond_all(self, answers: Mapping[str, Any]) -> dict[str, AnswerOutcome]:
        """:meth:`respond` to several requests at once, all or nothing: each answer validated,
        then all stored in one transaction -- or, one refused (a different answer to a request
        answered before, a cancelled or unknown request), none, with that one's error. Two
        clients answering the same questions at once each get all of theirs or none: never a
        run holding some answers of each."""
        if not isinstance(answers, Mapping):
            raise UsageError(
                "respond_all takes a mapping of request id to answer ({request_id: answer}), "
                f"not a {type(answers).__name__}"
            )
        given = list(answers.items())  # (read once: a mapping of its own may differ twice)
        for request_id, _ in given:
            check_id(request_id, "each request id", "respond_all")
        encoded = {}
        for request_id, data in given:
            if request_id in encoded:  # (a dict cannot, a Mapping of one's own can: the last won)
                raise UsageError(
                    f"respond_all: request {request_id!r} is answered twice; give each once"
                )
            encoded[request_id] = (await self._checked_answer(request_id, data))[1]
        outcomes = await self.store.answer_all(list(encoded.items()))
        return dict(zip(encoded, outcomes, strict=True))

    @_while_open("this answer to request {request_id!r} was not stored, nor its run resumed")
    async def respond_and_resume(
        self, request_id: str, data: Any, *, max_supersteps: int | None = None
    ) -> WorkflowRunResult:
        """:meth:`respond`, then :meth:`resume` the request's run -- storing the answer and
        taking the run's lease in one transaction.

        If another worker is executing the run, the answer is stored all the same (that worker
        applies it) and ``RunBusyError`` says so. An identical repeat of an answer resumes too;
        one to a run that has ended since (a retry after a lost reply) runs nothing and returns
        the run as it ended, as ``workflow.run(checkpoint=..., responses=...)`` does.
        """
        check_max_supersteps(max_supersteps)
        run_id, encoded = await self._checked_answer(request_id, data)
        chosen, check = self._resumable(run_id)
        owner = self._lease_owner()
        try:
            with anyio.CancelScope(shield=True):  # the lease must reach the ``finally`` below
                _, taken = await self.store.answer_and_acquire(
                    request_id, encoded, owner, self.lease_seconds, check
                )
        except RunNotResumableError:
            # the store judged the answer first: a different one was refused as such, so this
            # is a repeat of the one the run applied before it ended
            return await self._as_it_ended(run_id)
        if taken is None:
            holder = (await self.store.get_run(run_id)).owner
            who = holder_of(holder) if holder else "another worker"
            raise RunBusyError(
                f"run {run_id!r} is being executed by {who}: the answer to {request_id!r} is "
                "stored, and that execution applies it -- unless it is cancelling the run, "
                "which cancels the request with it"  # (the lease does not say which: tester 96)
            )
        _, lease, checkpoint, answered = taken
        wf, before = chosen
        sink = self._sink(wf, lease)
        sink.before = before
        sink.applying = bool(answered) and before.status is _WAITING
        loaded = (checkpoint, answered)
        execute = functools.partial(self._execute_from, wf, sink, loaded, max_supersteps)
        result = await self._executing_then_released(sink, execute)
        return await self._go_on(result, sink, max_supersteps)

    async def _cancel_stored(self, run_id: str) -> WorkflowRunResult:
        """Honour a cancel stored while this process held the run's lease and ran nothing that
        took it up (a resume with nothing to run): cancel the rested run now. Cancelled or
        finished by another process meanwhile, or taken by a worker that honours the stored
        request itself, it is left to that; the result is the run as it stands."""
        with contextlib.suppress(RunNotResumableError, RunBusyError):
            await self.cancel(run_id)
        return await self._as_it_ended(run_id)

    async def _as_it_ended(self, run_id: str) -> WorkflowRunResult:
        """A finished run's result when nothing ran now: its status and latest checkpoint."""
        run, checkpoint = await self.store.get_run_and_latest(run_id)
        return WorkflowRunResult(run_id=run_id, status=run.status, checkpoint=checkpoint)

    async def _checked_answer(self, request_id: str, data: Any) -> tuple[str, Any]:
        """The request's run id and ``data`` validated against the request's response type,
        encoded for the store."""
        request, run = await self.store.get_request_and_run(request_id)
        wf = self._workflow_for(run)
        try:
            expected = wf.resolve_type(request.response_type)
        except SerializationError as exc:  # stranded, as resume and cancel say
            raise SignatureMismatchError(
                f"run {run.run_id!r}: request {request_id!r} expects an answer of type "
                f"{request.response_type!r}, which workflow {wf.name!r} as registered here no "
                "longer declares (was the type renamed since the request was made?): the run is "
                "stranded"
            ) from exc
        try:
            value = wf.check_answer(
                run.run_id,
                request_id,
                request.port_id,
                wf.decode_stored(request.data, run.run_id, f"the data of request {request_id!r}"),
                expected,
                data,
            )
        except ResponseTypeError:
            # a request no longer waiting: what matters is that this is not its answer (a
            # client told to fix the payload would then meet the conflict)
            if request.status == "cancelled":
                raise RequestCancelledError(
                    f"run {run.run_id!r}: request {request_id!r} was cancelled"
                ) from None
            if request.status == "pending":
                raise
            try:  # as JSON sees it (``10.0`` for the ``10`` an ``int`` took): maybe a repeat
                value = wf.coerce_repeat(run.run_id, request_id, expected, data)
            except ResponseTypeError:
                raise RequestAlreadyAnsweredError(
                    f"run {run.run_id!r}: request {request_id!r} was already answered with a "
                    "different value; an answer cannot be changed"
                ) from None
        return run.run_id, wf.codec.encode(value)

    # --- queries --------------------------------------------------------------------------------

    @_while_open("run {run_id!r} was not read")
    async def get_run(self, run_id: str) -> RunInfo:
        return await self._run_info(run_id)

    async def _run_info(self, run_id: str) -> RunInfo:
        run, checkpoint = await self.store.get_run_and_latest(run_id)
        wf = decoding_workflow(self._workflows.get(run.workflow_name), run, checkpoint)
        answered: list[StoredRequest] = []
        stored: Sequence[StoredRequest] = ()
        if checkpoint is not None and checkpoint.pending_requests:
            # an answered one waits for the run (a resume), not a person
            answered = list(await self.store.list_requests(run_id, status="answered"))
        if checkpoint is not None and wf is None:
            stored = await self.store.list_requests(run_id, status="pending")
        in_doubt: list[InDoubtEffect] = []
        if checkpoint is not None and may_have_effects_in_doubt(run, time.time()):
            in_doubt = await _effects_cut_off(self.store, checkpoint)
        waiting = [r.request_id for r in answered]
        shown = functools.partial(
            run_info_of, run, checkpoint, answered=waiting, effects_in_doubt=in_doubt
        )
        try:
            return shown(wf, stored_pending=stored)
        except StoredTypeChangedError:
            # a stored value the code no longer reads as its type (a field changed): the run
            # is shown as stored, as one whose graph changed is (outside tester 96)
            return shown(None, stored_pending=await self.store.list_requests(run_id))

    @_while_open("runs were not listed")
    async def list_runs(
        self,
        status: WorkflowRunState | None = None,
        workflow: str | None = None,
        limit: int | None = None,
    ) -> list[RunRecord]:
        if status is not None:
            named = check_id(status, "status", "list_runs")  # (a WorkflowRunState is text)
            try:
                status = WorkflowRunState(named)
            except ValueError:
                states = ", ".join(s.value for s in WorkflowRunState)
                raise UsageError(
                    f"no run status {shown(status)}; a status is one of: {states}"
                ) from None
        if workflow is not None:
            check_id(workflow, "workflow", "list_runs")
        if limit is not None and (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 0 <= limit <= LARGEST_COUNT  # (-1: SQLite's "no limit"; past it: overflow)
        ):
            raise UsageError(
                f"list_runs: limit is a whole number (int) of at least 0, not {shown(limit, 40)}"
            )
        return list(await self.store.list_runs(status=status, workflow=workflow, limit=limit))

    @_while_open("requests were not listed")
    async def pending_requests(self, run_id: str | None = None) -> list[PendingRequest]:
        """The approval inbox: every pending request (of one run or all), data decoded."""
        if run_id is not None:
            check_id(run_id, "run_id", "pending_requests")
        out = []
        requests = await self.store.list_requests(run_id, status="pending")
        if run_id is not None and not requests:
            await self.store.get_run(run_id)  # an unknown run is RunNotFoundError, not "none"
        runs: dict[str, RunRecord] = {}
        if len({r.run_id for r in requests}) > 1:
            # one read for the runs waiting for answers, not one per run (20,000 runs: 20,000
            # reads); a request of a run in another state is looked up on its own below
            waiting = WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
            runs = {run.run_id: run for run in await self.store.list_runs(status=waiting)}
        for r in requests:
            run = runs.get(r.run_id) or await self.store.get_run(r.run_id)
            runs[r.run_id] = run
            wf = self._workflows.get(run.workflow_name)
            data = r.data  # (as stored: a workflow not registered here)
            if wf is not None:
                # (a stranded run's, as stored: the rest of the inbox still lists)
                with contextlib.suppress(StoredTypeChangedError):
                    data = wf.decode_stored(
                        r.data, r.run_id, f"the data of request {r.request_id!r}"
                    )
            out.append(
                PendingRequest(
                    r.request_id,
                    r.run_id,
                    run.workflow_name,
                    r.port_id,
                    data,
                    r.response_type,
                    r.status,
                    r.created_at,
                )
            )
        return out

    @_while_open("request {request_id!r} was not read")
    async def get_request(self, request_id: str) -> StoredRequest:
        return await self.store.get_request(request_id)

    @_while_open("run {run_id!r} was not read")
    async def history(self, run_id: str) -> list[CheckpointInfo]:
        await self.store.get_run(run_id)
        return list(await self.store.history(run_id))

    @_while_open("runs were not listed")
    async def stranded_runs(self) -> list[RunRecord]:
        """Unfinished runs this process cannot continue: their workflow is not registered, its
        graph changed, or a request they wait on expects an answer type the registered
        workflow no longer declares (a response type renamed)."""
        # by status, so that the finished runs -- most of a long-used store -- are not read
        # (all runs were: 0.7 s at 100,000 finished ones, outside tester 119)
        runs = sorted(
            [run for status in _UNFINISHED for run in await self.store.list_runs(status=status)],
            key=lambda run: (run.created_at, run.run_id),  # (list_runs' order)
        )
        unanswerable = set()
        if runs:
            names = {run.run_id: run.workflow_name for run in runs}
            waiting = [
                *await self.store.list_requests(status="pending"),
                *await self.store.list_requests(status="answered"),  # not applied yet
            ]
            for r in waiting:
                wf = self._workflows.get(names.get(r.run_id, ""))
                if wf is not None and not wf.declares_type(r.response_type):
                    unanswerable.add(r.run_id)
        out = []
        for run in runs:
            wf = self._workflows.get(run.workflow_name)
            if wf is None or wf.signature != run.workflow_signature or run.run_id in unanswerable:
                out.append(run)
        return out

    # --- time travel, cancel, retention ---------------------------------------------------------

    @_while_open("run {run_id!r} was not forked")
    async def fork(
        self, run_id: str, superstep: int | None = None, *, checkpoint_id: str | None = None
    ) -> str:
        """Start a new run from a past checkpoint of ``run_id`` (time travel).

        ``superstep``: the checkpoint that superstep's commit wrote (before any answers were
        applied on top of it); or name the exact ``checkpoint_id`` from :meth:`history`.
        """
        if superstep is not None and (
            isinstance(superstep, bool) or not isinstance(superstep, int)
        ):
            raise UsageError(
                f"fork: superstep is a whole number (int), not {type(superstep).__name__} "
                f"({superstep!r:.40})"
            )
        if superstep is not None and checkpoint_id is not None:  # (the superstep was ignored)
            raise UsageError(
                f"fork: give a superstep or a checkpoint_id, not both ({superstep}, "
                f"{checkpoint_id!r:.40})"
            )
        if checkpoint_id is not None and (not isinstance(checkpoint_id, str) or not checkpoint_id):
            # (history()'s CheckpointInfo was a raw SQLite binding error: outside tester 173)
            hint = ": its .checkpoint_id" if hasattr(checkpoint_id, "checkpoint_id") else ""
            raise UsageError(
                f"fork: checkpoint_id is a checkpoint's id (non-empty text), not "
                f"{type(checkpoint_id).__name__} ({checkpoint_id!r:.40}){hint}"
            )
        run = await self.store.get_run(run_id)
        wf = self._workflow_for(run)
        where = (
            f"checkpoint {checkpoint_id!r}"
            if checkpoint_id
            else f"superstep {superstep}"
            if superstep is not None
            else "latest checkpoint"
        )
        # the run's history is read only to find a superstep's checkpoint: the latest and a
        # named one are read as they are (a fork cost a read of every checkpoint's row: 0.1 s
        # at 20,000 of them, outside tester 119)
        chosen: str | None = checkpoint_id
        if superstep is not None:
            history = await self.store.history(run_id)
            chosen = next((i.checkpoint_id for i in history if i.superstep == superstep), None)
            if chosen is None:
                kept = min((i.superstep for i in history), default=None)
                why = (
                    f": it is no longer stored (a prune kept its checkpoints from superstep "
                    f"{kept} on)"
                    if kept is not None and 0 <= superstep < kept
                    else f" (it has reached superstep {run.superstep})"
                    if superstep > run.superstep
                    else ""
                )  # (it said "no superstep 1" of a superstep the run had passed: tester 149)
                raise CheckpointNotFoundError(f"run {run_id!r} has no {where}{why}")
        try:
            if chosen is None:  # default: the latest checkpoint (the run as it stands now)
                source = await self.store.latest(run_id)
                if source is None:
                    raise CheckpointNotFoundError(f"run {run_id!r} has no {where}")
            else:
                source = await self.store.load(chosen)
                if source.run_id != run_id:
                    raise CheckpointNotFoundError(f"run {run_id!r} has no {where}")
        except CheckpointNotFoundError:
            await self.store.get_run(run_id)  # RunNotFoundError if it was pruned meanwhile
            if chosen is not None and superstep is None:  # (pruned, or never its: tester 151)
                raise CheckpointNotFoundError(
                    f"run {run_id!r} has no {where}: none by that id is stored (a prune may "
                    "have deleted it; history() lists what is kept)"
                ) from None
            raise CheckpointNotFoundError(
                f"run {run_id!r} has no {where} any more: it was pruned while being forked"
            ) from None
        forked = wf.fork_checkpoint(source, new_run_id=uuid.uuid4().hex)
        await self.store.admit(forked, parent_run_id=run_id)
        return forked.run_id

    @_while_open("run {run_id!r} was not cancelled")
    async def cancel(self, run_id: str, *, unless_answered: Sequence[str] = ()) -> RunInfo:
        """Cancel a run: CANCELLED, its pending requests cancelled.

        A run another worker is executing cannot be stopped mid-superstep from here: the cancel
        is stored as a request, and that worker honours it at its next superstep boundary
        (the returned info then still shows it running). One that came to rest meanwhile (the
        store refuses the request: no worker holds it) is cancelled here after all, or said
        finished -- a request stored then outlived the run (outside tester 79).

        ``unless_answered``: requests of the run (the pause a person dismissed) that must still
        be unanswered. They are cancelled first, at once, so an answer racing this cancel either
        came first -- ``RequestAlreadyAnsweredError``, the run left as it is -- or is refused as
        ``RequestCancelledError``: one person's approval and another's cancel never both take
        effect (outside tester 107: a transfer approved ran, then its run was cancelled). That
        write records the run's cancel too: a process that dies before the run is cancelled
        leaves it interrupted, and the next ``resume`` cancels it (outside tester 131).
        """
        if isinstance(unless_answered, str | bytes):  # (its characters were taken for ids)
            raise UsageError(
                f"cancel: unless_answered is a list of request ids, not one id "
                f"({shown(unless_answered, 60)}): write [{shown(unless_answered, 60)}]"
            )
        try:  # (once: a generator was used up by the checks, and the run cancelled unguarded)
            unless_answered = list(unless_answered)
        except TypeError:
            raise UsageError(
                "cancel: unless_answered is a list of request ids, not "
                f"{shown(unless_answered, 60)}"
            ) from None
        for request_id in unless_answered:
            check_id(request_id, "each of unless_answered", "cancel")
        if unless_answered:
            ids = list(dict.fromkeys(unless_answered))
            for request_id in ids:
                request = await self.store.get_request(request_id)
                if request.run_id != run_id:
                    raise UsageError(
                        f"request {request_id!r} belongs to run {request.run_id!r}, not to run "
                        f"{run_id!r}; nothing was cancelled"
                    )
            # refused here as the cancel below would refuse it -- before anything is written,
            # not after the requests were cancelled (outside tester 147)
            run = await self.store.get_run(run_id)
            if run.live_owner(time.time()) is None and run.status not in _ENDED:
                try:
                    self._workflow_for(run)
                except (WorkflowNotRegisteredError, SignatureMismatchError) as exc:
                    raise _cancelled_only_by_its_workflow(exc, run_id) from None
            await self.store.cancel_requests(ids, run_id=run_id)
        for _ in range(_CANCEL_ATTEMPTS):
            cancelled = await self._cancel_once(run_id)
            if cancelled is not None:
                return cancelled
        raise RunBusyError(
            f"run {run_id!r} went from one worker to another while it was being cancelled; "
            "try again"
        )

    async def _cancel_once(self, run_id: str) -> RunInfo | None:
        """Cancel the run, or have its worker cancel it; None if it came to rest meanwhile."""
        try:
            wf, sink, loaded = await self._acquire(run_id, cancelling=True)
        except RunBusyError:
            if await self.store.request_cancel(run_id) is False:
                return None  # (a store without the answer returns None: stored)
            return await self._run_info(run_id)
        except (WorkflowNotRegisteredError, SignatureMismatchError) as exc:
            # this process cannot execute the run, but a worker executing it now honours a
            # stored cancel (say, the command line cancelling an application's run)
            run = await self.store.get_run(run_id)
            if run.status in _ENDED:
                raise RunNotResumableError(f"run {run_id!r} is already {_ended_as(run)}") from None
            if run.live_owner(time.time()) is None:
                raise _cancelled_only_by_its_workflow(exc, run_id) from None
            if await self.store.request_cancel(run_id) is False:
                return None
            return await self._run_info(run_id)
        try:
            checkpoint = loaded[0] if loaded is not None else await self.store.latest(run_id)
            if checkpoint is None:  # (a store's damage: every run is written with its first)
                raise CheckpointNotFoundError(f"run {run_id!r} has no checkpoint")
            _require_declared(wf, checkpoint)
            await wf.cancel(checkpoint=checkpoint, checkpoint_store=sink)
        finally:
            await self._release(sink)
        return await self._run_info(run_id)

    @_while_open("nothing was pruned")
    async def prune(
        self, *, finished_before: float | None = None, keep_last: int | None = None
    ) -> int:
        """Delete finished runs that ended before ``finished_before`` (a ``time.time()``
        value; with their requests and journal) and cut every run's history to its last
        ``keep_last`` checkpoints. Returns how many checkpoints were deleted (0: nothing to
        do)."""
        return await self.store.prune(finished_before=finished_before, keep_last=keep_last)

    async def close(self) -> None:
        """Stop the runs this runtime executes, give their leases back, close the store.

        Each run executing here is interrupted where it is: a step already under way that is
        not idempotent (a tool call, a payment) runs to its end and is recorded first (an
        idempotent one is cut off, and runs again on resume), then the run stops at its last
        committed superstep and its caller gets ``RunInterruptedError``. Its lease is given
        back before the store closes, so any process can resume it at once (instead of
        waiting for the lease to run out); a run still taking its lease is given it back too.
        Once closing began, every call that uses the store is refused (``UsageError``).
        Closing again, or from several tasks at once, waits for the same close."""
        if id(self) in _EXECUTING_FOR.get():
            raise UsageError(
                "close() was called from within a run this runtime executes: it would wait for "
                "that run to stop, and the run for it. Close the runtime from outside its runs"
            )
        self._closing = True
        while self._close_done is not None:  # another close() is under way: its end is ours
            await self._close_done.wait()
        if self._closed:
            return
        self._close_done = done = anyio.Event()
        try:
            for scope in self._executing:
                scope.cancel()  # (a run whose lease is taken later is, at once)
            while self._calls:
                over = anyio.Event()
                self._calls_over.append(over)
                await over.wait()
            if self._releasing:
                await asyncio.wait(set(self._releasing))
            await self._release_the_unreleased()
            await self.store.close()
            self._closed = True
        finally:
            self._close_done = None
            done.set()

    async def _release_the_unreleased(self) -> None:
        """Give back, once more, the leases whose release the store refused (a full disk):
        by now it may take them, and another process need not wait for them to run out
        (outside tester 198). A lease another execution took meanwhile is left alone: the
        store releases a run only for the owner that holds it."""
        unreleased, self._unreleased = self._unreleased, {}
        for run_id, lease in unreleased.items():
            try:
                with anyio.CancelScope(shield=True):
                    await self.store.release(lease)
            except Exception as exc:
                left = max(0.0, lease.expires_at - time.time())
                log.warning(
                    "run %r: its lease could not be given back at close either; other "
                    "processes can take the run once it runs out (in %.0f s): %s",
                    run_id,
                    left,
                    exc,
                )

    def _call_over(self) -> None:
        self._calls -= 1
        if not self._calls:
            for over in self._calls_over:
                over.set()
            self._calls_over.clear()


def _require_declared(wf: Workflow, checkpoint: Checkpoint) -> None:
    """Refuse, as a stranded run, a checkpoint waiting for an answer of a type ``wf`` no longer
    declares (a response model renamed leaves the graph's signature as it was): the stored
    records are intact, the workflow changed."""
    for request in checkpoint.pending_requests.values():
        if not wf.declares_type(request.response_type):
            raise SignatureMismatchError(
                f"run {checkpoint.run_id!r} waits for an answer of type "
                f"{request.response_type!r} to request {request.request_id!r}, which workflow "
                f"{wf.name!r} as registered here no longer declares: the run is stranded "
                "(register the workflow with that type again to continue it)"
            )


def _said_if_failed(releasing: asyncio.Task[None]) -> None:
    """Log a release that failed where no caller raises it."""
    if not releasing.cancelled() and releasing.exception() is not None:
        log.warning("a run was not released after its caller left: %s", releasing.exception())


async def _cancellation_if_any() -> None:
    """Raise the caller's cancellation if it was cancelled meanwhile: by a cancel scope, or on
    asyncio by ``task.cancel()`` (``asyncio.wait_for``) that a shielded wait held off."""
    if sniffio.current_async_library() == "asyncio":
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
    await anyio.lowlevel.checkpoint_if_cancelled()


@asynccontextmanager
async def _kept_alive(sink: _LeasedStore) -> AsyncIterator[None]:
    """Renew ``sink``'s lease while the body runs. On asyncio a timer does it: most runs rest
    long before a renewal is due, and a timer costs far less than a task group per run."""
    if sniffio.current_async_library() == "asyncio":
        keeper = _RenewalTimer(sink, asyncio.get_running_loop())
        try:
            yield
        finally:
            keeper.stop()
        return
    with _sole_exception():
        async with anyio.create_task_group() as tg:
            tg.start_soon(sink.keep_alive)
            try:
                yield
            finally:
                tg.cancel_scope.cancel()


class _RenewalTimer:
    """Renews a lease every third of its length from the asyncio loop's timer."""

    def __init__(self, sink: _LeasedStore, loop: asyncio.AbstractEventLoop) -> None:
        self.sink = sink
        self.loop = loop
        self.stopped = False
        self.task: asyncio.Task[None] | None = None
        self.timer: asyncio.TimerHandle = loop.call_later(sink.lease_seconds / 3, self._due)

    def _due(self) -> None:
        if not self.stopped:
            self.task = self.loop.create_task(self._renew())

    async def _renew(self) -> None:
        try:
            again = await self.sink.renew_once()
        except Exception:  # the store failed: the next commit will say so, loudly
            return
        if again and not self.stopped:
            self.timer = self.loop.call_later(self.sink.lease_seconds / 3, self._due)

    def stop(self) -> None:
        self.stopped = True
        self.timer.cancel()
        if self.task is not None:
            self.task.cancel()


@contextmanager
def _sole_exception() -> Iterator[None]:
    """The lease keeper runs beside the run in a task group; what the run raises (a
    ``WorkflowError``, a cancellation) reaches the caller as itself, not in an exception group."""
    try:
        yield
    except BaseExceptionGroup as group:
        # an error beside the caller's own cancellation (a store that stayed locked while
        # its caller's deadline passed, on trio): the error is what ended the run
        _, errors = group.split(anyio.get_cancelled_exc_class())
        if errors is None:
            raise  # only cancellations: their scopes take them
        leaves = _leaves(errors)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    """The exceptions of ``group`` and of the groups it holds."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(_leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


_WAITING = WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
_MAX_CATCH_UPS = 100
"""How many times one call resumes again for answers that arrived while it executed."""
_STORE_OPERATIONS = ("admit", "commit", "get_run", "list_runs", "close")
"""What ``Runtime`` calls on any store (the ``RunStore`` protocol's core)."""
_CANCEL_ATTEMPTS = 10
"""How many times ``cancel`` tries again when the run came to rest as its worker was asked."""
_ENDED = frozenset({WorkflowRunState.IDLE, WorkflowRunState.CANCELLED})


def _ended_as(run: RunRecord) -> str:
    """How a cancel or a resume says a run ended: ``finished`` (its status ``idle``, the
    engine's name for it, read as "waiting": outside tester 153), else its status."""
    return "finished (idle)" if run.status is WorkflowRunState.IDLE else run.status.value


def _cancelled_only_by_its_workflow(
    refused: WorkflowNotRegisteredError | SignatureMismatchError, run_id: str
) -> WorkflowError:
    """``refused`` (this process cannot execute run ``run_id``), saying that with no worker
    executing the run, only a process that has its workflow can cancel it."""
    said = type(refused)(
        f"{refused}; no worker is executing run {run_id!r}, so cancelling it takes a process "
        "that has its workflow"
    )
    said.__dict__.update(refused.__dict__)  # what it names (``workflow_name``)
    return said


def _joined(first: WorkflowRunResult, then: WorkflowRunResult) -> WorkflowRunResult:
    """One result for two continuations of a run, the second right after the first."""
    return WorkflowRunResult(
        run_id=then.run_id,
        status=then.status,
        events=[*first.events, *then.events],
        outputs=[*first.outputs, *then.outputs],
        pending_requests=then.pending_requests,
        checkpoint=then.checkpoint,
        error=then.error,
    )


@dataclass
class _Outcome:
    """Where a streamed run's result is put (joined across catch-up resumes)."""

    result: WorkflowRunResult | None = None


class RuntimeRunStream:
    """``async for event in runtime.resume_stream(run_id)``; ``result`` is set at the end.

    The run executes in a task of its own; leaving early -- ``aclose()``, ``async with``, or
    ``break`` and dropping the stream -- stops it and releases its lease at once.
    """

    def __init__(self, runtime: Runtime, run_id: str, max_supersteps: int | None) -> None:
        self.run_id = run_id
        self._runtime = runtime
        self._max_supersteps = max_supersteps
        self._outcome = _Outcome()  # shared with the run's task, which must not hold the stream
        self._pump: EventPump[WorkflowEvent] | None = None

    @property
    def result(self) -> WorkflowRunResult | None:
        return self._outcome.result

    def __aiter__(self) -> RuntimeRunStream:
        return self

    async def __aenter__(self) -> RuntimeRunStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def __anext__(self) -> WorkflowEvent:
        if self._pump is None:
            runtime, run_id, limit, outcome = (
                self._runtime,
                self.run_id,
                self._max_supersteps,
                self._outcome,
            )

            async def produce(emit: Callable[[WorkflowEvent], None]) -> None:
                await runtime._execute(run_id, limit, outcome, emit)

            self._pump = EventPump(produce)
        return await self._pump.next()

    async def aclose(self) -> None:
        if self._pump is not None:
            await self._pump.close()


async def _effects_cut_off(store: RunStore, checkpoint: Checkpoint) -> list[InDoubtEffect]:
    """The steps of the run in doubt (``effects_cut_off``), read from ``store``."""
    listing = getattr(store, "journal_after", None)
    if listing is None:  # a store without a durable journal keeps none of this
        return []
    entries = await listing(checkpoint.run_id, checkpoint.superstep)
    if not entries:
        return []
    return effects_cut_off(
        checkpoint, entries, await store.list_requests(checkpoint.run_id, status=None)
    )
