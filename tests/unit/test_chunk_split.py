"""A large row's long arrays, split into chunks (``storage._chunks``), put back together as
exactly the row's text -- whatever the values -- and an array grown at its end shares its
first chunks with what it grew from."""

from __future__ import annotations

import json
import os
from typing import Any

from hypothesis import event, given, settings
from hypothesis import strategies as st
from pydantic_core import to_json

from workflow_engine.storage._chunks import assemble, chunk_digest, split

EXAMPLES = 100 if os.environ.get("PROPERTY_EXAMPLES") == "half" else 200
LONG, PER_CHUNK = 6, 4  # (the same code as the store's 64 and 32, on smaller values)

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
    parts = split(text, LONG, PER_CHUNK)
    if parts is None:
        event("not split")
        assert not has_long_array(row) or text != to_json(json.loads(text)).decode()
        return
    event("split")
    stored, places, chunks = parts
    assert assemble(stored, places, chunks) == text
    for offset, digests in places:
        assert stored[offset : offset + 2] == "[]"
        assert all(chunk_digest(chunks[digest]) == digest for digest in digests)
    # the top level's long arrays are out (nested ones travel inside their array's chunks)
    left = json.loads(stored)
    assert not any(type(v) is list and len(v) >= LONG for v in left.values())
    assert all(len(json.loads(chunk)) <= PER_CHUNK for chunk in chunks.values())


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.lists(value, min_size=LONG, max_size=30), st.lists(value, min_size=1, max_size=10))
def test_an_array_grown_at_its_end_shares_its_full_chunks(
    items: list[Any], more: list[Any]
) -> None:
    before = split(to_json({"conversation": items}).decode(), LONG, PER_CHUNK)
    after = split(to_json({"conversation": [*items, *more]}).decode(), LONG, PER_CHUNK)
    assert before is not None and after is not None
    full = len(items) // PER_CHUNK
    assert before[1][0][1][:full] == after[1][0][1][:full]
    assert set(after[2]) - set(before[2]) <= set(after[1][0][1][full:])


def test_text_another_writer_spaced_is_stored_whole() -> None:
    """Only the compact JSON pydantic writes is split: other text would not come back the
    same, byte for byte."""
    spaced = json.dumps({"a": list(range(10))})
    assert split(spaced, LONG, PER_CHUNK) is None
    compact = json.dumps({"a": list(range(10))}, separators=(",", ":"))
    parts = split(compact, LONG, PER_CHUNK)
    assert parts is not None and assemble(*parts) == compact


def test_a_string_like_the_place_mark_does_not_confuse_the_split() -> None:
    row = {"a": list(range(8)), "b": "\x00" + "0" * 16 + ":0", "c": [str(i) for i in range(9)]}
    text = to_json(row).decode()
    parts = split(text, LONG, PER_CHUNK)
    assert parts is not None and assemble(*parts) == text
    assert len(parts[1]) == 2
