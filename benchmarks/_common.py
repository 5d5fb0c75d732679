"""Shared helpers for the benchmark scripts: the timing loop and checkpoint-store factories."""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Awaitable, Callable

from workflow_engine import CheckpointStore, InMemoryCheckpointStore

RunOnce = Callable[[CheckpointStore | None], Awaitable[None]]


def no_store() -> CheckpointStore | None:
    return None


def memory_store() -> CheckpointStore | None:
    return InMemoryCheckpointStore()


def add_common_args(parser: argparse.ArgumentParser, repeats: int) -> None:
    parser.add_argument("-r", "--repeats", type=int, default=repeats, help="timed runs per figure")
    parser.add_argument(
        "--no-gc", action="store_true", help="disable the cyclic GC inside the timed region"
    )


def gc_note(no_gc: bool) -> str:
    return ", GC off" if no_gc else ""


async def median_seconds(
    run_once: RunOnce,
    make_store: Callable[[], CheckpointStore | None],
    repeats: int,
    *,
    no_gc: bool = False,
    warmup: int = 1,
) -> float:
    """Median wall time of ``run_once`` over ``repeats`` runs.

    Each run gets a fresh store, made outside the timed region; the GC is collected before each
    run (and, with ``no_gc``, disabled while it is timed).
    """
    for _ in range(warmup):
        await run_once(make_store())
    samples: list[float] = []
    for _ in range(repeats):
        store = make_store()
        gc.collect()
        if no_gc:
            gc.disable()
        try:
            start = time.perf_counter()
            await run_once(store)
            samples.append(time.perf_counter() - start)
        finally:
            gc.enable()
    return statistics.median(samples)
