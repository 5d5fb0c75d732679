"""A snapshot's long lists, kept apart from its body (``checkpoints.lists`` and ``list_items``).

A snapshot row writes each long list state (``LONG_LIST`` items or more: an agent's
conversation) into ``list_items`` and an empty list in its place in the body; ``lists`` says
how many items each has and how many bytes they take. Folding a chain puts them back: read
with the row, or -- for a resume, which reads the rows ``lean`` -- as placeholders
(``StoredItem``) that ``StoredLists`` reads when a handler first needs them. A turn of a long
conversation resumed in a new process then reads and parses what it touches, not the whole
conversation.

Where placeholders are read from: the run's first snapshot at or after the one they came from.
That is the snapshot itself, unless ``prune(keep_last=)`` deleted it meanwhile; then it is the
snapshot prune made of a later checkpoint, whose list begins with the same items if the list
only grew since. Each list's digest, kept in ``lists``, proves it: items that are not the ones
the checkpoint recorded (the list was replaced before the prune; the file is another one) are an
error, never read as if they were.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

from pydantic_core import from_json, to_json

from workflow_engine import Checkpoint
from workflow_engine._errors import (
    CheckpointNotFoundError,
    StoreCorruptError,
    StoreUnavailableError,
)
from workflow_engine._stored_items import StoredItems

from ._chunks import STORED_LISTS_TEXTS, with_chunks
from ._records import SQLITE_FAILURES, fetch_rows
from ._sql import SQL_STORED_LISTS


class StoredLists:
    """Reads the lists of a store's snapshots when first needed, each time on a connection of
    its own: it may be asked from any thread at any moment (a handler decoding an item, a
    commit writing a snapshot), when the store's own connection may be busy elsewhere."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout

    def group(
        self,
        run_id: str,
        checkpoint_id: str,
        seq: int,
        executor_id: str,
        key: str,
        count: int,
        digest: str | None,
    ) -> StoredItems:
        where = (
            f"run {run_id!r}: list state {key!r} of executor {executor_id!r} in checkpoint "
            f"{checkpoint_id} (#{seq})"
        )
        read = functools.partial(self._read, run_id, seq, executor_id, key, count, digest, where)
        return StoredItems(read, count, where)

    def _read(
        self,
        run_id: str,
        seq: int,
        executor_id: str,
        key: str,
        count: int,
        digest: str | None,
        where: str,
    ) -> list[Any]:
        from ._reader import query_only_uri

        try:
            conn = sqlite3.connect(
                query_only_uri(self.path), uri=True, timeout=self.timeout, isolation_level=None
            )
            try:
                conn.execute("PRAGMA query_only = ON")
                conn.execute("BEGIN")  # (the row and its chunks as of one moment: tester 125)
                rows = with_chunks(
                    conn,
                    fetch_rows(conn, SQL_STORED_LISTS, (run_id, seq)),
                    STORED_LISTS_TEXTS,
                    f"run {run_id!r}",
                )
            finally:
                conn.close()
        except SQLITE_FAILURES as exc:
            raise StoreUnavailableError(
                f"{where}: its items could not be read from {self.path}: {exc}"
            ) from exc
        if not rows:
            raise CheckpointNotFoundError(
                f"{where}: its items are no longer stored (the run has no snapshot from #{seq} "
                "on: it was pruned or deleted since the checkpoint was read)"
            )
        found_id, found_seq, body, lists, list_items = rows[0]
        try:
            if lists is not None:
                value = _items_of(list_items)[executor_id][key]
            else:  # (a snapshot written whole: prune's, or an engine's before schema 6)
                value = json.loads(body)["executor_states"][executor_id][key]
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreCorruptError(
                f"{_holder(where, found_id, found_seq, seq)} is damaged: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if type(value) is list and len(value) > count:
            value = value[:count]
        if (
            type(value) is list
            and len(value) == count
            and (digest is None or list_digest(to_json(value)) == digest)
        ):
            return value
        if found_seq != seq:  # (what prune kept is the list as it is now: it was replaced)
            raise CheckpointNotFoundError(
                f"{where}: its items are no longer stored (its snapshot was pruned since the "
                f"checkpoint was read, and the list that checkpoint {found_id} (#{found_seq}) "
                "keeps now does not begin with them: the list was replaced)"
            )
        found = f"{len(value)} items" if type(value) is list else "no list"
        raise StoreCorruptError(
            f"{where} is damaged: it holds {found}, not the {count} items its checkpoint "
            "recorded (or the database file was replaced by another)"
        )


def _holder(where: str, found_id: str, found_seq: int, seq: int) -> str:
    """Names the list and, if another checkpoint holds its items now (after a prune), that."""
    if found_seq == seq:
        return where
    return f"{where}, kept now by checkpoint {found_id} (#{found_seq}),"


def list_digest(items_json: bytes) -> str:
    """A list's digest, of its JSON text as ``pydantic_core.to_json`` writes it."""
    return hashlib.blake2b(items_json, digest_size=16).hexdigest()


def lists_bytes(lists: str | None) -> int:
    """What a row's lists kept apart take (its ``lists`` column; 0 for none)."""
    return 0 if lists is None else _counts_of(lists)[0]


def put_lists_back(
    snapshot: Checkpoint,
    where: tuple[str, str, int],
    lists: str,
    list_items: str | None,
    stored: StoredLists | None,
) -> None:
    """Put a snapshot row's lists kept apart into ``snapshot`` (just parsed from its body):
    ``list_items`` if read, else placeholders that ``stored`` reads when first needed.
    ``where``: run, checkpoint id and seq. Damage is a ``ValueError`` saying what."""
    _, counts, digests = _counts_of(lists)
    if list_items is not None:
        items = _items_of(list_items)
    elif stored is None:
        raise ValueError("its lists kept apart are missing (no list_items)")
    states = snapshot.executor_states
    for executor_id, keys in counts.items():
        state = states.get(executor_id)
        for key, count in keys.items():
            if state is None or state.get(key) != []:
                raise ValueError(
                    f"its body holds no place for list state {key!r} of executor {executor_id!r}"
                )
            if list_items is None:
                assert stored is not None
                digest = digests.get(executor_id, {}).get(key)
                state[key] = stored.group(*where, executor_id, key, count, digest).placeholders()
                continue
            value = items.get(executor_id, {}).get(key)
            if type(value) is not list or len(value) != count:
                raise ValueError(
                    f"its list state {key!r} of executor {executor_id!r} is not the {count} "
                    "items its row counts"
                )
            state[key] = value


def _counts_of(lists: str) -> tuple[int, dict[str, dict[str, int]], dict[str, dict[str, str]]]:
    """A ``lists`` column: (bytes, counts and digests by executor and key), checked."""
    data = json.loads(lists)
    size = data.get("bytes") if type(data) is dict else None
    counts = data.get("counts") if type(data) is dict else None
    digests = data.get("digests", {}) if type(data) is dict else None
    if (
        type(size) is not int
        or type(counts) is not dict
        or not all(
            type(keys) is dict and all(type(n) is int and n >= 0 for n in keys.values())
            for keys in counts.values()
        )
        or type(digests) is not dict
        or not all(
            type(keys) is dict and all(type(d) is str for d in keys.values())
            for keys in digests.values()
        )
    ):
        raise ValueError(f"its lists column is not what it should be: {lists[:200]!r}")
    return size, counts, digests


def _items_of(list_items: str | None) -> dict[str, dict[str, Any]]:
    if list_items is None:
        raise ValueError("its lists kept apart are missing (no list_items)")
    items = from_json(list_items)
    if type(items) is not dict:
        raise ValueError("its list_items column is not an object")
    return items
