"""W2: one executor fans out to N workers, which fan in to one collector (3 supersteps).

Reports milliseconds per run, without checkpointing and with an ``InMemoryCheckpointStore``.
Building the workflow is setup and is not timed.

    .venv/bin/python benchmarks/bench_w2_fan.py
"""

from __future__ import annotations

import argparse

import anyio
from _common import (
    add_common_args,
    gc_note,
    median_seconds,
    memory_store,
    no_store,
)  # benchmarks/ is on sys.path

from workflow_engine import (
    CheckpointStore,
    Executor,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)


class Source(Executor):
    @handler
    async def on_int(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)


class Worker(Executor):
    @handler
    async def on_int(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n + 1)


class Collector(Executor):
    @handler
    async def on_batch(self, batch: list[int], ctx: WorkflowContext[None, int]) -> None:
        await ctx.yield_output(sum(batch))


def build_fan(n: int) -> Workflow:
    source = Source("source")
    workers = [Worker(f"w{i}") for i in range(n)]
    collector = Collector("collector")
    return (
        WorkflowBuilder("w2-fan", start=source)
        .add_fan_out_edges(source, workers)
        .add_fan_in_edges(workers, collector)
        .build()
    )


async def main(n: int, repeats: int, no_gc: bool) -> None:
    workflow = build_fan(n)

    async def run_once(store: CheckpointStore | None) -> None:
        result = await workflow.run(1, checkpoint_store=store)
        assert result.status is WorkflowRunState.IDLE, result.status
        assert result.outputs == [2 * n], result.outputs
        assert result.checkpoint is not None and result.checkpoint.superstep == 3

    plain = await median_seconds(run_once, no_store, repeats, no_gc=no_gc)
    checkpointed = await median_seconds(run_once, memory_store, repeats, no_gc=no_gc)
    print(
        f"W2  fan-out/fan-in N={n}: {plain * 1e3:.2f} ms/run "
        f"(median of {repeats}{gc_note(no_gc)}), "
        f"checkpointing in-memory: {checkpointed * 1e3:.2f} ms/run"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000, help="number of workers")
    add_common_args(parser, repeats=9)
    args = parser.parse_args()
    anyio.run(main, args.n, args.repeats, args.no_gc)
