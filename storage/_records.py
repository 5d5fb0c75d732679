"""Rows of ``runs`` and ``requests`` read back as records, every column checked: a damaged one
is a ``StoreCorruptError`` naming the run and the column.

Apart from ``_rows`` (which writes checkpoints, and so needs the pydantic models) so that a
read-only look at a database (``SqliteReader``: the command line's listings) loads none of them.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from workflow_engine._errors import StoreCorruptError, shown
from workflow_engine._events import WorkflowRunState
from workflow_engine._store import RunRecord, StoredRequest

from ._sql import (
    REQUEST_STATUSES,
    SQL_ANSWERED_COUNT_OF_RUN,
    SQL_ANSWERED_COUNTS,
    SQL_DAMAGED_REQUEST,
    SQL_DAMAGED_REQUEST_OF_RUN,
    SQL_DAMAGED_RUN,
)

MAX_STORED_DEPTH = 256
"""Nesting levels a stored JSON column may have: the codec writes at most ``MAX_DEPTH`` (180)
levels, so anything deeper was not written by the engine -- and ``json.loads`` recurses once per
level, so a column of ``[[[[...`` would otherwise end in ``RecursionError``."""

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?')  # (one left open: read once, see _input)
_BRACKET = re.compile(r"[\[\]{}]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")


SQLITE_FAILURES = (sqlite3.Error, UnicodeDecodeError)
"""What a ``sqlite3`` call raises on a damaged file: its own errors, and ``UnicodeDecodeError``
where SQLite's message quotes bytes that are not UTF-8 (a damaged schema: Python's ``sqlite3``
fails to decode the message itself, and raises that instead -- outside tester 137)."""


def decode_text(data: bytes) -> str:
    """SQLite TEXT as str (a connection's ``text_factory``): bytes that are not UTF-8 (a damaged
    page, a foreign tool) become lone surrogates instead of failing the whole query, so that the
    decoders below say which run and record is damaged: they refuse such text."""
    return data.decode("utf-8", "surrogateescape")


def fetch_rows(conn: sqlite3.Connection, text: str, params: Sequence[Any]) -> list[tuple]:
    """The rows of a query, their text decoded by ``sqlite3`` itself (strict UTF-8, in C): a
    connection's ``decode_text`` is a Python call per value, a quarter of the time to read a
    long chain or list. Text that is not UTF-8 makes that refuse; the rows are then read again
    the tolerant way, so that the decoders below say which record is damaged."""
    conn.text_factory = str
    try:
        return conn.execute(text, params).fetchall()
    except sqlite3.OperationalError as exc:
        if "decode" not in str(exc):
            raise
    finally:
        conn.text_factory = decode_text
    return conn.execute(text, params).fetchall()


RUN_STATES = {state.value: state for state in WorkflowRunState}


def corrupt(run_id: Any, what: str, problem: str) -> StoreCorruptError:
    return StoreCorruptError(f"run {shown(run_id, 400)}: {what} is damaged ({problem})")


def _nesting(text: str, limit: int) -> int:
    """How deep ``text`` nests arrays and objects, counting no further than ``limit + 1``;
    brackets inside strings do not count. No recursion, whatever the input."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_JSON_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        else:
            depth -= 1
    return deepest


def load_json(text: Any, run_id: Any, what: str, *, max_depth: int = MAX_STORED_DEPTH) -> Any:
    """A JSON column read back, bounded like input from outside: not text, not JSON, nested
    deeper than ``max_depth`` or holding a string that is not valid text (a lone surrogate) is
    a ``StoreCorruptError`` naming the run and ``what`` the column is."""
    if not isinstance(text, str):
        raise corrupt(run_id, what, f"a {type(text).__name__}, not JSON text")
    _check_utf8(text, run_id, what)
    if text.count("[") + text.count("{") > max_depth and _nesting(text, max_depth) > max_depth:
        raise corrupt(run_id, what, f"JSON nested more than {max_depth} levels deep")
    try:
        value = json.loads(text)
    except RecursionError:  # the depth was checked; kept as a last guard
        raise corrupt(run_id, what, "JSON nested too deep") from None
    except ValueError as exc:  # JSONDecodeError, or an integer beyond int_max_str_digits
        raise corrupt(run_id, what, f"not valid JSON: {str(exc).splitlines()[0]}") from None
    if _SURROGATE_ESCAPE.search(text):  # only an escape can carry a lone surrogate
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise corrupt(run_id, what, "a string in it is not valid text") from None
    return value


def checked_text(value: Any, run_id: Any, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if type(value) is str and value.isascii():  # (a flag of the str: free) the usual column
        return value
    if not isinstance(value, str):
        raise corrupt(run_id, what, f"{shown(value)} is not text")
    _check_utf8(value, run_id, what)
    return value


def _check_utf8(text: str, run_id: Any, what: str) -> None:
    """``StoreCorruptError`` for text holding lone surrogates: bytes that were not UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise corrupt(run_id, what, f"not UTF-8 at position {exc.start}") from None


def checked_count(value: Any, run_id: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise corrupt(run_id, what, f"{shown(value)} is not a count")
    return value


def checked_time(value: Any, run_id: Any, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if type(value) not in (int, float) or not _EARLIEST <= value <= _LATEST:
        raise corrupt(run_id, what, f"{shown(value)} is not a time")
    return value


_EARLIEST, _LATEST = -62_135_596_800.0, 253_402_300_799.0
"""The seconds a date can hold: 0001-01-01 to 9999-12-31 (UTC). A stored time outside them
(or NaN) is damage, said as such -- not an error later, when the date is shown."""


def run_record(row: Sequence[Any]) -> RunRecord:
    """A ``runs`` row (``RUN_COLUMNS`` order) as a RunRecord, every column checked."""
    run_id = checked_text(row[0], row[0], "its run_id")
    status = RUN_STATES.get(row[3]) if isinstance(row[3], str) else None
    if status is None:
        raise corrupt(run_id, "its status", f"{shown(row[3])} is not a run state")
    error = None
    if row[11] is not None:
        error = load_json(row[11], run_id, "its recorded error (runs.error)")
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            raise corrupt(run_id, "its recorded error (runs.error)", "not an object with a message")
    return RunRecord(
        run_id=run_id,
        workflow_name=checked_text(row[1], run_id, "its workflow_name"),
        workflow_signature=checked_text(row[2], run_id, "its workflow_signature"),
        status=status,
        superstep=checked_count(row[4], run_id, "its superstep"),
        created_at=checked_time(row[5], run_id, "its created_at"),
        updated_at=checked_time(row[6], run_id, "its updated_at"),
        version=checked_count(row[7], run_id, "its lease version"),
        owner=checked_text(row[8], run_id, "its lease owner", optional=True),
        lease_expires_at=checked_time(row[9], run_id, "its lease_expires_at", optional=True),
        latest_checkpoint_id=checked_text(
            row[10], run_id, "its latest_checkpoint_id", optional=True
        ),
        error=error,
        parent_run_id=checked_text(row[12], run_id, "its parent_run_id", optional=True),
        cancel_requested=bool(checked_count(row[13], run_id, "its cancel_requested")),
    )


def lease_columns(run_id: str, row: Sequence[Any]) -> tuple[Any, ...]:
    """``owner, lease_expires_at, version, checkpoint_seq, since_snapshot, cancel_requested``
    of a run, checked (the columns a lease is taken on)."""
    owner, expires, version, seq, since, cancel = row
    return (
        checked_text(owner, run_id, "its lease owner", optional=True),
        checked_time(expires, run_id, "its lease_expires_at", optional=True),
        checked_count(version, run_id, "its lease version"),
        checked_count(seq, run_id, "its checkpoint_seq"),
        checked_count(since, run_id, "its since_snapshot"),
        checked_count(cancel, run_id, "its cancel_requested"),
    )


def run_id_of(row: Sequence[Any]) -> str:
    """The id of a ``(run_id,)`` row, checked as ``run_record`` checks it."""
    text: str = checked_text(row[0], row[0], "its run_id")
    return text


def request_id_of(row: Sequence[Any]) -> str:
    """The id of a ``(request_id, run_id)`` row, checked as ``stored_request`` checks it."""
    run_id = row[1] if isinstance(row[1], str) else f"<unknown: {shown(row[1])}>"
    text: str = checked_text(row[0], run_id, "a request id")
    return text


def ids_beside(conn: sqlite3.Connection, text: str, ids: Iterable[str]) -> list[str]:
    """``ids`` and, for each, the stored ids just before and after it in id order (a query,
    ``text``, of ``_sql._beside``): what the shortest unique prefix of each of ``ids`` among
    all stored ids is worked out from, read as two seeks per id instead of every id there is
    (a table of 12 pending requests read 100,000 request ids and run ids: 0.9 s)."""
    found = set(ids)
    for given in list(found):
        for beside in conn.execute(text, (given,)).fetchone():
            if isinstance(beside, str):  # (a damaged one, not text, cannot be typed: no rival)
                found.add(beside)
    return sorted(found)


def listed_runs(
    conn: sqlite3.Connection, text: str, params: Sequence[Any], of_status: bool
) -> list[RunRecord]:
    """The runs a query (``text``) selects. Of one status (``of_status``), a run whose status
    is damaged is in no status's list: it is looked for too and named (``StoreCorruptError``),
    as a listing of every run names it (outside tester 124)."""
    records, damaged = listed_runs_apart(conn, text, params, of_status)
    if damaged:
        raise damaged[0]
    return records


def listed_runs_apart(
    conn: sqlite3.Connection, text: str, params: Sequence[Any], of_status: bool
) -> tuple[list[RunRecord], list[StoreCorruptError]]:
    """``listed_runs``, each run read on its own: the runs whose rows read, and the errors
    naming those whose rows do not -- one damaged run row (its id too) hid every other run
    from a person's listing (outside testers 137, 140)."""
    rows = conn.execute(SQL_DAMAGED_RUN).fetchall() if of_status else []  # (named first)
    rows += fetch_rows(conn, text, params)
    records: list[RunRecord] = []
    damaged: list[StoreCorruptError] = []
    for row in rows:
        try:
            records.append(run_record(row))
        except StoreCorruptError as exc:
            damaged.append(exc)
    return records, damaged


def answered_counts(conn: sqlite3.Connection, run_ids: Iterable[str] | None) -> dict[str, int]:
    """How many answers each run has stored and not applied yet (runs with none left out): of
    ``run_ids`` (an index seek each), or of every run (None), in the order of their first
    answer. Counted, not read: a listing that marks such runs read every answer in the store
    (0.4 s at 20,000), and one damaged answer failed it; acting on that run says so."""
    if run_ids is None:
        return {run_id_of(row): row[1] for row in fetch_rows(conn, SQL_ANSWERED_COUNTS, ())}
    counts = {}
    for run_id in run_ids:
        (count,) = conn.execute(SQL_ANSWERED_COUNT_OF_RUN, (run_id,)).fetchone()
        if count:
            counts[run_id] = count
    return counts


def requests_of_run(
    conn: sqlite3.Connection, text: str, params: Sequence[Any], run_id: str | None
) -> list[StoredRequest]:
    """The requests of one status a query (``text``) selects: of run ``run_id``, or -- for the
    pending ones, the inbox -- of every run (None). A request whose status is damaged may be
    one a person is to answer, or an answer the run is to apply, yet it is in no status's
    list: it is looked for too and named (``StoreCorruptError``) -- it was left out without a
    word (outside testers 115, 118)."""
    if run_id is None:
        damaged = conn.execute(SQL_DAMAGED_REQUEST).fetchone()
    else:
        damaged = conn.execute(SQL_DAMAGED_REQUEST_OF_RUN, (run_id,)).fetchone()
    if damaged is not None:
        stored_request(damaged)  # (raises, naming the run and the request)
    return [stored_request(row) for row in fetch_rows(conn, text, params)]


def stored_request(row: Sequence[Any]) -> StoredRequest:
    """A ``requests`` row (``REQUEST_COLUMNS`` order) as a StoredRequest, every column checked;
    errors name the run (as far as the row says) and the request."""
    run_id = row[1] if isinstance(row[1], str) else f"<unknown: {shown(row[1])}>"
    where = f"request {shown(row[0])}"
    status = row[8]
    if status not in REQUEST_STATUSES:
        raise corrupt(run_id, f"the status of {where}", f"{shown(status)} is not a status")
    answer = row[9]
    if answer is not None:
        answer = load_json(answer, run_id, f"the answer to {where}")
    return StoredRequest(
        request_id=checked_text(row[0], run_id, "a request id"),
        run_id=checked_text(row[1], run_id, f"the run id of {where}"),
        port_id=checked_text(row[2], run_id, f"the port of {where}"),
        source_executor_id=checked_text(row[3], run_id, f"the executor of {where}"),
        kind=checked_text(row[4], run_id, f"the kind of {where}"),
        data=load_json(row[5], run_id, f"the data of {where}"),
        response_type=checked_text(row[6], run_id, f"the response type of {where}"),
        superstep=checked_count(row[7], run_id, f"the superstep of {where}"),
        status=status,
        answer=answer,
        created_at=checked_time(row[10], run_id, f"the created_at of {where}"),
        answered_at=checked_time(row[11], run_id, f"the answered_at of {where}", optional=True),
    )


def journal_entries(run_id: str, rows: Sequence[tuple[Any, Any]]) -> list[tuple[str, Any]]:
    """A run's journal rows ``(key, value)`` as ``(key, entry)``, each checked."""
    entries = []
    for key, text in rows:
        if type(key) is not str:  # (every key is a step's name: text)
            raise StoreCorruptError(
                f"run {run_id!r}: a journal entry's key is damaged ({shown(key)}, not a "
                "step's name)"
            )
        entries.append((key, journal_entry(run_id, key, text)))
    return entries


def journal_entry(run_id: str, key: str, text: Any) -> dict[str, Any]:
    """A journal entry's stored value: an intent or a result, each a JSON object. Any other
    is damage: read as no entry, or as a result, a step in doubt went unasked and its effect
    ran again (outside tester 210: ``null``)."""
    entry = load_json(text, run_id, f"journal entry {key!r}")
    if type(entry) is not dict:
        raise StoreCorruptError(
            f"run {run_id!r}: journal entry {key!r} is damaged ({shown(entry, 60)}, not an "
            "intent or a result)"
        )
    return entry
