"""The physical floor of a durable step on this machine, to read W3 and W5 against.

* step floor: one asyncio task plus one SQLite commit (WAL, ``synchronous=NORMAL``, default
  settings otherwise, so SQLite's own automatic WAL checkpoints are included) of a ~1 KB row
  keyed ``(run_id, seq)`` -- the least a durable superstep can cost: the kernel must at least
  schedule the step, and the store must at least commit it (µs per step);
* runs/s floor: two tasks and one such commit per run -- the least a W5 phase can cost per run
  (a paused run is at least one task for its superstep and one commit; answer + resume at
  least as much).

Both are medians over ``--repeats`` rounds on a fresh file. W3 and W5 measure the floor in
their own process, beside their figures, and print the ratio to it.

    .venv/bin/python benchmarks/bench_floor.py
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from _durable import temp_dir

ROW = "x" * 1000


@dataclass
class Floor:
    step_us: float
    """One task + one commit, µs."""
    runs_per_s: float
    """Two tasks + one commit per run."""


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS steps (run_id TEXT NOT NULL, seq INTEGER NOT NULL, "
        "body TEXT NOT NULL, PRIMARY KEY (run_id, seq))"
    )
    return conn


async def _rounds(path: Path, count: int, repeats: int, tasks_per_commit: int) -> float:
    """Median seconds per item over ``repeats`` rounds of ``count`` items."""
    conn = _connect(path)
    seq = 0

    def commit() -> None:
        nonlocal seq
        seq += 1
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO steps VALUES (?, ?, ?)", (f"run-{seq % 64}", seq, ROW))
        conn.execute("COMMIT")

    async def step() -> None:
        commit()

    async def nothing() -> None:
        return None

    samples = []
    try:
        for i in range(repeats + 1):
            start = time.perf_counter()
            for _ in range(count):
                for _ in range(tasks_per_commit - 1):
                    await asyncio.create_task(nothing())
                await asyncio.create_task(step())
            if i:  # the first round is a warm-up
                samples.append((time.perf_counter() - start) / count)
    finally:
        conn.close()
    return statistics.median(samples)


async def measure_floor(tmp: Path, count: int = 1_000, repeats: int = 5) -> Floor:
    """The floor, measured now (on asyncio, which the benchmarks run on)."""
    step = await _rounds(tmp / "floor-step.db", count, repeats, 1)
    run = await _rounds(tmp / "floor-run.db", count, repeats, 2)
    return Floor(step * 1e6, 1 / run)


def describe(floor: Floor) -> str:
    return (
        f"floor on this machine: {floor.step_us:.1f} µs per step (1 task + 1 SQLite WAL NORMAL "
        f"commit of a 1 KB row), {floor.runs_per_s:,.0f} runs/s (2 tasks + 1 commit per run)"
    )


async def main(count: int, repeats: int) -> None:
    with temp_dir("floor-") as tmp:
        print(describe(await measure_floor(tmp, count, repeats)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000, help="steps per round (default 1,000)")
    parser.add_argument("-r", "--repeats", type=int, default=5, help="rounds (default 5)")
    args = parser.parse_args()
    asyncio.run(main(args.n, args.repeats))
