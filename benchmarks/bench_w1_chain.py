"""W1: a chain of N executors passing ``int + 1`` along; W1b: one executor looping to itself.

Reports microseconds per superstep (run time / supersteps), without checkpointing and with an
``InMemoryCheckpointStore``. Building the workflow is setup and is not timed.

    .venv/bin/python benchmarks/bench_w1_chain.py
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


class Step(Executor):
    @handler
    async def on_int(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n + 1)


class Last(Executor):
    @handler
    async def on_int(self, n: int, ctx: WorkflowContext[None, int]) -> None:
        await ctx.yield_output(n + 1)


class Loop(Executor):
    """Sends ``n + 1`` back to itself (the edge condition stops the loop at ``limit``)."""

    def __init__(self, id: str, limit: int) -> None:
        super().__init__(id)
        self.limit = limit

    @handler
    async def on_int(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        await ctx.send_message(n + 1)
        if n + 1 == self.limit:
            await ctx.yield_output(n + 1)


def build_chain(n: int) -> Workflow:
    nodes: list[Executor] = [Step(f"s{i}") for i in range(n - 1)]
    nodes.append(Last(f"s{n - 1}"))
    return WorkflowBuilder("w1-chain", start=nodes[0]).add_chain(nodes).build()


def build_self_loop(n: int) -> Workflow:
    a = Loop("a", n)
    return (
        WorkflowBuilder("w1b-self-loop", start=a).add_edge(a, a, condition=lambda m: m < n).build()
    )


async def measure(
    workflow: Workflow,
    message: int,
    expected: int,
    supersteps: int,
    repeats: int,
    no_gc: bool,
) -> tuple[float, float]:
    async def run_once(store: CheckpointStore | None) -> None:
        result = await workflow.run(message, checkpoint_store=store, max_supersteps=supersteps + 10)
        assert result.status is WorkflowRunState.IDLE, result.status
        assert result.outputs == [expected], result.outputs
        assert result.checkpoint is not None and result.checkpoint.superstep == supersteps

    plain = await median_seconds(run_once, no_store, repeats, no_gc=no_gc)
    checkpointed = await median_seconds(run_once, memory_store, repeats, no_gc=no_gc)
    return plain / supersteps * 1e6, checkpointed / supersteps * 1e6


async def main(n: int, repeats: int, no_gc: bool) -> None:
    chain = build_chain(n)
    plain, checkpointed = await measure(chain, 0, n, n, repeats, no_gc)
    print(
        f"W1  chain N={n}: {plain:.1f} µs/superstep (median of {repeats}{gc_note(no_gc)}), "
        f"checkpointing in-memory: {checkpointed:.1f} µs/superstep"
    )
    loop = build_self_loop(n)
    # the executor runs for 0, 1, ..., n - 1: n supersteps (the edge drops the message n).
    plain, checkpointed = await measure(loop, 0, n, n, repeats, no_gc)
    print(
        f"W1b self-loop N={n}: {plain:.1f} µs/superstep (median of {repeats}{gc_note(no_gc)}), "
        f"checkpointing in-memory: {checkpointed:.1f} µs/superstep"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000, help="chain length / loop iterations")
    add_common_args(parser, repeats=7)
    args = parser.parse_args()
    anyio.run(main, args.n, args.repeats, args.no_gc)
