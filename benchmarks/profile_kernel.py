"""Profile the W1/W2 benchmark workloads with cProfile and print the kernel's hot spots.

    .venv/bin/python benchmarks/profile_kernel.py w1 --checkpoint --sort tottime
    .venv/bin/python benchmarks/profile_kernel.py w2 --sort cumtime --limit 40

Only the runs are profiled (the workflow is built first). cProfile inflates call-heavy code, so
read shares, not absolute times; use the bench_* scripts for the figures themselves.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats

import anyio
from bench_w1_chain import build_chain, build_self_loop
from bench_w2_fan import build_fan

from workflow_engine import CheckpointStore, InMemoryCheckpointStore, Workflow

WORKLOADS = {
    "w1": (build_chain, 0, 20),
    "w1b": (build_self_loop, 0, 20),
    "w2": (build_fan, 1, 30),
}


async def run_many(workflow: Workflow, message: int, runs: int, checkpoint: bool) -> None:
    for _ in range(runs):
        store: CheckpointStore | None = InMemoryCheckpointStore() if checkpoint else None
        await workflow.run(message, checkpoint_store=store, max_supersteps=10_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=sorted(WORKLOADS))
    parser.add_argument("-n", type=int, default=1_000, help="chain length / number of workers")
    parser.add_argument("--checkpoint", action="store_true", help="use InMemoryCheckpointStore")
    parser.add_argument("--sort", default="cumtime", help="pstats sort key (cumtime, tottime)")
    parser.add_argument("--limit", type=int, default=30, help="rows to print")
    args = parser.parse_args()
    build, message, runs = WORKLOADS[args.workload]
    workflow = build(args.n)
    anyio.run(run_many, workflow, message, 2, args.checkpoint)  # warm-up
    profiler = cProfile.Profile()
    profiler.enable()
    anyio.run(run_many, workflow, message, runs, args.checkpoint)
    profiler.disable()
    pstats.Stats(profiler).strip_dirs().sort_stats(args.sort).print_stats(args.limit)


if __name__ == "__main__":
    main()
