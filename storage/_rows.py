"""How checkpoints, requests and runs map to and from table rows (tuples in column order)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic_core import to_json

from workflow_engine import Checkpoint, delta_of
from workflow_engine._checkpoint import (
    CHECKPOINT_SCHEMA_VERSION,
    CheckpointSpan,
    newer_version_refusal,
)
from workflow_engine._codec import UNREADABLE_INT, holds_unreadable_number
from workflow_engine._errors import CheckpointVersionError, StorageError, shown
from workflow_engine._store import CheckpointInfo
from workflow_engine._stored_items import has_placeholders, read_placeholders

from ._records import RUN_STATES, checked_count, checked_text, checked_time, corrupt
from ._stored_lists import list_digest

LONG_LIST = 64
"""An executor's list state of at least this many items is kept apart from its snapshot's body
(a conversation): a resume reads it only if it needs its items."""
LISTS_APART_VERSION = 5
"""The checkpoint schema version a row with lists kept apart says at least (an engine that
would read them empty refuses it): a fork or a prune's snapshot of an older checkpoint too."""


def admit_rows(
    checkpoint: Checkpoint,
    now: float,
    parent_run_id: str | None,
    owner: str | None,
    expires_at: float | None,
    version: int,
    lists_apart_from: int = LONG_LIST,
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
    return run, checkpoint_row(checkpoint, 0, lists_apart_from=lists_apart_from), requests


def checkpoint_row(
    checkpoint: Checkpoint, seq: int, *, snapshot: bool = True, lists_apart_from: int = LONG_LIST
) -> tuple:
    if snapshot:
        return _row(checkpoint, seq, "snapshot", *snapshot_parts(checkpoint, lists_apart_from))
    return _row(checkpoint, seq, "delta", delta_of(checkpoint).model_dump_json())


def span_row(checkpoint: Checkpoint, seq: int, span: CheckpointSpan) -> tuple:
    """A checkpoint's row stored as a span (see ``CheckpointSpan``)."""
    return _row(checkpoint, seq, "span", span.model_dump_json())


def _row(
    checkpoint: Checkpoint,
    seq: int,
    kind: str,
    body: str,
    lists: str | None = None,
    list_items: str | None = None,
) -> tuple:
    """``SQL_INSERT_CHECKPOINT``'s parameters (every kind stores the checkpoint's version, at
    least ``LISTS_APART_VERSION`` when it keeps lists apart)."""
    for text in (body, list_items):
        if text is not None and holds_unreadable_number(text):
            _refuse_unreadable(checkpoint, seq)
    version = checkpoint.schema_version
    return (
        checkpoint.checkpoint_id,
        checkpoint.run_id,
        seq,
        checkpoint.superstep,
        kind,
        checkpoint.status.value,
        checkpoint.codec,
        version if lists is None else max(version, LISTS_APART_VERSION),
        body,
        checkpoint.created_at,
        lists,
        list_items,
    )


def _refuse_unreadable(checkpoint: Checkpoint, seq: int) -> None:
    """A row holding an int no JSON reader reads back (more than 4,300 digits, in a list or
    dict the codec copied as it was) could never be read: the run would be stranded."""
    raise StorageError(
        f"run {checkpoint.run_id!r}: checkpoint #{seq} (superstep {checkpoint.superstep}) "
        f"holds {UNREADABLE_INT}; nothing was stored"
    )


def row_bytes(row: tuple) -> int:
    """What a row made by ``checkpoint_row`` or ``span_row`` stores: its body and lists."""
    items = row[11]
    return len(row[8]) + (len(items) if items is not None else 0)


def snapshot_parts(
    checkpoint: Checkpoint, lists_apart_from: int = LONG_LIST
) -> tuple[str, str | None, str | None]:
    """A snapshot's body and, apart, its long lists: ``lists`` (JSON: their bytes, and their
    lengths and digests by executor and key) and ``list_items`` (JSON: the lists by executor and
    key); the
    body holds each of them as an empty list, in its place. A list that begins with items not
    read yet (``StoredItem``, from a resume) is kept apart however short: it is read now.
    ``lists_apart_from``: how many items make a list long (a test sets it low)."""
    apart: dict[str, dict[str, list[Any]]] = {}
    for executor_id, state in checkpoint.executor_states.items():
        for key, value in state.items():
            if type(value) is list and (len(value) >= lists_apart_from or has_placeholders(value)):
                apart.setdefault(executor_id, {})[key] = value
    if not apart:
        return checkpoint.model_dump_json(), None, None
    read_placeholders(apart)  # (a store's error raised as itself, not wrapped by pydantic)
    states = {
        executor_id: {**state, **{key: [] for key in apart[executor_id]}}
        if executor_id in apart
        else state
        for executor_id, state in checkpoint.executor_states.items()
    }
    body = checkpoint.model_copy(update={"executor_states": states}).model_dump_json()
    counts: dict[str, dict[str, int]] = {}
    digests: dict[str, dict[str, str]] = {}
    parts = []
    for executor_id, lists in apart.items():
        texts = []
        for key, value in lists.items():
            text = to_json(value)  # (a placeholder is written as its item: see StoredItem)
            counts.setdefault(executor_id, {})[key] = len(value)
            digests.setdefault(executor_id, {})[key] = list_digest(text)
            texts.append(f"{json.dumps(key)}:{text.decode()}")
        parts.append(f"{json.dumps(executor_id)}:{{{','.join(texts)}}}")
    items = f"{{{','.join(parts)}}}"
    lists_column = {"bytes": len(items), "counts": counts, "digests": digests}
    return body, json.dumps(lists_column), items


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


def checkpoint_info(run_id: str, row: Sequence[Any]) -> CheckpointInfo:
    """A row of a run's history (``SQL_HISTORY``), checked."""
    checkpoint_id, seq, superstep, status, created_at, kind, version = row
    what = f"checkpoint {shown(checkpoint_id)}"
    state = RUN_STATES.get(status) if isinstance(status, str) else None
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
        raise corrupt(run_id, f"the status of {what}", f"{shown(status)} is not a run state")
    if not known:
        raise corrupt(
            run_id, f"the kind of {what}", f"{shown(kind)} is not snapshot, delta or span"
        )
    return CheckpointInfo(
        checked_text(checkpoint_id, run_id, "a checkpoint id"),
        run_id,
        checked_count(seq, run_id, f"the seq of {what}"),
        checked_count(superstep, run_id, f"the superstep of {what}"),
        state,
        checked_time(created_at, run_id, f"the created_at of {what}"),
        kind,
    )
