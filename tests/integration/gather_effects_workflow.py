"""A loop whose executors run two effects at once (``asyncio.gather`` of two ``run_once``), for
tests that SIGKILL the process driving it (``test_effects_in_flight.py``).

Each effect appends "<idempotency key> <label>" to a ledger file (fsynced: the outside world's
record) at a random moment of a short sleep. Run as a script, it drives the run ``r1`` of
``DB`` to its end, answering each effect in doubt truthfully from the ledger:

    python -m tests.integration.gather_effects_workflow DB LEDGER
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from typing import Any

import anyio

from workflow_engine import (
    Executor,
    Runtime,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.storage import SqliteStore

ROUNDS = 4
EFFECTS = ROUNDS * 6 + 1
"""Per round: the start's, two for each of two workers, the join's; then the last start's."""


def book(ledger: str, key: str, label: str) -> None:
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{key} {label}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


async def effect(ctx: WorkflowContext[Any, Any], step: str, label: str) -> str:
    key = ctx.idempotency_key(step)
    ledger = os.environ["GATHER_LEDGER"]

    async def act() -> str:
        await asyncio.sleep(random.random() * 0.04)
        book(ledger, key, label)
        await asyncio.sleep(random.random() * 0.04)
        return f"did {label}"

    return await ctx.run_once(step, act, description={"label": label})


class Start(Executor):
    @handler
    async def go(self, round_no: int, ctx: WorkflowContext[int, str]) -> None:
        did = await effect(ctx, "start", f"{round_no}-start")
        if round_no >= ROUNDS:
            await ctx.yield_output(did)
        else:
            await ctx.send_message(round_no)


class Pair(Executor):
    @handler
    async def go(self, round_no: int, ctx: WorkflowContext[int]) -> None:
        await asyncio.gather(
            effect(ctx, "a", f"{round_no}-{self.id}-a"), effect(ctx, "b", f"{round_no}-{self.id}-b")
        )
        await ctx.send_message(round_no)


class Join(Executor):
    @handler
    async def go(self, rounds: list[int], ctx: WorkflowContext[int, str]) -> None:
        await ctx.yield_output(await effect(ctx, "join", f"{rounds[0]}-join"))
        await ctx.send_message(rounds[0] + 1)


def build() -> Workflow:
    start, left, right, join = Start("start"), Pair("left"), Pair("right"), Join("join")
    return (
        WorkflowBuilder(name="gather", start=start)
        .add_fan_out_edges(start, [left, right])
        .add_fan_in_edges([left, right], join)
        .add_edge(join, start)
        .build()
    )


async def drive(db: str, ledger: str) -> None:
    runtime = Runtime(SqliteStore(db))
    runtime.register(build)
    try:
        if not await runtime.list_runs():
            await runtime.start("gather", 0, run_id="r1")
        while (await runtime.get_run("r1")).status is not WorkflowRunState.IDLE:
            await runtime.resume("r1")
            for asked in await runtime.pending_requests("r1"):
                with open(ledger, "a+") as f:
                    f.seek(0)
                    happened = asked.data.idempotency_key in f.read()
                label = asked.data.description["label"]
                answer: dict[str, Any] = {"happened": happened}
                if happened:
                    answer["result"] = f"did {label}"
                await runtime.respond(asked.request_id, answer)
    finally:
        await runtime.close()


if __name__ == "__main__":
    os.environ["GATHER_LEDGER"] = sys.argv[2]
    anyio.run(drive, sys.argv[1], sys.argv[2])
