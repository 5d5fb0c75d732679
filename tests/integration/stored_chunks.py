"""What a database's chunked rows hold (see ``storage._chunks``), for tests."""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from pathlib import Path


def stored_bytes(db: Path) -> int:
    """What the checkpoint rows and the chunks of a database hold."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT sum(length(body) + coalesce(length(list_items), 0) + "
            "coalesce(length(chunks), 0)) FROM checkpoints"
        ).fetchone()[0]
        chunks = conn.execute("SELECT coalesce(sum(length(items)), 0) FROM list_chunks").fetchone()
    return int(rows or 0) + int(chunks[0])


def check_counts(db: Path) -> int:
    """Each chunk is counted by exactly the rows and index chunks that use it (each once),
    and no chunk is unused. How many chunks there are."""
    with sqlite3.connect(db) as conn:
        used: Counter[str] = Counter()
        for (chunked,) in conn.execute(
            "SELECT chunks FROM checkpoints WHERE chunks IS NOT NULL"
        ).fetchall():
            places = json.loads(chunked).values()
            used.update({key for text in places for _, keys, _ in text for key in keys})
        counted = {}
        for key, items, refs in conn.execute("SELECT digest, items, refs FROM list_chunks"):
            counted[key] = refs
            if key.startswith("i"):  # an index chunk: it uses the chunks it lists
                used.update(set(json.loads(items)))
    assert counted == dict(used)
    return len(counted)
