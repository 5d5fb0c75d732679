"""Long JSON arrays of large checkpoint rows, stored once however many rows hold them.

An AG-UI client sends a thread's whole history with each message, and each message starts a
run: the run's input, its agent's conversation and its output each hold the history again. Run
*k* of a thread stored *k* messages three times, so a thread's storage grew with the square of
its length (560 MB for 1,000 messages). Yet run *k* holds the same arrays as run *k - 1*, with a
few items more at their ends. So a row whose text is long (``CHUNKED_FROM``) stores each of its
long arrays (``LONG_ARRAY`` items or more) as chunks of ``CHUNK_ITEMS`` items, each kept once in
``list_chunks`` under the digest of its text. An array that begins with another's items has the
same first chunks, so each run writes only the chunks at the end of its arrays. Snapshots of a
long conversation in one run, a fork and the snapshot a prune makes share chunks the same way.

The row keeps its text with ``[]`` in each array's place, and ``chunks`` (JSON) says where each
place is and which chunks fill it, for its body and for its lists kept apart. Put back together,
the text is the row's text exactly: a row is split only if that holds (checked as it is split),
and each chunk read is checked against its digest. ``list_chunks.refs`` counts the rows that use
a chunk; deleting or rewriting a row releases its chunks, and a chunk no row uses is deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic_core import from_json, to_json

from workflow_engine._errors import StoreCorruptError

from ._records import fetch_rows

CHUNKED_FROM = 16_384
"""Characters of row text (body or lists kept apart) from which its long arrays are chunked."""
LONG_ARRAY = 64
"""Items of an array from which it is stored as chunks."""
CHUNK_ITEMS = 32
"""Items per chunk (the last chunk of an array may hold fewer)."""
CHUNKING = (CHUNKED_FROM, LONG_ARRAY, CHUNK_ITEMS)
"""The three, as a store applies them (tests set smaller ones)."""

_COLUMNS = ("body", "list_items")
"""The row texts that may be chunked."""
_READ_AT_ONCE = 500
"""Chunks read per query (SQLite bounds a statement's parameters)."""

SQL_PUT_CHUNK = (
    "INSERT INTO list_chunks (digest, items, refs) VALUES (?1, ?2, 1) "
    "ON CONFLICT (digest) DO UPDATE SET refs = refs + 1"
)
SQL_RELEASE_CHUNK = "UPDATE list_chunks SET refs = refs - ?2 WHERE digest = ?1"
SQL_DROP_UNUSED_CHUNK = "DELETE FROM list_chunks WHERE digest = ?1 AND refs <= 0"


def chunk_digest(text: str) -> str:
    """A chunk's key: the digest of its JSON text."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


Places = list[list[Any]]
"""Where a text's chunked arrays were: ``[offset of their "[]", [chunk digests]]``, in order."""


def split(
    text: str, long_array: int = LONG_ARRAY, chunk_items: int = CHUNK_ITEMS
) -> tuple[str, Places, dict[str, str]] | None:
    """``text`` with each long array (``long_array`` items or more) replaced by ``[]``, where
    those are, and the chunks (of ``chunk_items``) by digest; None if it has no long array, or
    if its parts would not put back together as exactly ``text`` (then it is stored whole)."""
    try:
        tree = from_json(text)
    except ValueError:
        return None
    arrays: list[list[Any]] = []
    token = os.urandom(8).hex()  # (marks an array's place; checked to occur nowhere else)
    pending: list[Any] = [tree] if type(tree) is dict else []
    while pending:
        value = pending.pop()
        keys: Iterable[Any] = value.keys() if type(value) is dict else range(len(value))
        for key in keys:
            item = value[key]
            if type(item) is list and len(item) >= long_array:
                value[key] = f"\x00{token}:{len(arrays)}"
                arrays.append(item)
            elif type(item) is dict or type(item) is list:
                pending.append(item)
    if not arrays:
        return None
    try:
        skeleton = to_json(tree).decode()
        marks = [to_json(f"\x00{token}:{i}").decode() for i in range(len(arrays))]
        found = sorted((skeleton.find(mark), i) for i, mark in enumerate(marks))
        if any(skeleton.count(mark) != 1 for mark in marks):
            return None
        chunks: dict[str, str] = {}
        pieces: list[str] = []
        places: Places = []
        start = length = 0
        for at, i in found:
            piece = skeleton[start:at]
            pieces.append(piece)
            length += len(piece)
            digests = []
            array = arrays[i]
            for first in range(0, len(array), chunk_items):
                chunk = to_json(array[first : first + chunk_items]).decode()
                digest = chunk_digest(chunk)
                chunks[digest] = chunk
                digests.append(digest)
            places.append([length, digests])
            pieces.append("[]")
            length += 2
            start = at + len(marks[i])
        pieces.append(skeleton[start:])
    except ValueError:  # (text pydantic reads but does not write back: stored whole)
        return None
    stored = "".join(pieces)
    if assemble(stored, places, chunks) != text:
        return None
    return stored, places, chunks


def assemble(text: str, places: Places, chunks: dict[str, str]) -> str:
    """The text ``split`` took apart: each place's ``[]`` filled with its chunks' items."""
    pieces: list[str] = []
    start = 0
    for offset, digests in places:
        pieces.append(text[start:offset])
        pieces.append("[")
        pieces.append(",".join(chunks[digest][1:-1] for digest in digests))
        pieces.append("]")
        start = offset + 2
    pieces.append(text[start:])
    return "".join(pieces)


def stored_row(
    conn: sqlite3.Connection, row: tuple, chunking: tuple[int, int, int] = CHUNKING
) -> tuple:
    """A checkpoint row's ``SQL_INSERT_CHECKPOINT`` parameters (``row``, then its ``chunks``)
    with its long texts chunked, and their chunks stored: in the transaction that writes it."""
    body, list_items = row[8], row[11]
    if len(body) < chunking[0] and (list_items is None or len(list_items) < chunking[0]):
        return (*row, None)  # (most rows: nothing to look at)
    body, list_items, chunked = stored_texts(conn, body, list_items, chunking)
    return (*row[:8], body, *row[9:11], list_items, chunked)


def stored_texts(
    conn: sqlite3.Connection,
    body: str,
    list_items: str | None,
    chunking: tuple[int, int, int] = CHUNKING,
) -> tuple[str, str | None, str | None]:
    """A row's body and lists kept apart as stored, and its ``chunks`` value (None: nothing
    chunked), their chunks stored: in the transaction that writes the row."""
    texts = {"body": body, "list_items": list_items}
    chunked: dict[str, Places] = {}
    chunks: dict[str, str] = {}  # (a chunk in both texts is one use by the row)
    smallest, long_array, chunk_items = chunking
    for name, text in texts.items():
        if text is None or len(text) < smallest:
            continue
        parts = split(text, long_array, chunk_items)
        if parts is None:
            continue
        texts[name], chunked[name], found = parts
        chunks.update(found)
    if not chunked:
        return body, list_items, None
    conn.executemany(SQL_PUT_CHUNK, chunks.items())
    stored_body = texts["body"]
    assert stored_body is not None
    return stored_body, texts["list_items"], json.dumps(chunked, separators=(",", ":"))


def release(conn: sqlite3.Connection, chunked: Iterable[str | None]) -> None:
    """Give back the chunks of rows about to be deleted or rewritten (their ``chunks``
    values); a chunk no row uses any more is deleted. A value that is not what it should be
    is passed over: its chunks stay, unused, rather than the deletion failing."""
    released: Counter[str] = Counter()
    for value in chunked:
        if value is None:
            continue
        try:
            released.update(set(_digests(json.loads(value))))
        except (ValueError, TypeError, AttributeError):
            continue
    if released:
        conn.executemany(SQL_RELEASE_CHUNK, released.items())
        conn.executemany(SQL_DROP_UNUSED_CHUNK, [(digest,) for digest in released])


def _digests(chunked: dict[str, Places]) -> Iterable[str]:
    for places in chunked.values():
        for _, digests in places:
            yield from digests


def with_chunks(
    conn: sqlite3.Connection, rows: Sequence[tuple], texts_at: dict[str, int], where: str
) -> list[tuple]:
    """Rows read with their ``chunks`` value last: the same rows without it, each text put
    back together. ``texts_at``: where the body and the lists kept apart are in a row read
    (a text read as NULL -- the lists, by a lean read -- is left so). ``where`` names the run
    for errors. A chunk missing, or not the text its digest says, is a ``StoreCorruptError``."""
    if all(row[-1] is None for row in rows):
        return [row[:-1] for row in rows]
    places_of = [_chunked(row[-1], row, where) for row in rows]
    needed = {
        digest
        for row, chunked in zip(rows, places_of, strict=True)
        if chunked is not None
        for name, places in chunked.items()
        if row[texts_at[name]] is not None
        for _, digests in places
        for digest in digests
    }
    chunks = read_chunks(conn, needed, where) if needed else {}
    result = []
    for row, chunked in zip(rows, places_of, strict=True):
        texts = list(row[:-1])
        for name, places in (chunked or {}).items():
            at = texts_at[name]
            if texts[at] is not None:
                texts[at] = _assembled(texts[at], places, chunks, row, where)
        result.append(tuple(texts))
    return result


CHAIN_TEXTS = {"body": 3, "list_items": 6}
"""Where ``SQL_CHAIN``'s rows hold the texts ``with_chunks`` puts back together."""
STORED_LISTS_TEXTS = {"body": 2, "list_items": 4}
"""The same for ``SQL_STORED_LISTS``'s rows."""


def _chunked(value: Any, row: tuple, where: str) -> dict[str, Places] | None:
    if value is None:
        return None
    try:
        chunked = json.loads(value)
        if type(chunked) is not dict or not all(
            name in _COLUMNS
            and type(places) is list
            and all(
                type(place) is list
                and len(place) == 2
                and type(place[0]) is int
                and type(place[1]) is list
                and all(type(d) is str for d in place[1])
                for place in places
            )
            for name, places in chunked.items()
        ):
            raise ValueError("not the places of chunked arrays")
    except (ValueError, TypeError) as exc:
        raise StoreCorruptError(
            f"{where}: checkpoint {row[0]} (#{row[1]}) is damaged: its chunks column is not "
            f"what it should be ({exc})"
        ) from None
    return chunked


def read_chunks(conn: sqlite3.Connection, digests: Iterable[str], where: str) -> dict[str, str]:
    """The chunks of ``digests``, each checked against its digest."""
    wanted = sorted(digests)
    found: dict[str, str] = {}
    for first in range(0, len(wanted), _READ_AT_ONCE):
        batch = wanted[first : first + _READ_AT_ONCE]
        marks = ",".join("?" * len(batch))
        query = f"SELECT digest, items FROM list_chunks WHERE digest IN ({marks})"
        rows = fetch_rows(conn, query, batch)
        for digest, items in rows:
            if type(items) is not str or chunk_digest(items) != digest:
                raise StoreCorruptError(
                    f"{where}: stored chunk {digest} of a long list is damaged (its text is not "
                    "what its digest says)"
                )
            found[digest] = items
    missing = [digest for digest in wanted if digest not in found]
    if missing:
        raise StoreCorruptError(
            f"{where}: {len(missing)} stored chunk(s) of a long list are missing (the first: "
            f"{missing[0]})"
        )
    return found


def _assembled(text: Any, places: Places, chunks: dict[str, str], row: tuple, where: str) -> str:
    if type(text) is not str or any(text[offset : offset + 2] != "[]" for offset, _ in places):
        raise StoreCorruptError(
            f"{where}: checkpoint {row[0]} (#{row[1]}) is damaged: its text has no place where "
            "its chunks column says a long list goes"
        )
    for _, digests in places:
        for digest in digests:
            if not chunks[digest].startswith("[") or not chunks[digest].endswith("]"):
                raise StoreCorruptError(
                    f"{where}: stored chunk {digest} of a long list is damaged (not a list)"
                )
    return assemble(text, places, chunks)
