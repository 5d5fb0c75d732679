"""SqliteStore: durable runs in one SQLite file (WAL), committed on the event loop's thread.

Every write is one ``BEGIN IMMEDIATE`` transaction (or a SAVEPOINT in one), so a superstep
commit -- checkpoint, new requests, applied answers, run status -- lands whole or not at all,
and two processes never interleave writes. A commit writes a *delta* (what the superstep
changed); now and then a full *snapshot* (once the deltas since the last one hold as many bytes
as it did, so storage stays linear); and every ``span_every`` deltas after a snapshot a *span*
(the checkpoint with its growing lists as what they gained since the last snapshot or span). A
restore reads the snapshot, its spans and fewer than ``span_every`` deltas.

Execution: the store owns one ``sqlite3`` connection. A short transaction runs right on the
event loop's thread: a WAL commit costs tens of µs, less than the hop to a thread and back
(measured: ~20-30 µs per hop here, more with the GIL passed back and forth). What may block
long runs on the store's worker thread (``_worker.py``): a write that finds the database locked
by another process (on the loop the connection never waits: ``busy_timeout`` is 0 there, and
the write is handed to the worker, which waits up to ``busy_timeout``), big reads (lists,
histories, full checkpoint loads) and retention. While the worker has work queued, every
operation goes there too, so operations keep their order and the connection is never used by
two threads at once. On another async library than asyncio everything runs on the worker.

Group commit: the writes of other tasks that arrive while the loop iteration of a write is not
over share the next transaction, each in a SAVEPOINT (a write refused by its lease fence fails
alone); every caller is answered only after the COMMIT returned, so nothing that follows a
write -- an event, a published request id -- is seen before it is durable.

WAL checkpoints never run inside a commit (``wal_autocheckpoint=0``): a thread of their own
copies the WAL back in the background (``_Checkpointer``). Statements are constant SQL text
(``sqlite3`` caches the prepared statements). The schema is declared once, as SQLAlchemy Core
tables in ``_schema.py``, which creates and migrates databases; SQLAlchemy is imported only when
a database needs that.

Durability: ``synchronous=NORMAL`` (default) survives a process crash at any point, and loses at
most the last transactions on power loss; pass ``synchronous="FULL"`` (or set
``WORKFLOW_ENGINE_SQLITE_SYNC=FULL``) to fsync every commit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import sqlite3
import stat
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio

from workflow_engine import (
    Checkpoint,
    CheckpointNotFoundError,
    CheckpointNotLatestError,
    RequestAlreadyAnsweredError,
    RequestCancelledError,
    UnknownRequestError,
    WorkflowRunState,
)
from workflow_engine import __version__ as engine_version
from workflow_engine._checkpoint import (
    canonical_answer,
    span_of,
)
from workflow_engine._codec import UNREADABLE_INT
from workflow_engine._detached import Detached, spawn_detached
from workflow_engine._errors import (
    LeaseLostError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    SchemaVersionError,
    SerializationError,
    StorageError,
    StoreCorruptError,
    StoreLockedError,
    StoreUnavailableError,
    UsageError,
    shown,
)
from workflow_engine._store import (
    Acquired,
    AnswerOutcome,
    CheckpointInfo,
    Lease,
    RequestStatus,
    RunRecord,
    StoredRequest,
    check_own,
    check_prune,
    ended_lease,
    holder_of,
    owner_is_dead,
)

from ._chain import chain_to, check_chain, fold_chain, latest_chain
from ._chunks import (
    CHUNKED_VERSION,
    CHUNKING,
    split_texts,
    store_chunks,
    stored_row,
    with_split,
)
from ._location import default_db_path, synchronous_mode
from ._reader import (
    damaged,
    directory_refused,
    not_a_file_refused,
    not_sqlite,
    read_only_uri,
    reading_uri,
)
from ._records import (
    SQLITE_FAILURES,
    answered_counts,
    decode_text,
    ids_beside,
    journal_entries,
    journal_entry,
    lease_columns,
    listed_runs,
    listed_runs_apart,
    load_json,
    request_id_of,
    requests_of_run,
    run_id_of,
    run_record,
    stored_request,
)
from ._rows import (
    LISTS_APART_VERSION,
    LONG_LIST,
    admit_rows,
    checkpoint_info,
    checkpoint_row,
    new_request_rows,
    row_bytes,
    snapshot_parts,
    span_row,
)
from ._schema import SCHEMA_VERSION, TABLES, foreign_tables_refused, migrate
from ._sql import (
    REQUEST_COLUMNS,
    RUN_COLUMNS,
    SQL_ANSWER_STATE,
    SQL_ANSWER_WAITING,
    SQL_ANSWERED,
    SQL_CANCEL_DONE,
    SQL_CANCEL_INTENDED,
    SQL_CANCEL_REQUEST,
    SQL_CHECKPOINT_PLACE,
    SQL_COMMIT_RUN_KEEP_STATUS_NO_CANCEL,
    SQL_COMMIT_RUN_NO_CANCEL,
    SQL_COMMIT_RUN_RELEASE_CANCEL_DONE,
    SQL_COMMIT_RUN_RELEASE_NO_CANCEL,
    SQL_COMMIT_RUN_RELEASE_UNLESS_CANCEL,
    SQL_COMMIT_RUN_SAYING_CANCEL,
    SQL_COUNT_REQUESTS,
    SQL_DOOMED,
    SQL_DOOMED_RUN_NO,
    SQL_DROP_BEFORE,
    SQL_DROP_RUN,
    SQL_DROP_RUN_CHECKPOINTS,
    SQL_FENCE,
    SQL_FIRST_SPAN_AFTER,
    SQL_HISTORY,
    SQL_HISTORY_LENGTH,
    SQL_INSERT_CHECKPOINT,
    SQL_INSERT_REQUEST,
    SQL_INSERT_RUN,
    SQL_JOURNAL_AFTER,
    SQL_JOURNAL_CLEAR,
    SQL_JOURNAL_COMPACT,
    SQL_JOURNAL_GET,
    SQL_JOURNAL_PUT,
    SQL_JOURNAL_REPLACE,
    SQL_LEASE_STATE,
    SQL_LONG_HISTORIES,
    SQL_MAKE_SNAPSHOT,
    SQL_RELEASE,
    SQL_RELEASE_UNUSED,
    SQL_RELEASED_STATE,
    SQL_RENEW,
    SQL_REQUEST,
    SQL_REQUEST_AND_RUN,
    SQL_REQUEST_CANCEL,
    SQL_REQUEST_DATA_SIZE,
    SQL_REQUEST_IDS,
    SQL_REQUEST_IDS_BESIDE,
    SQL_REQUEST_STATUS,
    SQL_RUN,
    SQL_RUN_BASE,
    SQL_RUN_FOR_LEASE,
    SQL_RUN_IDS,
    SQL_RUN_IDS_BESIDE,
    SQL_RUNS_JOURNALED_PAST,
    SQL_SCHEMA_VERSION,
    SQL_SET_STATUS,
    SQL_SPAN_BASE,
    SQL_STORE_ANSWER,
    SQL_TABLE_NAMES,
    SQL_TAKE_LEASE,
    SQL_TAKE_LEASE_TO_APPLY,
    filtered,
    prefix_query,
    runs_by_update,
    started_runs,
)
from ._stored_lists import StoredLists, lists_bytes
from ._worker import Abandoned, Worker, given_up_on

log = logging.getLogger("workflow_engine.storage")

FaultHook = Callable[[str], None]
# Latest checkpoints kept in memory per store, most recently used first: at most this many runs,
# and at most about this many bytes of their stored JSON (a long conversation counts for what
# it holds, so a few big runs cannot pin much memory). Not more: every kept checkpoint is some
# 20 objects each full garbage collection walks, and a kept conversation one or more per 30
# bytes (32 MB of an AG-UI server's long threads held 700,000), for a saving (one read and
# parse per resume) that measured nothing at 2,000 concurrent resumes.
_RECENT_RUNS = 1024
_RECENT_BYTES = 4 * 1024 * 1024
Conn = sqlite3.Connection

_LOCK_SLICE_MS = 10
"""How long SQLite waits for a lock before ``_patiently`` tries again (see there)."""
_PRUNE_HOLD = 0.1
_PRUNE_GAP = 0.02
"""A prune holds the write lock about ``_PRUNE_HOLD`` s at a time, ``_PRUNE_GAP`` s apart --
more than ``_LOCK_SLICE_MS``, so that a writer waiting in another process takes it between."""

_SEEN_BUSY_RUNS = 4096
"""How many runs found leased by others a store remembers (``_refuse_while_held``)."""

_Committed = tuple[bool, bool, bool, tuple, float]
"""What a commit's transaction did: (a cancel was requested, answers are waiting, the lease was
released, the checkpoint row as written, the lease's expiry as written)."""

# --- SQL (constant text: prepared once per connection by sqlite3's statement cache) -------------


def stored_json(value: Any) -> str:
    """``value`` as JSON the way it is stored: compact, its keys in their order (a handler that
    walks an answer or a ``run_once`` result sees them as given, as it would without a store),
    text as UTF-8 (an escaped emoji takes 12 bytes, not 4). The codec has refused text that is
    not valid Unicode before a value gets here."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as exc:
        if "digits" not in str(exc):
            raise
        # (written, no JSON reader would read it back: refused before it is stored)
        raise SerializationError(_LONG_NUMBER) from None


def _answer_json(request_id: str, answer: Any) -> str:
    """``stored_json`` of an answer; one it refuses names the request."""
    try:
        return stored_json(answer)
    except SerializationError as exc:
        raise SerializationError(
            f"the answer to request {request_id!r} cannot be stored: {exc}"
        ) from None


_LONG_NUMBER = f"it holds {UNREADABLE_INT}"


_MAX_CHAIN = 1024
"""At most this many deltas follow a snapshot, however small they are."""
_CHECKPOINT_EVERY = 200
"""Writes between two WAL checkpoints (about 1,000 pages, SQLite's automatic interval); a
group commit counts each of its writes, so that many runs writing at once do not let the WAL
grow thousands of pages between two."""
_RESTART_FRAMES = 4_000
"""WAL frames (pages of 4 KiB) after which the WAL is made to start over (see _Checkpointer)."""
_RESTART_WAIT = 0.1
"""Seconds a checkpoint that makes the WAL start over waits for the write lock."""
_HELD_ROUNDS = 3
"""Checkpoint rounds in a row held back by a reader before its WAL's growth is warned of."""
_PAGE = 4096
"""Bytes of a WAL frame's page (SQLite's default page size, which the store keeps)."""
_WAL_SIZE_LIMIT = 64 * 1024 * 1024
"""A WAL file that grew past this (a burst) is truncated back to it when it restarts."""
_HEAVY_ROW = 250_000
"""Characters of a checkpoint row, a step's journaled result or an answer from which its write
goes to the worker thread (see ``_in_write``): up to 1 MB in UTF-8 (990,000 emoji, 4 MB, stayed
on the loop while the limit counted characters as bytes: outside tester 188), a few ms of
SQLite's work that the loop's other tasks need not wait for; a hop costs far less than that."""
_HEAVY_GROUP = 32 * _HEAVY_ROW
"""Characters from which a group commit goes to the worker thread (see ``_in_write``): writes
each under ``_HEAVY_ROW`` but many in one group held the loop (149 of a megabyte: 436 ms,
outside tester 196; 1,692 of 14 KB: 176 ms, tester 200). Not lower: on the worker, the writes
that arrive while it is busy are not grouped -- with every write counted against
``_HEAVY_ROW``, runs resumed 200 at once went at half the rate -- and W5's largest group, 1,999
runs' commits of a small checkpoint each, stores 3,161,387."""
_TURN = 0.002
"""Seconds of the event loop's time after which an operation on the loop's thread lets other
tasks run first (see ``SqliteStore._turn_due``)."""


class _Busy(StorageError):
    """On the event loop's thread the database was locked: retry on the worker (internal)."""


@dataclass(frozen=True, slots=True)
class _Admission:
    """A run admitted in the transaction of its first commit (``admit_and_commit``): its first
    checkpoint, that one's rows and size, the lease's length, and what to keep once committed."""

    checkpoint: Checkpoint
    rows: tuple
    size: int
    lease_seconds: float
    after: Callable[[Any], None]


class _Write:
    """One write of a group commit: ``body(conn, *args)``, then ``after(result)``; its result
    goes to ``abandoned`` instead if its caller gave up once it was under way."""

    __slots__ = ("abandoned", "after", "args", "body", "future")

    def __init__(
        self,
        body: Callable[..., Any],
        args: tuple,
        after: Callable[[Any], Any] | None,
        abandoned: Abandoned | None = None,
    ) -> None:
        self.body = body
        self.args = args
        self.after = after
        self.abandoned = abandoned
        self.future: asyncio.Future[Any] | None = None


def _answer(write: _Write, result: Any, error: BaseException | None) -> None:
    """Settle a batched write's caller -- or, if it gave up meanwhile (the batch waited for a
    lock on the worker, say), hand what it committed to ``abandoned``."""
    future = write.future
    if future is not None and future.done():
        if error is None and write.abandoned is not None:
            write.abandoned(result)
        return
    _settle(future, result, error)


def _settle(future: asyncio.Future[Any] | None, result: Any, error: BaseException | None) -> None:
    if future is None or future.done():  # the caller gave up waiting
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _settle_all(batch: list[_Write], error: BaseException) -> None:
    for write in batch:
        _settle(write.future, None, error)


def _answer_what(conn: Conn, request_id: str) -> str:
    """An answer, as an error about its size names it: by its run and request."""
    row = conn.execute(SQL_ANSWER_STATE, (request_id,)).fetchone()
    run = f"run {row[2]!r}: " if row is not None else ""
    return f"{run}the answer to request {request_id!r}"


def _result_what(run_id: str, key: str) -> str:
    """A step's result, as an error about storing it names it: the step ran."""
    return (
        f"run {run_id!r}: the result of step {key!r}, which ran (its effect happened; the step "
        "stays in doubt until someone says what to do)"
    )


def _entry_what(run_id: str, key: str) -> str:
    return f"run {run_id!r}: the journal entry of step {key!r}"


def _checkpoint_what(run_id: str, superstep: int) -> str:
    """A checkpoint row, as an error about its size names it."""
    return (
        f"run {run_id!r}: the checkpoint of superstep {superstep} (what it changed of the run's "
        "state, outputs, messages and requests)"
    )


def _batch_failed(batch: list[_Write]) -> Callable[[Any, BaseException | None], None]:
    """After the worker ran a batch: whoever it did not answer (it failed) gets the error."""

    def done(_: Any, error: BaseException | None) -> None:
        _settle_all(batch, error or StorageError("the group commit ended without an answer"))

    return done


class _Checkpointer:
    """Copies the WAL back into the database on a thread and a connection of its own, so that
    no commit, and never the event loop, pays for it.

    ``PRAGMA wal_checkpoint(PASSIVE)`` never waits for a lock nor blocks a writer; it copies
    the frames committed before it started. But the WAL starts over from its beginning only at
    the first write after a checkpoint that reached its end, which never happens while writes
    keep coming. So once the WAL is ``_RESTART_FRAMES`` long and copied, ``restart_due`` asks
    the store for a round with its writes held: ``wal_checkpoint(RESTART)`` copies the last
    frames and syncs (a few ms, the loop free, the writes waiting for it), and the next write
    starts the WAL over. (Those frames used to be copied on the loop's thread, after a commit:
    every task stopped for 6-50 ms; outside tester 52.)

    A connection that keeps a read transaction open pins the frames written since it began:
    none can be copied back, and the WAL grows until it ends. That is said in the log
    (``workflow_engine.storage``), once each time the WAL doubles past ``_WAL_SIZE_LIMIT``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.worker = Worker(f"workflow-engine-sqlite-wal:{path.name}")
        self.busy = False
        self.restart_due = False
        self._conn: Conn | None = None
        self._warned_at = _WAL_SIZE_LIMIT  # WAL bytes the next warning waits for
        self._held_rounds = 0  # rounds in a row that could not copy every frame

    def start(self, restart: bool = False, then: Callable[[], None] | None = None) -> None:
        """A round on the checkpointer's thread; ``restart``: make the WAL start over (the
        store holds its writes meanwhile); ``then`` is called on that thread after it."""
        self.busy = True
        self.worker.post(self._checkpoint, restart, then)

    def _checkpoint(self, restart: bool, then: Callable[[], None] | None) -> None:
        try:
            if self._conn is None:
                self._conn = sqlite3.connect(
                    self.path,
                    timeout=_RESTART_WAIT,  # (RESTART's wait for a lock; PASSIVE never waits)
                    isolation_level=None,
                    check_same_thread=False,
                )
            mode = "RESTART" if restart else "PASSIVE"
            ((blocked, frames, copied),) = self._conn.execute(
                f"PRAGMA wal_checkpoint({mode})"
            ).fetchall()
        except SQLITE_FAILURES:  # the next round tries again; the WAL only grows meanwhile
            return
        finally:
            self.busy = False
            if then is not None:
                then()
        held_back = bool(blocked) or copied < frames  # a reader pins frames, or a lock
        self.restart_due = not restart and not held_back and frames >= _RESTART_FRAMES
        # (a read of the store's own, under way at a round, holds one back too: only a
        # reader that holds several rounds in a row is worth a warning)
        self._held_rounds = self._held_rounds + 1 if held_back else 0
        size = frames * _PAGE
        if self._held_rounds >= _HELD_ROUNDS and size >= self._warned_at:
            self._warned_at = 2 * size
            log.warning(
                "database %s: its WAL has grown to %d MB and cannot be copied back into the "
                "database: a connection keeps a read transaction open (a read that never "
                "ended, in another program?), or reads follow one another with no pause "
                "between them (a listing polled back to back?), and the frames written since "
                "the oldest began must stay until it ends. Writes go on; the file keeps "
                "growing meanwhile.",
                self.path,
                size // 1_000_000,
            )
        elif not held_back:
            self._warned_at = _WAL_SIZE_LIMIT

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _stop(worker: Worker, checkpointer: _Checkpointer | None) -> None:
    worker.stop()
    if checkpointer is not None:
        checkpointer.worker.stop()


def _not_writable(path: Path, real: Path) -> str:
    """Why the store refuses a database file this user may not write, and what to do."""
    try:
        owner = real.stat().st_uid
    except OSError:
        owner = -1
    if owner == os.geteuid():
        return (
            f"cannot open the database {path}: it is read-only (no write permission for its "
            "owner, this user); make it writable (chmod u+w) to use it here. Opened read-only, "
            "SQLite would leave -wal and -shm files beside it"
        )
    who = _user_name(owner) if owner >= 0 else "another user"
    return (
        f"cannot open the database {path}: this user ({_user_name(os.geteuid())}) may not "
        f"write it (it belongs to {who}); opening it would leave -wal and -shm files that "
        "stop its owner's writes. Run the command as its owner, or give this user write access"
    )


def _side_file_refused(path: Path) -> str:
    """Why SQLite may have failed to open ``path``: a -wal or -shm file beside it that this user
    may not write, left by another user's process (outside tester 97); else ""."""
    real = os.path.realpath(path)
    for side in (f"{real}-wal", f"{real}-shm"):
        try:
            owner = os.stat(side).st_uid
        except OSError:
            continue
        if not os.access(side, os.R_OK | os.W_OK):
            return (
                f" ({side} belongs to {_user_name(owner)}, and this user may not write it: a "
                "process of that user has the database open, or left the file behind; give "
                "this user access to it, e.g. through the database's group)"
            )
    return ""


def _share_side_files(path: Path) -> None:
    """Give the -wal and -shm files this process made beside ``path`` the database's group.
    SQLite makes them with the database's permissions but this user's group: a database a
    group shares (0660) was then locked for its owner, outside that group, by a member's files
    (outside tester 95). (As root, SQLite hands them to the database's owner itself.)"""
    uid = os.geteuid()
    if uid == 0:
        return
    try:
        real = os.path.realpath(path)
        gid = os.stat(real).st_gid
    except OSError:
        return
    if gid not in os.getgroups() and gid != os.getegid():
        return  # (not ours to give: chown would be refused)
    for side in (f"{real}-wal", f"{real}-shm"):
        with contextlib.suppress(OSError):
            info = os.stat(side)
            if info.st_uid == uid and info.st_gid != gid:
                os.chown(side, -1, gid)


def _user_name(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except KeyError:
        return f"uid {uid}"


class SqliteStore:
    """A :class:`~workflow_engine.RunStore` (and ``CheckpointStore``) in one SQLite file."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        synchronous: str | None = None,
        busy_timeout: float = 5.0,
        snapshot_every: int = 64,
        span_every: int = 16,
        fault_hook: FaultHook | None = None,
        clock: Callable[[], float] = time.time,
        read_only: bool = False,
    ) -> None:
        self.clock = clock
        """Wall-clock seconds for leases and timestamps (a simulator passes its own)."""
        self.path = Path(path) if path is not None else default_db_path()
        if "\x00" in str(self.path):  # (no file has such a name: the OS refuses it)
            raise UsageError(f"a database path cannot hold a NUL character: {str(self.path)!r}")
        mode = synchronous_mode(synchronous)
        if mode is None:
            raise UsageError("synchronous must be NORMAL or FULL")
        self.synchronous = mode
        self.busy_timeout = busy_timeout
        self._stored_lists = StoredLists(self.path, busy_timeout)
        self._lists_apart_from = LONG_LIST  # (how many items make a list long: tests set less)
        self._chunking = CHUNKING  # (which rows and arrays are chunked: tests set less)
        self.snapshot_every = snapshot_every
        self.span_every = span_every
        """Every this many deltas after a snapshot, the checkpoint is stored as a span (relative
        to the last snapshot or span) instead: a restore folds at most this many deltas after
        the spans. 0: never."""
        self.fault_hook = fault_hook
        self.read_only = read_only
        """Only read the file, and leave it and the files beside it as they were: nothing is
        created, switched to WAL, upgraded or folded in (a killed writer's WAL stays), and a
        write is refused (``UsageError``). A database at an older schema version is refused
        too (``StoreUnavailableError``): a writer upgrades it, when no older engine uses it."""
        self._worker: Worker | None = None
        self._conn: Conn | None = None  # the loop's, or the worker's while it has work queued
        self._impatient = False  # running on the event loop: a busy lock goes to the worker
        self._on_worker = threading.local()  # (``slicing``: in ``_patiently``'s wait)
        self._batch: list[_Write] | None = None  # writes joining the next group commit
        self._batch_size = 0  # the characters its writes store (``_HEAVY_GROUP``)
        self._opener: asyncio.Task[Any] | None = None  # whose write opened the batch
        self._checkpointer: _Checkpointer | None = None
        self._opening = anyio.Lock()
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._meta: dict[str, tuple[int, int]] = {}  # run_id -> (checkpoint_seq, since_snapshot)
        self._lease_seconds: dict[str, float] = {}
        self._status: dict[str, str] = {}  # run_id -> the status our last commit of it wrote
        self._sizes: dict[str, tuple[int, int]] = {}  # run_id -> (delta bytes since, snapshot)
        self._span_base: dict[str, Checkpoint] = {}  # run_id -> its last snapshot or span
        self._journaled: set[str] = set()  # runs whose journal may hold entries to compact
        # runs another live worker held when this store last tried to lease them: until when
        self._seen_busy: dict[str, float] = {}
        self._giving_back: set[Detached] = set()  # releases of abandoned leases
        # run_id -> the latest checkpoint this store wrote or read, kept (on the store's thread
        # only) so that resuming a run this process paused skips reading and parsing it again
        self._recent: OrderedDict[str, tuple[Checkpoint, int]] = OrderedDict()
        self._recent_bytes = 0
        self._commits = 0  # since the last WAL checkpoint
        self._turn_task = 0  # the id of the task whose operations ran last
        self._turn_at = 0.0  # since when (see _turn_due)
        self._restarting: asyncio.Future[None] | None = None  # the WAL starting over (_held)
        self._closing = False  # close() is under way: no operation, no reopening

    # --- lifecycle ------------------------------------------------------------------------------

    async def __aenter__(self) -> SqliteStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Connect (one connection, on the store's own thread) and check the schema version;
        create or migrate the schema only when the database is new or older."""
        if self._worker is not None:
            return
        async with self._opening:
            if self._worker is not None:
                return
            if self.read_only:
                if not os.path.lexists(self.path):
                    raise StoreUnavailableError(
                        f"no database at {self.path} (a read-only store creates none)"
                    )
            else:
                try:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise StoreUnavailableError(
                        f"cannot create the directory for the database {self.path}: {exc.strerror}"
                    ) from exc
            try:
                info: os.stat_result | None = os.stat(self.path)
            except OSError:
                info = None
            if info is not None and stat.S_ISDIR(info.st_mode):
                raise StoreUnavailableError(directory_refused(self.path))
            if info is not None and not stat.S_ISREG(info.st_mode):  # (a FIFO: "disk I/O error")
                raise StoreUnavailableError(not_a_file_refused(self.path))
            # (where SQLite keeps the -wal and -shm files: beside the file a symlink names)
            real = Path(os.path.realpath(self.path))
            reading = reading_uri(real) if self.read_only else None
            if reading is None and not os.access(real.parent, os.W_OK):
                raise StoreUnavailableError(
                    f"cannot open the database {self.path}: directory {real.parent} is "
                    "not writable (SQLite keeps a database's -wal and -shm files beside it, "
                    "even to read it)"
                )
            if reading is None and real.exists() and not os.access(real, os.W_OK):
                # SQLite would open it read-only and leave -wal and -shm files this user owns
                # beside it, which stop its owner's next write (outside tester 94)
                raise StoreUnavailableError(_not_writable(self.path, real))
            if info is not None and not_sqlite(real, info.st_size):
                # (SQLite takes a file of a byte for a new database, and wrote over it)
                raise StoreCorruptError(damaged(self.path, "file is not a database"))
            worker = Worker(f"workflow-engine-sqlite:{self.path.name}")
            # an existing, current database is opened right here on the loop (a connection and
            # a few PRAGMAs: well under a ms); one that is new, older (to migrate) or locked is
            # opened on the worker thread, which may wait for the lock
            conn: Conn | None = None
            if self.read_only:
                # (reading_uri once: the fallback only for a file it would not just read)
                conn = await worker.call(self._connect, True, reading or read_only_uri(real))
            elif asyncio._get_running_loop() is not None:
                with contextlib.suppress(_Busy):
                    conn = self._on_loop(self._connect, (False,))
            if conn is None:
                try:
                    # a caller cancelled meanwhile leaves the worker to finish connecting; the
                    # connection it made is then closed -- that one, not the store's: another
                    # call may have opened the store by then (its connection was closed under
                    # it, and its runs' leases were never given back: outside tester 89)
                    conn = await worker.call(self._connect, True, abandoned=_close_quietly)
                except BaseException:
                    worker.stop()
                    raise
            checkpointer = _Checkpointer(self.path)
            self._conn = conn
            self._worker, self._checkpointer = worker, checkpointer
            # a store dropped without close() must not leave its threads behind
            self._finalizer = weakref.finalize(self, _stop, worker, checkpointer)

    async def check_tables(self) -> None:
        """Read the first entry of each of this store's tables and indexes -- their root pages
        and first leaves, the entry's header decoded: damage there is said now, naming the
        table (``StoreCorruptError``), not at the first write that meets it -- after a person
        typed a message, say, and the demo's agents ran (outside tester 191). Cheap (a few
        pages each); damage elsewhere in the file is found when a read or write meets it
        (``PRAGMA quick_check`` reads every page). Tables and indexes of others are left
        alone (an operator's partial index for a report is no damage: outside tester 196)."""
        await self._query(self._read_each_tree)

    def _read_each_tree(self, conn: Conn) -> None:
        trees = conn.execute(
            "SELECT type, name, tbl_name FROM sqlite_master "
            "WHERE type IN ('table', 'index') ORDER BY type DESC, name"
        ).fetchall()
        partial = {
            row[1]
            for table in TABLES
            for row in conn.execute(f"PRAGMA index_list({_quoted(table)})")
            if row[4]  # (a partial index: no plain ORDER BY can use it -- outside tester 198)
        }
        for kind, name, table in trees:
            if table not in TABLES or name in partial:
                continue
            try:
                if kind == "table":
                    info = conn.execute(f"PRAGMA table_info({_quoted(name)})")
                    columns = [row[1] for row in info]
                    # (each column's type: the entry's header decoded, not its long values)
                    types = ", ".join(f"typeof({_quoted(c)})" for c in columns) or "1"
                    query = f"SELECT {types} FROM {_quoted(name)} NOT INDEXED LIMIT 1"
                    conn.execute(query).fetchall()
                    continue
                columns = [row[2] for row in conn.execute(f"PRAGMA index_info({_quoted(name)})")]
                if columns and None not in columns:  # (not an expression's index)
                    # every key of the entry, and the row it names (damage past the first key
                    # went unseen: outside tester 198)
                    types = ", ".join(f"typeof({_quoted(c)})" for c in columns)
                    conn.execute(
                        f"SELECT {types}, typeof(rowid) FROM {_quoted(table)} "
                        f"INDEXED BY {_quoted(name)} ORDER BY {_quoted(columns[0])} LIMIT 1"
                    ).fetchall()
            except SQLITE_FAILURES as exc:
                damage = self._translate(exc)
                raise type(damage)(f"{damage} (its {kind} {name})") from exc

    async def close(self) -> None:
        worker = self._worker
        if worker is not None and worker.pending:
            # let what is queued finish (a write waiting for a lock, say) and be answered: a
            # lease written for a caller that gave up meanwhile is then given back, below
            await worker.call(_nothing)
        for giving_back in list(self._giving_back):
            await giving_back.wait()
        if self._batch:
            self._flush()
        worker, self._worker = self._worker, None
        if worker is None:
            return
        checkpointer, self._checkpointer = self._checkpointer, None
        # From here no operation uses the connection, nor opens the store again, until it is
        # closed: operations still in flight (runs executing while their runtime closes) are
        # told the store is closed. One reopened it meanwhile, and the old worker thread then
        # closed the new connection under the loop's thread: a segfault (outside tester 54).
        conn, self._conn = self._conn, None
        self._closing = True
        try:
            # its connection closes first: ours, the last, then checkpoints the WAL away
            if checkpointer is not None and checkpointer.worker.started:
                await checkpointer.worker.call(checkpointer.close)
            await worker.call(self._disconnect, conn)
        finally:
            self._closing = False
            if self._finalizer is not None:
                self._finalizer.detach()
            _stop(worker, checkpointer)

    # --- on the worker thread: connection and schema ------------------------------------------

    def _connect(self, patient: bool, reading: str | None = None) -> Conn | None:
        """A new connection, checked and set up; None (nothing opened) when not ``patient``
        and the database needs creating or migrating, which then happens patiently on the
        worker thread. Not patient, a locked database raises ``_Busy`` at once (on the loop:
        ``_on_loop``). The caller makes it the store's.

        ``reading`` (``read_only``): the URI to open the file by (``read_only_uri``'s: a WAL
        another writer left is read, not folded into the file), ``query_only`` set before
        anything is read; the schema checked, never created or migrated."""
        try:
            conn = sqlite3.connect(
                self.path if reading is None else reading,
                uri=reading is not None,
                timeout=self.busy_timeout if patient else 0.0,
                isolation_level=None,
                check_same_thread=False,  # the loop's thread, or the worker's (never both at once)
            )
        except SQLITE_FAILURES as exc:
            raise self._translate(exc) from exc
        # placeholders read the file this connection opened, whatever the directory later
        self._stored_lists.path = Path(os.path.abspath(self.path))
        try:
            if reading is not None:
                conn.execute("PRAGMA query_only=ON")
            listed = conn.execute("SELECT name FROM sqlite_master")
            refused = foreign_tables_refused({row[0] for row in listed}, self.path)
            if refused is not None:
                raise refused
            if reading is None:
                self._enter_wal(conn, patient)
                _share_side_files(self.path)
                conn.execute(f"PRAGMA synchronous={self.synchronous}")
                conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
                conn.execute("PRAGMA foreign_keys=ON")
                conn.execute("PRAGMA recursive_triggers=ON")  # (chunks listed by deep indexes)
                # WAL checkpoints run on a thread of their own (``_Checkpointer``), not in a
                # commit
                conn.execute("PRAGMA wal_autocheckpoint=0")
                conn.execute(f"PRAGMA journal_size_limit={_WAL_SIZE_LIMIT}")
            # No memory map (``mmap_size``): it read a cold chain 0.3 ms faster, but a file
            # another tool shrinks under a mapped reader kills the process with SIGBUS, where
            # read(2) gives an error this store names (StoreCorruptError, StorageError).
            # Text that is not UTF-8 (a damaged page, a foreign tool) arrives with its bad bytes
            # as lone surrogates instead of failing the whole query, so that the row decoders
            # (``_records``) can say which run and record it is: they refuse such text.
            conn.text_factory = decode_text
            current = self._schema_version(conn)
            self._check_version(current)
            if current < SCHEMA_VERSION:
                if reading is not None:
                    raise self._not_upgraded(current)
                if not patient:
                    conn.close()
                    return None
                self._migrate()
            self._check_tables(conn)
            if reading is None:
                conn.execute("PRAGMA busy_timeout=0")  # on the loop: a busy lock goes to the worker
                self._start_wal(conn)
        except BaseException as exc:
            conn.close()
            if isinstance(exc, SQLITE_FAILURES):
                raise self._translate(exc) from exc
            raise
        return conn

    def _not_upgraded(self, current: int) -> StoreUnavailableError:
        """A read-only store's refusal of a database that is new or at an older schema."""
        if current == 0:
            return StoreUnavailableError(
                f"database {self.path} holds no workflow-engine tables; a read-only store "
                "creates none"
            )
        return StoreUnavailableError(
            f"database {self.path} has schema version {current}, older than this "
            f"workflow-engine's {SCHEMA_VERSION}, and a read-only look does not upgrade it; a "
            "command that writes (resume, respond, cancel) or a SqliteStore that is not "
            "read-only upgrades it -- once no older workflow-engine uses the file"
        )

    def _enter_wal(self, conn: Conn, patient: bool) -> None:
        """``journal_mode=WAL``. Switching a database that is not in WAL mode yet (a new file
        another program created) takes its write lock, and there SQLite does not wait for a
        writer to finish -- it says "locked" at once, whatever the busy timeout -- so a
        ``patient`` caller waits here, up to ``busy_timeout``."""
        deadline = time.monotonic() + (self.busy_timeout if patient else 0.0)
        while True:
            try:
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                lowered = str(exc).lower()
                if ("locked" not in lowered and "busy" not in lowered) or (
                    time.monotonic() >= deadline
                ):
                    raise
            time.sleep(0.02)

    def _start_wal(self, conn: Conn) -> None:
        """Write the WAL's header now if the WAL is empty, so that the first commit does not.

        The last connection to close checkpoints the WAL and deletes it (persistent WAL and
        ``SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE`` are out of reach of Python 3.11's ``sqlite3``), so
        a reopened database starts a new WAL file at its first write: a header ``fdatasync``
        and a directory fsync, ~1 ms here -- paid by the first commit of every new process (a
        CLI resume, a worker's first request). Opening pays it instead: a rewrite of the
        database header with the value it has (``user_version``), which changes nothing but is
        one WAL frame. A database another process writes has its WAL already; a locked or
        read-only one is left alone (its first commit pays, as before).
        """
        try:
            if os.stat(f"{self.path}-wal").st_size > 0:
                return
        except OSError:
            return
        with contextlib.suppress(sqlite3.Error):
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            conn.execute(f"PRAGMA user_version={int(version)}")

    def _disconnect(self, conn: Conn | None = None) -> None:
        """Close ``conn`` (default: the store's), on the thread that last used it."""
        self._recent.clear()
        self._recent_bytes = 0
        self._span_base.clear()
        if conn is None:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _schema_version(self, conn: Conn) -> int:
        try:
            row = conn.execute(SQL_SCHEMA_VERSION).fetchone()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return 0
            raise
        if row is None:
            return 0
        if type(row[0]) is not int or row[0] < 0:
            raise StoreCorruptError(
                f"database {self.path} is damaged: its schema version (we_schema.version) is "
                f"{shown(row[0])}, not a version number"
            )
        return row[0]

    def _check_tables(self, conn: Conn) -> None:
        """A database at this schema version has every table of it: one that lost a table (a
        hand edit, another tool) is refused at open, not at the first write that needs it."""
        have = {row[0] for row in conn.execute(SQL_TABLE_NAMES)}
        missing = sorted(TABLES - have)
        if missing:
            raise StoreCorruptError(
                f"database {self.path} is damaged: it has no table {', '.join(missing)}"
            )

    def _check_version(self, current: int) -> None:
        if current > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"database {self.path} has schema version {current}, written by a newer "
                f"workflow-engine; this version understands up to {SCHEMA_VERSION}. Upgrade "
                "workflow-engine or use another database file."
            )

    def _migrate(self) -> None:
        try:
            migrate(self.path, self.busy_timeout, self._check_version, engine_version)
        except SQLITE_FAILURES as exc:
            raise self._translate(exc) from exc

    # --- plumbing -------------------------------------------------------------------------------

    def _fault(self, point: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(point)

    async def _started(self) -> Worker:
        worker = self._worker
        if worker is None:
            if self._closing:
                raise StorageError(f"database {self.path}: the store is closed")
            await self.open()
            worker = self._worker
            assert worker is not None
        return worker

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the store's worker thread: for what may take long (big reads,
        retention), and for everything while the worker is busy (order is kept)."""
        worker = await self._started()
        return await worker.call(self._patiently, fn, args)

    async def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the event loop's thread when the worker is idle (a short read costs
        less than the hop to a thread); on the worker otherwise, or if the database is locked."""
        worker = await self._started()
        if not worker.pending and asyncio._get_running_loop() is not None:
            if self._turn_due():
                await asyncio.sleep(0)
            if not worker.pending:  # (still: another task's write may have gone there meanwhile)
                try:
                    return self._on_loop(fn, args)
                except _Busy:
                    pass
        return await worker.call(self._patiently, fn, args)

    async def _query(self, body: Callable[..., Any], *args: Any) -> Any:
        """``body(conn, *args)`` in autocommit mode: one statement, its own transaction."""
        return await self._read(self._transaction, None, body, args)

    async def _in_write(
        self,
        body: Callable[..., Any],
        *args: Any,
        after: Callable[[Any], Any] | None = None,
        abandoned: Abandoned | None = None,
        size: int = 0,
    ) -> Any:
        """``body(conn, *args)`` in a write transaction, then ``after(result)`` once it is
        committed; the awaited value is what ``after`` returns (else ``body``'s result). A
        caller cancelled once the write is under way (on the worker, or answered but not yet
        resumed) does not get that value: ``abandoned`` does.

        Group commit: on asyncio, a write runs at once on the loop's thread when it is the
        first of its loop iteration (or from the task that wrote first); the writes of other
        tasks that arrive until the next iteration share one transaction (each in a SAVEPOINT
        of its own, so one that fails -- a lost lease -- fails alone). Every caller is
        answered only after that COMMIT returned. A busy lock, a busy
        worker, a heavy write (``size``: the characters of the big values it stores, past
        ``_HEAVY_ROW``; a 200 MB one held every other task of the loop for 2.9 s, outside
        tester 183), a group whose writes' sizes add up past ``_HEAVY_GROUP`` (149 of a
        megabyte each held the loop 436 ms: 196), or another async library: the worker
        thread runs it (waiting up to ``busy_timeout``).
        """
        self._refuse_if_read_only()
        worker = await self._started()
        loop = asyncio._get_running_loop()
        if loop is not None:
            if self._restarting is not None:
                await self._held()
            if not worker.pending and self._turn_due():
                await asyncio.sleep(0)
        write = _Write(body, args, after, abandoned)
        if loop is not None and not worker.pending and size <= _HEAVY_ROW:
            task = asyncio.current_task(loop)
            if self._batch is None:  # the first write of this loop iteration: at once
                self._batch = []
                self._batch_size = 0
                self._opener = task
                loop.call_soon(self._flush)
            elif task is not self._opener:  # another task's: joins the next group commit
                write.future = loop.create_future()
                self._batch.append(write)
                self._batch_size += size
                # (cancelled before the batch commits, the write is left out of it)
                return await given_up_on(write.future, abandoned)
            # (the same task writing again: no one waits on its previous write, so at once)
            try:
                return self._on_loop(self._write_one, (write,))
            except _Busy:
                pass
        return await worker.call(self._patiently, self._write_one, (write,), abandoned=abandoned)

    def _refuse_if_read_only(self) -> None:
        if self.read_only:
            raise UsageError(f"database {self.path} was opened read_only: nothing was written")

    def _turn_due(self) -> bool:
        """An operation on the loop's thread never suspends its caller (no lock, no thread to
        wait for): a task that reads and writes back to back -- one run after another -- held
        the loop, and no other task (a stream, a lease's renewal, a server's other requests)
        ran meanwhile, nor did their writes ever share a commit (outside tester 52). So once
        one task's operations have followed each other for ``_TURN`` (no other task's in
        between, which would mean the loop went round), the next lets the ready tasks run
        first: one loop iteration, about what one write costs. True: the caller yields now
        (a plain check, not a coroutine: it runs before every store operation)."""
        task = id(asyncio.current_task())  # (an id: a task that ended is not kept alive)
        now = time.monotonic()
        if task != self._turn_task:
            self._turn_task, self._turn_at = task, now
        elif now - self._turn_at >= _TURN:
            self._turn_at = now
            return True
        return False

    def _flush(self) -> None:
        """Commit the writes gathered since the last one that ran alone, in one transaction."""
        batch, self._batch = self._batch, None
        self._opener = None
        if not batch:
            return
        worker = self._worker
        if worker is None:
            _settle_all(batch, StorageError(f"database {self.path}: the store is closed"))
            return
        if not worker.pending and self._batch_size <= _HEAVY_GROUP:
            try:
                self._on_loop(self._write_batch, (batch,))
                return
            except _Busy:
                pass
        loop = asyncio.get_running_loop()
        worker.submit(loop, self._patiently, (self._write_batch, (batch,)), _batch_failed(batch))

    def _on_loop(self, fn: Callable[..., Any], args: tuple) -> Any:
        """``fn(*args)`` here, on the event loop's thread; ``_Busy`` instead of waiting for a
        lock (nothing was written)."""
        self._impatient = True
        try:
            return fn(*args)
        finally:
            self._impatient = False

    def _patiently(self, fn: Callable[..., Any], args: tuple) -> Any:
        """On the worker thread: ``fn(*args)``, waiting up to ``busy_timeout`` for a lock.

        The wait is SQLite's own in slices of ``_LOCK_SLICE_MS``, tried again at once: a
        whole ``busy_timeout`` in SQLite's hands sleeps up to 100 ms between its tries, so a
        renewal could find the lock free only after its lease ran out (outside tester 85: a
        lock held by another process released 54 ms before the lease's end). A lock refused
        at BEGIN wrote nothing, so trying ``fn`` again is safe."""
        conn = self._conn
        if conn is None:
            return fn(*args)  # raises: closed
        deadline = time.monotonic() + self.busy_timeout
        conn.execute(f"PRAGMA busy_timeout={_LOCK_SLICE_MS}")
        self._on_worker.slicing = True
        try:
            while True:
                try:
                    return fn(*args)
                except _Busy:
                    if time.monotonic() >= deadline:
                        raise self._locked() from None
        finally:
            self._on_worker.slicing = False
            if self._conn is conn:
                conn.execute("PRAGMA busy_timeout=0")

    def _write_one(self, write: _Write) -> Any:
        result = self._transaction("BEGIN IMMEDIATE", write.body, write.args)
        self._wrote()
        return write.after(result) if write.after is not None else result

    def _write_batch(self, batch: list[_Write]) -> None:
        """One transaction for every write of ``batch`` whose caller still waits; each answered
        (its future settled) after the COMMIT. Runs on the loop, or on the worker (then the
        futures are settled on the loop)."""
        live = [w for w in batch if w.future is not None and not w.future.done()]
        if not live:
            return
        conn = self._conn
        outcomes: list[tuple[Any, BaseException | None]] = []
        try:
            if conn is None:
                raise StorageError(f"database {self.path}: the store is closed")
            conn.execute("BEGIN IMMEDIATE")
            try:
                for write in live:
                    conn.execute("SAVEPOINT one_write")
                    try:
                        result = write.body(conn, *write.args)
                    except Exception as exc:
                        if not conn.in_transaction:  # SQLite ended the whole transaction
                            raise
                        conn.execute("ROLLBACK TO one_write")
                        conn.execute("RELEASE one_write")
                        if isinstance(exc, UnicodeEncodeError):
                            exc = _not_text(exc)
                        elif isinstance(exc, UnicodeDecodeError):
                            exc = self._translate(exc)
                        outcomes.append((None, exc))
                        continue
                    conn.execute("RELEASE one_write")
                    outcomes.append((result, None))
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
        except SQLITE_FAILURES as exc:
            failure = self._translate(exc)
            if isinstance(failure, _Busy):  # at BEGIN: nothing was written, the worker retries
                raise failure from exc
            outcomes = self._each_alone(live, failure)
        except Exception as exc:
            outcomes = [(None, exc)] * len(live)
        else:
            self._wrote(len(live))
        settled = []
        for write, (result, error) in zip(live, outcomes, strict=True):
            if isinstance(error, _Busy) and self._worker is not None:  # (see ``_each_alone``)
                loop = asyncio.get_running_loop()
                done = functools.partial(_answer, write)
                self._worker.submit(loop, self._patiently, (self._write_one, (write,)), done)
                continue
            if error is None and write.after is not None:
                try:
                    result = write.after(result)
                except Exception as exc:
                    error = exc
            elif isinstance(error, sqlite3.Error):
                error = self._translate(error)
            settled.append((write, result, error))
        if self._impatient:
            for write, result, error in settled:
                _answer(write, result, error)
        else:
            loop = live[0].future.get_loop()  # type: ignore[union-attr]
            for write, result, error in settled:
                loop.call_soon_threadsafe(_answer, write, result, error)

    def _each_alone(
        self, live: list[_Write], failure: StorageError
    ) -> list[tuple[Any, BaseException | None]]:
        """The outcomes of ``live`` written one by one, after their group's transaction
        failed as a whole with ``failure`` (rolled back: nothing of it was written). SQLite
        ends a transaction for what one write alone may cause -- a full disk, at its COMMIT --
        and every run of the group failed with it (outside tester 183: 18 small runs, for one
        that stored 4 MB). Alone, each write fails or not for itself. One that finds the lock
        taken meanwhile (another process writing) waits for it as any write does: here, on
        the worker thread, up to ``busy_timeout``; on the loop's, its outcome is a ``_Busy``,
        and ``_write_batch`` hands it to the worker (it got the group's failure, outside
        tester 188). All get the group's failure once the store is closed. So a write's body
        may run twice: it, and what it calls (a runtime's ``check``), must leave nothing
        behind in Python but its result."""
        if len(live) == 1 or self._conn is None:
            return [(None, failure)] * len(live)
        outcomes: list[tuple[Any, BaseException | None]] = []
        deadline = time.monotonic() + self.busy_timeout
        for write in live:
            try:
                while True:
                    try:
                        result = self._transaction("BEGIN IMMEDIATE", write.body, write.args)
                        break
                    except _Busy:
                        if self._impatient or time.monotonic() >= deadline:
                            raise
                outcomes.append((result, None))
            except _Busy as busy:
                outcomes.append((None, busy if self._impatient else self._locked()))
            except Exception as exc:
                outcomes.append((None, exc))
            else:
                self._wrote()
        return outcomes

    def _wrote(self, writes: int = 1) -> None:
        """After a COMMIT of ``writes`` writes (a group commit's are many: its pages too):
        count them; now and then checkpoint the WAL, off this path. When the WAL is due to
        start over (``_Checkpointer``), writes wait for that round (``_held``) -- from the
        loop's thread, which holds them."""
        self._commits += writes
        checkpointer = self._checkpointer
        if checkpointer is None or checkpointer.busy:
            return
        if checkpointer.restart_due and self._restarting is None:
            checkpointer.restart_due = False
            self._commits = 0
            if not self._impatient:
                # on the store's worker thread (another async library; or a lock met): the
                # loop is not held, and no other write runs meanwhile -- copy the last frames
                # here, and the next write starts the WAL over
                conn = self._conn
                if conn is not None:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                return
            loop = asyncio.get_running_loop()
            self._restarting = loop.create_future()
            checkpointer.start(restart=True, then=functools.partial(self._restarted, loop))
        elif self._commits >= _CHECKPOINT_EVERY:
            self._commits = 0
            checkpointer.start()

    def _restarted(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the checkpointer's thread: the WAL's restart round is over; writes go on."""

        def release() -> None:
            held, self._restarting = self._restarting, None
            if held is not None and not held.done():
                held.set_result(None)

        with contextlib.suppress(RuntimeError):  # (the loop has closed: nobody waits)
            loop.call_soon_threadsafe(release)

    async def _held(self) -> None:
        """Wait while the WAL starts over (a few ms; see ``_Checkpointer``)."""
        restarting = self._restarting
        if restarting is not None:
            await asyncio.shield(restarting)  # (a caller cancelled meanwhile: only it stops)

    def _transaction(self, begin: str | None, body: Callable[..., Any], args: tuple) -> Any:
        conn = self._conn
        if conn is None:
            raise StorageError(f"database {self.path}: the store is closed")
        try:
            if begin is None:
                return body(conn, *args)
            conn.execute(begin)
            try:
                result = body(conn, *args)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
            return result
        except SQLITE_FAILURES as exc:
            raise self._translate(exc) from exc
        except UnicodeEncodeError as exc:  # an id or a value with a lone surrogate
            raise _not_text(exc) from None

    def _locked(self) -> StoreLockedError:
        return StoreLockedError(
            f"database {self.path} stayed locked by another writer for more than "
            f"{self.busy_timeout:g} s"
        )

    def _translate(self, exc: sqlite3.Error | UnicodeDecodeError) -> StorageError:
        if isinstance(exc, UnicodeDecodeError):  # (SQLite's message, quoting the damage)
            said = exc.object.decode("utf-8", "replace") if isinstance(exc.object, bytes) else ""
            return StoreCorruptError(damaged(self.path, said or str(exc)))
        text = str(exc)
        lowered = text.lower()
        if "locked" in lowered or "busy" in lowered:
            if self._impatient or getattr(self._on_worker, "slicing", False):
                return _Busy(text)
            return self._locked()
        if "not a database" in lowered or "malformed" in lowered or "not decode" in lowered:
            return StoreCorruptError(damaged(self.path, text))
        if "unable to open" in lowered:
            why = _side_file_refused(self.path)
            return StoreUnavailableError(f"cannot open the database {self.path}: {text}{why}")
        if "readonly" in lowered or "disk i/o" in lowered:
            why = _side_file_refused(self.path)
            return StoreUnavailableError(f"cannot write the database {self.path}: {text}{why}")
        return StorageError(f"database {self.path}: {text}")

    # --- runs -----------------------------------------------------------------------------------

    async def admit(self, checkpoint: Checkpoint, *, parent_run_id: str | None = None) -> None:
        now = self.clock()
        self._fault("admit:before")
        rows = admit_rows(checkpoint, now, parent_run_id, None, None, 0, self._lists_apart_from)
        await self._in_write(
            self._admit,
            checkpoint.run_id,
            rows[0],
            with_split(rows[1], self._chunking),
            rows[2],
            after=self._admitted(checkpoint, row_bytes(rows[1])),
            size=row_bytes(rows[1]),  # (a 60 MB message: outside tester 196)
        )
        self._fault("admit:after")

    async def admit_and_acquire(
        self,
        checkpoint: Checkpoint,
        owner: str,
        lease_seconds: float,
        *,
        parent_run_id: str | None = None,
    ) -> Lease:
        """``admit`` and ``acquire`` in one transaction (the run is born leased to ``owner``);
        the same fault points as ``admit``."""
        self._fault("admit:before")
        rows = admit_rows(
            checkpoint, self.clock(), parent_run_id, owner, None, 1, self._lists_apart_from
        )
        expires_at = await self._in_write(
            self._admit,
            checkpoint.run_id,
            rows[0],
            with_split(rows[1], self._chunking),
            rows[2],
            lease_seconds,
            after=self._admitted(checkpoint, row_bytes(rows[1]), lease_seconds),
            abandoned=lambda expires: self._give_back(Lease(checkpoint.run_id, owner, 1, expires)),
            size=row_bytes(rows[1]),
        )
        self._fault("admit:after")
        return Lease(checkpoint.run_id, owner, 1, expires_at)

    async def admit_and_commit(
        self,
        admitted: Checkpoint,
        checkpoint: Checkpoint,
        owner: str,
        lease_seconds: float,
        *,
        release: bool = False,
    ) -> Lease:
        """``admit_and_acquire`` of ``admitted`` and ``commit`` (``commit_and_release``) of
        ``checkpoint`` in one transaction; the fault points of both, each ``after`` once the
        transaction is committed."""
        run_id = admitted.run_id
        if run_id in self._meta:  # this process holds a lease on a run with this id
            raise RunExistsError(f"run {run_id!r} already exists")
        self._fault("admit:before")
        # (the lease's expiry is the commit's, set when written)
        rows = admit_rows(admitted, self.clock(), None, owner, None, 1, self._lists_apart_from)
        size = row_bytes(rows[1])
        rows = (rows[0], with_split(rows[1], self._chunking), rows[2])
        admission = _Admission(
            admitted, rows, size, lease_seconds, self._admitted(admitted, size, lease_seconds)
        )
        lease = Lease(run_id, owner, 1, 0.0)
        lease = await self._commit_checkpoint(lease, checkpoint, release, admission)
        self._fault("admit:after")
        return lease

    def _admitted(
        self, checkpoint: Checkpoint, size: int, lease_seconds: float | None = None
    ) -> Callable[[Any], Any]:
        """After the COMMIT that admitted ``checkpoint``'s run (leased, with ``lease_seconds``):
        what this store keeps of it. Passes the write's result on."""

        def after(written: Any) -> Any:
            if lease_seconds is not None:  # after COMMIT, like every lease we take
                self._leased(checkpoint.run_id, (0, 0), lease_seconds, new=True)
            self._remember(checkpoint, size)
            self._sizes[checkpoint.run_id] = (0, size)
            self._span_base[checkpoint.run_id] = checkpoint  # its first row is a snapshot
            return written

        return after

    def _admit(
        self,
        conn: Conn,
        run_id: str,
        run: tuple,
        body: tuple,
        requests: list[tuple],
        lease_seconds: float | None = None,
    ) -> float | None:
        """The admission's rows; with ``lease_seconds``, the run leased from now (not from
        when the write was asked for: a wait for the lock is not taken out of the lease). The
        lease's expiry."""
        if lease_seconds is not None:
            run = (*run[:8], self.clock() + lease_seconds, *run[9:])
        try:
            conn.execute(SQL_INSERT_RUN, run)
        except sqlite3.IntegrityError as exc:
            raise RunExistsError(f"run {run_id!r} already exists") from exc
        what = f"run {run_id!r}: its first checkpoint (the start message)"
        with _Sized(conn, what, _largest_value(body)):
            conn.execute(SQL_INSERT_CHECKPOINT, stored_row(conn, body, self._chunking))
        if requests:
            _insert_requests(conn, requests)
        self._fault("admit:inside")
        return run[8]

    async def acquire(self, run_id: str, owner: str, lease_seconds: float) -> Lease:
        if run_id in self._seen_busy:
            await self._refuse_while_held(run_id, owner)

        def after(taken: tuple[Lease, tuple[int, int]]) -> Lease:
            self._leased(taken[0].run_id, taken[1], lease_seconds)
            return taken[0]

        return await self._in_write(self._acquire_rows, run_id, owner, lease_seconds, after=after)

    def _acquire_rows(
        self, conn: Conn, run_id: str, owner: str, lease_seconds: float
    ) -> tuple[Lease, tuple[int, int]]:
        now = self.clock()
        row = conn.execute(SQL_LEASE_STATE, (run_id,)).fetchone()
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self.path}")
        return self._take_lease(
            conn, run_id, owner, lease_seconds, now, *lease_columns(run_id, row)
        )

    def _leased(
        self, run_id: str, meta: tuple[int, int], lease_seconds: float, *, new: bool = False
    ) -> None:
        """After the COMMIT that leased ``run_id``: where the run's checkpoint chain stands.
        ``new``: the run was admitted in that transaction (no journal entries to compact)."""
        self._meta[run_id] = meta
        self._status.pop(run_id, None)  # as the lease was taken (maybe 'in_progress')
        if not new:
            self._journaled.add(run_id)  # a crashed holder may have left entries
        self._lease_seconds[run_id] = lease_seconds

    def _take_lease(
        self,
        conn: Conn,
        run_id: str,
        owner: str,
        lease_seconds: float,
        now: float,
        holder: str | None,
        expires: float | None,
        version: int,
        seq: int,
        since: int,
        cancel_requested: int = 0,
        *,
        applying: bool = False,
    ) -> tuple[Lease, tuple[int, int]]:
        """Take the run's lease (``RunBusyError`` if a live owner holds it). ``applying``: the
        run rests with answers waiting, so it runs from now on -- its status says so until the
        commit that applies them (which answering does not write)."""
        self._refuse_if_held(run_id, owner, holder, expires, now)
        expires_at = now + lease_seconds
        take = SQL_TAKE_LEASE_TO_APPLY if applying else SQL_TAKE_LEASE
        conn.execute(take, (owner, expires_at, version + 1, run_id, version))
        lease = Lease(run_id, owner, version + 1, expires_at, bool(cancel_requested))
        return lease, (seq, since)

    def _refuse_if_held(
        self, run_id: str, owner: str, holder: str | None, expires: float | None, now: float
    ) -> None:
        """``RunBusyError`` while another live worker holds the run's lease (remembered, for
        ``_refuse_while_held``)."""
        if (
            holder is not None
            and holder != owner
            and (expires or 0) > now
            and not owner_is_dead(holder)
        ):
            if len(self._seen_busy) >= _SEEN_BUSY_RUNS:
                self._seen_busy.clear()
            self._seen_busy[run_id] = expires or 0
            left = (expires or 0) - now
            raise RunBusyError(
                f"run {run_id!r} is being executed by {holder_of(holder)}, which renews its "
                f"lease while it works (if it has stopped without releasing it, the lease "
                f"lapses in {left:.0f} s)"
            )

    async def _refuse_while_held(self, run_id: str, owner: str) -> None:
        """Before taking the write lock to lease a run this store was refused last time: read
        its lease first, and refuse again while the other worker still holds it. Processes that
        poll runs others execute (``resume`` until it succeeds) would otherwise take the write
        lock at every attempt, and their holders -- whose renewals and commits wait for that
        lock -- could not keep their leases (outside tester 84: a 0.2 s lease lapsed so, and a
        poller took over a run its owner was executing)."""
        if self.clock() < self._seen_busy.get(run_id, 0.0):
            row = await self._query(_fetch_one, SQL_LEASE_STATE, (run_id,))
            if row is not None:
                self._refuse_if_held(run_id, owner, row[0], row[1], self.clock())
        self._seen_busy.pop(run_id, None)  # (free now: the write decides)

    async def acquire_latest(
        self,
        run_id: str,
        owner: str,
        lease_seconds: float,
        check: Callable[[RunRecord], None] | None = None,
    ) -> Acquired:
        """What resuming needs, in one transaction: the run, its lease, its latest checkpoint
        and its answered requests. ``check(run)`` runs first (on the store's thread); whatever
        it raises aborts with nothing written.

        A checkpoint that cannot be read releases the lease again and raises
        ``StoreCorruptError``; a run without checkpoints gives ``None``.
        """

        def after(rows: tuple) -> tuple:
            run, lease, meta, chain, answered = rows
            self._leased(lease.run_id, meta, lease_seconds)
            return run, lease, chain, answered

        if run_id in self._seen_busy:
            await self._refuse_while_held(run_id, owner)
        return await self._leased_latest(
            await self._in_write(
                self._acquire_with_rows,
                run_id,
                owner,
                lease_seconds,
                check,
                after=after,
                abandoned=lambda taken: self._give_back(taken[1], taken[0].status),
            )
        )

    async def _leased_latest(self, taken: tuple) -> Acquired:
        """After the COMMIT that took a lease with the latest checkpoint's rows: the checkpoint
        (kept, or folded from the rows)."""
        run, lease, chain, answered = taken
        run_id = lease.run_id
        if chain is None or isinstance(chain, Checkpoint):
            return run, lease, chain, answered
        try:
            checkpoint = self._fold_latest(run_id, chain)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self._release_as(lease, run.status)
            raise
        return run, lease, checkpoint, answered

    def _fold_latest(self, run_id: str, chain: list[tuple]) -> Checkpoint:
        """The run's latest checkpoint, folded from its rows, kept -- with what the next
        commits need of the chain: the snapshot policy's sizes (the snapshot's, and the bytes
        written since it) and the base of the next span. Kept without them, it would be
        committed after with no spans, and snapshots placed otherwise than without a restart."""
        checkpoint, base, recorded = self._fold_from(run_id, chain, self._stored_lists)
        read = sum(len(r[3]) for r in chain[1:])
        # written since the snapshot, as the commits that wrote them counted: the rows read,
        # and those before the last span (not read again: the span recorded them; a span of
        # an engine that did not record them: the rows read, less than what was written)
        last_span = max((i for i, row in enumerate(chain) if row[2] == "span"), default=0)
        since = read
        if last_span and recorded:
            since = recorded + sum(len(r[3]) for r in chain[last_span:])
        snapshot_bytes = len(chain[0][3]) + lists_bytes(chain[0][5])  # (its lists apart too)
        self._sizes[run_id] = (since, snapshot_bytes)
        self._span_base[run_id] = base
        self._remember(checkpoint, read + snapshot_bytes)
        return checkpoint

    async def answer_and_acquire(
        self,
        request_id: str,
        answer: Any,
        owner: str,
        lease_seconds: float,
        check: Callable[[RunRecord], None] | None = None,
    ) -> tuple[AnswerOutcome, Acquired | None]:
        """``answer``, then ``acquire_latest`` of the request's run, in one transaction. The
        same fault points as ``answer``. A run another live owner holds gives ``None`` for the
        second part, the answer stored all the same (that worker applies it); whatever else
        the acquiring raises (``check`` included) aborts the whole, nothing written."""
        text = _answer_json(request_id, answer)
        self._fault("answer:before")

        def after(rows: tuple) -> tuple:
            outcome, taken = rows
            if taken is not None:
                run, lease, meta, chain, answered = taken
                self._leased(lease.run_id, meta, lease_seconds)
                taken = (run, lease, chain, answered)
            return outcome, taken

        outcome, taken = await self._in_write(
            self._answer_and_acquire_rows,
            request_id,
            text,
            owner,
            lease_seconds,
            check,
            after=after,
            abandoned=self._give_back_taken,
            size=len(text),
        )
        if outcome is AnswerOutcome.STORED:
            self._fault("answer:after")
        if taken is None:
            return outcome, None
        return outcome, await self._leased_latest(taken)

    def _answer_and_acquire_rows(
        self,
        conn: Conn,
        request_id: str,
        text: str,
        owner: str,
        lease_seconds: float,
        check: Callable[[RunRecord], None] | None,
    ) -> tuple[AnswerOutcome, tuple | None]:
        outcome, run_id = self._answer(conn, request_id, text)
        try:
            taken = self._acquire_with_rows(conn, run_id, owner, lease_seconds, check)
        except RunBusyError:  # nothing of the acquiring was written: the answer stays
            return outcome, None
        return outcome, taken

    def _remember(self, checkpoint: Checkpoint, size: int) -> None:
        """Keep ``checkpoint`` as its run's latest (after the COMMIT that wrote it, or a read).
        Checkpoints are immutable, and each id names one content (``prune`` rewrites a body
        as a snapshot of the same checkpoint), so a kept one is valid for as long as it is its
        run's ``latest_checkpoint_id``. ``size``: the bytes of its stored chain (what it holds,
        about), for the memory budget."""
        recent = self._recent
        run_id = checkpoint.run_id
        before = recent.pop(run_id, None)
        if before is not None:
            self._recent_bytes -= before[1]
        recent[run_id] = (checkpoint, size)
        self._recent_bytes += size
        while len(recent) > _RECENT_RUNS or (
            self._recent_bytes > _RECENT_BYTES and len(recent) > 1
        ):
            gone, (_, size) = recent.popitem(last=False)
            self._recent_bytes -= size
            self._sizes.pop(gone, None)
            self._span_base.pop(gone, None)

    def _recall(self, run_id: str, checkpoint_id: str | None) -> Checkpoint | None:
        kept = self._recent.get(run_id)
        return kept[0] if kept is not None and kept[0].checkpoint_id == checkpoint_id else None

    def _acquire_with_rows(
        self,
        conn: Conn,
        run_id: str,
        owner: str,
        lease_seconds: float,
        check: Callable[[RunRecord], None] | None,
    ) -> tuple[
        RunRecord, Lease, tuple[int, int], list[tuple] | Checkpoint | None, list[StoredRequest]
    ]:
        now = self.clock()
        row = conn.execute(SQL_RUN_FOR_LEASE, (run_id,)).fetchone()
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self.path}")
        run = run_record(row)
        columns = lease_columns(run_id, (row[8], row[9], row[7], row[14], row[15], row[13]))
        if check is not None:
            check(run)
        # (a request of the run whose status is damaged: named now, the lease rolled back --
        # the run paused on it as if nothing were wrong, and its answer was ignored: tester 118)
        answered = requests_of_run(conn, SQL_ANSWERED, (run_id,), run_id)
        applying = bool(answered) and run.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
        lease, meta = self._take_lease(
            conn, run_id, owner, lease_seconds, now, *columns, applying=applying
        )
        # the checkpoint kept in memory, taken now (others' writes may drop it from the cache
        # before this one is answered), or the rows to read it from
        chain: list[tuple] | Checkpoint | None = self._recall(run_id, run.latest_checkpoint_id)
        if chain is None:
            chain = latest_chain(conn, run_id, row[16], lean=True)
            # raising here rolls the lease back: nothing is written
            check_chain(conn, run_id, run.latest_checkpoint_id, chain)
        return run, lease, meta, chain, answered

    def _give_back(self, lease: Lease, status: WorkflowRunState | None = None) -> None:
        """Release a lease taken for a caller that was cancelled while it was being written
        (``_in_write``'s ``abandoned``): no one executes the run, which would otherwise stay
        locked until the lease runs out. ``status``: what the run was before the lease (taking
        it to apply answers set ``in_progress``), set again."""
        task = spawn_detached(
            lambda: self._release_abandoned(lease, status),
            on_done=lambda: self._giving_back.discard(task),
        )
        self._giving_back.add(task)

    def _give_back_taken(self, done: tuple[AnswerOutcome, tuple | None]) -> None:
        """``_give_back`` for ``answer_and_acquire``: the lease, if it took one."""
        if done[1] is not None:
            self._give_back(done[1][1], done[1][0].status)

    async def _release_abandoned(self, lease: Lease, status: WorkflowRunState | None) -> None:
        if self._worker is None:  # closed meanwhile: releasing would open the store again
            log.info(
                "run %r: the store closed before a cancelled caller's lease was given "
                "back; it lapses by itself",
                lease.run_id,
            )
            return
        try:
            await self._release_as(lease, status)
        except Exception as exc:  # the lease runs out instead, as if this process had died
            log.warning(
                "run %r: could not release the lease of a cancelled caller (%s); it lapses "
                "by itself",
                lease.run_id,
                exc,
            )

    async def release(self, lease: Lease) -> Lease | None:
        return await self._release_as(lease, None)

    async def _release_as(self, lease: Lease, status: WorkflowRunState | None) -> Lease | None:
        """``release``; with ``status``, for a lease under which nothing ran, the run's status
        as the lease found it is set again: a lease taken to apply answers marks the run
        ``in_progress`` (so a crash while it executes shows a step in doubt), which a run
        nothing executed is not."""

        def after(ended: Lease | None) -> Lease | None:
            if ended is not None:
                self._forget(lease.run_id)
            return ended

        self._fault("release:before")
        return await self._in_write(self._release, lease, status, after=after)

    @staticmethod
    def _release(conn: Conn, lease: Lease, status: WorkflowRunState | None) -> Lease | None:
        if status is None:
            released = conn.execute(SQL_RELEASE, (lease.run_id, lease.owner)).rowcount
        else:
            params = (status.value, lease.run_id, lease.owner)
            released = conn.execute(SQL_RELEASE_UNUSED, params).rowcount
        if released != 1:
            return None
        # what arrived while it was held that no commit took up (in this transaction: an
        # answer or a cancel stored from now on finds the run unleased, and acts itself)
        row = conn.execute(SQL_RELEASED_STATE, (lease.run_id, lease.run_id)).fetchone()
        return ended_lease(lease, WorkflowRunState(row[0]), bool(row[1]), bool(row[2]))

    async def renew(self, lease: Lease) -> Lease:
        """Extend the lease (same version); ``LeaseLostError`` if another worker took it."""
        seconds = self._lease_seconds.get(lease.run_id, 30.0)
        return await self._in_write(self._renew, lease, seconds)

    def _renew(self, conn: Conn, lease: Lease, seconds: float) -> Lease:
        cancel = self._fence(conn, lease)[1]
        expires = self.clock() + seconds  # from now, not from before a wait for the lock
        conn.execute(SQL_RENEW, (expires, lease.run_id, lease.owner, lease.version))
        return Lease(lease.run_id, lease.owner, lease.version, expires, cancel)

    async def request_cancel(self, run_id: str) -> bool:
        return bool(await self._in_write(self._request_cancel, run_id))

    def _request_cancel(self, conn: Conn, run_id: str) -> bool:
        if conn.execute(SQL_REQUEST_CANCEL, (run_id,)).rowcount == 1:
            return True
        if conn.execute(SQL_LEASE_STATE, (run_id,)).fetchone() is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self.path}")
        return False  # no worker holds it: it rests

    @staticmethod
    def _fence(conn: Conn, lease: Lease) -> tuple[str | None, bool]:
        """Inside a write transaction: refuse unless ``lease`` still holds the run. Returns the
        run's latest checkpoint id and whether a cancel was requested."""
        row = conn.execute(SQL_FENCE, (lease.run_id,)).fetchone()
        if row is None:
            raise RunNotFoundError(f"no run {lease.run_id!r}")
        if row[0] != lease.owner or row[1] != lease.version:
            now = (
                f"is being executed by {holder_of(row[0])}"
                if row[0] is not None
                else "was taken over by another worker, which is done with it (it cancelled, "
                "resumed or released the run)"
            )
            raise LeaseLostError(
                f"run {lease.run_id!r} {now}: our lease was lost, so this write is refused"
            )
        return row[2], bool(row[3])

    def _forget(self, run_id: str) -> None:
        """Our lease on ``run_id`` ended: drop what we kept for committing under it."""
        self._meta.pop(run_id, None)
        self._lease_seconds.pop(run_id, None)
        self._status.pop(run_id, None)

    async def commit(self, lease: Lease, checkpoint: Checkpoint) -> Lease:
        """One transaction: fenced run update, checkpoint row, request changes."""
        return await self._commit_checkpoint(lease, checkpoint, False)

    async def commit_and_release(self, lease: Lease, checkpoint: Checkpoint) -> Lease:
        """``commit`` and ``release`` in one transaction, for a checkpoint after which this
        execution writes nothing more (the run rests). The same fault points as ``commit``.
        """
        return await self._commit_checkpoint(lease, checkpoint, True)

    async def _commit_checkpoint(
        self,
        lease: Lease,
        checkpoint: Checkpoint,
        release: bool,
        admission: _Admission | None = None,
    ) -> Lease:
        """The commit of ``checkpoint`` under ``lease``; with ``admission``, of the run's first
        superstep, in the transaction that admits the run (where the run's chain, sizes and
        status would stand after that admission are the admission's, not read from here)."""
        run_id = lease.run_id
        check_own(run_id, checkpoint)
        now = self.clock()
        if admission is None:
            meta = self._meta.get(run_id)
            if meta is None:
                raise RunBusyError(f"run {run_id!r}: commit without acquiring its lease")
            sizes = self._sizes.get(run_id, (0, 0))
            lease_seconds = self._lease_seconds.get(run_id, 30.0)
            last_status = self._status.get(run_id)
            span_base = self._span_base.get(run_id)
        else:
            meta, sizes, lease_seconds = (0, 0), (0, admission.size), admission.lease_seconds
            last_status, span_base = None, admission.checkpoint
        seq, since = meta
        seq += 1
        # Snapshot policy. A snapshot bounds how many deltas a restore folds; but a run whose
        # state only grows (a conversation, outputs) would copy all of it into every snapshot,
        # so storage would grow quadratically. So a snapshot is also due only once the deltas
        # since the last one add up to as many bytes as it had: snapshots then grow
        # geometrically and storage stays linear in the run's length. ``_MAX_CHAIN`` caps the
        # fold anyway.
        body = None
        if checkpoint.parent_id is None:
            snapshot = True
        else:
            body = checkpoint_row(checkpoint, seq, snapshot=False)
            since_bytes, snapshot_bytes = sizes
            snapshot = since + 1 >= _MAX_CHAIN or (
                since + 1 >= self.snapshot_every and since_bytes + row_bytes(body) >= snapshot_bytes
            )
        since = 0 if snapshot else since + 1
        changes = checkpoint.changes
        self._fault("commit:before")
        status = checkpoint.status.value
        run = (
            lease.version + 1,
            status,
            checkpoint.superstep,
            now,  # (updated_at and ...)
            checkpoint.checkpoint_id,
            seq,
            since,
            None,  # (... the lease's expiry: each commit renews it; set when written)
            run_id,
            lease.version,
            lease.owner,
            checkpoint.parent_id,
            checkpoint.parent_id,
        )
        same_status = last_status == status
        added = changes.requests_added
        request_rows = new_request_rows(checkpoint, added, now) if added else None
        status_rows = [("applied", r) for r in changes.requests_answered]
        status_rows += [("cancelled", r) for r in changes.requests_cancelled]
        span_base_id: str | None = None
        if body is None or snapshot:
            body = checkpoint_row(checkpoint, seq, lists_apart_from=self._lists_apart_from)
        elif self.span_every and since % self.span_every == 0:
            # now and then a span instead of a delta: a restore then folds the snapshot, the
            # spans and at most ``span_every - 1`` deltas, not every delta since the snapshot
            span = span_of(checkpoint, span_base) if span_base is not None else None
            if span is not None:
                # what was written since the snapshot before it: read back after a restart
                span = span.model_copy(update={"written_before": sizes[0]})
                body = span_row(checkpoint, seq, span)
                span_base_id = span.base_id

        # (partials, not closures: a closure's variables are cells, objects that every garbage
        # collection walks while the commit waits -- thousands of them with thousands of runs)
        after = functools.partial(self._after_commit, checkpoint, admission, seq, since, status)
        how = (release, same_status, span_base_id, lease_seconds, admission is not None)
        # (split before the write lock is taken: see ``with_split``)
        args = (checkpoint, how, run, with_split(body, self._chunking), request_rows)
        size = row_bytes(body) + (admission.size if admission is not None else 0)
        if admission is None:
            done = await self._in_write(
                self._commit_rows, *args, status_rows, after=after, size=size
            )
        else:
            abandoned = functools.partial(self._admission_abandoned, lease)
            done = await self._in_write(
                self._admit_then_commit_rows,
                admission.rows,
                *args,
                status_rows,
                after=after,
                abandoned=abandoned,
                size=size,
            )
        cancel, waiting, expires_at = done[0], done[1], done[4]
        self._fault("commit:after")
        return Lease(run_id, lease.owner, lease.version + 1, expires_at, cancel, waiting)

    def _after_commit(
        self,
        checkpoint: Checkpoint,
        admission: _Admission | None,
        seq: int,
        since: int,
        status: str,
        done: _Committed,
    ) -> _Committed:
        """What this store keeps after the COMMIT of ``_commit_checkpoint`` (even if the caller
        gave up waiting). ``done[3]``: the row as stored (a span may have become a snapshot,
        see ``_commit_rows``)."""
        run_id = checkpoint.run_id
        if admission is not None:
            admission.after(None)
        released, written = done[2], done[3]
        whole = written[4] == "snapshot"
        if released:
            self._forget(run_id)
        else:
            self._meta[run_id] = (seq, 0 if whole else since)
            self._status[run_id] = status
        kept = None if whole else self._recent.get(run_id)
        self._remember(checkpoint, row_bytes(written) + (kept[1] if kept is not None else 0))
        if whole or written[4] == "span":
            self._span_base[run_id] = checkpoint
        if whole:
            self._sizes[run_id] = (0, row_bytes(written))
        else:
            since_bytes, snapshot_bytes = self._sizes.get(run_id, (0, 0))
            self._sizes[run_id] = (since_bytes + row_bytes(written), snapshot_bytes)
        self._journaled.discard(run_id)
        return done

    def _admission_abandoned(self, lease: Lease, done: _Committed) -> None:
        """An admitting commit whose caller gave up: the lease it took is given back."""
        if not done[2]:  # (a lease the commit ended has nothing to give back)
            self._give_back(Lease(lease.run_id, lease.owner, lease.version + 1, done[4]))

    def _admit_then_commit_rows(
        self, conn: Conn, admission_rows: tuple, *commit: Any
    ) -> _Committed:
        self._admit(conn, admission_rows[0][0], *admission_rows)
        return self._commit_rows(conn, *commit)

    def _commit_rows(
        self,
        conn: Conn,
        checkpoint: Checkpoint,
        how: tuple[bool, bool, str | None, float, bool],
        run: tuple,
        body: tuple,
        request_rows: list[tuple] | None,
        status_rows: list[tuple[str, str]],
    ) -> _Committed:
        """The commit's rows (see ``_Committed``). ``how``: (release the lease, the status is
        what our last commit wrote, the checkpoint a span ``body`` is relative to, the lease's
        length, the run is admitted in this transaction). The lease runs from now, when it is
        written: a wait for the lock (another process writing) is not taken out of it."""
        run_id = run[8]
        release, same_status, span_base, lease_seconds, admitting = how
        now = self.clock()
        run = (*run[:3], now, *run[4:7], now + lease_seconds, *run[8:])
        if span_base is not None and conn.execute(SQL_SPAN_BASE, (run_id,)).fetchone() != (
            span_base,
        ):
            # a restore would not start from the span's base any more: ``prune(keep_last=)``
            # (any process) re-based the run's history since this store last read or wrote
            # it. Stored whole instead, the checkpoint is where restores start from now.
            body = checkpoint_row(checkpoint, run[5], lists_apart_from=self._lists_apart_from)
            run = (*run[:6], 0, *run[7:])
        # (a finished run stays finished: a cancel requested meanwhile is moot, as it is for a
        # workflow engine's completed workflow -- it was marked cancelled after its effects ran,
        # outside testers 110 and 111)
        done_with_cancel = checkpoint.status in (WorkflowRunState.CANCELLED, WorkflowRunState.IDLE)
        cancel = False
        # each update first as if no cancel were requested (the usual case, one statement); no
        # row updated, the statement that says the flag tells a cancel from a refusal
        if release:
            released = (*run[:7], None, *run[8:])  # (the lease ends: no expiry)
        if release and done_with_cancel:  # (a cancel requested meanwhile is done with)
            updated = conn.execute(SQL_COMMIT_RUN_RELEASE_CANCEL_DONE, released).rowcount
        elif release:
            updated = conn.execute(SQL_COMMIT_RUN_RELEASE_NO_CANCEL, released).rowcount
            if not updated:
                # a cancel requested while this superstep ran: the lease is kept even if the
                # run would rest now, so that its holder honours the cancel at this boundary
                said = conn.execute(SQL_COMMIT_RUN_RELEASE_UNLESS_CANCEL, run).fetchall()
                updated = len(said)
                cancel = bool(said) and bool(said[0][0])
                release = not cancel
        else:  # (most supersteps)
            updated = 0
            if same_status:  # the status as the row holds it (the update checks it): left out
                kept = (run[0], *run[2:], run[1])
                updated = conn.execute(SQL_COMMIT_RUN_KEEP_STATUS_NO_CANCEL, kept).rowcount
            if not updated:
                updated = conn.execute(SQL_COMMIT_RUN_NO_CANCEL, run).rowcount
            if not updated:
                said = conn.execute(SQL_COMMIT_RUN_SAYING_CANCEL, run).fetchall()
                updated = len(said)
                if said and said[0][0]:
                    cancel = not done_with_cancel
                    if done_with_cancel:
                        conn.execute(SQL_CANCEL_DONE, (run_id,))
        if updated != 1:
            # refused: say why (lease lost, or history moved)
            latest, _ = self._fence(conn, Lease(run_id, run[10], run[9], 0.0))
            raise CheckpointNotLatestError(
                f"run {run_id!r}: checkpoint {checkpoint.checkpoint_id} follows "
                f"{checkpoint.parent_id}, but the run's latest checkpoint is {latest}; continue "
                "from the latest, or fork"
            )

        what = functools.partial(_checkpoint_what, run_id, checkpoint.superstep)
        with _Sized(conn, what, _largest_value(body)):
            conn.execute(SQL_INSERT_CHECKPOINT, stored_row(conn, body, self._chunking))
        if request_rows:
            _insert_requests(conn, request_rows)
        if status_rows:
            conn.executemany(SQL_REQUEST_STATUS, status_rows)
        # entries of committed supersteps are never read again (only a run whose journal this
        # store touched since its lease was taken can have any)
        if run_id in self._journaled:
            conn.execute(SQL_JOURNAL_COMPACT, (run_id, checkpoint.superstep))
        # answers stored while this worker executed (this commit applied the ones it knew of):
        # a run about to rest must go on instead of waiting for them (none for a run admitted
        # in this transaction: no one else has seen its requests)
        waiting = (
            checkpoint.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
            and not admitting
            and conn.execute(SQL_ANSWER_WAITING, (run_id,)).fetchone() is not None
        )
        self._fault("commit:inside")
        return cancel, waiting, release, body, run[7]

    async def set_status(
        self, lease: Lease, status: WorkflowRunState, error: dict[str, Any] | None = None
    ) -> Lease:
        self._status.pop(lease.run_id, None)
        params = (
            lease.version + 1,
            status.value,
            self.clock(),
            json.dumps(error) if error else None,
            status is WorkflowRunState.FAILED,
            lease.run_id,
            lease.version,
            lease.owner,
        )
        if not await self._in_write(_update_one, SQL_SET_STATUS, params):
            raise RunBusyError(
                f"run {lease.run_id!r}: this execution's lease was taken over, so its status "
                "is not set"
            )
        return Lease(lease.run_id, lease.owner, lease.version + 1, lease.expires_at)

    async def get_run(self, run_id: str) -> RunRecord:
        row = await self._query(_fetch_one, SQL_RUN, (run_id,))
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self.path}")
        return run_record(row)

    async def get_run_and_latest(self, run_id: str) -> tuple[RunRecord, Checkpoint | None]:
        """``get_run`` and ``latest`` in one read."""
        return await self._read(self._get_run_and_latest, run_id)

    def _get_run_and_latest(self, run_id: str) -> tuple[RunRecord, Checkpoint | None]:
        row, chain = self._transaction("BEGIN", self._run_and_chain, (run_id,))
        if row is None:
            raise RunNotFoundError(f"no run {run_id!r} in {self.path}")
        if chain is None:
            return run_record(row), self._recall(run_id, row[10])
        return run_record(row), self._fold_latest(run_id, chain)

    def _run_and_chain(self, conn: Conn, run_id: str) -> tuple[tuple | None, list | None]:
        row = conn.execute(SQL_RUN, (run_id,)).fetchone()
        if row is None or self._recall(run_id, row[10]) is not None:
            return row, None
        chain = latest_chain(conn, run_id, lean=True)
        check_chain(conn, run_id, row[10], chain)
        return row, chain

    async def list_runs(
        self,
        status: WorkflowRunState | None = None,
        workflow: str | None = None,
        limit: int | None = None,
        *,
        started: bool | None = None,
    ) -> Sequence[RunRecord]:
        """``RunStore.list_runs``; ``started``: only runs some worker has taken (True), or
        only runs none ever took (False), told apart by the query (``started_runs``)."""
        text, params = self._runs_query(status, workflow, started)
        if limit is not None:
            text += " LIMIT ?"
            params.append(limit)
        return await self._run(
            self._transaction, "BEGIN", listed_runs, (text, params, status is not None)
        )

    @staticmethod
    def _runs_query(
        status: WorkflowRunState | None, workflow: str | None, started: bool | None
    ) -> tuple[str, list[Any]]:
        """The SQL of a listing of runs, oldest first, and its parameters."""
        return filtered(
            f"SELECT {RUN_COLUMNS} FROM runs",
            (
                ("status", WorkflowRunState(status).value if status is not None else None),
                ("workflow_name", workflow),
            ),
            "created_at, run_id",
            *started_runs(started),
        )

    async def runs_by_update_apart(
        self,
        status: WorkflowRunState | None = None,
        workflow: str | None = None,
        *,
        started: bool | None = None,
        last: int | None = None,
    ) -> tuple[list[RunRecord], list[StoreCorruptError], int]:
        """What ``runs list`` shows: runs least recently updated first (``last``: only the
        ``last`` updated most recently), the errors naming those whose rows do not read
        (``list_runs_apart``), and how many runs the filters match in all."""
        value = WorkflowRunState(status).value if status is not None else None
        text, count, params = runs_by_update(value, workflow, started, last)

        def read(conn: Conn) -> tuple[list[RunRecord], list[StoreCorruptError], int]:
            records, damaged = listed_runs_apart(conn, text, params, status is not None)
            return records, damaged, conn.execute(count, params).fetchone()[0]

        return await self._run(self._transaction, "BEGIN", read, ())

    async def run_ids(self, prefix: str = "") -> Sequence[str]:
        # (every id: maybe many, on the worker; those with a prefix, a range: a short read)
        read = self._read if prefix else self._run
        rows = await read(self._transaction, None, _fetch_all, prefix_query(SQL_RUN_IDS, prefix))
        return [run_id_of(row) for row in rows]

    async def run_ids_beside(self, run_ids: Iterable[str]) -> list[str]:
        """``run_ids`` with the stored run ids just before and after each, in order: what the
        shortest unique prefix of each of them is worked out from (a table the command line
        prints), without reading every id there is."""
        return await self._read(
            self._transaction, "BEGIN", ids_beside, (SQL_RUN_IDS_BESIDE, list(run_ids))
        )

    async def request_ids_beside(self, request_ids: Iterable[str]) -> list[str]:
        """``request_ids`` with the stored request ids just before and after each."""
        return await self._read(
            self._transaction, "BEGIN", ids_beside, (SQL_REQUEST_IDS_BESIDE, list(request_ids))
        )

    async def answered_counts(self, run_ids: Iterable[str] | None = None) -> dict[str, int]:
        """How many answers each run has stored and not applied yet (runs with none left out):
        of ``run_ids``, or of every run (None); counted, not read (a listing marks such runs)."""
        given = list(run_ids) if run_ids is not None else None
        return await self._read(self._transaction, "BEGIN", answered_counts, (given,))

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
        return await self._run(self._latest, run_id)

    def _latest(self, run_id: str) -> Checkpoint | None:
        chain = self._transaction("BEGIN", latest_chain, (run_id,))
        return self._fold(run_id, chain) if chain is not None else None

    # (the chain's rows and their fold: ``_chain``; on the store, so a benchmark can time it)
    _fold_from = staticmethod(fold_chain)

    @staticmethod
    def _fold(run_id: str, rows: list[tuple]) -> Checkpoint:
        """The checkpoint a chain of rows (a snapshot, spans, then deltas) reads as."""
        return fold_chain(run_id, rows)[0]

    async def load(self, checkpoint_id: str) -> Checkpoint:
        return await self._run(self._load, checkpoint_id)

    def _load(self, checkpoint_id: str) -> Checkpoint:
        run_id, chain = self._transaction("BEGIN", self._load_chain, (checkpoint_id,))
        return self._fold(run_id, chain)

    def _load_chain(self, conn: Conn, checkpoint_id: str) -> tuple[str, list[tuple]]:
        row = conn.execute(SQL_CHECKPOINT_PLACE, (checkpoint_id,)).fetchone()
        if row is None:
            raise CheckpointNotFoundError(f"no checkpoint {checkpoint_id!r} in {self.path}")
        return row[0], chain_to(conn, row[0], row[1], row[2])

    async def list(self, run_id: str) -> Sequence[Checkpoint]:
        return [await self.load(info.checkpoint_id) for info in await self.history(run_id)]

    async def history(self, run_id: str) -> Sequence[CheckpointInfo]:
        rows = await self._run(self._transaction, None, _fetch_all, (SQL_HISTORY, (run_id,)))
        return [checkpoint_info(run_id, row) for row in rows]

    async def delete(self, checkpoint_id: str) -> None:
        raise StorageError("checkpoints are removed with prune(keep_last=...)")

    # --- requests -------------------------------------------------------------------------------

    async def get_request(self, request_id: str) -> StoredRequest:
        row = await self._query(_fetch_one, SQL_REQUEST, (request_id,))
        if row is None:
            raise UnknownRequestError(f"no request {request_id!r} in {self.path}")
        return stored_request(row)

    async def get_request_and_run(self, request_id: str) -> tuple[StoredRequest, RunRecord]:
        """``get_request`` and the ``get_run`` of its run in one read."""
        row = await self._query(_fetch_one, SQL_REQUEST_AND_RUN, (request_id,))
        if row is None:
            raise UnknownRequestError(f"no request {request_id!r} in {self.path}")
        if row[12] is None:
            raise RunNotFoundError(f"no run {row[1]!r} in {self.path}")
        return stored_request(row), run_record(row[12:])

    async def list_requests(
        self,
        run_id: str | None = None,
        status: RequestStatus | None = "pending",
        *,
        limit: int | None = None,
    ) -> Sequence[StoredRequest]:
        """``RunStore.list_requests``; with ``limit``, the first ``limit`` of them alone are
        read (``count_requests`` says how many there are)."""
        text, params = filtered(
            f"SELECT {REQUEST_COLUMNS} FROM requests",
            (("run_id", run_id), ("status", status)),
            "created_at, rowid",  # the order the run asked them in (rows go in in that order)
        )
        if limit is not None:
            text += f" LIMIT {int(limit)}"
        if status == "pending" or (status is not None and run_id is not None):
            return await self._run(self._transaction, None, requests_of_run, (text, params, run_id))
        rows = await self._run(self._transaction, None, _fetch_all, (text, params))
        return [stored_request(r) for r in rows]

    async def count_requests(self, status: RequestStatus) -> int:
        """How many requests of ``status`` there are (of every run)."""
        row = await self._query(_fetch_one, SQL_COUNT_REQUESTS, (status,))
        return int(row[0])

    async def request_ids(self, prefix: str = "") -> Sequence[str]:
        read = self._read if prefix else self._run  # (as ``run_ids``)
        rows = await read(
            self._transaction, None, _fetch_all, prefix_query(SQL_REQUEST_IDS, prefix)
        )
        return [request_id_of(row) for row in rows]

    async def answer(self, request_id: str, answer: Any) -> AnswerOutcome:
        text = _answer_json(request_id, answer)
        self._fault("answer:before")
        outcome, _ = await self._in_write(self._answer, request_id, text, size=len(text))
        if outcome is AnswerOutcome.STORED:
            self._fault("answer:after")
        return outcome

    async def answer_all(self, answers: Sequence[tuple[str, Any]]) -> Sequence[AnswerOutcome]:
        texts = [(request_id, _answer_json(request_id, answer)) for request_id, answer in answers]
        self._fault("answer:before")
        size = sum(len(text) for _, text in texts)
        outcomes: Sequence[AnswerOutcome] = await self._in_write(self._answer_all, texts, size=size)
        if AnswerOutcome.STORED in outcomes:
            self._fault("answer:after")
        return outcomes

    def _answer_all(self, conn: Conn, texts: Sequence[tuple[str, str]]) -> Sequence[AnswerOutcome]:
        """Each answer, in the one write (its savepoint: one refused, none is kept)."""
        return [self._answer(conn, request_id, text)[0] for request_id, text in texts]

    async def cancel_requests(
        self, request_ids: Sequence[str], *, run_id: str | None = None
    ) -> None:
        self._fault("cancel:before")
        after = None if run_id is None else functools.partial(self._cancel_intended, run_id)
        await self._in_write(self._cancel_requests, tuple(request_ids), run_id, after=after)
        self._fault("cancel:after")

    def _cancel_requests(self, conn: Conn, request_ids: Sequence[str], run_id: str | None) -> None:
        """Each pending one cancelled, in the one write (its savepoint: one refused, none is);
        then, with ``run_id``, the run's cancel recorded."""
        for request_id in request_ids:
            if conn.execute(SQL_CANCEL_REQUEST, (request_id,)).fetchall():
                continue
            row = conn.execute(SQL_ANSWER_STATE, (request_id,)).fetchone()
            if row is None:
                raise UnknownRequestError(f"no request {request_id!r} in {self.path}")
            if row[0] != "cancelled":
                raise RequestAlreadyAnsweredError(
                    f"run {row[2]!r}: request {request_id!r} was already answered; an answered "
                    "request cannot be cancelled"
                )
        if run_id is not None:
            # (a run that ended keeps no cancel: the cancel after this says it ended)
            recorded = conn.execute(SQL_CANCEL_INTENDED, (run_id,)).rowcount
            if not recorded and conn.execute(SQL_LEASE_STATE, (run_id,)).fetchone() is None:
                raise RunNotFoundError(f"no run {run_id!r} in {self.path}")
            self._fault("cancel:inside")

    def _cancel_intended(self, run_id: str, _: None) -> None:
        """After the COMMIT that recorded a run's cancel: the status this store last wrote for
        it may no longer be the row's."""
        self._status.pop(run_id, None)

    def _answer(self, conn: Conn, request_id: str, text: str) -> tuple[AnswerOutcome, str]:
        """Store ``text`` as the answer of ``request_id``: (the outcome, the request's run)."""

        def beside() -> str:  # (asked only if the row is too big)
            data = conn.execute(SQL_REQUEST_DATA_SIZE, (request_id,)).fetchone()
            return f"the request's data ({data[0]:,} bytes) and " if data else ""

        what = functools.partial(_answer_what, conn, request_id)
        with _Sized(conn, what, text, beside):
            stored = conn.execute(SQL_STORE_ANSWER, (text, self.clock(), request_id)).fetchall()
        if stored:
            self._fault("answer:inside")  # it was pending: stored
            return AnswerOutcome.STORED, stored[0][0]
        row = conn.execute(SQL_ANSWER_STATE, (request_id,)).fetchone()
        if row is None:
            raise UnknownRequestError(f"no request {request_id!r} in {self.path}")
        status, previous, run_id = row
        if status == "cancelled":
            raise RequestCancelledError(f"run {run_id!r}: request {request_id!r} was cancelled")
        if status in ("answered", "applied"):
            if previous == text or _same_json(previous, text):
                return AnswerOutcome.DUPLICATE, run_id
            raise RequestAlreadyAnsweredError(
                f"run {run_id!r}: request {request_id!r} was already answered with a "
                "different value; an answer cannot be changed"
            )
        raise StorageError(f"request {request_id!r} has an unknown status {status!r}")

    # --- side-effect journal ------------------------------------------------------------------

    async def journal_get(self, run_id: str, key: str) -> Any | None:
        row = await self._query(_fetch_one, SQL_JOURNAL_GET, (run_id, key))
        if row is None:
            return None
        self._journaled.add(run_id)
        return journal_entry(run_id, key, row[0])

    async def runs_journaled_past(self) -> Sequence[RunRecord]:
        """The runs in progress with journal entries of supersteps after their latest
        checkpoint's, oldest first: only such a run can have a step in doubt (one query, not
        a ``journal_after`` per run in progress)."""
        rows = await self._query(_fetch_all, SQL_RUNS_JOURNALED_PAST, ())
        return [run_record(row) for row in rows]

    async def journal_after(self, run_id: str, superstep: int) -> Sequence[tuple[str, Any]]:
        """The entries ``(key, entry)`` of supersteps after ``superstep``, oldest first."""
        rows = await self._query(_fetch_all, SQL_JOURNAL_AFTER, (run_id, superstep))
        return journal_entries(run_id, rows)

    async def journal_intent(
        self, run_id: str, key: str, entry: Any, superstep: int, *, lease: Lease | None = None
    ) -> None:
        """Record that a step is starting (kept if the key has an entry), fenced by ``lease``."""
        text = stored_json(entry)
        self._journaled.add(run_id)
        self._fault("intent:before")
        await self._in_write(
            self._journal_write,
            *(run_id, key, text, superstep, lease, False),
            size=len(text),
        )
        self._fault("intent:after")

    async def journal_put(
        self, run_id: str, key: str, value: Any, superstep: int, *, lease: Lease | None = None
    ) -> Any:
        """Store a result unless one exists (first writer wins; it replaces an intent);
        returns the stored result. Fenced by ``lease`` when given."""
        try:
            text = stored_json(value)
        except SerializationError:
            raise StorageError(
                f"{_result_what(run_id, key)} cannot be stored: {_LONG_NUMBER}"
            ) from None
        self._journaled.add(run_id)
        self._fault("journal:before")
        stored = await self._in_write(
            self._journal_write,
            *(run_id, key, text, superstep, lease, True),
            size=len(text),
        )
        self._fault("journal:after")
        return load_json(stored, run_id, f"journal entry {key!r}")

    def _journal_write(
        self,
        conn: Conn,
        run_id: str,
        key: str,
        text: str,
        superstep: int,
        lease: Lease | None,
        result: bool,
    ) -> str:
        if lease is not None:
            self._fence(conn, lease)
        row = conn.execute(SQL_JOURNAL_GET, (run_id, key)).fetchone()
        what = _result_what if result else _entry_what
        sized = _Sized(conn, functools.partial(what, run_id, key), text)
        if row is None:
            with sized:
                conn.execute(SQL_JOURNAL_PUT, (run_id, key, text, self.clock(), superstep))
            stored = text
        elif result and not row[0].startswith('{"value":'):  # an intent: the result replaces it
            with sized:
                conn.execute(SQL_JOURNAL_REPLACE, (text, self.clock(), run_id, key))
            stored = text
        else:
            stored = row[0]
        self._fault("journal:inside")
        return stored

    async def journal_clear(self, run_id: str, key: str, *, lease: Lease | None = None) -> None:
        await self._in_write(self._journal_clear, run_id, key, lease)

    def _journal_clear(self, conn: Conn, run_id: str, key: str, lease: Lease | None) -> None:
        if lease is not None:
            self._fence(conn, lease)
        conn.execute(SQL_JOURNAL_CLEAR, (run_id, key))

    # --- retention ------------------------------------------------------------------------------

    async def prune(
        self, *, finished_before: float | None = None, keep_last: int | None = None
    ) -> int:
        check_prune(finished_before, keep_last)
        self._refuse_if_read_only()
        # Each part first looks, in a read transaction, for what it would delete -- every
        # finished run, every run's history: a scan -- and takes the write lock only for
        # those runs, each checked again under it. It held the lock for the whole scan, even
        # with nothing to delete: other writers stalled (0.2 s at 100,000 runs, tester 119).
        deleted = 0
        if finished_before is not None:
            now = self.clock()
            doomed = await self._run(
                self._transaction, "BEGIN", _fetch_all, (SQL_DOOMED, (finished_before, now))
            )
            if doomed:
                deleted += await self._in_slices(
                    _prune_finished,
                    [run_id for (run_id,) in doomed],
                    finished_before,
                    now,
                    self._fault,
                )
        if keep_last is not None:
            long = await self._run(
                self._transaction, "BEGIN", _fetch_all, (SQL_LONG_HISTORIES, (keep_last,))
            )
            if long:
                deleted += await self._in_slices(
                    self._keep_last, [run_id for run_id, _, _ in long], keep_last
                )
        return deleted

    async def _in_slices(self, body: Callable[..., int], run_ids: Sequence[str], *args: Any) -> int:
        """The sum of ``body(conn, some_run_ids, *args)`` over slices of ``run_ids``, each in a
        write transaction of its own that holds the lock about ``_PRUNE_HOLD`` (the slices
        sized by how long the last one took), with ``_PRUNE_GAP`` between them for other
        writers -- other processes' too. In one transaction, a prune of 100,000 runs held the
        lock 6 s, and a run started meanwhile in another process failed as locked (outside
        tester 215)."""
        deleted, at, count = 0, 0, 1
        while at < len(run_ids):
            if at:
                await anyio.sleep(_PRUNE_GAP)
            piece = run_ids[at : at + count]
            began = time.monotonic()
            deleted += await self._run(self._transaction, "BEGIN IMMEDIATE", body, (piece, *args))
            took = max(time.monotonic() - began, 1e-4)
            at += len(piece)
            count = max(1, min(count * 4, int(count * _PRUNE_HOLD / took)))
        return deleted

    def _keep_last(self, conn: Conn, run_ids: Sequence[str], keep: int) -> int:
        """Cut the histories of ``run_ids`` that are longer than ``keep`` checkpoints now."""
        deleted = 0
        for run_id in run_ids:
            self._fault("prune:run")
            found = conn.execute(SQL_HISTORY_LENGTH, (run_id,)).fetchone()
            if found is None or found[0] is None or found[1] <= keep:
                continue  # (gone, or cut meanwhile by another process's prune)
            max_seq = found[0]
            first_kept = max_seq - keep + 1
            (base,) = conn.execute(SQL_RUN_BASE, (run_id,)).fetchone()
            # the oldest kept checkpoint becomes a snapshot, so nothing kept needs the rest;
            # so does the first span after it, which is relative to a row about to go
            full = self._fold(run_id, chain_to(conn, run_id, first_kept, base))
            (span_seq,) = conn.execute(SQL_FIRST_SPAN_AFTER, (run_id, first_kept)).fetchone()
            if span_seq is not None:
                rebased = self._fold(run_id, chain_to(conn, run_id, span_seq, base))
                self._make_snapshot(conn, run_id, rebased, span_seq)
            self._make_snapshot(conn, run_id, full, first_kept)
            deleted += conn.execute(SQL_DROP_BEFORE, (run_id, first_kept)).rowcount
        return deleted

    def _make_snapshot(self, conn: Conn, run_id: str, checkpoint: Checkpoint, seq: int) -> None:
        """Rewrite row ``seq`` of the run as a snapshot of ``checkpoint`` (what it folds to),
        its chunks stored (the database's trigger gives back those the row held). Its version
        says at least what an engine must know to read it: an older one that had the file open
        read a rewritten row's long lists as empty (outside tester 125)."""
        body, lists, list_items = snapshot_parts(checkpoint, self._lists_apart_from)
        chunked = None
        parts = split_texts(body, list_items, self._chunking)
        if parts is not None:
            body, list_items, chunked, chunks, keys = parts
            store_chunks(conn, keys, chunks)
        version = CHUNKED_VERSION if chunked is not None else LISTS_APART_VERSION if lists else 0
        conn.execute(SQL_MAKE_SNAPSHOT, (run_id, body, seq, lists, list_items, chunked, version))


# --- statements and rows ------------------------------------------------------------------------


class _Sized:
    """Statements that store ``text`` (``what`` it is, or a function saying it: built only
    if needed; ``beside``: what else of its row to name, asked only if the row is what is too
    big): SQLite refusing it as larger than it stores in one value or one row
    (``SQLITE_TOOBIG``) becomes a ``StorageError`` naming ``what`` and the sizes, not SQLite's
    bare "string or blob too big". A class, not a generator: it guards every commit."""

    __slots__ = ("beside", "conn", "text", "what")

    def __init__(
        self,
        conn: Conn,
        what: str | Callable[[], str],
        text: str,
        beside: Callable[[], str] | None = None,
    ) -> None:
        self.conn, self.what, self.text, self.beside = conn, what, text, beside

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        if kind is None or not issubclass(kind, sqlite3.DataError):
            return
        if getattr(exc, "sqlite_errorname", None) != "SQLITE_TOOBIG":
            return
        conn, text = self.conn, self.text
        what = self.what if isinstance(self.what, str) else self.what()
        refused = _too_big(conn, what, text)
        if refused is None:  # each value fits, the row does not
            limit = conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
            others = self.beside() if self.beside is not None else ""
            refused = StorageError(
                f"{what} is {_utf8_size(text):,} bytes; with {others}the rest of its row, that "
                f"is more than SQLite stores in one row ({limit:,} bytes): keep data that large "
                "outside the run (a file, say) and pass its path or id"
            )
        raise refused from None


def _largest_value(row: tuple) -> str:
    """A checkpoint row's largest text (its body, or its lists kept apart): what may be too
    big to store."""
    items = row[11]
    return items if items is not None and len(items) > len(row[8]) else row[8]


def _too_big(conn: Conn, what: str, text: str) -> StorageError | None:
    """The error for ``text`` if it is larger than SQLite stores in one value, else None."""
    size = _utf8_size(text)
    limit = conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH)
    if size <= limit:
        return None
    return StorageError(
        f"{what} is {size:,} bytes, more than SQLite stores in one value ({limit:,} bytes): "
        "keep data that large outside the run (a file, say) and pass its path or id"
    )


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _insert_requests(conn: Conn, rows: list[tuple]) -> None:
    """New requests' rows; one whose data SQLite cannot store is named."""
    try:
        conn.executemany(SQL_INSERT_REQUEST, rows)
    except sqlite3.DataError as exc:
        for row in rows:  # which one (SQLite says only that one was too big)
            refused = _too_big(conn, f"run {row[1]!r}: the data of request {row[0]!r}", row[5])
            if refused is not None:
                raise refused from exc
        raise


def _not_text(exc: UnicodeEncodeError) -> UsageError:
    """An id or a value holding a lone surrogate: nothing stored holds one, nothing can."""
    bad = exc.object[exc.start : exc.end] if isinstance(exc.object, str) else "?"
    return UsageError(
        f"text with a lone surrogate ({bad!r}) is not valid Unicode: no run, request or value "
        "in a store holds one"
    )


def _same_json(stored: str, text: str) -> bool:
    """Whether a stored answer and a new one are the same value (keys in any order, ``10`` and
    ``10.0`` alike: see ``canonical_answer``)."""
    try:
        return canonical_answer(json.loads(stored)) == canonical_answer(json.loads(text))
    except ValueError:  # a damaged stored answer is no duplicate of anything
        return False


def _nothing() -> None:
    return None


def _close_quietly(conn: Conn | None) -> None:
    """Close a connection made for a caller that stopped waiting for it."""
    if conn is not None:
        with contextlib.suppress(sqlite3.Error):
            conn.close()


def _fetch_one(conn: Conn, text: str, params: Sequence[Any]) -> tuple | None:
    return conn.execute(text, params).fetchone()


def _quoted(name: str) -> str:
    """An SQL identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


def _fetch_all(conn: Conn, text: str, params: Sequence[Any]) -> list[tuple]:
    return conn.execute(text, params).fetchall()


def _update_one(conn: Conn, text: str, params: Sequence[Any]) -> bool:
    return conn.execute(text, params).rowcount == 1


def _prune_finished(
    conn: Conn,
    run_ids: Sequence[str],
    finished_before: float,
    now: float,
    fault: Callable[[str], None] | None = None,
) -> int:
    """Delete the runs of ``run_ids`` that are still finished before ``finished_before`` and
    unleased (one resumed since it was found is kept), with their rows. ``fault``: the
    store's fault hook, told ``prune:run`` before each run's checkpoints go."""
    doomed = []
    for run_id in run_ids:
        found = conn.execute(SQL_DOOMED_RUN_NO, (run_id, finished_before, now)).fetchone()
        if found is not None:
            doomed.append((run_id, found[0]))
    deleted = 0
    for _, run_no in doomed:
        if fault is not None:
            fault("prune:run")
        deleted += conn.execute(SQL_DROP_RUN_CHECKPOINTS, (run_no,)).rowcount
    for table in ("requests", "journal", "runs"):
        conn.executemany(SQL_DROP_RUN[table], [(run_id,) for run_id, _ in doomed])
    return deleted
