"""The durable-run store contract: what a store must do for runs to survive any process.

The kernel defines it; ``storage`` implements it (in memory, SQLite; PostgreSQL later) and one
conformance suite (``tests/integration/store_conformance.py``) holds every implementation to it.

The rules a store keeps:

* **Admission is atomic**: the run row, its first checkpoint and its requests appear together.
* **One writer per run**: ``acquire`` hands out a lease; every ``commit`` is fenced by the lease's
  version, so a worker whose lease was taken over can no longer write -- history never forks.
* **A commit is all or nothing**: the checkpoint (as a delta against its parent, or a snapshot),
  new requests, answered/cancelled requests and the run's status, in one transaction.
* **Answers are durable and single-valued**: ``answer`` stores the first answer to a pending
  request; the identical answer again is a no-op; any other answer is a conflict. Answers wait in
  the store (the inbox) until a commit applies them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from ._errors import UsageError, shown
from ._events import WorkflowRunState

if TYPE_CHECKING:  # (the records alone load no pydantic model: the CLI's listings read them)
    from ._checkpoint import Checkpoint


def default_owner() -> str:
    """``host:pid:nonce`` -- lets a store on the same host see that an owner process died."""
    return f"{_host()}:{os.getpid()}:{os.urandom(4).hex()}"


def _host() -> str:
    """Where this process's id means this process, as owner tokens carry it: the host's name
    and, on Linux, the process-id namespace (``name#inode``). Containers sharing a host name
    and a database file (``--network host``, ``hostNetwork``) each number their processes:
    pid 50000 in one is no process, or another one, in the next, and a live worker there was
    taken for dead -- its run taken over, its effect made twice (outside tester 112). A token
    of another namespace is not judged; its lease runs out instead. (``socket`` is loaded
    only now: reading the records, as the command line's listings do, needs it only for a
    run someone holds.)"""
    import socket

    return socket.gethostname() + _pid_namespace()


_NAMESPACE: tuple[int, str, bool] = (-1, "", False)
"""(pid, ``#inode``, /proc is this namespace's): as the process with that pid saw it (a fork
asks again)."""


def _namespace() -> tuple[int, str, bool]:
    global _NAMESPACE
    pid = os.getpid()
    if _NAMESPACE[0] != pid:
        try:
            found = f"#{os.stat('/proc/self/ns/pid').st_ino}"
        except OSError:
            # no /proc: on Linux a namespace that cannot be told apart from another one's
            # (a tmpfs over /proc), so none is judged by its pid -- a name no other has; where
            # there is no /proc at all (not Linux), no namespaces either
            found = f"#?{os.urandom(4).hex()}" if sys.platform.startswith("linux") else ""
        try:  # /proc of the parent namespace shows other processes under these numbers
            ours = os.readlink("/proc/self") == str(pid)
        except OSError:
            ours = False
        _NAMESPACE = (pid, found, ours)
    return _NAMESPACE


def _pid_namespace() -> str:
    return _namespace()[1]


_ENDED_OWNERS: set[str] = set()
"""Owner tokens of this process's executions that ended without their release being written
(the store refused it: a full disk). Each token names one execution and is never used again."""


def owner_ended(owner: str) -> None:
    """Say that the execution ``owner`` names has ended, though its lease could not be released:
    this process may take that run over at once instead of waiting out the lease."""
    _ENDED_OWNERS.add(owner)


def forget_ended_owner(owner: str) -> None:
    """``owner``'s lease has been taken over or released: no need to remember it any more."""
    _ENDED_OWNERS.discard(owner)


def check_own(run_id: str, checkpoint: Checkpoint) -> None:
    """``UsageError`` for a checkpoint of another run committed under ``run_id``'s lease
    (before a store writes anything): stored, it would sit in the other run's history as this
    run's latest."""
    if checkpoint.run_id != run_id:
        raise UsageError(
            f"run {run_id!r}: checkpoint {checkpoint.checkpoint_id!r} is of run "
            f"{checkpoint.run_id!r}; a run's lease commits only that run's checkpoints"
        )


def ended_lease(
    lease: Lease, status: WorkflowRunState, cancel_requested: bool, answered: bool
) -> Lease:
    """What ``release`` returns: ``lease`` as it ended, with a cancel still to honour (the run
    not finished) and answers waiting for a run resting paused."""
    unfinished = status not in (WorkflowRunState.IDLE, WorkflowRunState.CANCELLED)
    return Lease(
        lease.run_id,
        lease.owner,
        lease.version,
        lease.expires_at,
        cancel_requested=unfinished and cancel_requested,
        answers_waiting=answered and status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS,
    )


LARGEST_COUNT = 2**63 - 1
"""The largest whole number a store takes (SQLite's INTEGER): past it, a bare OverflowError
from ``sqlite3`` (outside tester 143)."""


def check_prune(finished_before: float | None, keep_last: int | None) -> None:
    """``UsageError`` for arguments ``prune`` cannot take -- raised before a store deletes
    anything (a refused call must change nothing)."""
    if finished_before is not None and (
        isinstance(finished_before, bool)
        or not isinstance(finished_before, int | float)
        or finished_before != finished_before  # NaN
        or abs(finished_before) > LARGEST_COUNT  # (a float too: 1e300, inf -- tester 155)
    ):
        raise UsageError(
            f"finished_before must be a time in seconds, not {shown(finished_before, 60)}"
        )
    if keep_last is not None and (
        isinstance(keep_last, bool)
        or not isinstance(keep_last, int)
        or not 1 <= keep_last <= LARGEST_COUNT
    ):
        raise UsageError(
            f"keep_last must be a whole number of at least 1, not {shown(keep_last, 60)}"
        )


def owner_is_dead(owner: str) -> bool:
    """True when ``owner`` (``host:pid:...``) names a process on this host, in this process-id
    namespace, that has exited, or an execution of this process that ended without releasing
    its lease (``owner_ended``).

    Lets a crashed worker's lease be taken over at once instead of after it expires.
    """
    if owner in _ENDED_OWNERS:
        return True
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != _host() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except (ProcessLookupError, OverflowError):  # (beyond any pid: no process holds it)
        return True
    except PermissionError:
        return False
    if int(pid_text) == os.getpid():
        return False
    # (a zombie is read from /proc: only where /proc numbers processes as this process does --
    # another namespace's /proc shows another process, and a live worker was taken for dead:
    # outside tester 114)
    return _namespace()[2] and _is_zombie(int(pid_text))


def holder_of(owner: str) -> str:
    """Who holds a lease, as an error names it: another worker, or (an owner token of this very
    process: two requests on one server, say) another execution in this process."""
    host, _, rest = owner.partition(":")
    mine = host == _host() and rest.partition(":")[0] == str(os.getpid())
    return f"{'another execution in this process' if mine else 'another worker'} ({owner})"


def _is_zombie(pid: int) -> bool:
    """A killed child that its parent has not reaped yet still answers kill(pid, 0)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


RequestStatus = Literal["pending", "answered", "applied", "cancelled"]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """A run as the store knows it."""

    run_id: str
    workflow_name: str
    workflow_signature: str
    status: WorkflowRunState
    superstep: int
    created_at: float
    updated_at: float
    version: int = 0
    owner: str | None = None
    lease_expires_at: float | None = None
    latest_checkpoint_id: str | None = None
    error: dict[str, Any] | None = None
    parent_run_id: str | None = None
    cancel_requested: bool = False
    """A cancel is stored for the worker executing the run (honoured at its next superstep
    boundary, or where the next continuation starts)."""

    def live_owner(self, now: float) -> str | None:
        """The worker whose lease on the run is live at ``now``, or None. A lease whose holder
        on this host has exited is not live, however long it still runs."""
        owner, expires = self.owner, self.lease_expires_at
        if owner is None or expires is None or expires < now or owner_is_dead(owner):
            return None
        return owner


@dataclass(frozen=True, slots=True)
class StoredRequest:
    """A request in the inbox. ``data`` and ``answer`` are codec-encoded JSON values."""

    request_id: str
    run_id: str
    port_id: str
    source_executor_id: str
    kind: str
    data: Any
    response_type: str
    superstep: int
    status: RequestStatus
    answer: Any = None
    created_at: float = 0.0
    answered_at: float | None = None


@dataclass(frozen=True, slots=True)
class Lease:
    """The right to execute (and commit to) one run, until ``expires_at``."""

    run_id: str
    owner: str
    version: int
    expires_at: float
    cancel_requested: bool = False
    """Someone asked (durably) to cancel the run; honour it at the next superstep boundary."""
    answers_waiting: bool = False
    """Set by a commit in which the run rests waiting for answers while some have already
    arrived (stored during the execution): the run should go on at once."""


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """One entry of a run's history."""

    checkpoint_id: str
    run_id: str
    seq: int
    superstep: int
    status: WorkflowRunState
    created_at: float
    kind: str


class AnswerOutcome(StrEnum):
    STORED = "stored"
    DUPLICATE = "duplicate"


Acquired = tuple[RunRecord, Lease, "Checkpoint | None", Sequence[StoredRequest]]
"""What resuming a run needs, taken in one transaction: the run, its lease, its latest
checkpoint and its answered requests (``acquire_latest``, ``answer_and_acquire``)."""


@runtime_checkable
class RunStore(Protocol):
    """Durable storage of runs, checkpoints and the request inbox. All methods are async."""

    async def admit(self, checkpoint: Checkpoint, *, parent_run_id: str | None = None) -> None:
        """Create a run from its first checkpoint; ``RunBusyError`` if the id exists."""
        ...

    async def acquire(self, run_id: str, owner: str, lease_seconds: float) -> Lease:
        """Take the run's lease; ``RunBusyError`` while another live owner holds it."""
        ...

    async def admit_and_acquire(
        self,
        checkpoint: Checkpoint,
        owner: str,
        lease_seconds: float,
        *,
        parent_run_id: str | None = None,
    ) -> Lease:
        """``admit`` and ``acquire`` in one transaction: the run is born leased to ``owner``."""
        ...

    async def admit_and_commit(
        self,
        admitted: Checkpoint,
        checkpoint: Checkpoint,
        owner: str,
        lease_seconds: float,
        *,
        release: bool = False,
    ) -> Lease:
        """``admit_and_acquire`` of ``admitted``, then ``commit`` of ``checkpoint`` (its first
        superstep) under that lease -- or ``commit_and_release`` with ``release`` -- in one
        transaction: a run started and executed at once is written once, when its first
        superstep commits. ``RunExistsError`` if the id exists; refused, nothing is written."""
        ...

    async def acquire_latest(
        self,
        run_id: str,
        owner: str,
        lease_seconds: float,
        check: Callable[[RunRecord], None] | None = None,
    ) -> Acquired:
        """What resuming needs, atomically: the run, its lease, its latest checkpoint and its
        answered requests. ``check(run)`` runs first; whatever it raises aborts, nothing written.
        A run resting paused with answers waiting is marked ``in_progress`` as its lease is
        taken (it runs from now on, to apply them); no other status changes."""
        ...

    async def answer_and_acquire(
        self,
        request_id: str,
        answer: Any,
        owner: str,
        lease_seconds: float,
        check: Callable[[RunRecord], None] | None = None,
    ) -> tuple[AnswerOutcome, Acquired | None]:
        """``answer``, then ``acquire_latest`` of the request's run, atomically (answering and
        resuming at once). While another live owner holds the run, the answer is stored and the
        second part is ``None`` (that owner applies it); anything else that refuses -- the
        answer, ``check(run)`` -- aborts the whole, nothing written."""
        ...

    async def release(self, lease: Lease) -> Lease | None:
        """End the lease if ``lease.owner`` still holds it (owner tokens are unique per
        execution, so a lease taken over by another worker releases nothing: ``None``).

        The lease as it ended says what arrived while it was held and no commit took up: a
        cancel requested (``cancel_requested``, the run not finished) and answers stored for
        a run resting paused (``answers_waiting``). Their holder said "that execution applies
        it"; one that ends without a commit (a resume with nothing to run) must still."""
        ...

    async def renew(self, lease: Lease) -> Lease:
        """Extend the lease by its length, same version (``RunBusyError`` if it was lost).
        The returned lease says whether a cancel was requested."""
        ...

    async def request_cancel(self, run_id: str) -> bool:
        """Ask the worker executing the run to cancel it at its next superstep boundary (or, if
        that worker died, the next execution of the run). False, nothing stored, if no worker
        holds the run's lease: it rests (finished, paused, failed), so whoever asks cancels it
        directly -- a flag stored then was never honoured, and outlived the run's end.
        ``RunNotFoundError`` for an unknown id."""
        ...

    async def commit(self, lease: Lease, checkpoint: Checkpoint) -> Lease:
        """Persist a checkpoint atomically; ``LeaseLostError`` if the lease was lost,
        ``CheckpointNotLatestError`` if its parent is not the run's latest checkpoint (history
        never forks). The commit also deletes the run's journal entries of supersteps up to the
        checkpoint's (they are never read again)."""
        ...

    async def commit_and_release(self, lease: Lease, checkpoint: Checkpoint) -> Lease:
        """``commit`` and ``release`` in one transaction (the run rests after this checkpoint)
        -- unless a cancel of the run was requested meanwhile and the run does not finish with
        it: then the lease is kept (the returned lease says ``cancel_requested``), so that its
        holder honours the cancel at this boundary instead of leaving it unanswered on a
        resting run. A checkpoint that finishes the run (``idle``) is done with the cancel."""
        ...

    async def set_status(
        self, lease: Lease, status: WorkflowRunState, error: dict[str, Any] | None = None
    ) -> Lease:
        """Set the run's status (and error) under ``lease``. A run set FAILED is done with a
        cancel requested meanwhile (it stopped; a retry by ``resume`` is a decision of its
        own)."""
        ...

    async def get_run(self, run_id: str) -> RunRecord:
        """``RunNotFoundError`` for an unknown id."""
        ...

    async def get_run_and_latest(self, run_id: str) -> tuple[RunRecord, Checkpoint | None]:
        """``get_run`` and ``latest`` in one read."""
        ...

    async def list_runs(
        self,
        status: WorkflowRunState | None = None,
        workflow: str | None = None,
        limit: int | None = None,
    ) -> Sequence[RunRecord]: ...

    async def run_ids(self, prefix: str = "") -> Sequence[str]:
        """The id of every run that starts with ``prefix``, sorted: what a shortened run id is
        resolved against, without reading (and checking) every run's record."""
        ...

    async def latest(self, run_id: str) -> Checkpoint | None: ...

    async def load(self, checkpoint_id: str) -> Checkpoint: ...

    async def history(self, run_id: str) -> Sequence[CheckpointInfo]: ...

    async def get_request(self, request_id: str) -> StoredRequest: ...

    async def get_request_and_run(self, request_id: str) -> tuple[StoredRequest, RunRecord]:
        """``get_request`` and its run in one read."""
        ...

    async def list_requests(
        self, run_id: str | None = None, status: RequestStatus | None = "pending"
    ) -> Sequence[StoredRequest]:
        """Requests (of one run, or all; of one status, or any), oldest first; those of one
        commit in the order the run asked them."""
        ...

    async def request_ids(self, prefix: str = "") -> Sequence[str]:
        """The id of every request (any status) that starts with ``prefix``, sorted: what a
        shortened id is resolved against, without reading the requests' data and answers."""
        ...

    async def answer(self, request_id: str, answer: Any) -> AnswerOutcome: ...

    async def answer_all(self, answers: Sequence[tuple[str, Any]]) -> Sequence[AnswerOutcome]:
        """``answer`` of each ``(request id, answer)``, atomically: all of them, or -- one
        refused (unknown, cancelled, answered otherwise) -- none. Its error is that one's."""
        ...

    async def cancel_requests(
        self, request_ids: Sequence[str], *, run_id: str | None = None
    ) -> None:
        """Mark pending requests cancelled, atomically, so that no answer is taken for them from
        now on: what cancelling a pause means when a person answering it may race the cancel.
        One already answered (stored or applied) refuses them all (``RequestAlreadyAnsweredError``,
        nothing changed); one cancelled already stays so; an unknown id is
        ``UnknownRequestError``.

        The run is not cancelled here (``Runtime.cancel`` does both), but with ``run_id`` (the
        requests' run) its cancel is recorded in the same write: a cancel requested, and a run
        resting (paused, or failed with requests pending) marked in progress. A process that
        dies before it cancels the run then leaves it interrupted, and the next ``resume``
        cancels it -- not resting forever on requests no answer can reach (outside testers 131
        and 134). A run that ended (idle, cancelled)
        is left as it is; ``RunNotFoundError`` for an unknown run."""
        ...

    async def prune(
        self, *, finished_before: float | None = None, keep_last: int | None = None
    ) -> int:
        """Delete finished runs older than ``finished_before`` (with their requests and journal;
        never a run whose lease is live: it is being retried); keep only the last
        ``keep_last`` checkpoints of every run. Returns how many checkpoints were deleted."""
        ...

    # the side-effect journal (see ``JournalStore``); writes are fenced by ``lease`` if given

    async def journal_get(self, run_id: str, key: str) -> Any | None: ...

    async def journal_intent(
        self, run_id: str, key: str, entry: Any, superstep: int, *, lease: Lease | None = None
    ) -> None: ...

    async def journal_put(
        self, run_id: str, key: str, value: Any, superstep: int, *, lease: Lease | None = None
    ) -> Any: ...

    async def journal_clear(self, run_id: str, key: str, *, lease: Lease | None = None) -> None: ...

    async def close(self) -> None: ...
