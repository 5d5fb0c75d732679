"""A read-only look at a SQLite store's runs and requests, with ``sqlite3`` alone.

``SqliteStore`` is the store: it opens a database read-write, creates or migrates its tables and
runs its statements through an event loop. A command that only lists what is stored needs none
of that, and a fresh process pays for each of them in start-up time (the loop and the pydantic
models it loads are most of a second of the command line's ``runs list``). ``SqliteReader``
reads the same rows with the same statements and decoders (``_sql``, ``_records``), in one read
transaction, and writes nothing (``PRAGMA query_only``).

It reads only a database at this engine's schema version: any other is for ``SqliteStore`` to
migrate, or to refuse with its reasons (``SqliteReader.open`` returns None).
"""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._records import (
    answered_counts,
    decode_text,
    fetch_rows,
    ids_beside,
    journal_entries,
    listed_runs,
    request_id_of,
    requests_of_run,
    run_id_of,
    run_record,
    stored_request,
)
from ._schema import SCHEMA_VERSION, TABLES
from ._sql import (
    REQUEST_COLUMNS,
    RUN_COLUMNS,
    SQL_COUNT_REQUESTS,
    SQL_HISTORY,
    SQL_JOURNAL_AFTER,
    SQL_JOURNALED_AFTER,
    SQL_REQUEST,
    SQL_REQUEST_IDS,
    SQL_REQUEST_IDS_BESIDE,
    SQL_RUN,
    SQL_RUN_IDS,
    SQL_RUN_IDS_BESIDE,
    SQL_RUNS_JOURNALED_PAST,
    SQL_RUNS_WITH_PENDING,
    SQL_SCHEMA_VERSION,
    SQL_TABLE_NAMES,
    filtered,
    prefix_query,
    runs_by_update,
    started_runs,
)

if TYPE_CHECKING:
    from workflow_engine._checkpoint import Checkpoint
    from workflow_engine._events import WorkflowRunState
    from workflow_engine._store import CheckpointInfo, RequestStatus, RunRecord, StoredRequest


def query_only_uri(path: Path) -> str:
    """The URI to open ``path`` by to only read it: ``mode=rw``, so that a file deleted meanwhile
    is not created again, and the caller sets ``PRAGMA query_only``. Not ``mode=ro``: a
    read-only connection cannot remove the WAL and shared-memory files it makes beside a
    database in WAL mode, so each read left two files behind; an ordinary connection that the
    pragma keeps from writing removes them on closing, as every SQLite program does."""
    return f"{path.resolve().as_uri()}?mode=rw"


_WAL_HEADER = b"\x02\x02"
"""Bytes 18 and 19 of a SQLite file's header, the versions that write and read it: 2 for WAL."""


def directory_refused(path: Path) -> str:
    """What a store says of a database path that names a directory."""
    return f"cannot open the database {path}: it is a directory, not a file"


def damaged(path: Path, said: str) -> str:
    """What a store says of a database SQLite finds damaged (``said``: SQLite's words)."""
    return f"database {path} is damaged: {said}"


_SQLITE_HEADER = b"SQLite format 3\x00"


def not_a_file_refused(path: Path) -> str:
    """What a store says of a database path that names something other than a file or a
    directory (a FIFO, a device)."""
    return f"cannot open the database {path}: it is not a file"


def not_sqlite(real: Path, size: int) -> bool:
    """Whether the file at ``real`` (``size`` bytes) holds something, but not a SQLite
    database's header: SQLite takes a file of a byte or so for a new database and writes its
    own over it (``echo > file`` makes one: outside tester 218)."""
    if size == 0:
        return False
    try:
        with real.open("rb") as f:
            header = f.read(len(_SQLITE_HEADER))
    except OSError:
        return False
    return header != _SQLITE_HEADER


def refused_before_reading(path: Path) -> str | None:
    """What ``SqliteStore`` says of ``path`` before it reads a row, where that is sure without
    opening it as the store does: a directory, or a file SQLite refuses as not a database
    (asked of SQLite itself, read-only and leaving nothing beside the file), where the store
    would open it -- in a writable directory, itself writable. None for any other, whatever
    the store makes of it. A command that only reads says these in a fraction of the time the
    store takes to load (outside testers 214, 217)."""
    try:
        info = path.stat()
    except (OSError, ValueError):
        return None
    if stat.S_ISDIR(info.st_mode):
        return directory_refused(path)
    if not stat.S_ISREG(info.st_mode):
        return not_a_file_refused(path)
    real = Path(os.path.realpath(path))
    if info.st_size == 0:
        return None
    if not (os.access(real.parent, os.W_OK) and os.access(real, os.R_OK | os.W_OK)):
        return None
    if not_sqlite(real, info.st_size):
        return damaged(path, "file is not a database")
    try:
        conn = sqlite3.connect(f"{real.as_uri()}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error:
        return None
    try:
        conn.execute("PRAGMA schema_version").fetchone()
    except sqlite3.DatabaseError as exc:
        if str(exc) == "file is not a database":
            return damaged(path, str(exc))
    finally:
        conn.close()
    return None


def reading_uri(file: Path) -> str | None:
    """How to open ``file`` so as to read it and leave it, and the files beside it, as they
    were; None for one the store would not just read (so it says or does what it does then):
    not a SQLite database in WAL mode (the store switches one to it), in a directory this
    process cannot write (the store refuses: SQLite keeps its -wal and -shm files there), or
    not writable by this process while others may write it.

    - With a ``-wal`` and a ``-shm`` file beside it (a worker has it open, or one crashed):
      read-only, leaving those files as they are -- a crashed writer's WAL too, which an
      ordinary connection would fold into the file on closing. (A writer that opens the file
      after this look and is killed while the snapshot is read leaves its WAL to the
      snapshot's ordinary connection, which folds it in on closing: SQLite's own recovery.)
    - Writable by no one (``chmod a-w``): immutable, which takes no lock and makes no file
      beside it. A read-only connection would leave -shm and -wal files that no one can write
      either, and its owner's next write, once it is writable again, would fail on them.
    - Otherwise ``query_only_uri``: an ordinary connection that removes the files it made.
    """
    try:
        # (the files beside the one SQLite opens, and its folder: a symlink's target's, not the
        # link's -- looked for beside the link, a killed writer's WAL was missed, tester 94)
        file = file.resolve()
        info = file.stat()
        if not stat.S_ISREG(info.st_mode):  # (a FIFO's open would wait for a writer)
            return None
        with file.open("rb") as f:
            header = f.read(100)
    except OSError:
        return None
    if not header.startswith(b"SQLite format 3\x00") or header[18:20] != _WAL_HEADER:
        return None
    if not os.access(file.parent, os.W_OK):
        return None
    base = file.as_uri()
    if os.path.lexists(f"{file}-wal"):
        # (without its -shm, which reading would make and leave: a killed writer's, the -shm
        # removed by hand; the store recovers that)
        return f"{base}?mode=ro" if os.path.lexists(f"{file}-shm") else None
    if info.st_mode & 0o222 == 0:
        return f"{base}?mode=ro&immutable=1"
    if not os.access(file, os.W_OK):
        return None
    return query_only_uri(file)


def read_only_uri(file: Path) -> str:
    """How to open ``file`` only to read it, for a caller that reads it whatever it is (a
    read-only store, once its checks let it through): ``reading_uri``'s; a WAL without its
    -shm (a killed writer's, the -shm removed by hand) read-only, the WAL left where it is --
    SQLite makes the -shm index it needs, and leaves it (an ordinary connection would fold the
    WAL into the file: outside tester 133); anything else (out of WAL mode) as an ordinary
    connection kept from writing (``query_only_uri``)."""
    uri = reading_uri(file)
    if uri is not None:
        return uri
    real = file.resolve()
    if os.path.lexists(f"{real}-wal"):
        return f"{real.as_uri()}?mode=ro"
    return query_only_uri(real)


class SqliteReader:
    """One consistent, read-only snapshot of a SQLite store, as the store's own reads return
    it (a damaged row is the same ``StoreCorruptError``). Use it as a context manager: the
    snapshot is the read transaction it holds until closed."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    @classmethod
    def open(cls, path: str | Path, *, timeout: float = 1.0) -> SqliteReader | None:
        """A reader of the database at ``path``; None when it is not one this engine reads as
        it is (see ``reading_uri``; another schema version, a table missing): ``SqliteStore``
        says why, or makes it one. ``timeout``: how long to wait for a lock (a database of ours,
        in WAL mode, is never locked for reading). SQLite's own errors (``sqlite3.Error``) are
        raised."""
        file = Path(path)
        uri = reading_uri(file)
        if uri is None:
            return None
        conn = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
        try:
            conn.execute("PRAGMA query_only = ON")  # (before anything is read)
            conn.text_factory = decode_text
            conn.execute("BEGIN")
            tables = {row[0] for row in conn.execute(SQL_TABLE_NAMES)}  # (tables: not views)
            if not tables.issuperset(TABLES):
                conn.close()
                return None
            row = conn.execute(SQL_SCHEMA_VERSION).fetchone()
            if row is None or row[0] != SCHEMA_VERSION:
                conn.close()
                return None
        except BaseException:
            conn.close()
            raise
        return cls(conn)

    def close(self) -> None:
        self._conn.close()  # (ends the read transaction: nothing was written)

    def __enter__(self) -> SqliteReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def list_runs(
        self,
        status: WorkflowRunState | None = None,
        workflow: str | None = None,
        *,
        started: bool | None = None,
    ) -> list[RunRecord]:
        """Runs, oldest first (``RunStore.list_runs``). ``started``: only runs some worker has
        taken (True), or only runs none ever took (False: their lease version is still the
        admission's), told apart here rather than by reading every run."""
        text, params = filtered(
            f"SELECT {RUN_COLUMNS} FROM runs",
            (("status", status.value if status is not None else None), ("workflow_name", workflow)),
            "created_at, run_id",
            *started_runs(started),
        )
        return listed_runs(self._conn, text, params, status is not None)

    def runs_by_update(
        self,
        status: WorkflowRunState | None = None,
        workflow: str | None = None,
        *,
        started: bool | None = None,
        last: int | None = None,
    ) -> tuple[list[RunRecord], int]:
        """What ``runs list`` shows: runs least recently updated first (``last``: only the
        ``last`` updated most recently), and how many runs the filters match in all."""
        value = status.value if status is not None else None
        text, count, params = runs_by_update(value, workflow, started, last)
        records = listed_runs(self._conn, text, params, status is not None)
        return records, self._conn.execute(count, params).fetchone()[0]

    def runs_with_pending(self) -> list[RunRecord]:
        """The runs that have pending requests (in no particular order)."""
        return [run_record(row) for row in fetch_rows(self._conn, SQL_RUNS_WITH_PENDING, ())]

    def runs_journaled_past(self) -> list[RunRecord]:
        """The runs in progress with journal entries of supersteps after their latest
        checkpoint's: only such a run can have a step in doubt (see ``journaled_after``)."""
        return [run_record(row) for row in fetch_rows(self._conn, SQL_RUNS_JOURNALED_PAST, ())]

    def answered_counts(self, run_ids: Iterable[str] | None = None) -> dict[str, int]:
        """How many answers each run has waiting (``_records.answered_counts``)."""
        return answered_counts(self._conn, run_ids)

    def get_run(self, run_id: str) -> RunRecord | None:
        row = self._conn.execute(SQL_RUN, (run_id,)).fetchone()
        return run_record(row) if row is not None else None

    def run_ids(self, prefix: str = "") -> list[str]:
        """The ids of the runs whose id starts with ``prefix`` (all: ""), sorted."""
        text, params = prefix_query(SQL_RUN_IDS, prefix)
        return [run_id_of(row) for row in fetch_rows(self._conn, text, params)]

    def request_ids(self, prefix: str = "") -> list[str]:
        """The ids of the requests whose id starts with ``prefix`` (all: ""), sorted."""
        text, params = prefix_query(SQL_REQUEST_IDS, prefix)
        return [request_id_of(row) for row in fetch_rows(self._conn, text, params)]

    def get_request(self, request_id: str) -> StoredRequest | None:
        """The request (``RunStore.get_request``); None for no such request."""
        rows = fetch_rows(self._conn, SQL_REQUEST, (request_id,))
        return stored_request(rows[0]) if rows else None

    def run_ids_beside(self, run_ids: Iterable[str]) -> list[str]:
        """``run_ids`` with the stored run ids next to each (``_records.ids_beside``)."""
        return ids_beside(self._conn, SQL_RUN_IDS_BESIDE, run_ids)

    def request_ids_beside(self, request_ids: Iterable[str]) -> list[str]:
        """``request_ids`` with the stored request ids next to each (``ids_beside``)."""
        return ids_beside(self._conn, SQL_REQUEST_IDS_BESIDE, request_ids)

    def run_and_latest(self, run_id: str) -> tuple[RunRecord, Checkpoint | None] | None:
        """The run and its latest checkpoint, folded from its rows as the store folds them
        (``SqliteStore.get_run_and_latest``); None for no such run. Loads the checkpoint
        models (pydantic), which the listings never need."""
        from ._chain import check_chain, fold_chain, latest_chain

        row = self._conn.execute(SQL_RUN, (run_id,)).fetchone()
        if row is None:
            return None
        chain = latest_chain(self._conn, run_id)
        check_chain(self._conn, run_id, row[10], chain)
        return run_record(row), fold_chain(run_id, chain)[0] if chain is not None else None

    def history(self, run_id: str) -> list[CheckpointInfo]:
        """The run's checkpoints, oldest first (``SqliteStore.history``)."""
        from ._rows import checkpoint_info

        rows = fetch_rows(self._conn, SQL_HISTORY, (run_id,))
        return [checkpoint_info(run_id, row) for row in rows]

    def list_requests(
        self,
        run_id: str | None = None,
        status: RequestStatus | None = "pending",
        *,
        limit: int | None = None,
    ) -> list[StoredRequest]:
        """Requests in the order their runs asked them (``RunStore.list_requests``); with
        ``limit``, the first ``limit`` of them (``count_requests`` says how many there are)."""
        text, params = filtered(
            f"SELECT {REQUEST_COLUMNS} FROM requests",
            (("run_id", run_id), ("status", status)),
            "created_at, rowid",
        )
        if limit is not None:
            text += f" LIMIT {int(limit)}"
        if status == "pending" or (status is not None and run_id is not None):
            return requests_of_run(self._conn, text, params, run_id)
        return [stored_request(row) for row in fetch_rows(self._conn, text, params)]

    def count_requests(self, status: RequestStatus) -> int:
        """How many requests of ``status`` there are (of every run)."""
        return self._conn.execute(SQL_COUNT_REQUESTS, (status,)).fetchone()[0]

    def journal_after(self, run_id: str, superstep: int) -> list[tuple[str, Any]]:
        """The entries ``(key, entry)`` of supersteps after ``superstep``, oldest first
        (``SqliteStore.journal_after``)."""
        rows = fetch_rows(self._conn, SQL_JOURNAL_AFTER, (run_id, superstep))
        return journal_entries(run_id, rows)

    def journaled_after(self, run_id: str, superstep: int) -> bool:
        """Whether the run has journal entries of supersteps after ``superstep``: only such a
        run can have a step in doubt (which takes folding its checkpoints to tell)."""
        return self._conn.execute(SQL_JOURNALED_AFTER, (run_id, superstep)).fetchone() is not None


__all__ = ["SqliteReader"]
