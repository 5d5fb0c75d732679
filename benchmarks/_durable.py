"""Shared helpers for the durable-run benchmarks (W3-W5): temp SQLite files, file sizes, I/O."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from workflow_engine.storage import SqliteStore


@contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory for SQLite files, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as name:
        yield Path(name)


async def open_store(path: Path, synchronous: str = "NORMAL") -> SqliteStore:
    """A SqliteStore on a fresh file, opened (connected, schema created) before timing."""
    store = SqliteStore(path, synchronous=synchronous)
    await store.open()
    return store


def db_bytes(path: Path) -> int:
    """Size of the database file plus its WAL file (0 for a file that does not exist)."""
    total = 0
    for p in (path, path.with_name(path.name + "-wal")):
        with suppress(FileNotFoundError):
            total += p.stat().st_size
    return total


def written_bytes() -> int | None:
    """Bytes this process has passed to write(2) so far (``wchar`` of /proc/self/io), or None.

    Counts WAL frames and WAL-to-database checkpoint copies alike: the real write volume.
    """
    try:
        with open(f"/proc/{os.getpid()}/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def kib(n: float) -> str:
    return f"{n / 1024:.2f} KiB"
