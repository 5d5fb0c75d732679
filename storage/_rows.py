"""How checkpoints, requests and runs map to and from table rows (tuples in column order)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from workflow_engine import Checkpoint, WorkflowRunState, delta_of
from workflow_engine._checkpoint import (
    CHECKPOINT_SCHEMA_VERSION,
    CheckpointSpan,
    newer_version_refusal,
    shown,
)
from workflow_engine._errors import CheckpointVersionError, StoreCorruptError
from workflow_engine._store import CheckpointInfo, RunRecord, StoredRequest


def admit_rows(
    checkpoint: Checkpoint,
    now: float,
    parent_run_id: str | None,
    owner: str | None,
    expires_at: float | None,
    version: int,
) -> tuple[tuple, tuple, list[tuple]]:
    """The run row, the first checkpoint's row and its requests' rows."""
    run = (
        checkpoint.run_id,
        checkpoint.workflow_name,
        checkpoint.workflow_signature,
        checkpoint.status.value,
        checkpoint.superstep,
        now,
        now,
        owner,
        expires_at,
        version,
        checkpoint.checkpoint_id,
        parent_run_id,
    )
    requests = new_request_rows(checkpoint, list(checkpoint.pending_requests), now)
    return run, checkpoint_row(checkpoint, 0), requests


def checkpoint_row(checkpoint: Checkpoint, seq: int, *, snapshot: bool = True) -> tuple:
    if snapshot:
        return _row(checkpoint, seq, "snapshot", checkpoint.model_dump_json())
    return _row(checkpoint, seq, "delta", delta_of(checkpoint).model_dump_json())


def span_row(checkpoint: Checkpoint, seq: int, span: CheckpointSpan) -> tuple:
    """A checkpoint's row stored as a span (see ``CheckpointSpan``)."""
    return _row(checkpoint, seq, "span", span.model_dump_json())


def _row(checkpoint: Checkpoint, seq: int, kind: str, body: str) -> tuple:
    """``SQL_INSERT_CHECKPOINT``'s parameters (every kind stores the checkpoint's version)."""
    return (
        checkpoint.checkpoint_id,
        checkpoint.run_id,
        seq,
        checkpoint.superstep,
        kind,
        checkpoint.status.value,
        checkpoint.codec,
        checkpoint.schema_version,
        body,
        checkpoint.created_at,
    )


def new_request_rows(checkpoint: Checkpoint, ids: Sequence[str], now: float) -> list[tuple]:
    rows = []
    pending = checkpoint.pending_requests
    for rid in ids:
        record = pending.get(rid)
        if record is None:
            continue
        rows.append(
            (
                rid,
                checkpoint.run_id,
                record.port_id,
                record.source_executor_id,
                record.kind,
                json.dumps(record.data),
                record.response_type,
                record.superstep,
                checkpoint.codec,
                now,
            )
        )
    return rows


# --- reading rows back: every column is checked, a damaged one is a StoreCorruptError ---------

MAX_STORED_DEPTH = 256
"""Nesting levels a stored JSON column may have: the codec writes at most ``MAX_DEPTH`` (180)
levels, so anything deeper was not written by the engine -- and ``json.loads`` recurses once per
level, so a column of ``[[[[...`` would otherwise end in ``RecursionError``."""

_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_BRACKET = re.compile(r"[\[\]{}]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89abcdefABCDEF]")
REQUEST_STATUSES = frozenset(("pending", "answered", "applied", "cancelled"))
_STATES = {state.value: state for state in WorkflowRunState}


def _corrupt(run_id: Any, what: str, problem: str) -> StoreCorruptError:
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
        raise _corrupt(run_id, what, f"a {type(text).__name__}, not JSON text")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _corrupt(run_id, what, f"not UTF-8 at position {exc.start}") from None
    if text.count("[") + text.count("{") > max_depth and _nesting(text, max_depth) > max_depth:
        raise _corrupt(run_id, what, f"JSON nested more than {max_depth} levels deep")
    try:
        value = json.loads(text)
    except RecursionError:  # the depth was checked; kept as a last guard
        raise _corrupt(run_id, what, "JSON nested too deep") from None
    except ValueError as exc:  # JSONDecodeError, or an integer beyond int_max_str_digits
        raise _corrupt(run_id, what, f"not valid JSON: {str(exc).splitlines()[0]}") from None
    if _SURROGATE_ESCAPE.search(text):  # only an escape can carry a lone surrogate
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise _corrupt(run_id, what, "a string in it is not valid text") from None
    return value


def _text(value: Any, run_id: Any, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if type(value) is str and value.isascii():  # (a flag of the str: free) the usual column
        return value
    if not isinstance(value, str):
        raise _corrupt(run_id, what, f"{shown(value)} is not text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _corrupt(run_id, what, f"not UTF-8 at position {exc.start}") from None
    return value


def _integer(value: Any, run_id: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise _corrupt(run_id, what, f"{shown(value)} is not a count")
    return value


def _time(value: Any, run_id: Any, what: str, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if type(value) not in (int, float) or not _EARLIEST <= value <= _LATEST:
        raise _corrupt(run_id, what, f"{shown(value)} is not a time")
    return value


_EARLIEST, _LATEST = -62_135_596_800.0, 253_402_300_799.0
"""The seconds a date can hold: 0001-01-01 to 9999-12-31 (UTC). A stored time outside them
(or NaN) is damage, said as such -- not an error later, when the date is shown."""


def run_record(row: Sequence[Any]) -> RunRecord:
    """A ``runs`` row (``RUN_COLUMNS`` order) as a RunRecord, every column checked."""
    run_id = _text(row[0], row[0], "its run_id")
    status = _STATES.get(row[3]) if isinstance(row[3], str) else None
    if status is None:
        raise _corrupt(run_id, "its status", f"{shown(row[3])} is not a run state")
    error = None
    if row[11] is not None:
        error = load_json(row[11], run_id, "its recorded error (runs.error)")
        if not isinstance(error, dict) or not isinstance(error.get("message"), str):
            raise _corrupt(
                run_id, "its recorded error (runs.error)", "not an object with a message"
            )
    return RunRecord(
        run_id=run_id,
        workflow_name=_text(row[1], run_id, "its workflow_name"),
        workflow_signature=_text(row[2], run_id, "its workflow_signature"),
        status=status,
        superstep=_integer(row[4], run_id, "its superstep"),
        created_at=_time(row[5], run_id, "its created_at"),
        updated_at=_time(row[6], run_id, "its updated_at"),
        version=_integer(row[7], run_id, "its lease version"),
        owner=_text(row[8], run_id, "its lease owner", optional=True),
        lease_expires_at=_time(row[9], run_id, "its lease_expires_at", optional=True),
        latest_checkpoint_id=_text(row[10], run_id, "its latest_checkpoint_id", optional=True),
        error=error,
        parent_run_id=_text(row[12], run_id, "its parent_run_id", optional=True),
        cancel_requested=bool(_integer(row[13], run_id, "its cancel_requested")),
    )


def lease_columns(run_id: str, row: Sequence[Any]) -> tuple[Any, ...]:
    """``owner, lease_expires_at, version, checkpoint_seq, since_snapshot, cancel_requested``
    of a run, checked (the columns a lease is taken on)."""
    owner, expires, version, seq, since, cancel = row
    return (
        _text(owner, run_id, "its lease owner", optional=True),
        _time(expires, run_id, "its lease_expires_at", optional=True),
        _integer(version, run_id, "its lease version"),
        _integer(seq, run_id, "its checkpoint_seq"),
        _integer(since, run_id, "its since_snapshot"),
        _integer(cancel, run_id, "its cancel_requested"),
    )


def checkpoint_info(run_id: str, row: Sequence[Any]) -> CheckpointInfo:
    """A row of a run's history (``SQL_HISTORY``), checked."""
    checkpoint_id, seq, superstep, status, created_at, kind, version = row
    what = f"checkpoint {shown(checkpoint_id)}"
    state = _STATES.get(status) if isinstance(status, str) else None
    known = kind in ("snapshot", "delta", "span")
    if (
        (state is None or not known)
        and type(version) is int
        and version > CHECKPOINT_SCHEMA_VERSION
    ):
        # a kind or a status this engine does not know, from a newer one: said as reading it is
        raise CheckpointVersionError(
            f"run {shown(run_id, 400)}: checkpoint {checkpoint_id} (#{seq}, {kind}) "
            f"{newer_version_refusal(version)}"
        )
    if state is None:
        raise _corrupt(run_id, f"the status of {what}", f"{shown(status)} is not a run state")
    if not known:
        raise _corrupt(
            run_id, f"the kind of {what}", f"{shown(kind)} is not snapshot, delta or span"
        )
    return CheckpointInfo(
        _text(checkpoint_id, run_id, "a checkpoint id"),
        run_id,
        _integer(seq, run_id, f"the seq of {what}"),
        _integer(superstep, run_id, f"the superstep of {what}"),
        state,
        _time(created_at, run_id, f"the created_at of {what}"),
        kind,
    )


def run_id_of(row: Sequence[Any]) -> str:
    """The id of a ``(run_id,)`` row, checked as ``run_record`` checks it."""
    text: str = _text(row[0], row[0], "its run_id")
    return text


def request_id_of(row: Sequence[Any]) -> str:
    """The id of a ``(request_id, run_id)`` row, checked as ``stored_request`` checks it."""
    run_id = row[1] if isinstance(row[1], str) else f"<unknown: {shown(row[1])}>"
    text: str = _text(row[0], run_id, "a request id")
    return text


def stored_request(row: Sequence[Any]) -> StoredRequest:
    """A ``requests`` row (``REQUEST_COLUMNS`` order) as a StoredRequest, every column checked;
    errors name the run (as far as the row says) and the request."""
    run_id = row[1] if isinstance(row[1], str) else f"<unknown: {shown(row[1])}>"
    where = f"request {shown(row[0])}"
    status = row[8]
    if status not in REQUEST_STATUSES:
        raise _corrupt(run_id, f"the status of {where}", f"{shown(status)} is not a status")
    answer = row[9]
    if answer is not None:
        answer = load_json(answer, run_id, f"the answer to {where}")
    return StoredRequest(
        request_id=_text(row[0], run_id, "a request id"),
        run_id=_text(row[1], run_id, f"the run id of {where}"),
        port_id=_text(row[2], run_id, f"the port of {where}"),
        source_executor_id=_text(row[3], run_id, f"the executor of {where}"),
        kind=_text(row[4], run_id, f"the kind of {where}"),
        data=load_json(row[5], run_id, f"the data of {where}"),
        response_type=_text(row[6], run_id, f"the response type of {where}"),
        superstep=_integer(row[7], run_id, f"the superstep of {where}"),
        status=status,
        answer=answer,
        created_at=_time(row[10], run_id, f"the created_at of {where}"),
        answered_at=_time(row[11], run_id, f"the answered_at of {where}", optional=True),
    )
