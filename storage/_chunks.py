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
An array of more than ``FANOUT`` chunks is named by *index* chunks, each listing ``FANOUT``
chunks' digests (and so on, level by level), so that what a row stores stays small however long
its arrays grow: the full index chunks are shared like the rest.

The row keeps its text with ``[]`` in each array's place, and ``chunks`` (JSON) says where each
place is, which chunks fill it and through how many levels of index. Put back together, the text
is the row's text exactly: a row is split only if that holds (checked as it is split), and each
chunk read is checked against its digest (an index chunk's key is its digest after ``i``: it is
never taken for a chunk of items with the same text). A chunked row's checkpoint schema version
is at least ``CHUNKED_VERSION``, so an engine that would read its arrays empty refuses it.

``list_chunks.refs`` counts the rows and index chunks that use a chunk. Writing a row counts its
chunks (``stored_row``); the database's triggers (``RELEASE_TRIGGERS``) give them back when a
row is deleted or its chunks rewritten, delete a chunk no one uses, and have a deleted index
chunk give back those it lists -- whatever process deletes, an older engine's prune included.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
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
"""Items per chunk (the last chunk of an array may hold fewer; short items, more)."""
CHUNK_CHARS = 2048
"""Characters of text a chunk holds at least, doubling its items until it does (but the last)."""
CHUNKED_VERSION = 6
"""The checkpoint schema version a chunked row says at least (see ``CHECKPOINT_SCHEMA_VERSION``)."""
BIG_ITEM_CHUNKS = 4
"""An item of more than this many ``CHUNK_CHARS`` (in UTF-8 bytes) ends its chunk (``_cut``)."""
FANOUT = 32
"""Chunks named by one index chunk (and the most a place names itself)."""
INDEX = "i"
"""What an index chunk's key starts with (before the digest of its text)."""
CHUNKING = (CHUNKED_FROM, LONG_ARRAY, CHUNK_ITEMS, CHUNK_CHARS, FANOUT)
"""These, in this order, as a store applies them (tests set smaller ones)."""

_COLUMNS = ("body", "list_items")
"""The row texts that may be chunked."""
_READ_AT_ONCE = 500
"""Chunks read per query (SQLite bounds a statement's parameters)."""

SQL_PUT_CHUNK = (
    "INSERT INTO list_chunks (digest, items, refs) VALUES (?1, ?2, 1) "
    "ON CONFLICT (digest) DO UPDATE SET refs = refs + 1"
)
SQL_PUT_INDEX_CHUNK = f"{SQL_PUT_CHUNK} RETURNING refs"  # (new: it uses those it lists)
_KEYS_OF_OLD_ROW = "SELECT value FROM json_tree(OLD.chunks) WHERE type = 'text'"
_KEYS_OF_OLD_INDEX = "SELECT value FROM json_each(OLD.items) WHERE type = 'text'"


def _released(name: str, event: str, when: str, keys: str) -> str:
    return (
        f"CREATE TRIGGER IF NOT EXISTS {name} AFTER {event} WHEN {when} BEGIN "
        f"UPDATE list_chunks SET refs = refs - 1 WHERE digest IN ({keys}); "
        f"DELETE FROM list_chunks WHERE refs <= 0 AND digest IN ({keys}); END"
    )


RELEASE_TRIGGERS = (
    # a row deleted, or its chunks rewritten (prune making a snapshot): each chunk it names
    # is used once less (the only strings of a ``chunks`` value are chunk keys)
    _released(
        "checkpoint_chunks_deleted",
        "DELETE ON checkpoints",
        "OLD.chunks IS NOT NULL AND json_valid(OLD.chunks)",
        _KEYS_OF_OLD_ROW,
    ),
    _released(
        "checkpoint_chunks_rewritten",
        "UPDATE OF chunks ON checkpoints",
        "OLD.chunks IS NOT NULL AND json_valid(OLD.chunks)",
        _KEYS_OF_OLD_ROW,
    ),
    # an index chunk deleted: each chunk it lists is used once less (deeper indexes need
    # ``recursive_triggers``, which this engine's connections turn on)
    _released(
        "index_chunk_deleted",
        "DELETE ON list_chunks",
        f"substr(OLD.digest, 1, 1) = '{INDEX}' AND json_valid(OLD.items)",
        _KEYS_OF_OLD_INDEX,
    ),
)
"""What keeps ``list_chunks.refs`` right when rows go, whoever deletes them. A ``chunks`` value
or an index chunk that is not JSON gives nothing back (its chunks stay, unused): the deletion
does not fail on a damaged row."""


def chunk_digest(text: str) -> str:
    """A chunk's key: the digest of its JSON text."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


Places = list[list[Any]]
"""Where a text's chunked arrays were: ``[offset of their "[]", [chunk keys], levels of index
above the chunks of items (0: the keys are theirs)]``, in order."""


def split(
    text: str,
    long_array: int = LONG_ARRAY,
    chunk_items: int = CHUNK_ITEMS,
    chunk_chars: int = CHUNK_CHARS,
    fanout: int = FANOUT,
) -> tuple[str, Places, dict[str, str]] | None:
    """``text`` with each long array (``long_array`` items or more) replaced by ``[]``, where
    those are, and the chunks (of ``chunk_items`` or more, see ``_cut``; index chunks of
    ``fanout`` keys) by key. None if it has no long array, or if its parts would not put back
    together as exactly ``text`` (then it is stored whole)."""
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
            cut = _cut(arrays[i], chunk_items, chunk_chars)
            keys = [_leaf(chunk, chunks) for chunk in cut]
            levels = 0
            while len(keys) > fanout:
                keys = [_index(keys[j : j + fanout], chunks) for j in range(0, len(keys), fanout)]
                levels += 1
            places.append([length, keys, levels])
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


def _cut(array: list[Any], chunk_items: int, chunk_chars: int) -> Iterable[str]:
    """The texts of ``array``'s chunks: from its start, each ``chunk_items`` items, or twice,
    four times... as many while that is fewer than ``chunk_chars`` characters (a chunk of 32
    numbers is a few bytes: its row would weigh more) -- or fewer, up to an item of more than
    ``BIG_ITEM_CHUNKS`` chunks' characters (in UTF-8 bytes), which ends its chunk (a chunk is
    rewritten until it is full: a 300 KB message pasted into a thread was stored again by the
    next 8 runs, each writing it three times -- outside tester 184). Where one ends depends
    only on the items from where it starts: an array grown at its end is cut as before, up to
    its last chunk."""
    first = 0
    big = BIG_ITEM_CHUNKS * chunk_chars
    while first < len(array):
        size = chunk_items
        chunk = to_json(array[first : first + size]).decode()
        while len(chunk) < chunk_chars and first + size < len(array):
            size *= 2
            chunk = to_json(array[first : first + size]).decode()
        if 4 * len(chunk) > big:  # (an item that big, if any, ends the chunk; in UTF-8:
            # its bytes are what is stored again -- 7,000 emoji are 28 KB, outside tester 187)
            for end, item in enumerate(array[first : first + size - 1], first + 1):
                if len(to_json(item)) > big:
                    size = end - first
                    chunk = to_json(array[first:end]).decode()
                    break
        yield chunk
        first += size


def _leaf(chunk: str, chunks: dict[str, str]) -> str:
    """A chunk of items, added to ``chunks``; its key."""
    key = chunk_digest(chunk)
    chunks[key] = chunk
    return key


def _index(keys: list[str], chunks: dict[str, str]) -> str:
    """An index chunk listing ``keys``, added to ``chunks``; its key."""
    text = json.dumps(keys, separators=(",", ":"))
    key = INDEX + chunk_digest(text)
    chunks[key] = text
    return key


def assemble(text: str, places: Places, chunks: dict[str, str]) -> str:
    """The text ``split`` took apart: each place's ``[]`` filled with its chunks' items."""
    pieces: list[str] = []
    start = 0
    for offset, keys, levels in places:
        pieces.append(text[start:offset])
        pieces.append("[")
        pieces.append(",".join(chunks[key][1:-1] for key in _leaves(keys, levels, chunks)))
        pieces.append("]")
        start = offset + 2
    pieces.append(text[start:])
    return "".join(pieces)


def _leaves(keys: list[str], levels: int, chunks: dict[str, str]) -> list[str]:
    """The keys of the chunks of items that ``keys`` name through ``levels`` of index."""
    for _ in range(levels):
        keys = [key for index in keys for key in json.loads(chunks[index])]
    return keys


Chunking = tuple[int, int, int, int, int]
Split = tuple[str, "str | None", str, dict[str, str], set[str]]
"""How a row's texts split: its body and lists kept apart as stored, its ``chunks`` value, the
chunks by key, and the keys the row names itself."""


def with_split(row: tuple, chunking: Chunking = CHUNKING) -> tuple:
    """``row`` (a checkpoint row's 12 parameters) with how its long texts split after them (or
    ``row`` itself: nothing to split). Worked out before the write lock is taken -- splitting
    12 MB of numbers takes 0.2 s, which other writers waited for (outside tester 126) -- and
    stored by ``stored_row`` inside it."""
    body, list_items = row[8], row[11]
    if len(body) < chunking[0] and (list_items is None or len(list_items) < chunking[0]):
        return row  # (most rows: nothing to look at)
    return (*row, split_texts(body, list_items, chunking))


def stored_row(conn: sqlite3.Connection, row: tuple, chunking: Chunking = CHUNKING) -> tuple:
    """A checkpoint row's ``SQL_INSERT_CHECKPOINT`` parameters (``row``, then its ``chunks``)
    with its long texts chunked (as ``with_split`` found, or now), and their chunks counted: in
    the transaction that writes it. A chunked row says ``CHUNKED_VERSION`` at least."""
    if len(row) == 12:  # (nothing to split, or a row rebuilt inside the transaction)
        row = with_split(row, chunking)
    if len(row) == 12 or row[12] is None:
        return (*row[:12], None)
    body, list_items, chunked, chunks, keys = row[12]
    store_chunks(conn, keys, chunks)
    version = max(row[7], CHUNKED_VERSION)
    return (*row[:7], version, body, *row[9:11], list_items, chunked)


def split_texts(body: str, list_items: str | None, chunking: Chunking = CHUNKING) -> Split | None:
    """How a row's body and lists kept apart split (None: nothing chunked). No database."""
    texts = {"body": body, "list_items": list_items}
    chunked: dict[str, Places] = {}
    chunks: dict[str, str] = {}  # (a chunk in both texts is one use by the row)
    smallest, long_array, chunk_items, chunk_chars, fanout = chunking
    for name, text in texts.items():
        if text is None or len(text) < smallest:
            continue
        parts = split(text, long_array, chunk_items, chunk_chars, fanout)
        if parts is None:
            continue
        texts[name], chunked[name], found = parts
        chunks.update(found)
    if not chunked:
        return None
    keys = {key for places in chunked.values() for _, keys, _ in places for key in keys}
    stored_body = texts["body"]
    assert stored_body is not None
    places = json.dumps(chunked, separators=(",", ":"))
    return stored_body, texts["list_items"], places, chunks, keys


def store_chunks(conn: sqlite3.Connection, keys: Iterable[str], chunks: dict[str, str]) -> None:
    """Count one more use of each chunk of ``keys`` (a row's, or a new index chunk's: each
    once), storing those that are new; a new index chunk uses those it lists. The chunks of
    items go in one statement (thousands for a long array)."""
    conn.executemany(SQL_PUT_CHUNK, [(key, chunks[key]) for key in keys if key[:1] != INDEX])
    for key in keys:
        if key[:1] == INDEX:
            (refs,) = conn.execute(SQL_PUT_INDEX_CHUNK, (key, chunks[key])).fetchone()
            if refs == 1:
                store_chunks(conn, set(json.loads(chunks[key])), chunks)


def with_chunks(
    conn: sqlite3.Connection, rows: Sequence[tuple], texts_at: dict[str, int], where: str
) -> list[tuple]:
    """Rows read with their ``chunks`` value last: the same rows without it, each text put
    back together. ``texts_at``: where the body and the lists kept apart are in a row read
    (a text read as NULL -- the lists, by a lean read -- is left so). ``where`` names the run
    for errors. A chunk missing, or not the text its key says, is a ``StoreCorruptError``. Read
    in one transaction with the rows: a prune between the two could delete chunks they name."""
    if all(row[-1] is None for row in rows):
        return [row[:-1] for row in rows]
    places_of = [_chunked(row[-1], row, where) for row in rows]
    needed = {
        key
        for row, chunked in zip(rows, places_of, strict=True)
        if chunked is not None
        for name, places in chunked.items()
        if row[texts_at[name]] is not None
        for _, keys, _ in places
        for key in keys
    }
    chunks: dict[str, str] = {}
    while needed:  # (level by level: the chunks an index chunk lists are read next)
        found = read_chunks(conn, needed, where)
        chunks.update(found)
        needed = {
            key
            for index, text in found.items()
            if index.startswith(INDEX)
            for key in _listed(index, text, where)
            if key not in chunks
        }
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
    """A row's ``chunks`` value, checked (the store never writes one that names nothing)."""
    if value is None:
        return None
    try:
        chunked = json.loads(value)
        if (
            type(chunked) is not dict
            or not chunked
            or not all(
                name in _COLUMNS and type(places) is list and places and all(map(_place, places))
                for name, places in chunked.items()
            )
        ):
            raise ValueError("not the places of chunked arrays")
    except (ValueError, TypeError) as exc:
        raise StoreCorruptError(
            f"{where}: checkpoint {row[0]} (#{row[1]}) is damaged: its chunks column is not "
            f"what it should be ({exc})"
        ) from None
    return chunked


def _place(place: Any) -> bool:
    """Whether ``place`` is ``[offset, [keys], levels]``."""
    return (
        type(place) is list
        and len(place) == 3
        and type(place[0]) is int
        and place[0] >= 0
        and type(place[1]) is list
        and bool(place[1])
        and all(type(key) is str for key in place[1])
        and type(place[2]) is int
        and place[2] >= 0
    )


def _listed(index: str, text: str, where: str) -> list[str]:
    """The keys index chunk ``index`` lists."""
    keys = json.loads(text)
    if type(keys) is not list or not keys or not all(type(key) is str for key in keys):
        raise StoreCorruptError(
            f"{where}: stored index chunk {index} of a long list is damaged (not a list of keys)"
        )
    return keys


def read_chunks(conn: sqlite3.Connection, keys: Iterable[str], where: str) -> dict[str, str]:
    """The chunks of ``keys``, each checked against its key."""
    wanted = sorted(keys)
    found: dict[str, str] = {}
    for first in range(0, len(wanted), _READ_AT_ONCE):
        batch = wanted[first : first + _READ_AT_ONCE]
        marks = ",".join("?" * len(batch))
        query = f"SELECT digest, items FROM list_chunks WHERE digest IN ({marks})"
        for key, items in fetch_rows(conn, query, batch):
            kind = INDEX if key.startswith(INDEX) else ""
            if type(items) is not str or kind + chunk_digest(items) != key:
                raise StoreCorruptError(
                    f"{where}: stored chunk {key} of a long list is damaged (its text is not "
                    "what its key says)"
                )
            found[key] = items
    missing = [key for key in wanted if key not in found]
    if missing:
        raise StoreCorruptError(
            f"{where}: {len(missing)} stored chunk(s) of a long list are missing (the first: "
            f"{missing[0]})"
        )
    return found


def _assembled(text: Any, places: Places, chunks: dict[str, str], row: tuple, where: str) -> str:
    damaged = f"{where}: checkpoint {row[0]} (#{row[1]}) is damaged"
    if type(text) is not str or any(text[offset : offset + 2] != "[]" for offset, _, _ in places):
        raise StoreCorruptError(
            f"{damaged}: its text has no place where its chunks column says a long list goes"
        )
    for _, keys, levels in places:
        for _ in range(levels):  # (each level's keys are index chunks', the last's are items')
            if not all(key.startswith(INDEX) for key in keys):
                raise StoreCorruptError(f"{damaged}: its chunks column names the wrong chunks")
            keys = _leaves(keys, 1, chunks)
        for key in keys:
            if key.startswith(INDEX) or not (chunks[key][:1] == "[" and chunks[key][-1:] == "]"):
                raise StoreCorruptError(
                    f"{damaged}: its chunks column names the wrong chunks ({key} is not items)"
                )
    return assemble(text, places, chunks)
