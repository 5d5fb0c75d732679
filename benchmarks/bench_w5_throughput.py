"""W5: throughput of durable pause/resume -- 200 W4 runs started until paused, then all resumed.

Each run is W4's start → review (request port) → end. Phase 1 starts every run with
``runtime.run(...)`` until it pauses on its request; phase 2 answers each one and resumes it to
completion with ``respond_and_resume`` (the answer stored and the lease taken in one
transaction), or with ``--separate`` by ``respond`` then ``resume`` (one transaction each).
Both phases are timed, sequentially (one run after another) and concurrently (one anyio task
per run in a task group, at most ``--concurrency`` at a time), one process, one ``Runtime``, a
fresh SQLite file (WAL, ``synchronous=NORMAL``) per mode. Each mode is also run (up to three
rounds) over an ``InMemoryRunStore`` (the same ``Runtime``, no SQLite): what the kernel and
runtime alone cost, so a figure's store share is the difference.
Figures are runs per second, median over ``--repeats`` rounds (fewer if a mode's rounds have
already taken ``--budget`` seconds, so the script stays under a minute on a slow store).
``--gc-threshold 10000`` shows what collecting garbage less often gives: with thousands of
runs in flight, each collection of the youngest generation traverses many live objects and finds
few cycles.

    .venv/bin/python benchmarks/bench_w5_throughput.py
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
from _durable import open_store, temp_dir
from bench_floor import describe, measure_floor
from bench_w4_pause_resume import ANSWER, START_MESSAGE, build_review

from workflow_engine import Runtime, WorkflowRunState
from workflow_engine.storage import InMemoryRunStore

Phase = Callable[[], Awaitable[None]]


async def run_all(jobs: list[Callable[[], Awaitable[None]]], concurrency: int) -> None:
    """Run the jobs one after another (``concurrency`` 1) or as tasks of one task group, at
    most ``concurrency`` at a time (a ``CapacityLimiter``, only when it can limit: taking it
    costs each task a reschedule and objects the collector walks -- 26 → 18 µs a run at 200
    at once, and the W5 figures 5-15% -- while the floor it is compared with spawns bare
    tasks)."""
    if concurrency <= 1:
        for job in jobs:
            await job()
        return
    if concurrency >= len(jobs):  # all at once: a limiter would only cost
        async with anyio.create_task_group() as tg:
            for job in jobs:
                tg.start_soon(job)
        return
    limiter = anyio.CapacityLimiter(concurrency)

    async def limited(job: Callable[[], Awaitable[None]]) -> None:
        async with limiter:
            await job()

    async with anyio.create_task_group() as tg:
        for job in jobs:
            tg.start_soon(limited, job)


async def harness_seconds(count: int, concurrency: int, repeats: int = 5) -> float:
    """Seconds per job that ``run_all`` itself costs (its tasks, the limiter), each job doing
    nothing but yield once: the part of a W5 figure that is the harness, not the engine (the
    floor spawns bare asyncio tasks)."""

    async def empty() -> None:
        await anyio.lowlevel.checkpoint()

    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        await run_all([empty] * count, concurrency)
        samples.append((time.perf_counter() - t0) / count)
    return statistics.median(samples)


async def one_round(
    path: Path | None, runs: int, concurrency: int, separate: bool = False
) -> tuple[float, float]:
    """Seconds to pause ``runs`` runs, then seconds to answer and finish all of them (``path``
    None: over an ``InMemoryRunStore``)."""
    runtime = Runtime(InMemoryRunStore() if path is None else await open_store(path))
    name = runtime.register(build_review())
    paused: list[tuple[str, str]] = []

    async def start() -> None:
        result = await runtime.run(name, START_MESSAGE)
        assert result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, result.status
        paused.append((result.run_id, result.pending_requests[0].request_id))

    def finisher(run_id: str, request_id: str) -> Callable[[], Awaitable[None]]:
        async def finish() -> None:
            if separate:
                await runtime.respond(request_id, ANSWER)
                result = await runtime.resume(run_id)
            else:
                result = await runtime.respond_and_resume(request_id, ANSWER)
            assert result.status is WorkflowRunState.IDLE, result.status
            assert result.outputs == ["published"], result.outputs

        return finish

    try:
        await start()  # warm-up run, not counted
        await finisher(*paused.pop())()
        t0 = time.perf_counter()
        await run_all([start] * runs, concurrency)
        t1 = time.perf_counter()
        assert len(paused) == runs
        await run_all([finisher(r, q) for r, q in paused], concurrency)
        t2 = time.perf_counter()
    finally:
        await runtime.close()
    return t1 - t0, t2 - t1


async def main(
    runs: int, repeats: int, concurrency: list[int], budget: float, separate: bool
) -> None:
    modes = [("sequential", 1)] + [
        (f"concurrent (task group, ≤{c} at once)", c) for c in concurrency if c > 1
    ]
    answering = "respond, resume" if separate else "respond_and_resume"
    with temp_dir("w5-") as tmp:
        # (rounds of 1,000, as documented: SQLite checkpoints its WAL every ~1,000 pages, so
        # rounds of 100 or 200 steps put a checkpoint in some rounds only, and the floor moved
        # from 17 to 33 µs with the round size -- outside tester 169)
        floor = await measure_floor(tmp)
        print(describe(floor))
        for label, limit in modes:
            count = max(runs, limit)  # at least as many runs as may run at once
            pauses, resumes, totals = [], [], []
            began = time.perf_counter()
            for i in range(repeats):
                if i and time.perf_counter() - began > budget:
                    break
                pause_s, resume_s = await one_round(
                    tmp / f"w5-{limit}-{i}.db", count, limit, separate
                )
                pauses.append(count / pause_s)
                resumes.append(count / resume_s)
                totals.append(count / (pause_s + resume_s))
            med = statistics.median
            pause, resume = med(pauses), med(resumes)
            harness = await harness_seconds(count, limit)
            memory = [await one_round(None, count, limit, separate) for _ in range(min(3, repeats))]
            memory_pause_s = med(m[0] for m in memory)
            memory_resume_s = med(m[1] for m in memory)
            print(
                f"W5 {count} runs, {label}: start→paused {pause:,.0f} runs/s "
                f"({pause / floor.runs_per_s:.0%} of the floor), {answering}→done "
                f"{resume:,.0f} runs/s ({resume / floor.runs_per_s:.0%} of the floor), whole "
                f"lifecycle {med(totals):,.0f} runs/s (median of {len(totals)} rounds); "
                f"the harness alone (its tasks and any limiter, empty jobs): "
                f"{harness * 1e6:.1f} µs per run, {harness * floor.runs_per_s:.0%} of the floor's "
                f"time per run; "
                f"same Runtime over InMemoryRunStore (median of {len(memory)}): start→paused "
                f"{count / memory_pause_s:,.0f} runs/s, {answering}→done "
                f"{count / memory_resume_s:,.0f} runs/s"
            )
    print("  targets: ≥ 25% of the floor's runs/s in both directions; ≥ 2,000 runs/s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="runs per round (default 200)")
    parser.add_argument("-r", "--repeats", type=int, default=5, help="rounds per mode")
    parser.add_argument(
        "-c",
        "--concurrency",
        type=int,
        nargs="+",
        default=[200, 2_000],
        help="task-group concurrency limits (default 200 2000; a round has at least as many runs)",
    )
    parser.add_argument(
        "--budget", type=float, default=12.0, help="seconds per mode before rounds stop early"
    )
    parser.add_argument(
        "--gc-threshold",
        type=int,
        help="the garbage collector's youngest-generation threshold (Python's default: 700)",
    )
    parser.add_argument(
        "--separate",
        action="store_true",
        help="answer with respond, then resume (two transactions instead of one)",
    )
    args = parser.parse_args()
    if args.gc_threshold is not None:
        gc.set_threshold(args.gc_threshold, *gc.get_threshold()[1:])
        print(f"gc thresholds {gc.get_threshold()}")
    anyio.run(main, args.runs, args.repeats, args.concurrency, args.budget, args.separate)
