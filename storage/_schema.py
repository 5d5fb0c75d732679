"""The database schema, declared once as SQLAlchemy Core tables, and its forward-only migrations.

Portable SQL only (the same tables will serve PostgreSQL): text JSON bodies, no SQLite-only types.
Every row that holds encoded data records the codec and schema version that wrote it.

    we_schema     one row: the schema version of this database
    runs          one row per run; owner/lease_expires_at/version are the lease and fencing token
    checkpoints   per run, seq 0..n; kind "snapshot" (full JSON) or "delta" (changes vs. parent)
    requests      the inbox: pending → answered (by respond) → applied (by a commit) | cancelled
    journal       (v2) results of side effects, per run and step key: never recomputed once
                  stored; (v3) the superstep each entry belongs to (compacted at its commit),
                  intents of steps that started
    runs.cancel_requested (v3) a durable request to cancel the run at its next boundary
    runs.run_no   (v5) a number per run; checkpoint rows are keyed ``pos = run_no * 2**32 + seq``
                  (the table's own key orders a run's rows: no ``(run_id, seq)`` index to write)
    checkpoints.lists, list_items (v6) a snapshot's long lists apart from its body, read only
                  when needed
    list_chunks   (v7) the long arrays of large rows, in chunks kept once by digest and shared
                  by every row that holds them (``checkpoints.chunks`` says where: see
                  ``_chunks``)

The tables (and ``MIGRATIONS``) are built on first access: SQLAlchemy is needed only to create
and migrate a database, not to import ``storage`` or to open a database that is up to date.
The store's hot paths run constant SQL text that names exactly these tables and columns.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import TYPE_CHECKING, Any

from ._sql import SEQ_SPAN

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from sqlalchemy import Connection, MetaData, Table

    metadata: MetaData
    schema_info: Table
    runs: Table
    checkpoints: Table
    requests: Table
    journal: Table
    list_chunks: Table
    MIGRATIONS: dict[int, Callable[[Connection], None]]

SCHEMA_VERSION = 7
TABLES = frozenset({"we_schema", "runs", "checkpoints", "requests", "journal", "list_chunks"})
"""The tables of the current schema."""

_DECLARED = (
    "metadata",
    "schema_info",
    "runs",
    "checkpoints",
    "requests",
    "journal",
    "list_chunks",
    "MIGRATIONS",
)
_LOCK = threading.Lock()  # stores migrate from their own threads: declare the tables once


def __getattr__(name: str) -> Any:
    if name in _DECLARED:
        with _LOCK:
            if "metadata" not in globals():
                globals().update(_declare())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _declare() -> dict[str, Any]:
    from sqlalchemy import (
        DDL,
        BigInteger,
        Column,
        Float,
        ForeignKey,
        Index,
        Integer,
        MetaData,
        String,
        Table,
        Text,
        event,
    )

    metadata = MetaData()

    schema_info = Table(
        "we_schema",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("version", Integer, nullable=False),
        Column("written_by", String(64), nullable=False),
    )

    runs = Table(
        "runs",
        metadata,
        Column("run_id", String(64), primary_key=True),
        Column("workflow_name", String(200), nullable=False),
        Column("workflow_signature", String(64), nullable=False),
        Column("status", String(40), nullable=False),
        Column("superstep", Integer, nullable=False),
        Column("created_at", Float, nullable=False),
        Column("updated_at", Float, nullable=False),
        Column("owner", String(200)),
        Column("lease_expires_at", Float),
        Column("version", Integer, nullable=False),
        Column("latest_checkpoint_id", String(64)),
        Column("checkpoint_seq", Integer, nullable=False),
        Column("since_snapshot", Integer, nullable=False),
        Column("error", Text),
        Column("parent_run_id", String(64)),
        Column("cancel_requested", Integer, nullable=False, server_default="0"),
        Column("run_no", BigInteger().with_variant(Integer, "sqlite")),
        Index("ix_runs_status", "status"),
        Index("ix_runs_workflow", "workflow_name"),
        Index("ix_runs_run_no", "run_no", unique=True),
    )

    checkpoints = Table(
        "checkpoints",
        metadata,
        # exactly INTEGER on SQLite, so that it is the rowid: the row is stored under it
        Column("pos", BigInteger().with_variant(Integer, "sqlite"), primary_key=True),
        Column("checkpoint_id", String(64), nullable=False, unique=True),
        # no foreign key: with no index on run_id, deleting a run would scan every checkpoint
        # row for its children (pruning 300 of 600 runs took 2.9 s, not 35 ms). The trigger
        # below refuses a row whose run does not exist, and a run's rows go with it by range.
        Column("run_id", String(64), nullable=False),
        Column("seq", Integer, nullable=False),
        Column("superstep", Integer, nullable=False),
        Column("kind", String(16), nullable=False),
        Column("status", String(40), nullable=False),
        Column("codec", String(64), nullable=False),
        Column("schema_version", Integer, nullable=False),
        Column("body", Text, nullable=False),
        Column("created_at", Float, nullable=False),
        # (v7) where the row's long arrays are, and the chunks that fill them (``_chunks``):
        # before the lists (a database upgraded to v7 has it last)
        Column("chunks", Text),
        # (v6) a snapshot's long lists, kept out of its body (the body holds them empty):
        # ``lists`` counts them, ``list_items`` holds them -- last, so that reading the row's
        # other columns never reads these pages (a resume reads them only when it needs them)
        Column("lists", Text),
        Column("list_items", Text),
    )
    # A row is only ever written at its place, under an existing run. An engine before schema 5
    # that had the database open when it was upgraded leaves ``pos`` out of its INSERT, and
    # SQLite would put the row after the newest run's rows -- into another run. It is refused by
    # name instead.
    event.listen(
        checkpoints,
        "after_create",
        DDL(
            "CREATE TRIGGER checkpoints_in_place BEFORE INSERT ON checkpoints "
            "WHEN NEW.pos IS NOT (SELECT run_no FROM runs WHERE run_id = NEW.run_id) * "
            f"{SEQ_SPAN} + NEW.seq BEGIN SELECT RAISE(ABORT, 'checkpoint row out of place: "
            "its run does not exist, or a process of an older version writes to this "
            "database, which a newer workflow-engine upgraded to schema 5; restart that "
            "process with the newer version'); END"
        ).execute_if(dialect="sqlite"),
    )

    requests = Table(
        "requests",
        metadata,
        Column("request_id", String(64), primary_key=True),
        Column("run_id", String(64), ForeignKey("runs.run_id", ondelete="CASCADE"), nullable=False),
        Column("port_id", String(200), nullable=False),
        Column("source_executor_id", String(200), nullable=False),
        Column("kind", String(16), nullable=False),
        Column("data", Text, nullable=False),
        Column("response_type", String(400), nullable=False),
        Column("superstep", Integer, nullable=False),
        Column("status", String(16), nullable=False),
        Column("answer", Text),
        Column("codec", String(64), nullable=False),
        Column("created_at", Float, nullable=False),
        Column("answered_at", Float),
        Index("ix_requests_run_status", "run_id", "status"),
        Index("ix_requests_status", "status"),
    )

    journal = Table(
        "journal",
        metadata,
        Column(
            "run_id", String(64), ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True
        ),
        Column("key", String(400), primary_key=True),
        Column("value", Text, nullable=False),
        Column("created_at", Float, nullable=False),
        Column("superstep", Integer, nullable=False, server_default="0"),
    )

    list_chunks = Table(
        "list_chunks",
        metadata,
        Column("digest", String(40), primary_key=True),  # (an index chunk's: "i" + 32)
        Column("items", Text, nullable=False),
        Column("refs", Integer, nullable=False),
        # (a rowid table: a chunk is kilobytes, too big for the pages of a WITHOUT ROWID
        # table's b-tree, which stored 4,000 of them 3x slower)
    )

    def _create_v1(conn: Connection) -> None:
        for table in (runs, checkpoints, requests):
            table.create(conn, checkfirst=True)

    def _add_journal_v2(conn: Connection) -> None:
        journal.create(conn, checkfirst=True)

    def _step_identity_v3(conn: Connection) -> None:
        # the tables are declared as of the newest version, so a database created by this code
        # already has these columns: add each only where it is missing
        from sqlalchemy import text

        for table, column in (("runs", "cancel_requested"), ("journal", "superstep")):
            present = {row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({table})")}
            if column not in present:
                conn.execute(
                    text(f"ALTER TABLE {table} ADD COLUMN {column} INTEGER NOT NULL DEFAULT 0")
                )

    def _spans_v4(conn: Connection) -> None:
        """No new column: checkpoint rows of kind 'span' may follow from now on. The version
        itself is the change -- an older engine, which could not fold a span, refuses the
        database by name instead of misreading it."""

    def _checkpoints_by_position_v5(conn: Connection) -> None:
        """Number the runs, and rebuild the checkpoints table keyed by (run number, seq). A
        database created by this code already has both: each step runs only where missing."""
        present = {row[1] for row in conn.exec_driver_sql("PRAGMA table_info(runs)")}
        if "run_no" not in present:
            conn.exec_driver_sql("ALTER TABLE runs ADD COLUMN run_no INTEGER")
            conn.exec_driver_sql("UPDATE runs SET run_no = rowid")  # unique; fixed from now on
            next(i for i in runs.indexes if i.name == "ix_runs_run_no").create(conn)
        present = {row[1] for row in conn.exec_driver_sql("PRAGMA table_info(checkpoints)")}
        if "pos" not in present:
            conn.exec_driver_sql("ALTER TABLE checkpoints RENAME TO checkpoints_v4")
            checkpoints.create(conn)
            # (the columns a version-4 table has: the table is declared as of the newest)
            copied = [c.name for c in checkpoints.columns if c.name not in _NOT_IN_V4]
            columns = ", ".join(copied)
            prefixed = ", ".join(f"c.{name}" for name in copied)
            conn.exec_driver_sql(
                f"INSERT INTO checkpoints (pos, {columns}) "
                f"SELECT r.run_no * {SEQ_SPAN} + c.seq, {prefixed} "
                "FROM checkpoints_v4 c JOIN runs r ON r.run_id = c.run_id"
            )
            conn.exec_driver_sql("DROP TABLE checkpoints_v4")

    def _lists_apart_v6(conn: Connection) -> None:
        """A snapshot row may keep its long lists apart from its body. A database created by
        this code already has the columns; older rows leave them empty (NULL)."""
        present = {row[1] for row in conn.exec_driver_sql("PRAGMA table_info(checkpoints)")}
        for column in ("lists", "list_items"):
            if column not in present:
                conn.exec_driver_sql(f"ALTER TABLE checkpoints ADD COLUMN {column} TEXT")

    def _chunks_v7(conn: Connection) -> None:
        """Large rows may store their long arrays as shared chunks. A database created by this
        code already has both; older rows leave ``chunks`` empty (NULL): stored whole."""
        present = {row[1] for row in conn.exec_driver_sql("PRAGMA table_info(checkpoints)")}
        if "chunks" not in present:
            conn.exec_driver_sql("ALTER TABLE checkpoints ADD COLUMN chunks TEXT")
        list_chunks.create(conn, checkfirst=True)
        if conn.dialect.name == "sqlite":  # (PostgreSQL will need its own triggers)
            from ._chunks import RELEASE_TRIGGERS

            for trigger in RELEASE_TRIGGERS:
                conn.exec_driver_sql(trigger)

    migrations: dict[int, Callable[[Connection], None]] = {
        1: _create_v1,
        2: _add_journal_v2,
        3: _step_identity_v3,
        4: _spans_v4,
        5: _checkpoints_by_position_v5,
        6: _lists_apart_v6,
        7: _chunks_v7,
    }
    """Version N's migration upgrades a database at version N-1. Never edit one that shipped."""

    return {
        "metadata": metadata,
        "schema_info": schema_info,
        "runs": runs,
        "checkpoints": checkpoints,
        "requests": requests,
        "journal": journal,
        "list_chunks": list_chunks,
        "MIGRATIONS": migrations,
    }


def migrate(
    path: Path, busy_timeout: float, check_version: Callable[[int], None], written_by: str
) -> None:
    """Create or upgrade the schema through SQLAlchemy, on a connection of its own, in one
    ``BEGIN IMMEDIATE`` transaction (a concurrent opener waits, then finds it done).

    ``check_version`` refuses a database newer than this code. SQLite errors surface as
    ``sqlite3.Error`` for the store to translate.
    """
    from sqlalchemy import create_engine, event, insert, select, update
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.pool import NullPool

    info = __getattr__("schema_info")
    migrations = __getattr__("MIGRATIONS")

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    engine = create_engine("sqlite://", creator=connect, poolclass=NullPool)
    event.listen(engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN IMMEDIATE"), named=False)
    try:
        with engine.begin() as conn:
            listed = conn.exec_driver_sql("SELECT name FROM sqlite_master")
            refused = foreign_tables_refused({row[0] for row in listed}, path)
            if refused is not None:  # (checked again: another program may have made them)
                raise refused
            info.create(conn, checkfirst=True)
            row = conn.execute(select(info.c.version)).first()
            current = row[0] if row else 0
            check_version(current)
            for version in range(current + 1, SCHEMA_VERSION + 1):
                migrations[version](conn)
            if current == 0:
                conn.execute(
                    insert(info).values(id=1, version=SCHEMA_VERSION, written_by=written_by)
                )
            elif current < SCHEMA_VERSION:
                conn.execute(update(info).values(version=SCHEMA_VERSION, written_by=written_by))
    except DBAPIError as exc:
        if isinstance(exc.orig, sqlite3.Error):
            raise exc.orig from exc
        raise
    finally:
        engine.dispose()


_NOT_IN_V4 = frozenset({"pos", "lists", "list_items", "chunks"})
"""Columns of ``checkpoints`` a version-4 table lacks."""

_OUR_TABLES = ("runs", "checkpoints", "requests", "journal")


def foreign_tables_refused(tables: set[str], path: Path) -> Exception | None:
    """The error for a database whose tables (``tables``: the names of its tables, views,
    indexes and triggers) are another program's: no version table of ours, yet something by
    one of our names. Creating our tables would skip that one, and migrating would alter it
    (outside tester 86: another program's ``runs`` table got our columns, the file was
    stamped as ours, and every write then failed). Checked before anything is written, WAL
    mode included."""
    named = {name.lower() for name in tables}  # (SQLite's names ignore case: RUNS is runs)
    taken = [name for name in _OUR_TABLES if name in named]
    if "we_schema" in named or not taken:
        return None
    from workflow_engine import StoreUnavailableError

    return StoreUnavailableError(
        f"cannot use {path} as a workflow-engine database: it holds another program's tables "
        f"(or views, indexes) named {', '.join(taken)} and no workflow-engine schema; nothing "
        "was written to it -- use another file"
    )
