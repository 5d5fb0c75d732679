"""Profile the durable workloads (W3 chain; W5 = W4's pause/answer/resume lifecycle x runs).

    .venv/bin/python benchmarks/profile_durable.py w3 -n 1000 --sort tottime
    .venv/bin/python benchmarks/profile_durable.py w5 --runs 200 --sort cumtime --limit 40
    .venv/bin/python benchmarks/profile_durable.py w5 --no-profile   # hops and worker time only

cProfile sees only the event-loop thread (kernel, runtime, anyio, pydantic); time spent waiting
for the store's worker thread shows there as ``epoll.poll``. So the script also counts the calls
that cross to that thread per superstep (W3) or per run (W5) -- each crossing is a queue put, a
thread wake-up and a ``call_soon_threadsafe`` back -- and how long the worker was busy running
them (the sqlite3 work itself, plus decoding checkpoints read back), by operation.
``--no-profile`` gives those figures without profiler overhead. Besides the usual pstats table
it prints the profile's own time grouped by package. cProfile inflates call-heavy code: read
shares, not absolute times.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from _durable import open_store, temp_dir
from bench_w3_durable_chain import build_chain
from bench_w4_pause_resume import ANSWER, START_MESSAGE, build_review

from workflow_engine import Runtime, WorkflowRunState
from workflow_engine.storage import _sqlite

HOPS: collections.Counter[str] = collections.Counter()
WORKER_BUSY: collections.Counter[str] = collections.Counter()  # seconds inside each call kind
WRITES: collections.Counter[str] = collections.Counter()  # store writes, by operation
TRANSACTIONS = collections.Counter[str]()  # write transactions: "alone" or "group"
_original_call = _sqlite.Worker.call
_original_write_one = _sqlite.SqliteStore._write_one
_original_write_batch = _sqlite.SqliteStore._write_batch

Workload = Callable[[], Awaitable[None]]


def _op_name(fn: Any, args: tuple[Any, ...]) -> str:
    """The store operation a hop runs (the transaction body for ``_transaction``)."""
    name = getattr(fn, "__name__", type(fn).__name__)
    if name == "_transaction" and len(args) > 1:
        name = getattr(args[1], "__name__", name)
    return name.lstrip("_")


async def _counting_call(self: Any, fn: Any, *args: Any, abandoned: Any = None) -> Any:
    """One hop to the store's thread, counted, with the time the thread spends on it."""
    name = _op_name(fn, args)
    HOPS[name] += 1

    def timed(*inner: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*inner)
        finally:
            WORKER_BUSY[name] += time.perf_counter() - start

    return await _original_call(self, timed, *args, abandoned=abandoned)


def _counting_write_one(self: Any, write: Any) -> Any:
    """A write in a transaction of its own, counted (a retry after a busy lock counts twice)."""
    WRITES[_op_name(write.body, ())] += 1
    TRANSACTIONS["alone"] += 1
    return _original_write_one(self, write)


def _counting_write_batch(self: Any, batch: list[Any]) -> None:
    """A group commit: one transaction for the writes of several runs."""
    live = [w for w in batch if w.future is not None and not w.future.done()]
    if live:
        TRANSACTIONS["group"] += 1
    for write in live:
        WRITES[_op_name(write.body, ())] += 1
    _original_write_batch(self, batch)


async def w3(tmp: Path, n: int, runs: int, separate: bool = False) -> tuple[Workload, int]:
    """``runs`` durable chains of ``n`` supersteps, each on a store opened beforehand."""
    workflow = build_chain(n)
    runtimes = []
    for i in range(runs):
        runtime = Runtime(await open_store(tmp / f"w3-{n}-{time.perf_counter_ns()}-{i}.db"))
        runtime.register(workflow)
        runtimes.append(runtime)

    async def go() -> None:
        for runtime in runtimes:
            result = await runtime.run(workflow.name, 0, max_supersteps=n + 10)
            assert result.outputs == [n]
            await runtime.close()

    return go, n * runs


async def w5(tmp: Path, n: int, runs: int, separate: bool = False) -> tuple[Workload, int]:
    """``runs`` W4 runs paused one after another, then each answered and resumed
    (``respond_and_resume``; ``separate``: ``respond`` then ``resume``)."""
    runtime = Runtime(await open_store(tmp / f"w5-{time.perf_counter_ns()}.db"))
    name = runtime.register(build_review())

    async def go() -> None:
        paused = []
        for _ in range(runs):
            result = await runtime.run(name, START_MESSAGE)
            assert result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
            paused.append((result.run_id, result.pending_requests[0].request_id))
        for run_id, request_id in paused:
            if separate:
                await runtime.respond(request_id, ANSWER)
                result = await runtime.resume(run_id)
            else:
                result = await runtime.respond_and_resume(request_id, ANSWER)
            assert result.status is WorkflowRunState.IDLE
        await runtime.close()

    return go, runs


WORKLOADS = {"w3": w3, "w5": w5}
GROUPS = (
    ("select.epoll", "wait for the worker thread (epoll)"),
    ("sqlalchemy", "sqlalchemy"),
    ("SimpleQueue", "queue put (thread wake-up)"),
    ("pydantic", "pydantic"),
    ("anyio", "anyio"),
    ("asyncio", "asyncio loop"),
    ("selectors", "asyncio loop"),
    ("workflow_engine/_codec", "kernel: codec"),
    ("workflow_engine", "kernel: other"),
    ("storage", "storage/_sqlite.py"),
    ("json", "json"),
)


def shares(stats: pstats.Stats) -> list[tuple[str, float]]:
    """The profile's own (tottime) seconds grouped by package, largest first."""
    totals: collections.Counter[str] = collections.Counter()
    for (filename, _line, func), row in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{filename}:{func}"
        group = next((g for key, g in GROUPS if key in where), "other")
        totals[group] += row[2]
    return totals.most_common()


async def main(args: argparse.Namespace) -> None:
    runs = args.runs if args.runs is not None else (3 if args.workload == "w3" else 200)
    unit = "superstep" if args.workload == "w3" else "run"
    with temp_dir("profile-durable-") as tmp:
        warm, _ = await WORKLOADS[args.workload](tmp, args.n, 1, args.separate)
        await warm()
        go, units = await WORKLOADS[args.workload](tmp, args.n, runs, args.separate)
        for counter in (HOPS, WORKER_BUSY, WRITES, TRANSACTIONS):
            counter.clear()
        profiler = cProfile.Profile()
        start = time.perf_counter()
        if args.no_profile:
            await go()
        else:
            profiler.enable()
            await go()
            profiler.disable()
        elapsed = time.perf_counter() - start
    print(
        f"{args.workload}: {units} {unit}s in {elapsed:.3f} s ({elapsed / units * 1e6:.0f} µs per "
        f"{unit}{'' if args.no_profile else ', under the profiler'}); store-thread hops per "
        f"{unit}: {sum(HOPS.values()) / units:.2f} "
        f"({', '.join(f'{k} {v / units:.2f}' for k, v in HOPS.most_common())})"
    )
    print(
        f"  store writes per {unit}: {sum(WRITES.values()) / units:.2f} "
        f"({', '.join(f'{k} {v / units:.2f}' for k, v in WRITES.most_common())}); write "
        f"transactions per {unit}: {sum(TRANSACTIONS.values()) / units:.2f} "
        f"({', '.join(f'{k} {v / units:.2f}' for k, v in TRANSACTIONS.most_common())})"
    )
    busy = sum(WORKER_BUSY.values())
    print(
        f"  store thread busy {busy / units * 1e6:.0f} µs per {unit} "
        f"({busy / elapsed:.0%} of wall time): "
        + ", ".join(f"{k} {v / units * 1e6:.0f} µs" for k, v in WORKER_BUSY.most_common(6))
    )
    if args.no_profile:
        return
    stats = pstats.Stats(profiler)
    total = sum(s for _, s in shares(stats)) or 1.0
    print(
        "  own time by package: "
        + ", ".join(f"{group} {s / total:.0%}" for group, s in shares(stats) if s / total >= 0.01)
    )
    stats.strip_dirs().sort_stats(args.sort).print_stats(args.limit)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("-n", type=int, default=1_000, help="W3 chain length")
    parser.add_argument("--runs", type=int, help="W3 runs (default 3) / W5 runs (default 200)")
    parser.add_argument("--no-profile", action="store_true", help="only count thread hops")
    parser.add_argument(
        "--separate", action="store_true", help="W5: answer with respond, then resume"
    )
    parser.add_argument("--sort", default="tottime", help="pstats sort key (tottime, cumtime)")
    parser.add_argument("--limit", type=int, default=30, help="rows to print")
    _sqlite.Worker.call = _counting_call  # type: ignore[method-assign]
    _sqlite.SqliteStore._write_one = _counting_write_one  # type: ignore[method-assign]
    _sqlite.SqliteStore._write_batch = _counting_write_batch  # type: ignore[method-assign]
    anyio.run(main, parser.parse_args())
