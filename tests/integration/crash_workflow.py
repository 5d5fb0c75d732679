"""The workflow the crash-safety harness kills: a loop, a human pause, another loop.

``stepper`` counts ``Tick``s in its own state and in shared state, fanning every tick out to
itself and to ``mirror`` (so most supersteps run two executors concurrently). After ``ticks_a``
ticks it asks the ``approve`` port; the answer starts ``ticks_b`` more ticks, after which it
yields a summary. ``mirror`` yields one output per tick, built from its own state and the shared
state committed at the previous barrier, so outputs only match an uninterrupted run if every
piece of state was restored exactly.

``decided`` keeps the answer's note through a journaled step (``ctx.run_once("note", ...,
idempotent=True)``): a re-executed superstep replays the journaled note instead of running the
step again, unless the process died before the result was durable; once the superstep commits,
its journal entry is compacted away.

Every invocation appends ``superstep=<n> executor=<id> run=<run_id> pid=<pid>`` to the file
named by ``$CRASH_SIDE_EFFECT_LOG`` (one ``write`` on an ``O_APPEND`` descriptor, so a line is
either there whole or not at all when the process is killed), and so does every run of the
journaled step, as executor ``stepper:note``: the harness uses it to see which supersteps and
steps ran more than once. ``Decision.delay`` makes every later invocation sleep, so two
processes resuming one run overlap.
"""

from __future__ import annotations

import os
from typing import Any, Never

import anyio
from pydantic import BaseModel

from workflow_engine import (
    Executor,
    RequestPort,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)

WORKFLOW_NAME = "crash_loop"
LOG_ENV = "CRASH_SIDE_EFFECT_LOG"


class Start(BaseModel):
    ticks_a: int
    ticks_b: int


class Tick(BaseModel):
    phase: str
    i: int


class Approval(BaseModel):
    count: int
    total: int


class Decision(BaseModel):
    approved: bool
    note: str
    delay: float = 0.0


def side_effect(ctx: WorkflowContext[Any, Any], step: str = "") -> None:
    """Record this invocation (or this run of its journaled ``step``) in the side-effect log (if
    the harness asked for one)."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    executor = f"{ctx.executor_id}:{step}" if step else ctx.executor_id
    line = f"superstep={ctx.superstep} executor={executor} run={ctx.run_id} pid={os.getpid()}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def pause(ctx: WorkflowContext[Any, Any]) -> None:
    delay = await ctx.get_shared("delay", 0.0)
    if delay:
        await anyio.sleep(delay)


class Stepper(Executor):
    @handler
    async def begin(self, start: Start, ctx: WorkflowContext[Tick]) -> None:
        side_effect(ctx)
        await ctx.set_state("plan", {"a": start.ticks_a, "b": start.ticks_b})
        await ctx.set_state("count", 0)
        await ctx.set_shared("total", 0)
        await ctx.send_message(Tick(phase="a", i=1))

    @handler
    async def tick(self, t: Tick, ctx: WorkflowContext[Tick | Approval, str]) -> None:
        side_effect(ctx)
        await pause(ctx)
        plan = await ctx.get_state("plan")
        count = await ctx.get_state("count") + 1
        total = await ctx.get_shared("total") + t.i * (10 if t.phase == "b" else 1)
        await ctx.set_state("count", count)
        await ctx.set_shared("total", total)
        if t.i < plan[t.phase]:
            await ctx.send_message(Tick(phase=t.phase, i=t.i + 1))
        elif t.phase == "a":
            await ctx.send_message(Approval(count=count, total=total))
        else:
            note = await ctx.get_state("note")
            seen = await ctx.get_shared("mirror_seen", 0)
            await ctx.yield_output(
                f"done count={count} total={total} note={note} mirror_seen={seen} "
                f"superstep={ctx.superstep}"
            )

    @handler
    async def decided(self, decision: Decision, ctx: WorkflowContext[Tick, str]) -> None:
        side_effect(ctx)

        async def note() -> str:
            side_effect(ctx, "note")
            return decision.note

        await ctx.set_state("note", await ctx.run_once("note", note, idempotent=True))
        await ctx.set_shared("delay", decision.delay)
        if not decision.approved:
            await ctx.yield_output(f"rejected: {decision.note}")
            return
        await ctx.send_message(Tick(phase="b", i=1))


class Mirror(Executor):
    @handler
    async def watch(self, t: Tick, ctx: WorkflowContext[Never, str]) -> None:
        side_effect(ctx)
        await pause(ctx)
        seen = await ctx.get_state("seen", [])
        seen.append(f"{t.phase}{t.i}")
        await ctx.set_state("seen", seen)
        await ctx.set_shared("mirror_seen", len(seen))
        total = await ctx.get_shared("total")
        await ctx.yield_output(f"mirror {t.phase}{t.i} seen={','.join(seen)} total={total}")


def build_workflow() -> Workflow:
    stepper = Stepper("stepper")
    mirror = Mirror("mirror")
    approve = RequestPort("approve", request_type=Approval, response_type=Decision)
    return (
        WorkflowBuilder(name=WORKFLOW_NAME, start=stepper)
        .add_edge(stepper, stepper)
        .add_edge(stepper, mirror)
        .add_edge(stepper, approve)
        .add_edge(approve, stepper)
        .build()
    )
