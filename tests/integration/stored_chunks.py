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
    """Each chunk is counted by exactly the rows that use it, and no chunk is unused. How
    many chunks there are."""
    with sqlite3.connect(db) as conn:
        used: Counter[str] = Counter()
        for (chunked,) in conn.execute(
            "SELECT chunks FROM checkpoints WHERE chunks IS NOT NULL"
        ).fetchall():
            digests = {d for places in json.loads(chunked).values() for _, ds in places for d in ds}
            used.update(digests)
        counted = dict(conn.execute("SELECT digest, refs FROM list_chunks").fetchall())
    assert counted == dict(used)
    return len(counted)
