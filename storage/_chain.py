"""A run's checkpoint from its rows: which rows to read (its *chain*) and folding them.

A commit writes a delta, now and then a snapshot, and every so many deltas a span (see
``_sqlite``). A checkpoint reads as the latest snapshot at or before it, the spans after that,
and the deltas after the last span. The store reads chains this way, and so does the read-only
``SqliteReader``: each is one read on a ``sqlite3`` connection, and folding needs the checkpoint
models alone (no event loop).
"""

from __future__ import annotations

import sqlite3
from typing import TYPE_CHECKING

from pydantic import ValidationError

from workflow_engine import Checkpoint, CheckpointDelta
from workflow_engine._checkpoint import (
    CHECKPOINT_SCHEMA_VERSION,
    apply_deltas,
    apply_span,
    newer_version_refusal,
    read_span,
    version_refusal,
)
from workflow_engine._errors import CheckpointVersionError, StoreCorruptError, shown

from ._chunks import CHAIN_TEXTS, with_chunks
from ._records import fetch_rows
from ._sql import (
    SEQ_SPAN,
    SQL_CHAIN,
    SQL_CHECKPOINT_PLACE,
    SQL_LATEST_CHAIN,
    SQL_LATEST_CHAIN_LEAN,
    SQL_LATEST_SEQ,
    SQL_RUN_BASE,
    SQL_RUN_NUMBER,
)
from ._stored_lists import put_lists_back

if TYPE_CHECKING:
    from ._stored_lists import StoredLists


def latest_chain(
    conn: sqlite3.Connection, run_id: str, base: int | None = None, *, lean: bool = False
) -> list[tuple] | None:
    """The rows to fold for the run's latest checkpoint; None if it has none. ``base``: the
    run's first row position, if its row was read already (else it is looked up). ``lean``:
    without the snapshot's long lists (``list_items`` None: to be read when needed)."""
    if base is None:
        found = conn.execute(SQL_RUN_BASE, (run_id,)).fetchone()
        base = found[0] if found is not None else None
        if base is None:
            return None
    rows = fetch_rows(conn, SQL_LATEST_CHAIN_LEAN if lean else SQL_LATEST_CHAIN, (base,))
    if rows:
        return with_chunks(conn, rows, CHAIN_TEXTS, f"run {run_id!r}")
    seq = conn.execute(SQL_LATEST_SEQ, (run_id,)).fetchone()[0]
    # none: a run without checkpoints; else a chain without a snapshot, which raises
    return chain_to(conn, run_id, seq, base) if seq is not None else None


def chain_to(conn: sqlite3.Connection, run_id: str, seq: int, base: int) -> list[tuple]:
    """The rows to fold for checkpoint ``seq`` of the run whose rows start at ``base``: the
    latest snapshot at or before it, the spans after that snapshot, and the deltas after
    the last of them."""
    rows = fetch_rows(conn, SQL_CHAIN, (base, seq))
    if not rows:
        raise StoreCorruptError(f"run {run_id!r}: no snapshot at or before checkpoint #{seq}")
    return with_chunks(conn, rows, CHAIN_TEXTS, f"run {run_id!r}")


def check_chain(
    conn: sqlite3.Connection, run_id: str, latest_id: str | None, chain: list[tuple] | None
) -> None:
    """The rows to fold must end at the run's latest checkpoint: a run whose checkpoints were
    deleted (or whose newest one was) is damaged, not a run without history; so is one whose
    row names no latest checkpoint (a run is written with its first: its next commit would be
    refused after its step's effects ran, outside tester 138). Which part is damaged is read
    again, on this error only (outside tester 140: a damaged run number read as checkpoints
    missing)."""
    found = chain[-1][0] if chain else None
    if latest_id is not None and found == latest_id:
        return
    if latest_id is None:
        stored = f"yet checkpoint {found} is stored" if found is not None else "nor is one stored"
        raise StoreCorruptError(
            f"run {run_id!r}: its row names no latest checkpoint, {stored}: the row is damaged"
        )
    raise StoreCorruptError(_why_not_found(conn, run_id, latest_id, found))


def _why_not_found(conn: sqlite3.Connection, run_id: str, latest_id: str, found: str | None) -> str:
    """Why the run's latest checkpoint is not where its rows end: its run number (which
    places its rows) damaged, the id another run's or an older one of its own, or the
    checkpoint gone."""
    number = conn.execute(SQL_RUN_NUMBER, (run_id,)).fetchone()
    if number is not None and (number[0] != "integer" or number[1] < 0):
        return (
            f"run {run_id!r}: its run_no is damaged ({shown(number[1])}): its checkpoint rows "
            "cannot be found"
        )
    place = conn.execute(SQL_CHECKPOINT_PLACE, (latest_id,)).fetchone()
    if place is not None and place[0] != run_id:
        return (
            f"run {run_id!r}: its latest checkpoint {shown(latest_id)} is run "
            f"{shown(place[0])}'s: the row is damaged"
        )
    if place is not None and number is not None and place[2] != number[1] * SEQ_SPAN:
        return (
            f"run {run_id!r}: its run_no is damaged ({shown(number[1])}): its checkpoints "
            "are stored under another number"
        )
    if place is not None:
        return (
            f"run {run_id!r}: its latest checkpoint {shown(latest_id)} is not its newest stored "
            f"({found}): the row is damaged"
        )
    newest = f"the newest stored is {found}" if found is not None else "none is stored"
    return f"run {run_id!r}: its latest checkpoint {shown(latest_id)} is missing ({newest})"


def fold_chain(
    run_id: str, rows: list[tuple], stored: StoredLists | None = None
) -> tuple[Checkpoint, Checkpoint, int]:
    """The checkpoint a chain of rows reads as, the last snapshot or span on the way (what
    the next span is written relative to), and what the last span recorded of the rows
    written before it since the snapshot (``CheckpointSpan.written_before``; 0: none).

    A snapshot's long lists come with its row, or -- rows read ``lean`` -- as placeholders
    that ``stored`` reads when first needed (see ``StoredItem``)."""
    snapshot: Checkpoint | None = None
    deltas: list[CheckpointDelta] = []
    recorded = 0
    where = f"run {run_id!r}: no checkpoint to read"
    for checkpoint_id, row_seq, kind, body, version, lists, list_items in rows:
        where = f"run {run_id!r}: checkpoint {checkpoint_id} (#{row_seq}, {kind})"
        if type(version) is not int or version < 1:
            raise StoreCorruptError(
                f"{where} is corrupt and cannot be read: its schema_version column holds "
                f"{version!r}, not a version"
            )
        if version > CHECKPOINT_SCHEMA_VERSION:
            # the row says so even if its body does not: a newer layout is not guessed at
            raise CheckpointVersionError(f"{where} {newer_version_refusal(version)}")
        try:
            if not isinstance(body, str):
                raise ValueError(f"its body is a {type(body).__name__}, not JSON text")
            try:
                if not body.isascii():  # (a flag of the str: free) only then can it hold
                    body.encode("utf-8")  # a lone surrogate, from bytes that were not UTF-8
            except UnicodeEncodeError as exc:
                raise ValueError(f"its body is not UTF-8 at position {exc.start}") from None
            if kind == "snapshot":
                snapshot, deltas = Checkpoint.model_validate_json(body), []
                if lists is not None:
                    where_lists = (run_id, checkpoint_id, row_seq)
                    put_lists_back(snapshot, where_lists, lists, list_items, stored)
            elif kind == "span" and snapshot is not None:
                # it holds everything up to it: deltas before it (none are read) are moot
                span = read_span(body)
                try:
                    # (what it is applied to was parsed or built by this fold: extended in place)
                    snapshot, deltas = apply_span(snapshot, span, consume_base=True), []
                except (KeyError, TypeError, IndexError) as exc:  # (a name its base lacks)
                    raise ValueError(
                        f"it does not fit the checkpoint before it ({type(exc).__name__} {exc})"
                    ) from exc
                recorded = span.written_before
            elif kind == "delta" and snapshot is not None:
                deltas.append(CheckpointDelta.model_validate_json(body))
            else:
                first = snapshot is None and kind in ("delta", "span")
                raise ValueError(
                    f"a {kind} with no snapshot before it" if first else "unknown kind"
                )
        except (ValidationError, ValueError) as exc:
            raise StoreCorruptError(
                f"{where} is corrupt and cannot be read: {what_is_wrong(exc)}"
            ) from exc
        except CheckpointVersionError as exc:  # the body's own version (the row's is above)
            raise CheckpointVersionError(f"{where} {version_refusal(exc)}") from None
    if snapshot is None:
        raise StoreCorruptError(f"run {run_id!r}: no checkpoint to read")
    if not deltas:
        return snapshot, snapshot, recorded
    try:
        # one fold for the whole chain: each delta costs what it holds
        return apply_deltas(snapshot, deltas), snapshot, recorded
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise StoreCorruptError(
            f"run {run_id!r}: the checkpoint chain ending at {where.split(': ', 1)[1]} is "
            f"corrupt and cannot be read: {str(exc).splitlines()[0]}"
        ) from exc


def what_is_wrong(exc: ValueError) -> str:
    """A body's problem in one line: for pydantic's errors, where the first one is and what it
    is (its own first line only counts them)."""
    if not isinstance(exc, ValidationError):
        return str(exc).splitlines()[0]
    errors = exc.errors(include_url=False, include_input=False)
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"])
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where + ': ' if where else ''}{first['msg']}{more}"
