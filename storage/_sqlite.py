"""SqliteStore: durable runs in one SQLite file (WAL), through SQLAlchemy Core over aiosqlite.

Every write is one ``BEGIN IMMEDIATE`` transaction, so a superstep commit -- checkpoint, new
requests, applied answers, run status -- lands whole or not at all, and two processes never
interleave writes. A commit writes a *delta* (what the superstep changed) and, every
``snapshot_every`` commits, a full *snapshot*, so restore reads one snapshot plus a bounded tail.

Durability: ``synchronous=NORMAL`` (default) survives a process crash at any point, and loses at
most the last transactions on power loss; pass ``synchronous="FULL"`` (or set
``WORKFLOW_ENGINE_SQLITE_SYNC=FULL``) to fsync every commit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, event, func, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from workflow_engine import (
    Checkpoint,
    CheckpointDelta,
    CheckpointNotFoundError,
    RequestAlreadyAnsweredError,
    RequestCancelledError,
    UnknownRequestError,
    WorkflowRunState,
    apply_delta,
    delta_of,
)
from workflow_engine import __version__ as engine_version
from workflow_engine._errors import (
    RunBusyError,
    RunNotFoundError,
    SchemaVersionError,
    StorageError,
    StoreCorruptError,
    StoreLockedError,
    StoreUnavailableError,
)
from workflow_engine._store import (
    AnswerOutcome,
    CheckpointInfo,
    Lease,
    RequestStatus,
    RunRecord,
    StoredRequest,
    owner_is_dead,
)

from ._schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    checkpoints,
    journal,
    requests,
    runs,
    schema_info,
)

FaultHook = Callable[[str], None]
_TERMINAL = ("idle", "cancelled", "failed")


def default_db_path() -> Path:
    """``$WORKFLOW_ENGINE_DB``, else ``$XDG_DATA_HOME/workflow-engine/runs.db``."""
    env = os.environ.get("WORKFLOW_ENGINE_DB")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "workflow-engine" / "runs.db"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


class SqliteStore:
    """A :class:`~workflow_engine.RunStore` (and ``CheckpointStore``) in one SQLite file."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        synchronous: str | None = None,
        busy_timeout: float = 5.0,
        snapshot_every: int = 64,
        fault_hook: FaultHook | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        self.synchronous = (
            synchronous or os.environ.get("WORKFLOW_ENGINE_SQLITE_SYNC") or "NORMAL"
        ).upper()
        if self.synchronous not in ("NORMAL", "FULL"):
            raise ValueError("synchronous must be NORMAL or FULL")
        self.busy_timeout = busy_timeout
        self.snapshot_every = snapshot_every
        self.fault_hook = fault_hook
        self._writer: AsyncEngine | None = None
        self._reader: AsyncEngine | None = None
        self._meta: dict[str, tuple[int, int]] = {}  # run_id -> (checkpoint_seq, since_snapshot)
        self._lease_seconds: dict[str, float] = {}

    # --- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> SqliteStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._writer is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(
                f"cannot create the directory for the database {self.path}: {exc.strerror}"
            ) from exc
        if not os.access(self.path.parent, os.W_OK):
            raise StoreUnavailableError(
                f"cannot write the database {self.path}: directory {self.path.parent} is not "
                "writable"
            )
        self._writer = self._engine(immediate=True)
        self._reader = self._engine(immediate=False)
        try:
            await self._migrate()
        except BaseException:
            await self.close()
            raise

    def _engine(self, *, immediate: bool) -> AsyncEngine:
        engine = create_async_engine(
            f"sqlite+aiosqlite:///{self.path}",
            connect_args={"timeout": self.busy_timeout},
        )
        sync_mode = self.synchronous
        busy_ms = int(self.busy_timeout * 1000)

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute(f"PRAGMA synchronous={sync_mode}")
            cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine

    async def close(self) -> None:
        for engine in (self._writer, self._reader):
            if engine is not None:
                await engine.dispose()
        self._writer = self._reader = None

    async def _migrate(self) -> None:
        async with self._write() as conn:
            await conn.run_sync(lambda c: schema_info.create(c, checkfirst=True))
            row = (await conn.execute(select(schema_info.c.version))).first()
            current = row[0] if row else 0
            if current > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"database {self.path} has schema version {current}, written by a newer "
                    f"workflow-engine; this version understands up to {SCHEMA_VERSION}. Upgrade "
                    "workflow-engine or use another database file."
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                await conn.run_sync(MIGRATIONS[version])
            if current == 0:
                await conn.execute(
                    insert(schema_info).values(
                        id=1, version=SCHEMA_VERSION, written_by=engine_version
                    )
                )
            elif current < SCHEMA_VERSION:
                await conn.execute(
                    update(schema_info).values(version=SCHEMA_VERSION, written_by=engine_version)
                )

    # --- plumbing -------------------------------------------------------------------------------

    def _fault(self, point: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(point)

    @asynccontextmanager
    async def _write(self) -> AsyncIterator[AsyncConnection]:
        if self._writer is None:
            await self.open()
        assert self._writer is not None
        try:
            async with self._writer.begin() as conn:
                yield conn
        except IntegrityError:
            raise  # the caller knows which constraint means what
        except DBAPIError as exc:
            raise self._translate(exc) from exc

    @asynccontextmanager
    async def _read(self) -> AsyncIterator[AsyncConnection]:
        if self._reader is None:
            await self.open()
        assert self._reader is not None
        try:
            async with self._reader.begin() as conn:
                yield conn
        except DBAPIError as exc:
            raise self._translate(exc) from exc

    def _translate(self, exc: DBAPIError) -> StorageError:
        text = str(exc.orig) if exc.orig is not None else str(exc)
        lowered = text.lower()
        if "locked" in lowered or "busy" in lowered:
            return StoreLockedError(
                f"database {self.path} stayed locked by another writer for more than "
                f"{self.busy_timeout:g} s"
            )
        if "not a database" in lowered or "malformed" in lowered:
            return StoreCorruptError(f"database {self.path} is damaged: {text}")
        if "readonly" in lowered or "unable to open" in lowered or "disk i/o" in lowered:
            return StoreUnavailableError(f"cannot write the database {self.path}: {text}")
        return StorageError(f"database {self.path}: {text}")

    # --- runs -----------------------------------------------------------------------------------

    async def admit(self, checkpoint: Checkpoint, *, parent_run_id: str | None = None) -> None:
        now = time.time()
        self._fault("admit:before")
        try:
            async with self._write() as conn:
                await conn.execute(
                    insert(runs).values(
                        run_id=checkpoint.run_id,
                        workflow_name=checkpoint.workflow_name,
                        workflow_signature=checkpoint.workflow_signature,
                        status=checkpoint.status.value,
                        superstep=checkpoint.superstep,
                        created_at=now,
                        updated_at=now,
                        version=0,
                        latest_checkpoint_id=checkpoint.checkpoint_id,
                        checkpoint_seq=0,
                        since_snapshot=0,
                        parent_run_id=parent_run_id,
                    )
                )
                await conn.execute(insert(checkpoints).values(**_checkpoint_row(checkpoint, 0)))
                rows = _request_rows(checkpoint, list(checkpoint.pending_requests), now)
                if rows:
                    await conn.execute(insert(requests), rows)
                self._fault("admit:inside")
        except IntegrityError as exc:
            raise StorageError(f"run {checkpoint.run_id!r} already exists") from exc
        self._fault("admit:after")

    async def acquire(self, run_id: str, owner: str, lease_seconds: float) -> Lease:
        now = time.time()
        async with self._write() as conn:
            row = (
                await conn.execute(
                    select(
                        runs.c.owner,
                        runs.c.lease_expires_at,
                        runs.c.version,
                        runs.c.checkpoint_seq,
                        runs.c.since_snapshot,
                    ).where(runs.c.run_id == run_id)
                )
            ).first()
            if row is None:
                raise RunNotFoundError(f"no run {run_id!r} in {self.path}")
            holder, expires, version, seq, since = row
            if (
                holder is not None
                and holder != owner
                and (expires or 0) > now
                and not owner_is_dead(holder)
            ):
                raise RunBusyError(
                    f"run {run_id!r} is being executed by another worker ({holder}); its lease "
                    f"runs for {expires - now:.1f} s more"
                )
            expires_at = now + lease_seconds
            await conn.execute(
                update(runs)
                .where(runs.c.run_id == run_id, runs.c.version == version)
                .values(owner=owner, lease_expires_at=expires_at, version=version + 1)
            )
        self._meta[run_id] = (seq, since)
        self._lease_seconds[run_id] = lease_seconds
        return Lease(run_id, owner, version + 1, expires_at)

    async def release(self, lease: Lease) -> None:
        async with self._write() as conn:
            await conn.execute(
                update(runs)
                .where(
                    runs.c.run_id == lease.run_id,
                    runs.c.owner == lease.owner,
                    runs.c.version == lease.version,
                )
                .values(owner=None, lease_expires_at=None)
            )

    async def commit(self, lease: Lease, checkpoint: Checkpoint) -> Lease:
        """One transaction: fenced run update, checkpoint row, request changes."""
        now = time.time()
        seq, since = self._meta.get(lease.run_id, (None, None))  # type: ignore[assignment]
        if seq is None:
            raise RunBusyError(f"run {lease.run_id!r}: commit without acquiring its lease")
        seq += 1
        snapshot = checkpoint.parent_id is None or since + 1 >= self.snapshot_every
        since = 0 if snapshot else since + 1
        changes = checkpoint.changes
        expires_at = now + self._lease_seconds.get(lease.run_id, 30.0)  # each commit renews
        self._fault("commit:before")
        async with self._write() as conn:
            result = await conn.execute(
                update(runs)
                .where(
                    runs.c.run_id == lease.run_id,
                    runs.c.version == lease.version,
                    runs.c.owner == lease.owner,
                )
                .values(
                    version=lease.version + 1,
                    status=checkpoint.status.value,
                    superstep=checkpoint.superstep,
                    updated_at=now,
                    latest_checkpoint_id=checkpoint.checkpoint_id,
                    checkpoint_seq=seq,
                    since_snapshot=since,
                    lease_expires_at=expires_at,
                    error=None,
                )
            )
            if result.rowcount != 1:
                raise RunBusyError(
                    f"run {lease.run_id!r} is being executed by another worker: our lease "
                    "was taken over, so this superstep is not committed"
                )
            await conn.execute(
                insert(checkpoints).values(**_checkpoint_row(checkpoint, seq, snapshot=snapshot))
            )
            if changes.requests_added:
                rows = _request_rows(checkpoint, changes.requests_added, now)
                if rows:
                    await conn.execute(insert(requests), rows)
            if changes.requests_answered:
                await conn.execute(
                    update(requests)
                    .where(requests.c.request_id.in_(changes.requests_answered))
                    .values(status="applied")
                )
            if changes.requests_cancelled:
                await conn.execute(
                    update(requests)
                    .where(requests.c.request_id.in_(changes.requests_cancelled))
                    .values(status="cancelled")
                )
            self._fault("commit:inside")
        self._meta[lease.run_id] = (seq, since)
        self._fault("commit:after")
        return Lease(lease.run_id, lease.owner, lease.version + 1, expires_at)

    async def set_status(
        self, lease: Lease, status: WorkflowRunState, error: dict[str, Any] | None = None
    ) -> Lease:
        async with self._write() as conn:
            result = await conn.execute(
                update(runs)
                .where(
                    runs.c.run_id == lease.run_id,
                    runs.c.version == lease.version,
                    runs.c.owner == lease.owner,
                )
                .values(
                    version=lease.version + 1,
                    status=status.value,
                    updated_at=time.time(),
                    error=json.dumps(error) if error else None,
                )
            )
            if result.rowcount != 1:
                raise RunBusyError(
                    f"run {lease.run_id!r} is being executed by another worker: status not set"
                )
        return Lease(lease.run_id, lease.owner, lease.version + 1, lease.expires_at)

    async def get_run(self, run_id: str) -> RunRecord:
        async with self._read() as conn:
            row = (await conn.execute(select(runs).where(runs.c.run_id == run_id))).first()
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self.path}")
        return _run_record(row)

    async def list_runs(
        self,
        status: WorkflowRunState | None = None,
        workflow: str | None = None,
        limit: int | None = None,
    ) -> Sequence[RunRecord]:
        query = select(runs).order_by(runs.c.created_at, runs.c.run_id)
        if status is not None:
            query = query.where(runs.c.status == WorkflowRunState(status).value)
        if workflow is not None:
            query = query.where(runs.c.workflow_name == workflow)
        if limit is not None:
            query = query.limit(limit)
        async with self._read() as conn:
            return [_run_record(r) for r in await conn.execute(query)]

    # --- checkpoints ----------------------------------------------------------------------------

    async def save(self, checkpoint: Checkpoint) -> None:
        """``CheckpointStore.save`` for plain ``workflow.run(checkpoint_store=...)`` use: admits
        the run on its first checkpoint, then commits under a lease this store holds."""
        try:
            await self.get_run(checkpoint.run_id)
        except RunNotFoundError:
            await self.admit(checkpoint)
            return
        lease = await self.acquire(checkpoint.run_id, f"save:{os.getpid()}", 60.0)
        lease = await self.commit(lease, checkpoint)
        await self.release(lease)

    async def latest(self, run_id: str) -> Checkpoint | None:
        async with self._read() as conn:
            seq = (
                await conn.execute(
                    select(func.max(checkpoints.c.seq)).where(checkpoints.c.run_id == run_id)
                )
            ).scalar()
            if seq is None:
                return None
            return await self._materialize(conn, run_id, seq)

    async def load(self, checkpoint_id: str) -> Checkpoint:
        async with self._read() as conn:
            row = (
                await conn.execute(
                    select(checkpoints.c.run_id, checkpoints.c.seq).where(
                        checkpoints.c.checkpoint_id == checkpoint_id
                    )
                )
            ).first()
            if row is None:
                raise CheckpointNotFoundError(f"no checkpoint {checkpoint_id!r} in {self.path}")
            return await self._materialize(conn, row[0], row[1])

    async def _materialize(self, conn: AsyncConnection, run_id: str, seq: int) -> Checkpoint:
        """Fold the latest snapshot at or before ``seq`` and the deltas after it."""
        base = (
            await conn.execute(
                select(func.max(checkpoints.c.seq)).where(
                    checkpoints.c.run_id == run_id,
                    checkpoints.c.seq <= seq,
                    checkpoints.c.kind == "snapshot",
                )
            )
        ).scalar()
        if base is None:
            raise StoreCorruptError(f"run {run_id!r}: no snapshot at or before checkpoint #{seq}")
        rows = await conn.execute(
            select(
                checkpoints.c.checkpoint_id,
                checkpoints.c.seq,
                checkpoints.c.kind,
                checkpoints.c.body,
            )
            .where(
                checkpoints.c.run_id == run_id,
                checkpoints.c.seq >= base,
                checkpoints.c.seq <= seq,
            )
            .order_by(checkpoints.c.seq)
        )
        current: Checkpoint | None = None
        for checkpoint_id, row_seq, kind, body in rows:
            try:
                if kind == "snapshot":
                    current = Checkpoint.model_validate_json(body)
                else:
                    assert current is not None
                    current = apply_delta(current, CheckpointDelta.model_validate_json(body))
            except (ValidationError, ValueError) as exc:
                raise StoreCorruptError(
                    f"run {run_id!r}: checkpoint {checkpoint_id} (#{row_seq}, {kind}) is "
                    f"corrupt and cannot be read: {str(exc).splitlines()[0]}"
                ) from exc
        assert current is not None
        return current

    async def list(self, run_id: str) -> Sequence[Checkpoint]:
        return [await self.load(info.checkpoint_id) for info in await self.history(run_id)]

    async def history(self, run_id: str) -> Sequence[CheckpointInfo]:
        async with self._read() as conn:
            rows = await conn.execute(
                select(
                    checkpoints.c.checkpoint_id,
                    checkpoints.c.seq,
                    checkpoints.c.superstep,
                    checkpoints.c.status,
                    checkpoints.c.created_at,
                    checkpoints.c.kind,
                )
                .where(checkpoints.c.run_id == run_id)
                .order_by(checkpoints.c.seq)
            )
            return [
                CheckpointInfo(cid, run_id, seq, step, WorkflowRunState(status), created, kind)
                for cid, seq, step, status, created, kind in rows
            ]

    async def delete(self, checkpoint_id: str) -> None:
        raise StorageError("checkpoints are removed with prune(keep_last=...)")

    # --- requests -------------------------------------------------------------------------------

    async def get_request(self, request_id: str) -> StoredRequest:
        async with self._read() as conn:
            row = (
                await conn.execute(select(requests).where(requests.c.request_id == request_id))
            ).first()
        if row is None:
            raise UnknownRequestError(f"no request {request_id!r} in {self.path}")
        return _request(row)

    async def list_requests(
        self, run_id: str | None = None, status: RequestStatus | None = "pending"
    ) -> Sequence[StoredRequest]:
        query = select(requests).order_by(requests.c.created_at, requests.c.request_id)
        if run_id is not None:
            query = query.where(requests.c.run_id == run_id)
        if status is not None:
            query = query.where(requests.c.status == status)
        async with self._read() as conn:
            return [_request(r) for r in await conn.execute(query)]

    async def answer(self, request_id: str, answer: Any) -> AnswerOutcome:
        text = canonical_json(answer)
        self._fault("answer:before")
        async with self._write() as conn:
            row = (
                await conn.execute(
                    select(requests.c.status, requests.c.answer, requests.c.run_id).where(
                        requests.c.request_id == request_id
                    )
                )
            ).first()
            if row is None:
                raise UnknownRequestError(f"no request {request_id!r} in {self.path}")
            status, previous, run_id = row
            if status == "cancelled":
                raise RequestCancelledError(f"run {run_id!r}: request {request_id!r} was cancelled")
            if status in ("answered", "applied"):
                if previous == text:
                    return AnswerOutcome.DUPLICATE
                raise RequestAlreadyAnsweredError(
                    f"run {run_id!r}: request {request_id!r} was already answered with a "
                    "different value; an answer cannot be changed"
                )
            await conn.execute(
                update(requests)
                .where(requests.c.request_id == request_id, requests.c.status == "pending")
                .values(status="answered", answer=text, answered_at=time.time())
            )
            self._fault("answer:inside")
        self._fault("answer:after")
        return AnswerOutcome.STORED

    # --- side-effect journal ------------------------------------------------------------------

    async def journal_get(self, run_id: str, key: str) -> Any | None:
        async with self._read() as conn:
            value = (
                await conn.execute(
                    select(journal.c.value).where(journal.c.run_id == run_id, journal.c.key == key)
                )
            ).scalar()
        return json.loads(value) if value is not None else None

    async def journal_put(self, run_id: str, key: str, value: Any) -> Any:
        """Insert unless present (first writer wins); returns the stored value."""
        text = canonical_json(value)
        self._fault("journal:before")
        async with self._write() as conn:
            stored = (
                await conn.execute(
                    select(journal.c.value).where(journal.c.run_id == run_id, journal.c.key == key)
                )
            ).scalar()
            if stored is None:
                await conn.execute(
                    insert(journal).values(
                        run_id=run_id, key=key, value=text, created_at=time.time()
                    )
                )
                stored = text
            self._fault("journal:inside")
        self._fault("journal:after")
        return json.loads(stored)

    # --- retention ------------------------------------------------------------------------------

    async def prune(
        self, *, finished_before: float | None = None, keep_last: int | None = None
    ) -> int:
        deleted = 0
        if finished_before is not None:
            async with self._write() as conn:
                doomed = [
                    r[0]
                    for r in await conn.execute(
                        select(runs.c.run_id).where(
                            runs.c.status.in_(_TERMINAL), runs.c.updated_at < finished_before
                        )
                    )
                ]
                for table in (checkpoints, requests, journal):
                    result = await conn.execute(delete(table).where(table.c.run_id.in_(doomed)))
                    if table is checkpoints:
                        deleted += result.rowcount
                await conn.execute(delete(runs).where(runs.c.run_id.in_(doomed)))
        if keep_last is not None:
            if keep_last < 1:
                raise ValueError("keep_last must be at least 1")
            deleted += await self._keep_last(keep_last)
        return deleted

    async def _keep_last(self, keep: int) -> int:
        deleted = 0
        async with self._write() as conn:
            counts = await conn.execute(
                select(checkpoints.c.run_id, func.max(checkpoints.c.seq), func.count())
                .group_by(checkpoints.c.run_id)
                .having(func.count() > keep)
            )
            for run_id, max_seq, _count in list(counts):
                first_kept = max_seq - keep + 1
                # the oldest kept checkpoint becomes a snapshot, so nothing kept needs the rest
                full = await self._materialize(conn, run_id, first_kept)
                await conn.execute(
                    update(checkpoints)
                    .where(checkpoints.c.run_id == run_id, checkpoints.c.seq == first_kept)
                    .values(kind="snapshot", body=full.model_dump_json())
                )
                result = await conn.execute(
                    delete(checkpoints).where(
                        checkpoints.c.run_id == run_id, checkpoints.c.seq < first_kept
                    )
                )
                deleted += result.rowcount
        return deleted


def _checkpoint_row(checkpoint: Checkpoint, seq: int, *, snapshot: bool = True) -> dict[str, Any]:
    body = checkpoint.model_dump_json() if snapshot else delta_of(checkpoint).model_dump_json()
    return {
        "checkpoint_id": checkpoint.checkpoint_id,
        "run_id": checkpoint.run_id,
        "seq": seq,
        "superstep": checkpoint.superstep,
        "kind": "snapshot" if snapshot else "delta",
        "status": checkpoint.status.value,
        "codec": checkpoint.codec,
        "schema_version": checkpoint.schema_version,
        "body": body,
        "created_at": checkpoint.created_at,
    }


def _request_rows(checkpoint: Checkpoint, ids: Sequence[str], now: float) -> list[dict[str, Any]]:
    rows = []
    for rid in ids:
        record = checkpoint.pending_requests.get(rid)
        if record is None:
            continue
        rows.append(
            {
                "request_id": rid,
                "run_id": checkpoint.run_id,
                "port_id": record.port_id,
                "source_executor_id": record.source_executor_id,
                "kind": record.kind,
                "data": json.dumps(record.data),
                "response_type": record.response_type,
                "superstep": record.superstep,
                "status": "pending",
                "answer": None,
                "codec": checkpoint.codec,
                "created_at": now,
                "answered_at": None,
            }
        )
    return rows


def _run_record(row: Any) -> RunRecord:
    m = row._mapping
    return RunRecord(
        run_id=m["run_id"],
        workflow_name=m["workflow_name"],
        workflow_signature=m["workflow_signature"],
        status=WorkflowRunState(m["status"]),
        superstep=m["superstep"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        version=m["version"],
        owner=m["owner"],
        lease_expires_at=m["lease_expires_at"],
        latest_checkpoint_id=m["latest_checkpoint_id"],
        error=json.loads(m["error"]) if m["error"] else None,
        parent_run_id=m["parent_run_id"],
    )


def _request(row: Any) -> StoredRequest:
    m = row._mapping
    return StoredRequest(
        request_id=m["request_id"],
        run_id=m["run_id"],
        port_id=m["port_id"],
        source_executor_id=m["source_executor_id"],
        kind=m["kind"],
        data=json.loads(m["data"]),
        response_type=m["response_type"],
        superstep=m["superstep"],
        status=m["status"],
        answer=json.loads(m["answer"]) if m["answer"] is not None else None,
        created_at=m["created_at"],
        answered_at=m["answered_at"],
    )
