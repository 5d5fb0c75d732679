"""InMemoryRunStore: the RunStore contract kept in dicts -- for tests and throwaway runs.

It keeps the same rules as the SQLite store (atomic admission, fenced commits, single-valued
answers) so the conformance suite can hold both to one standard; it just forgets on exit.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import anyio

from workflow_engine import (
    AnswerOutcome,
    Checkpoint,
    CheckpointInfo,
    CheckpointNotFoundError,
    CheckpointNotLatestError,
    Lease,
    LeaseLostError,
    RequestAlreadyAnsweredError,
    RequestCancelledError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    RunRecord,
    StorageError,
    StoredRequest,
    UnknownRequestError,
    WorkflowRunState,
    owner_is_dead,
)
from workflow_engine._checkpoint import canonical_answer
from workflow_engine._store import (
    Acquired,
    RequestStatus,
    check_own,
    check_prune,
    ended_lease,
    holder_of,
)

_TERMINAL = (WorkflowRunState.IDLE, WorkflowRunState.CANCELLED, WorkflowRunState.FAILED)


def _copy(value: Any) -> Any:
    """A JSON copy of ``value`` as a store keeps it: its keys in their order."""
    return json.loads(json.dumps(value, separators=(",", ":"), allow_nan=False))


_DONE_WITH_A_CANCEL = frozenset({WorkflowRunState.CANCELLED, WorkflowRunState.IDLE})
"""A checkpoint of these ends what a cancel requested meanwhile asked for: cancelled, or
finished -- a finished run stays finished, as a workflow engine's completed workflow ignores a
late cancel (it was then marked cancelled, its effects done: outside testers 110, 111)."""


class InMemoryRunStore:
    """A RunStore in process memory. Checkpoints are immutable, so they are kept as objects."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        """Wall-clock seconds for leases and timestamps (a simulator passes its own)."""
        self._runs: dict[str, RunRecord] = {}
        self._checkpoints: dict[str, list[Checkpoint]] = {}
        self._requests: dict[str, StoredRequest] = {}
        # each run's request ids, in the order it asked them: a run's commit, resume or listing
        # reads its own requests, not every run's (which made each one slower as runs piled up)
        self._requests_of: dict[str, dict[str, None]] = {}
        self._lease_seconds: dict[str, float] = {}
        self._seq_offset: dict[str, int] = {}  # checkpoints pruned from the front
        # run_id -> key -> (superstep, entry)
        self._journal: dict[str, dict[str, tuple[int, Any]]] = {}
        self._checkpoint_by_id: dict[str, Checkpoint] = {}
        self._cancel_requested: set[str] = set()
        # uncontended (every call on one event loop, most of the time): taken without a trip
        # through the event loop, which cost more than the store's own work per commit
        self._lock = anyio.Lock(fast_acquire=True)

    async def __aenter__(self) -> InMemoryRunStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        return None

    def _run(self, run_id: str) -> RunRecord:
        try:
            return self._runs[run_id]
        except KeyError:
            raise RunNotFoundError(f"no run {run_id!r} in memory") from None

    def _add_requests(self, checkpoint: Checkpoint, ids: Sequence[str], now: float) -> None:
        for rid in ids:
            record = checkpoint.pending_requests.get(rid)
            if record is not None:
                self._requests_of.setdefault(checkpoint.run_id, {})[rid] = None
                self._requests[rid] = StoredRequest(
                    rid,
                    checkpoint.run_id,
                    record.port_id,
                    record.source_executor_id,
                    record.kind,
                    record.data,
                    record.response_type,
                    record.superstep,
                    "pending",
                    None,
                    now,
                    None,
                )

    async def admit(self, checkpoint: Checkpoint, *, parent_run_id: str | None = None) -> None:
        async with self._lock:
            if checkpoint.run_id in self._runs:
                raise RunExistsError(f"run {checkpoint.run_id!r} already exists")
            self._check_new_id(checkpoint)
            now = self.clock()
            self._runs[checkpoint.run_id] = RunRecord(
                run_id=checkpoint.run_id,
                workflow_name=checkpoint.workflow_name,
                workflow_signature=checkpoint.workflow_signature,
                status=checkpoint.status,
                superstep=checkpoint.superstep,
                created_at=now,
                updated_at=now,
                latest_checkpoint_id=checkpoint.checkpoint_id,
                parent_run_id=parent_run_id,
            )
            self._checkpoints[checkpoint.run_id] = [checkpoint]
            self._checkpoint_by_id[checkpoint.checkpoint_id] = checkpoint
            self._add_requests(checkpoint, list(checkpoint.pending_requests), now)

    async def acquire(self, run_id: str, owner: str, lease_seconds: float) -> Lease:
        async with self._lock:
            run = self._run(run_id)
            now = self.clock()
            if (
                run.owner is not None
                and run.owner != owner
                and (run.lease_expires_at or 0) > now
                and not owner_is_dead(run.owner)
            ):
                raise RunBusyError(f"run {run_id!r} is being executed by {holder_of(run.owner)}")
            expires = now + lease_seconds
            self._runs[run_id] = replace(
                run, owner=owner, lease_expires_at=expires, version=run.version + 1
            )
            self._lease_seconds[run_id] = lease_seconds
            cancel = run_id in self._cancel_requested
            return Lease(run_id, owner, run.version + 1, expires, cancel)

    async def admit_and_acquire(
        self,
        checkpoint: Checkpoint,
        owner: str,
        lease_seconds: float,
        *,
        parent_run_id: str | None = None,
    ) -> Lease:
        await self.admit(checkpoint, parent_run_id=parent_run_id)
        return await self.acquire(checkpoint.run_id, owner, lease_seconds)

    async def admit_and_commit(
        self,
        admitted: Checkpoint,
        checkpoint: Checkpoint,
        owner: str,
        lease_seconds: float,
        *,
        release: bool = False,
    ) -> Lease:
        # as one transaction would: what would refuse the commit is checked before the run is
        # admitted, so a refusal writes nothing
        if admitted.run_id in self._runs:
            raise RunExistsError(f"run {admitted.run_id!r} already exists")
        check_own(admitted.run_id, checkpoint)
        if checkpoint.parent_id != admitted.checkpoint_id:
            raise CheckpointNotLatestError(
                f"run {admitted.run_id!r}: checkpoint {checkpoint.checkpoint_id} follows "
                f"{checkpoint.parent_id}, but the run's first checkpoint is "
                f"{admitted.checkpoint_id}"
            )
        if checkpoint.checkpoint_id == admitted.checkpoint_id:
            raise StorageError(
                f"run {admitted.run_id!r}: two checkpoints with the id "
                f"{checkpoint.checkpoint_id!r}; checkpoint ids are unique"
            )
        self._check_new_id(checkpoint)  # (``admit`` checks the admitted one's before writing)
        lease = await self.admit_and_acquire(admitted, owner, lease_seconds)
        if release:
            return await self.commit_and_release(lease, checkpoint)
        return await self.commit(lease, checkpoint)

    async def acquire_latest(
        self,
        run_id: str,
        owner: str,
        lease_seconds: float,
        check: Callable[[RunRecord], None] | None = None,
    ) -> Acquired:
        run = self._run(run_id)
        if check is not None:
            check(run)
        lease = await self.acquire(run_id, owner, lease_seconds)
        answered = await self.list_requests(run_id, status="answered")
        if answered and run.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS:
            # it runs from now on, to apply them (answering does not write the run's status)
            self._runs[run_id] = replace(self._runs[run_id], status=WorkflowRunState.IN_PROGRESS)
        return self._run(run_id), lease, await self.latest(run_id), answered

    async def answer_and_acquire(
        self,
        request_id: str,
        answer: Any,
        owner: str,
        lease_seconds: float,
        check: Callable[[RunRecord], None] | None = None,
    ) -> tuple[AnswerOutcome, Acquired | None]:
        # as one transaction would: the answer is judged first (a conflict is said as such),
        # then the run checked; refused, nothing is written, the answer neither
        async with self._lock:
            request = await self.get_request(request_id)
            repeat = self._answered(request, answer)
            if check is not None:
                check(self._run(request.run_id))
            if not repeat:
                self._store_answer(request, answer)
        outcome = AnswerOutcome.DUPLICATE if repeat else AnswerOutcome.STORED
        try:
            return outcome, await self.acquire_latest(request.run_id, owner, lease_seconds)
        except RunBusyError:
            return outcome, None

    async def commit_and_release(self, lease: Lease, checkpoint: Checkpoint) -> Lease:
        lease = await self.commit(lease, checkpoint)
        if not lease.cancel_requested:  # else kept: its holder honours the cancel now
            await self.release(lease)
        return lease

    async def get_run_and_latest(self, run_id: str) -> tuple[RunRecord, Checkpoint | None]:
        return self._shown(self._run(run_id)), await self.latest(run_id)

    async def get_request_and_run(self, request_id: str) -> tuple[StoredRequest, RunRecord]:
        request = await self.get_request(request_id)
        return request, self._shown(self._run(request.run_id))

    def _shown(self, run: RunRecord) -> RunRecord:
        """The record as readers get it: with the cancel request kept beside it."""
        if run.run_id in self._cancel_requested:
            return replace(run, cancel_requested=True)
        return run

    async def release(self, lease: Lease) -> Lease | None:
        async with self._lock:
            run = self._runs.get(lease.run_id)
            # owner tokens are unique per execution: the owner alone fences a release (so a
            # caller that lost track of its lease version mid-commit can still release)
            if run is None or run.owner != lease.owner:
                return None
            self._runs[lease.run_id] = replace(run, owner=None, lease_expires_at=None)
            return ended_lease(
                lease,
                run.status,
                lease.run_id in self._cancel_requested,
                any(  # (the run's own requests: every request of every run was scanned)
                    self._requests[rid].status == "answered"
                    for rid in self._requests_of.get(lease.run_id, ())
                ),
            )

    def _fenced(self, lease: Lease) -> RunRecord:
        run = self._run(lease.run_id)
        if run.owner != lease.owner or run.version != lease.version:
            now = f"it is held by {holder_of(run.owner)}" if run.owner else "it was released"
            raise LeaseLostError(
                f"run {lease.run_id!r}: our lease was taken over ({now}), so this write is refused"
            )
        return run

    async def renew(self, lease: Lease) -> Lease:
        async with self._lock:
            run = self._fenced(lease)
            expires = self.clock() + self._lease_seconds.get(lease.run_id, 30.0)
            self._runs[lease.run_id] = replace(run, lease_expires_at=expires)
            cancel = lease.run_id in self._cancel_requested
            return Lease(lease.run_id, lease.owner, lease.version, expires, cancel)

    async def request_cancel(self, run_id: str) -> bool:
        async with self._lock:
            if self._run(run_id).owner is None:
                return False  # it rests: cancelled directly
            self._cancel_requested.add(run_id)
            return True

    async def commit(self, lease: Lease, checkpoint: Checkpoint) -> Lease:
        check_own(lease.run_id, checkpoint)
        async with self._lock:
            run = self._fenced(lease)
            if (
                checkpoint.parent_id is not None
                and checkpoint.parent_id != run.latest_checkpoint_id
            ):
                raise CheckpointNotLatestError(
                    f"run {lease.run_id!r}: checkpoint {checkpoint.checkpoint_id} follows "
                    f"{checkpoint.parent_id}, but the run's latest checkpoint is "
                    f"{run.latest_checkpoint_id}; continue from the latest or fork"
                )
            self._check_new_id(checkpoint)
            now = self.clock()
            expires = now + self._lease_seconds.get(lease.run_id, 30.0)
            changes = checkpoint.changes
            self._checkpoints[lease.run_id].append(checkpoint)
            self._checkpoint_by_id[checkpoint.checkpoint_id] = checkpoint
            self._add_requests(checkpoint, changes.requests_added, now)
            for rid in changes.requests_answered:
                if rid in self._requests:
                    self._requests[rid] = replace(self._requests[rid], status="applied")
            for rid in changes.requests_cancelled:
                if rid in self._requests:
                    self._requests[rid] = replace(self._requests[rid], status="cancelled")
            self._runs[lease.run_id] = replace(
                run,
                version=run.version + 1,
                status=checkpoint.status,
                superstep=checkpoint.superstep,
                updated_at=now,
                latest_checkpoint_id=checkpoint.checkpoint_id,
                lease_expires_at=expires,
                error=None,
            )
            journal = self._journal.get(lease.run_id)
            if journal:
                for key in [k for k, (step, _) in journal.items() if step <= checkpoint.superstep]:
                    del journal[key]
            if checkpoint.status in _DONE_WITH_A_CANCEL:
                self._cancel_requested.discard(lease.run_id)
            cancel = lease.run_id in self._cancel_requested
            waiting = checkpoint.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS and any(
                self._requests[rid].status == "answered"
                for rid in self._requests_of.get(lease.run_id, ())
            )
            return Lease(lease.run_id, lease.owner, run.version + 1, expires, cancel, waiting)

    def _forget_checkpoints(self, checkpoints: list[Checkpoint]) -> int:
        """Drop pruned checkpoints from the index by id; how many they were."""
        for cp in checkpoints:
            del self._checkpoint_by_id[cp.checkpoint_id]
        return len(checkpoints)

    def _check_new_id(self, checkpoint: Checkpoint) -> None:
        """A checkpoint id names one checkpoint (as the SQLite store's unique key keeps it)."""
        if checkpoint.checkpoint_id in self._checkpoint_by_id:
            raise StorageError(
                f"run {checkpoint.run_id!r}: a checkpoint {checkpoint.checkpoint_id!r} is "
                "already stored; checkpoint ids are unique"
            )

    async def set_status(
        self, lease: Lease, status: WorkflowRunState, error: dict[str, Any] | None = None
    ) -> Lease:
        async with self._lock:
            run = self._fenced(lease)
            self._runs[lease.run_id] = replace(
                run, version=run.version + 1, status=status, updated_at=self.clock(), error=error
            )
            if status is WorkflowRunState.FAILED:
                self._cancel_requested.discard(lease.run_id)
            return Lease(lease.run_id, lease.owner, run.version + 1, lease.expires_at)

    async def get_run(self, run_id: str) -> RunRecord:
        return self._shown(self._run(run_id))

    async def list_runs(
        self,
        status: WorkflowRunState | None = None,
        workflow: str | None = None,
        limit: int | None = None,
    ) -> Sequence[RunRecord]:
        out = [
            self._shown(r)
            for r in sorted(self._runs.values(), key=lambda r: (r.created_at, r.run_id))
            if (status is None or r.status == status)
            and (workflow is None or r.workflow_name == workflow)
        ]
        return out[:limit] if limit is not None else out

    async def save(self, checkpoint: Checkpoint) -> None:
        if checkpoint.run_id not in self._runs:
            await self.admit(checkpoint)
            return
        lease = await self.acquire(checkpoint.run_id, "save", 60.0)
        lease = await self.commit(lease, checkpoint)
        await self.release(lease)

    async def latest(self, run_id: str) -> Checkpoint | None:
        items = self._checkpoints.get(run_id)
        return items[-1] if items else None

    async def load(self, checkpoint_id: str) -> Checkpoint:
        try:
            return self._checkpoint_by_id[checkpoint_id]
        except KeyError:
            raise CheckpointNotFoundError(f"no checkpoint {checkpoint_id!r}") from None

    async def list(self, run_id: str) -> Sequence[Checkpoint]:
        return list(self._checkpoints.get(run_id, []))

    async def history(self, run_id: str) -> Sequence[CheckpointInfo]:
        items = self._checkpoints.get(run_id, [])
        offset = self._seq_offset.get(run_id, 0)
        return [
            CheckpointInfo(
                cp.checkpoint_id,
                run_id,
                offset + i,
                cp.superstep,
                cp.status,
                cp.created_at,
                "snapshot",
            )
            for i, cp in enumerate(items)
        ]

    async def delete(self, checkpoint_id: str) -> None:
        raise StorageError("checkpoints are removed with prune(keep_last=...)")

    async def get_request(self, request_id: str) -> StoredRequest:
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownRequestError(f"no request {request_id!r} in memory") from None

    async def list_requests(
        self, run_id: str | None = None, status: RequestStatus | None = "pending"
    ) -> Sequence[StoredRequest]:
        if run_id is None:
            requests: Any = self._requests.values()
        else:
            requests = (self._requests[rid] for rid in self._requests_of.get(run_id, ()))
        return sorted(
            (r for r in requests if status is None or r.status == status),
            key=lambda r: r.created_at,  # stable: the order the run asked them in
        )

    async def run_ids(self, prefix: str = "") -> Sequence[str]:
        return sorted(i for i in self._runs if i.startswith(prefix))

    async def request_ids(self, prefix: str = "") -> Sequence[str]:
        return sorted(i for i in self._requests if i.startswith(prefix))

    async def answer(self, request_id: str, answer: Any) -> AnswerOutcome:
        async with self._lock:
            request = await self.get_request(request_id)
            if self._answered(request, answer):
                return AnswerOutcome.DUPLICATE
            self._store_answer(request, answer)
            return AnswerOutcome.STORED

    async def answer_all(self, answers: Sequence[tuple[str, Any]]) -> Sequence[AnswerOutcome]:
        async with self._lock:
            # every one checked before any is stored: one refused, none is
            first: dict[str, Any] = {}  # request id -> the answer it has or gets
            to_store: list[StoredRequest | None] = []
            for request_id, answer in answers:
                request = await self.get_request(request_id)
                if request_id in first:  # (twice in the batch: the same answer, or refused)
                    given = replace(request, status="answered", answer=first[request_id])
                    self._answered(given, answer)
                    to_store.append(None)
                    continue
                repeat = self._answered(request, answer)
                first[request_id] = request.answer if repeat else answer
                to_store.append(None if repeat else request)
            outcomes = []
            for (_, answer), pending in zip(answers, to_store, strict=True):
                if pending is None:
                    outcomes.append(AnswerOutcome.DUPLICATE)
                else:
                    self._store_answer(pending, answer)
                    outcomes.append(AnswerOutcome.STORED)
            return outcomes

    async def cancel_requests(
        self, request_ids: Sequence[str], *, run_id: str | None = None
    ) -> None:
        async with self._lock:
            run = None if run_id is None else self._run(run_id)
            requests = [await self.get_request(request_id) for request_id in request_ids]
            for request in requests:  # every one checked before any is cancelled
                if request.status in ("answered", "applied"):
                    raise RequestAlreadyAnsweredError(
                        f"run {request.run_id!r}: request {request.request_id!r} was already "
                        "answered; an answered request cannot be cancelled"
                    )
            for request in requests:
                self._requests[request.request_id] = replace(request, status="cancelled")
            if run is not None and run.status not in (
                WorkflowRunState.IDLE,
                WorkflowRunState.CANCELLED,
            ):  # (a run that ended keeps no cancel: the cancel after this says it ended)
                self._cancel_requested.add(run.run_id)
                if run.status in (
                    WorkflowRunState.IDLE_WITH_PENDING_REQUESTS,
                    WorkflowRunState.FAILED,
                ):
                    self._runs[run.run_id] = replace(run, status=WorkflowRunState.IN_PROGRESS)

    def _answered(self, request: StoredRequest, answer: Any) -> bool:
        """Whether ``request`` already has ``answer`` (True: a repeat); raises if it cannot take
        it (cancelled, or answered otherwise). False: it is pending."""
        if request.status == "cancelled":
            raise RequestCancelledError(
                f"run {request.run_id!r}: request {request.request_id!r} was cancelled"
            )
        if request.status in ("answered", "applied"):
            if canonical_answer(request.answer) == canonical_answer(answer):
                return True
            raise RequestAlreadyAnsweredError(
                f"run {request.run_id!r}: request {request.request_id!r} was already answered "
                "with a different value; an answer cannot be changed"
            )
        return False

    def _store_answer(self, request: StoredRequest, answer: Any) -> None:
        self._requests[request.request_id] = replace(
            request, status="answered", answer=_copy(answer), answered_at=self.clock()
        )

    async def journal_get(self, run_id: str, key: str) -> Any | None:
        found = self._journal.get(run_id, {}).get(key)
        return None if found is None else _copy(found[1])

    async def journal_after(self, run_id: str, superstep: int) -> Sequence[tuple[str, Any]]:
        """The entries ``(key, entry)`` of supersteps after ``superstep``, oldest first."""
        return [
            (key, _copy(entry))
            for key, (step, entry) in self._journal.get(run_id, {}).items()
            if step > superstep
        ]

    async def journal_intent(
        self, run_id: str, key: str, entry: Any, superstep: int, *, lease: Lease | None = None
    ) -> None:
        async with self._lock:
            if lease is not None:
                self._fenced(lease)
            self._journal.setdefault(run_id, {}).setdefault(key, (superstep, _copy(entry)))

    async def journal_put(
        self, run_id: str, key: str, value: Any, superstep: int, *, lease: Lease | None = None
    ) -> Any:
        async with self._lock:
            if lease is not None:
                self._fenced(lease)
            journal = self._journal.setdefault(run_id, {})
            found = journal.get(key)
            if found is not None and "value" in found[1]:
                return _copy(found[1])
            journal[key] = (superstep, _copy(value))
            return _copy(value)

    async def journal_clear(self, run_id: str, key: str, *, lease: Lease | None = None) -> None:
        async with self._lock:
            if lease is not None:
                self._fenced(lease)
            self._journal.get(run_id, {}).pop(key, None)

    async def prune(
        self, *, finished_before: float | None = None, keep_last: int | None = None
    ) -> int:
        check_prune(finished_before, keep_last)
        deleted = 0
        async with self._lock:
            if finished_before is not None:
                now = self.clock()
                for run_id, run in list(self._runs.items()):
                    leased = run.owner is not None and (run.lease_expires_at or 0) > now
                    if run.status in _TERMINAL and run.updated_at < finished_before and not leased:
                        deleted += self._forget_checkpoints(self._checkpoints.pop(run_id, []))
                        del self._runs[run_id]
                        # nothing of it stays: a run admitted again under its id starts afresh
                        self._seq_offset.pop(run_id, None)
                        self._cancel_requested.discard(run_id)
                        self._lease_seconds.pop(run_id, None)
                        for rid in self._requests_of.pop(run_id, ()):
                            del self._requests[rid]
                        self._journal.pop(run_id, None)
            if keep_last is not None:
                for run_id, items in self._checkpoints.items():
                    if len(items) > keep_last:
                        dropped = len(items) - keep_last
                        deleted += self._forget_checkpoints(items[:dropped])
                        self._seq_offset[run_id] = self._seq_offset.get(run_id, 0) + dropped
                        self._checkpoints[run_id] = items[dropped:]
        return deleted
