"""The SQL text the SQLite store runs: constant strings, so ``sqlite3`` caches each prepared
statement. Plain standard SQL over the tables declared in ``_schema.py``."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

RUN_COLUMNS = (
    "run_id, workflow_name, workflow_signature, status, superstep, created_at, updated_at, "
    "version, owner, lease_expires_at, latest_checkpoint_id, error, parent_run_id, cancel_requested"
)  # RunRecord's field order
REQUEST_COLUMNS = (
    "request_id, run_id, port_id, source_executor_id, kind, data, response_type, superstep, "
    "status, answer, created_at, answered_at"
)  # StoredRequest's field order
TERMINAL_SQL = "('idle', 'cancelled', 'failed')"

SQL_SCHEMA_VERSION = "SELECT version FROM we_schema WHERE id = 1"
SQL_TABLE_NAMES = "SELECT name FROM sqlite_master WHERE type = 'table'"

# Checkpoint rows are keyed by ``pos = run_no * 2**32 + seq`` (``runs.run_no``: a number per run,
# given at admission): the table's own b-tree orders a run's rows, so a commit inserts into two
# b-trees (the table and the ``checkpoint_id`` index) instead of three. Every query of a run's
# rows is a range of ``pos``; ``_BASE`` is that run's first position (run id as ``?1``).
SEQ_SPAN = 2**32


def _rows_of(run_no: str) -> str:
    """The condition on ``pos`` that selects every checkpoint row of run number ``run_no``."""
    return f"pos BETWEEN {run_no} * {SEQ_SPAN} AND {run_no} * {SEQ_SPAN} + {SEQ_SPAN - 1}"


_RUN_NO = "(SELECT run_no FROM runs WHERE run_id = ?1)"
_BASE = f"{_RUN_NO} * {SEQ_SPAN}"
_IN_RUN = _rows_of(_RUN_NO)
SQL_INSERT_RUN = (
    "INSERT INTO runs (run_id, workflow_name, workflow_signature, status, superstep, created_at, "
    "updated_at, owner, lease_expires_at, version, latest_checkpoint_id, checkpoint_seq, "
    "since_snapshot, error, parent_run_id, run_no) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, 0, NULL, ?, "
    "(SELECT coalesce(max(run_no), 0) + 1 FROM runs))"
)
SQL_INSERT_CHECKPOINT = (  # the run's row exists (admitted in the same transaction, or leased)
    "INSERT INTO checkpoints (pos, checkpoint_id, run_id, seq, superstep, kind, status, codec, "
    f"schema_version, body, created_at, lists, list_items, chunks) VALUES "
    f"({_BASE.replace('?1', '?2')} + ?3, ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
)
SQL_INSERT_REQUEST = (
    "INSERT INTO requests (request_id, run_id, port_id, source_executor_id, kind, data, "
    "response_type, superstep, status, answer, codec, created_at, answered_at) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'pending', NULL, ?, ?, NULL)"
)
SQL_RUN = f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?"
SQL_RUN_FOR_LEASE = (
    f"SELECT {RUN_COLUMNS}, checkpoint_seq, since_snapshot, run_no * {SEQ_SPAN} FROM runs "
    "WHERE run_id = ?"
)
SQL_LEASE_STATE = (
    "SELECT owner, lease_expires_at, version, checkpoint_seq, since_snapshot, cancel_requested "
    "FROM runs WHERE run_id = ?"
)
SQL_TAKE_LEASE = (
    "UPDATE runs SET owner = ?, lease_expires_at = ?, version = ? WHERE run_id = ? AND version = ?"
)
SQL_TAKE_LEASE_TO_APPLY = (  # the same, for a run resting with answers to apply: it runs now
    "UPDATE runs SET owner = ?, lease_expires_at = ?, version = ?, status = 'in_progress' "
    "WHERE run_id = ? AND version = ?"
)
SQL_RELEASE = (  # owner tokens are unique per execution, so the owner alone fences a release
    "UPDATE runs SET owner = NULL, lease_expires_at = NULL WHERE run_id = ? AND owner = ?"
)
SQL_RELEASED_STATE = (  # what a release found: status, a cancel, answers waiting
    "SELECT status, cancel_requested, EXISTS (SELECT 1 FROM requests WHERE run_id = ? AND "
    "status = 'answered') FROM runs WHERE run_id = ?"
)
SQL_RELEASE_UNUSED = (  # a lease given back before anything ran: the status it found again
    "UPDATE runs SET owner = NULL, lease_expires_at = NULL, status = ? "
    "WHERE run_id = ? AND owner = ?"
)
SQL_COMMIT_RUN = (
    "UPDATE runs SET version = ?, status = ?, superstep = ?, updated_at = ?, "
    "latest_checkpoint_id = ?, checkpoint_seq = ?, since_snapshot = ?, lease_expires_at = ?, "
    "error = NULL WHERE run_id = ? AND version = ? AND owner = ? "
    "AND (? IS NULL OR latest_checkpoint_id = ?)"
)  # fenced by the lease, and by the parent being the latest (history never forks)
SQL_COMMIT_RUN_RELEASE = (  # the same, and the lease ends (lease_expires_at is given as NULL)
    "UPDATE runs SET version = ?, status = ?, superstep = ?, updated_at = ?, "
    "latest_checkpoint_id = ?, checkpoint_seq = ?, since_snapshot = ?, lease_expires_at = ?, "
    "error = NULL, owner = NULL WHERE run_id = ? AND version = ? AND owner = ? "
    "AND (? IS NULL OR latest_checkpoint_id = ?)"
)
# The same for a run that ends cancelled: a cancel requested meanwhile is done with.
SQL_COMMIT_RUN_RELEASE_CANCEL_DONE = SQL_COMMIT_RUN_RELEASE.replace(
    "owner = NULL", "owner = NULL, cancel_requested = 0", 1
)
# SQL_COMMIT_RUN_RELEASE, but for a cancel requested while the superstep ran: then the lease is
# kept (``lease_expires_at`` is given, as SQL_COMMIT_RUN renews it), so that its holder honours
# the cancel at this boundary -- saying whether it was, with no statement of its own to read it.
# (SET reads the row as it was; RETURNING, as it is: the flag is not changed here.)
SQL_COMMIT_RUN_RELEASE_UNLESS_CANCEL = (
    "UPDATE runs SET version = ?, status = ?, superstep = ?, updated_at = ?, "
    "latest_checkpoint_id = ?, checkpoint_seq = ?, since_snapshot = ?, "
    "lease_expires_at = CASE WHEN cancel_requested THEN ? END, error = NULL, "
    "owner = CASE WHEN cancel_requested THEN owner END WHERE run_id = ? AND version = ? "
    "AND owner = ? AND (? IS NULL OR latest_checkpoint_id = ?) RETURNING cancel_requested"
)
# SQL_COMMIT_RUN for a run whose status did not change since its last commit (most supersteps):
# leaving it out of SET, the ``status`` index is not rewritten -- one page fewer per commit.
# ``status = ?`` (the last parameter) checks that it did not change. A commit that ends the lease
# writes the status in full: it rests the run, which its last commit under the lease did not.
SQL_COMMIT_RUN_KEEP_STATUS = SQL_COMMIT_RUN.replace("status = ?, ", "", 1) + " AND status = ?"
# The usual commit: these, only while no cancel was requested -- one updated row says both that
# the lease and history held and that no cancel waits, with no statement of its own to read the
# flag (measured: 13.8 µs for the three statements of a transaction, against 15.5 with a SELECT
# of the flag and 16.5 with RETURNING). No row: the statement saying the flag tells which it was.
_NO_CANCEL = " AND cancel_requested = 0"
SQL_COMMIT_RUN_NO_CANCEL = SQL_COMMIT_RUN + _NO_CANCEL
SQL_COMMIT_RUN_KEEP_STATUS_NO_CANCEL = SQL_COMMIT_RUN_KEEP_STATUS + _NO_CANCEL
SQL_COMMIT_RUN_RELEASE_NO_CANCEL = SQL_COMMIT_RUN_RELEASE + _NO_CANCEL
# SQL_COMMIT_RUN, saying whether a cancel was requested meanwhile
SQL_COMMIT_RUN_SAYING_CANCEL = SQL_COMMIT_RUN + " RETURNING cancel_requested"
SQL_SET_STATUS = (  # a run that ends failed is done with a cancel requested meanwhile
    "UPDATE runs SET version = ?, status = ?, updated_at = ?, error = ?, "
    "cancel_requested = CASE WHEN ? THEN 0 ELSE cancel_requested END "
    "WHERE run_id = ? AND version = ? AND owner = ?"
)
SQL_REQUEST_STATUS = "UPDATE requests SET status = ? WHERE request_id = ?"
SQL_LATEST_SEQ = (  # one row always: NULL when the run has no checkpoint rows
    f"SELECT (SELECT seq FROM checkpoints WHERE {_IN_RUN} ORDER BY pos DESC LIMIT 1)"
)
# The rows a restore folds for checkpoint ?2 of the run whose first position is ?1 (``run_no *
# SEQ_SPAN``, read with the run's row): the latest snapshot at or before it, the spans after that
# snapshot (each holds everything up to it), and the deltas after the last span. Scalar
# subqueries, each run once: ranges of ``pos`` read backwards, not a join per row.
_SNAPSHOT_SEQ = (
    "(SELECT seq FROM checkpoints WHERE pos BETWEEN ?1 AND ?1 + ?2 AND kind = 'snapshot' "
    "ORDER BY pos DESC LIMIT 1)"
)
SQL_CHAIN = (
    "SELECT checkpoint_id, seq, kind, body, schema_version, lists, list_items, chunks "
    "FROM checkpoints "
    f"WHERE pos BETWEEN ?1 + {_SNAPSHOT_SEQ} AND ?1 + ?2 "
    "AND (kind != 'delta' OR seq > coalesce((SELECT seq FROM checkpoints "
    f"WHERE pos > ?1 + {_SNAPSHOT_SEQ} AND pos <= ?1 + ?2 AND kind = 'span' "
    "ORDER BY pos DESC LIMIT 1), -1)) ORDER BY pos"
)
SQL_LATEST_CHAIN = SQL_CHAIN.replace("?2", str(SEQ_SPAN - 1))  # the same, up to the newest
SQL_LATEST_CHAIN_LEAN = SQL_LATEST_CHAIN.replace("list_items, chunks", "NULL, chunks")
"""The same rows without the snapshot's long lists: a resume reads them when it needs them."""
SQL_STORED_LISTS = (  # run ?1's first snapshot at or after seq ?2 (see ``_stored_lists``)
    "SELECT checkpoint_id, seq, body, lists, list_items, chunks FROM checkpoints WHERE pos BETWEEN "
    f"{_BASE} + ?2 AND {_BASE} + {SEQ_SPAN - 1} AND kind = 'snapshot' ORDER BY pos LIMIT 1"
)
SQL_RUN_BASE = f"SELECT run_no * {SEQ_SPAN} FROM runs WHERE run_id = ?"
SQL_RUN_NUMBER = "SELECT typeof(run_no), run_no FROM runs WHERE run_id = ?"
SQL_CHECKPOINT_PLACE = "SELECT run_id, seq, pos - seq FROM checkpoints WHERE checkpoint_id = ?"
SQL_SPAN_BASE = (  # what a new span of run ?1 must be relative to: its newest snapshot or span
    f"SELECT checkpoint_id FROM checkpoints WHERE {_IN_RUN} AND kind != 'delta' "
    "ORDER BY pos DESC LIMIT 1"
)
SQL_HISTORY = (
    "SELECT checkpoint_id, seq, superstep, status, created_at, kind, schema_version "
    f"FROM checkpoints WHERE {_IN_RUN} ORDER BY pos"
)
SQL_REQUEST = f"SELECT {REQUEST_COLUMNS} FROM requests WHERE request_id = ?"
SQL_REQUEST_AND_RUN = (
    "SELECT "
    + ", ".join(f"q.{c.strip()}" for c in REQUEST_COLUMNS.split(","))
    + ", "
    + ", ".join(f"r.{c.strip()}" for c in RUN_COLUMNS.split(","))
    + " FROM requests q LEFT JOIN runs r ON r.run_id = q.run_id WHERE q.request_id = ?"
)
REQUEST_STATUSES = frozenset(("pending", "answered", "applied", "cancelled"))
_STATUSES = sorted(REQUEST_STATUSES)  # (ASCII: Python's order is SQLite's BINARY collation)


def _damaged_status(
    table: str, columns: str, statuses: Sequence[str], index: str, of_run: str = ""
) -> str:
    """The query for one row of ``table`` whose status is none of ``statuses`` (NULL, another
    text, a blob), through ``index``: a seek into each gap around the values in the index
    (below the first, between two, above the last), so it costs the same however many rows
    there are. (``NOT IN`` read every request of a run: 0.2 ms at a 1,000-turn chat's
    resume.) ``of_run`` narrows it to run ``?1``."""
    ordered = sorted(statuses)  # (ASCII: Python's order is SQLite's BINARY collation)
    gaps = ["status IS NULL", f"status < '{ordered[0]}'"]
    gaps += [f"status > '{a}' AND status < '{b}'" for a, b in pairwise(ordered)]
    gaps.append(f"status > '{ordered[-1]}'")
    seeks = " UNION ALL ".join(
        f"SELECT * FROM (SELECT rowid FROM {table} INDEXED BY {index} WHERE {of_run}{gap} LIMIT 1)"
        for gap in gaps
    )
    return f"SELECT {columns} FROM {table} WHERE rowid = (SELECT rowid FROM ({seeks}) LIMIT 1)"


SQL_DAMAGED_REQUEST = _damaged_status("requests", REQUEST_COLUMNS, _STATUSES, "ix_requests_status")
SQL_DAMAGED_REQUEST_OF_RUN = _damaged_status(
    "requests", REQUEST_COLUMNS, _STATUSES, "ix_requests_run_status", "run_id = ?1 AND "
)
RUN_STATUSES = (
    "in_progress",
    "idle",
    "idle_with_pending_requests",
    "max_supersteps_reached",
    "failed",
    "cancelled",
)  # (``WorkflowRunState``'s values; this module imports nothing of the engine)
SQL_DAMAGED_RUN = _damaged_status("runs", RUN_COLUMNS, RUN_STATUSES, "ix_runs_status")
"""A run whose status is damaged: a listing of runs of one status looks for it, as one of
every run meets it, and says so (it was left out without a word: outside tester 124)."""


def _starting_with(select: str, column: str) -> tuple[str, str, str]:
    """``select`` narrowed to the rows whose ``column`` starts with a prefix: (every row; a
    prefix ``?1`` and the first text after all that start with it, ``?2``; a prefix ``?1``
    of ``?2`` characters with no such text). The texts from a prefix up to that one are
    exactly those that start with it (SQLite compares text by its UTF-8 bytes: code points),
    so a look-up is a range of the column's index and costs the ids it finds, not every id
    there is: ``substr`` read the whole index (an unknown id given to the command line read
    every run's id and every request's), and it never matched an id holding a NUL."""
    order = f" ORDER BY {column}"
    return (
        select + order,
        f"{select} WHERE {column} >= ?1 AND {column} < ?2{order}",
        f"{select} WHERE {column} >= ?1 AND substr({column}, 1, ?2) = ?1{order}",
    )


def prefix_query(queries: tuple[str, str, str], prefix: str) -> tuple[str, tuple[str | int, ...]]:
    """The query of ``queries`` (``_starting_with``) for ``prefix``, with its parameters."""
    if not prefix:
        return queries[0], ()
    after = following(prefix)
    if after is None:  # (a prefix of nothing but U+10FFFF)
        return queries[2], (prefix, len(prefix))
    return queries[1], (prefix, after)


def following(prefix: str) -> str | None:
    """The first text after every text that starts with ``prefix`` in SQLite's order (BINARY:
    UTF-8 bytes, so code points): its last character incremented, carrying past the last code
    point and skipping surrogates (not text). None when there is none (all U+10FFFF)."""
    chars = list(prefix)
    while chars:
        point = ord(chars.pop()) + 1
        if 0xD800 <= point <= 0xDFFF:
            point = 0xE000
        if point <= 0x10FFFF:
            return "".join(chars) + chr(point)
    return None


def _beside(table: str, column: str) -> str:
    """The ids just before and after id ``?1`` in ``column``'s order (NULL where none): two
    seeks of its index."""
    return (
        f"SELECT (SELECT {column} FROM {table} WHERE {column} < ?1 ORDER BY {column} DESC "
        f"LIMIT 1), (SELECT {column} FROM {table} WHERE {column} > ?1 ORDER BY {column} LIMIT 1)"
    )


SQL_RUN_IDS_BESIDE = _beside("runs", "run_id")
SQL_REQUEST_IDS_BESIDE = _beside("requests", "request_id")
SQL_RUN_IDS = _starting_with("SELECT run_id FROM runs", "run_id")
SQL_REQUEST_IDS = _starting_with(  # ids only: the data and answers of every request can be MBs
    "SELECT request_id, run_id FROM requests", "request_id"
)
SQL_ANSWERED = (
    f"SELECT {REQUEST_COLUMNS} FROM requests WHERE run_id = ? AND status = 'answered' "
    "ORDER BY created_at, request_id"
)
SQL_ANSWER_WAITING = "SELECT 1 FROM requests WHERE run_id = ? AND status = 'answered' LIMIT 1"
SQL_ANSWER_STATE = "SELECT status, answer, run_id FROM requests WHERE request_id = ?"
SQL_REQUEST_DATA_SIZE = "SELECT length(CAST(data AS BLOB)) FROM requests WHERE request_id = ?"
SQL_STORE_ANSWER = (  # the run it answers: no statement of its own to read it
    "UPDATE requests SET status = 'answered', answer = ?, answered_at = ? "
    "WHERE request_id = ? AND status = 'pending' RETURNING run_id"
)
SQL_CANCEL_REQUEST = (  # its run: the refusal of an answered one names it
    "UPDATE requests SET status = 'cancelled' WHERE request_id = ? AND status = 'pending' "
    "RETURNING run_id"
)
SQL_JOURNAL_GET = "SELECT value FROM journal WHERE run_id = ? AND key = ?"
SQL_JOURNAL_PUT = (
    "INSERT INTO journal (run_id, key, value, created_at, superstep) VALUES (?, ?, ?, ?, ?)"
)
SQL_JOURNAL_REPLACE = "UPDATE journal SET value = ?, created_at = ? WHERE run_id = ? AND key = ?"
SQL_JOURNAL_CLEAR = "DELETE FROM journal WHERE run_id = ? AND key = ?"
SQL_JOURNAL_AFTER = (
    "SELECT key, value FROM journal WHERE run_id = ? AND superstep > ? ORDER BY created_at, key"
)
SQL_JOURNALED_AFTER = "SELECT 1 FROM journal WHERE run_id = ? AND superstep > ? LIMIT 1"
SQL_RUNS_JOURNALED_PAST = (
    f"SELECT {RUN_COLUMNS} FROM runs WHERE status = 'in_progress' AND EXISTS (SELECT 1 FROM "
    "journal WHERE journal.run_id = runs.run_id AND (journal.superstep > runs.superstep OR "
    "typeof(runs.superstep) != 'integer') AND (NOT json_valid(journal.value) OR "
    "json_type(journal.value, '$.value') IS NULL)) ORDER BY created_at, run_id"
)  # the runs that may have a step in doubt: an intent with no result (a result is replayed)
# journaled after the latest checkpoint, in one query (one whose superstep or entry is
# damaged too, to be said); a run stopped after its steps' results were journaled is not one
# of them (it was counted as one: outside tester 186)
SQL_COUNT_REQUESTS = "SELECT count(*) FROM requests WHERE status = ?"
SQL_RUNS_WITH_PENDING = (
    f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id IN "
    "(SELECT run_id FROM requests WHERE status = 'pending')"
)
SQL_ANSWERED_COUNTS = (  # (runs in the order of their first answer, as ``list_requests``')
    "SELECT run_id, count(*), min(created_at), rowid FROM requests WHERE status = 'answered' "
    "GROUP BY run_id ORDER BY 3, 4"
)
SQL_ANSWERED_COUNT_OF_RUN = "SELECT count(*) FROM requests WHERE run_id = ? AND status = 'answered'"
SQL_JOURNAL_COMPACT = "DELETE FROM journal WHERE run_id = ? AND superstep <= ?"
SQL_FENCE = (
    "SELECT owner, version, latest_checkpoint_id, cancel_requested FROM runs WHERE run_id = ?"
)
SQL_RENEW = "UPDATE runs SET lease_expires_at = ? WHERE run_id = ? AND owner = ? AND version = ?"
# only for a run a worker holds (or held when it died): one that rests is cancelled directly
SQL_REQUEST_CANCEL = "UPDATE runs SET cancel_requested = 1 WHERE run_id = ? AND owner IS NOT NULL"
SQL_CANCEL_DONE = "UPDATE runs SET cancel_requested = 0 WHERE run_id = ?"
SQL_CANCEL_INTENDED = (  # ``cancel_requests(run_id=)``: a resting run is left interrupted
    "UPDATE runs SET cancel_requested = 1, status = CASE WHEN status IN "
    "('idle_with_pending_requests', 'failed') THEN 'in_progress' ELSE status END "
    "WHERE run_id = ? AND status NOT IN ('idle', 'cancelled')"
)
SQL_DOOMED = (  # finished, old, and not leased (a failed run being retried is kept)
    f"SELECT run_id FROM runs WHERE status IN {TERMINAL_SQL} AND updated_at < ? "
    "AND (owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at < ?)"
)
SQL_DOOMED_RUN_NO = (  # run ?1's number, if it is one SQL_DOOMED finds (with ?2, ?3) now
    f"SELECT run_no FROM runs WHERE run_id = ?1 AND status IN {TERMINAL_SQL} AND updated_at < ?2 "
    "AND (owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at < ?3)"
)
SQL_DROP_RUN = {
    table: f"DELETE FROM {table} WHERE run_id = ?" for table in ("requests", "journal", "runs")
}
SQL_DROP_RUN_CHECKPOINTS = f"DELETE FROM checkpoints WHERE {_rows_of('?1')}"  # of run number ?1
_RUN_ROWS = f"FROM checkpoints WHERE {_rows_of('r.run_no')}"  # the rows of run ``r``


def _history_ends(rows: str) -> str:
    """The newest and oldest seq of the checkpoint ``rows`` (``FROM ... WHERE ...``), as
    ``newest`` and ``oldest``: two seeks -- a run's seqs are contiguous (rows only ever go
    from the front), so ``newest - oldest + 1`` is how many it has."""
    return (
        f"(SELECT seq {rows} ORDER BY pos DESC LIMIT 1) AS newest, "
        f"(SELECT seq {rows} ORDER BY pos LIMIT 1) AS oldest"
    )


SQL_HISTORY_LENGTH = (  # run ?1's newest checkpoint seq and how many rows it has (NULLs: none)
    "SELECT newest, newest - oldest + 1 FROM "
    f"(SELECT {_history_ends(f'FROM checkpoints WHERE {_IN_RUN}')})"
)
SQL_LONG_HISTORIES = (  # runs with more than ?1 checkpoint rows: (run, newest seq, rows)
    "SELECT run_id, newest, newest - oldest + 1 FROM (SELECT r.run_id AS run_id, "
    f"{_history_ends(_RUN_ROWS)} FROM runs r) WHERE newest - oldest + 1 > ?1"
)
SQL_MAKE_SNAPSHOT = (  # checkpoint ?3 of run ?1 becomes a snapshot holding ?2 (lists apart: ?4,
    # ?5; chunked: ?6), of checkpoint schema ?7 at least
    "UPDATE checkpoints SET kind = 'snapshot', body = ?2, lists = ?4, list_items = ?5, "
    "chunks = ?6, schema_version = max(schema_version, ?7) "
    f"WHERE pos = {_BASE} + ?3"
)
SQL_FIRST_SPAN_AFTER = (  # the first span after ?2 with no snapshot between: its base is before ?2
    f"SELECT min(seq) FROM checkpoints WHERE pos > {_BASE} + ?2 AND pos < {_BASE} + "
    f"coalesce((SELECT seq FROM checkpoints WHERE pos > {_BASE} + ?2 AND pos <= {_BASE} + "
    f"{SEQ_SPAN - 1} AND kind = 'snapshot' ORDER BY pos LIMIT 1), {SEQ_SPAN}) AND kind = 'span'"
)
SQL_DROP_BEFORE = f"DELETE FROM checkpoints WHERE pos >= {_BASE} AND pos < {_BASE} + ?2"


def filtered(
    select: str, filters: Sequence[tuple[str, Any]], order: str, *conditions: str
) -> tuple[str, list]:
    """``select`` with the given ``column = ?`` filters (None: no filter), any other
    ``conditions``, and ``order``."""
    where, params = _where(filters, conditions)
    return f"{select}{where} ORDER BY {order}", params


def _where(filters: Sequence[tuple[str, Any]], conditions: Sequence[str]) -> tuple[str, list]:
    """The ``WHERE`` clause (or "") of ``filtered``, and its parameters."""
    where = [f"{column} = ?" for column, value in filters if value is not None]
    where += conditions
    params = [value for _, value in filters if value is not None]
    return (" WHERE " + " AND ".join(where) if where else ""), params


def runs_by_update(
    status: str | None, workflow: str | None, started: bool | None, last: int | None = None
) -> tuple[str, str, list[Any]]:
    """What ``runs list`` reads: the runs least recently updated first (with ``last``, only
    the ``last`` updated most recently -- a top-N sort in SQLite, not every run read and
    decoded to keep a few: 0.65 s at 100,000 runs, outside tester 175); then the SQL that
    counts every run the filters match; and the parameters of both."""
    where, params = _where((("status", status), ("workflow_name", workflow)), started_runs(started))
    text = f"SELECT {RUN_COLUMNS} FROM runs{where} ORDER BY updated_at, run_id"
    if last is not None:
        newest = f"SELECT {RUN_COLUMNS} FROM runs{where} ORDER BY updated_at DESC, run_id DESC"
        text = f"SELECT * FROM ({newest} LIMIT {int(last)}) ORDER BY updated_at, run_id"
    return text, f"SELECT count(*) FROM runs{where}", params


def started_runs(started: bool | None) -> tuple[str, ...]:
    """The condition on ``runs`` for runs some worker took (True: the lease version is past
    the admission's 0), or none ever took (False); none for None. A version that is not a
    whole number from 0 is in both, so that reading the run says it is damaged (it was left
    out of both without a word: outside tester 123)."""
    if started is None:
        return ()
    taken = "version > 0" if started else "version = 0"
    return (f"({taken} OR typeof(version) != 'integer' OR version < 0)",)
