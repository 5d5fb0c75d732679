"""How checkpoints, requests and runs map to and from table rows (tuples in column order)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from workflow_engine import Checkpoint, WorkflowRunState, delta_of
from workflow_engine._errors import StoreCorruptError
from workflow_engine._store import RunRecord, StoredRequest


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
    body = checkpoint.model_dump_json() if snapshot else delta_of(checkpoint).model_dump_json()
    return (
        checkpoint.checkpoint_id,
        checkpoint.run_id,
        seq,
        checkpoint.superstep,
        "snapshot" if snapshot else "delta",
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


def run_record(row: Sequence[Any]) -> RunRecord:
    return RunRecord(
        run_id=row[0],
        workflow_name=row[1],
        workflow_signature=row[2],
        status=WorkflowRunState(row[3]),
        superstep=row[4],
        created_at=row[5],
        updated_at=row[6],
        version=row[7],
        owner=row[8],
        lease_expires_at=row[9],
        latest_checkpoint_id=row[10],
        error=_json_field(row[11], row[0], "the run's error") if row[11] else None,
        parent_run_id=row[12],
    )


def _json_field(text: str, run_id: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, TypeError) as exc:
        raise StoreCorruptError(f"run {run_id!r}: {what} is not valid JSON ({exc})") from None


def stored_request(row: Sequence[Any]) -> StoredRequest:
    where = f"request {row[0]!r}"
    return StoredRequest(
        request_id=row[0],
        run_id=row[1],
        port_id=row[2],
        source_executor_id=row[3],
        kind=row[4],
        data=_json_field(row[5], row[1], f"the data of {where}"),
        response_type=row[6],
        superstep=row[7],
        status=row[8],
        answer=_json_field(row[9], row[1], f"the answer to {where}")
        if row[9] is not None
        else None,
        created_at=row[10],
        answered_at=row[11],
    )
