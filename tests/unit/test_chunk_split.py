"""A large row's long arrays, split into chunks (``storage._chunks``), put back together as
exactly the row's text -- whatever the values -- and an array grown at its end shares its
first chunks with what it grew from."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from pydantic_core import to_json

from workflow_engine.storage._chunks import BIG_ITEM_CHUNKS, assemble, chunk_digest, split

# (a quarter in the fast tier, which has a minute: 100 took 4.9 s of it)
EXAMPLES = 50 if os.environ.get("PROPERTY_EXAMPLES") == "half" else 200
LONG, PER_CHUNK, CHARS, FANOUT = 6, 2, 12, 2  # (the store's 64, 32, 2,048 and 32, smaller)

leaf = st.one_of(
    st.integers(-(2**70), 2**70),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
    st.none(),
)
value = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=12),
        st.dictionaries(st.text(max_size=3), inner, max_size=4),
    ),
    max_leaves=40,
)
rows = st.dictionaries(st.text(max_size=4), value, min_size=1, max_size=5)


def has_long_array(data: Any, long: int = LONG) -> bool:
    if type(data) is list:
        return len(data) >= long or any(has_long_array(item, long) for item in data)
    if type(data) is dict:
        return any(has_long_array(item, long) for item in data.values())
    return False


@settings(max_examples=EXAMPLES, deadline=None)
@given(rows)
def test_a_split_row_is_put_back_together_exactly(row: dict[str, Any]) -> None:
    text = to_json(row).decode()
    parts = split(text, LONG, PER_CHUNK, CHARS, FANOUT)
    if parts is None:
        event("not split")
        assert not has_long_array(row) or text != to_json(json.loads(text)).decode()
        return
    event("split")
    stored, places, chunks = parts
    assert assemble(stored, places, chunks) == text
    for offset, keys, levels in places:
        assert stored[offset : offset + 2] == "[]"
        assert len(keys) <= FANOUT
        for _ in range(levels):  # index chunks, keyed "i" + the digest of their text
            assert all(key == "i" + chunk_digest(chunks[key]) for key in keys)
            keys = [listed for key in keys for listed in json.loads(chunks[key])]
        assert all(chunk_digest(chunks[key]) == key for key in keys)
    # the top level's long arrays are out (nested ones travel inside their array's chunks)
    left = json.loads(stored)
    assert not any(type(v) is list and len(v) >= LONG for v in left.values())
    # each chunk of items but the last: PER_CHUNK items, doubled while short -- or fewer, up
    # to a big item (``BIG_ITEM_CHUNKS`` chunks' characters), which ends it
    for place in places:
        leaves = levels_of(place, chunks)[0]
        for key in leaves[:-1]:
            items = json.loads(chunks[key])
            sizes = [len(to_json(item)) for item in items]  # (UTF-8 bytes)
            assert not any(size > BIG_ITEM_CHUNKS * CHARS for size in sizes[:-1]), items
            if sizes[-1] > BIG_ITEM_CHUNKS * CHARS:
                continue
            assert len(items) in {PER_CHUNK * 2**j for j in range(12)}, items
            half = to_json(items[: len(items) // 2]).decode()
            assert len(items) == PER_CHUNK or len(half) < CHARS


@pytest.mark.slow  # (2 s of the fast tier's minute; `make test` runs it)
@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(value, min_size=LONG, max_size=60), st.lists(value, min_size=1, max_size=10))
def test_an_array_grown_at_its_end_shares_its_full_chunks(
    items: list[Any], more: list[Any]
) -> None:
    """...and the index chunks over them, level by level: all but the last at each level."""
    before = split(to_json({"conversation": items}).decode(), LONG, PER_CHUNK, CHARS, FANOUT)
    grown = to_json({"conversation": [*items, *more]}).decode()
    after = split(grown, LONG, PER_CHUNK, CHARS, FANOUT)
    assert before is not None and after is not None
    for level, keys in enumerate(levels_of(before[1][0], before[2])):
        assert set(keys[:-1]) <= set(after[2]), (level, keys)


def levels_of(place: list[Any], chunks: dict[str, str]) -> list[list[str]]:
    """A place's keys level by level, from the chunks of items up."""
    keys, levels = place[1], place[2]
    found = [keys]
    for _ in range(levels):
        keys = [listed for key in keys for listed in json.loads(chunks[key])]
        found.append(keys)
    return found[::-1]


def test_text_another_writer_spaced_is_stored_whole() -> None:
    """Only the compact JSON pydantic writes is split: other text would not come back the
    same, byte for byte."""
    spaced = json.dumps({"a": list(range(10))})
    assert split(spaced, LONG, PER_CHUNK, CHARS, FANOUT) is None
    compact = json.dumps({"a": list(range(10))}, separators=(",", ":"))
    parts = split(compact, LONG, PER_CHUNK, CHARS, FANOUT)
    assert parts is not None and assemble(*parts) == compact


def test_a_string_like_the_place_mark_does_not_confuse_the_split() -> None:
    row = {"a": list(range(8)), "b": "\x00" + "0" * 16 + ":0", "c": [str(i) for i in range(9)]}
    text = to_json(row).decode()
    parts = split(text, LONG, PER_CHUNK, CHARS, FANOUT)
    assert parts is not None and assemble(*parts) == text
    assert len(parts[1]) == 2


def test_a_big_item_ends_its_chunk_so_later_runs_do_not_store_it_again() -> None:
    """A chunk is rewritten until it is full: a 300 KB message pasted into an AG-UI thread
    was stored again by each of the next runs whose arrays ended in its chunk (outside tester
    184). An item past ``BIG_ITEM_CHUNKS`` chunks' characters ends its chunk: every array
    grown after it stores it in the same chunk."""
    for big in ("x" * (BIG_ITEM_CHUNKS * CHARS + 1), "\N{GRINNING FACE}" * (CHARS + 1)):
        assert chunks_holding(big) == 1, big


def chunks_holding(big: str) -> int:
    """How many chunks hold ``big`` over eight runs of a thread it arrives in."""
    holding: set[str] = set()
    history: list[Any] = [f"m{i}" for i in range(LONG)] + [big]
    for n in range(8):  # the thread grows a message a run
        parts = split(to_json({"conversation": history}).decode(), LONG, 8, CHARS, FANOUT)
        assert parts is not None
        _, places, chunks = parts
        for key in levels_of(places[0], chunks)[-1]:
            if big in chunks[key]:
                holding.add(key)
        history.append(f"after {n}")
    return len(holding)
