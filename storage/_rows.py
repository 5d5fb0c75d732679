"""How checkpoints, requests and runs map to and from table rows (tuples in column order)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from workflow_engine import Checkpoint, delta_of
from workflow_engine._checkpoint import (
    CHECKPOINT_SCHEMA_VERSION,
    CheckpointSpan,
    newer_version_refusal,
)
from workflow_engine._errors import CheckpointVersionError, shown
from workflow_engine._store import CheckpointInfo

from ._records import RUN_STATES, checked_count, checked_text, checked_time, corrupt


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
