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

import sqlite3
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from ._records import decode_text, request_id_of, run_id_of, run_record, stored_request
from ._schema import SCHEMA_VERSION, TABLES
from ._sql import (
    REQUEST_COLUMNS,
    RUN_COLUMNS,
    SQL_REQUEST_IDS,
    SQL_RUN,
    SQL_RUN_IDS,
    SQL_SCHEMA_VERSION,
    filtered,
)

if TYPE_CHECKING:
    from workflow_engine._events import WorkflowRunState
    from workflow_engine._store import RequestStatus, RunRecord, StoredRequest

SQL_JOURNALED_AFTER = "SELECT 1 FROM journal WHERE run_id = ? AND superstep > ? LIMIT 1"


def query_only_uri(path: Path) -> str:
    """The URI to open ``path`` by to only read it: ``mode=rw``, so that a file deleted meanwhile
    is not created again, and the caller sets ``PRAGMA query_only``. Not ``mode=ro``: a
    read-only connection cannot remove the WAL and shared-memory files it makes beside a
    database in WAL mode, so each read left two files behind; an ordinary connection that the
    pragma keeps from writing removes them on closing, as every SQLite program does."""
    return f"{path.resolve().as_uri()}?mode=rw"


class SqliteReader:
    """One consistent, read-only snapshot of a SQLite store, as the store's own reads return
    it (a damaged row is the same ``StoreCorruptError``). Use it as a context manager: the
    snapshot is the read transaction it holds until closed."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    @classmethod
    def open(cls, path: str | Path, *, timeout: float = 1.0) -> SqliteReader | None:
        """A reader of the database at ``path``; None when it is not one this engine reads as
        it is (no such file, another schema version, a table missing): ``SqliteStore`` says why.
        ``timeout``: how long to wait for a lock (a database of ours, in WAL mode, is never
        locked for reading). SQLite's own errors (``sqlite3.Error``) are raised."""
        file = Path(path)
        if not file.is_file():
            return None
        uri = query_only_uri(file)
        conn = sqlite3.connect(uri, uri=True, timeout=timeout, isolation_level=None)
        try:
            conn.execute("PRAGMA query_only = ON")  # (before anything is read)
            conn.text_factory = decode_text
            conn.execute("BEGIN")
            tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
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
        self, status: WorkflowRunState | None = None, workflow: str | None = None
    ) -> list[RunRecord]:
        """Runs, oldest first (``RunStore.list_runs``)."""
        text, params = filtered(
            f"SELECT {RUN_COLUMNS} FROM runs",
            (("status", status.value if status is not None else None), ("workflow_name", workflow)),
            "created_at, run_id",
        )
        return [run_record(row) for row in self._conn.execute(text, params)]

    def get_run(self, run_id: str) -> RunRecord | None:
        row = self._conn.execute(SQL_RUN, (run_id,)).fetchone()
        return run_record(row) if row is not None else None

    def run_ids(self) -> list[str]:
        """Every run's id, sorted."""
        return [run_id_of(row) for row in self._conn.execute(SQL_RUN_IDS, (0, ""))]

    def list_requests(
        self, run_id: str | None = None, status: RequestStatus | None = "pending"
    ) -> list[StoredRequest]:
        """Requests in the order their runs asked them (``RunStore.list_requests``)."""
        text, params = filtered(
            f"SELECT {REQUEST_COLUMNS} FROM requests",
            (("run_id", run_id), ("status", status)),
            "created_at, rowid",
        )
        return [stored_request(row) for row in self._conn.execute(text, params)]

    def request_ids(self) -> list[str]:
        """Every request's id, sorted."""
        return [request_id_of(row) for row in self._conn.execute(SQL_REQUEST_IDS, (0, ""))]

    def journaled_after(self, run_id: str, superstep: int) -> bool:
        """Whether the run has journal entries of supersteps after ``superstep``: only such a
        run can have a step in doubt (which takes folding its checkpoints to tell)."""
        return self._conn.execute(SQL_JOURNALED_AFTER, (run_id, superstep)).fetchone() is not None


__all__ = ["SqliteReader"]
