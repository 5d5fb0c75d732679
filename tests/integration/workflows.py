"""Small workflows the integration tests run against real stores."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Never

import anyio
import pytest
from pydantic import BaseModel

from workflow_engine import (
    Checkpoint,
    Executor,
    ExternalRequest,
    RequestPort,
    RunStore,
    Runtime,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    default_owner,
    handler,
)
from workflow_engine.storage import SqliteStore


class Ticket(BaseModel):
    step: int
    question: str


class Answer(BaseModel):
    approved: bool
    note: str = ""


class Stepper(Executor):
    """Counts to ``pause_at`` (state + shared state), asks a human, then counts to ``stop_at``."""

    def __init__(self, id: str, pause_at: int = 3, stop_at: int = 6) -> None:
        super().__init__(id)
        self.pause_at = pause_at
        self.stop_at = stop_at

    @handler
    async def step(self, n: int, ctx: WorkflowContext[int | Ticket, str]) -> None:
        seen = await ctx.get_state("seen", [])
        seen.append(n)
        await ctx.set_state("seen", seen)
        await ctx.set_shared("total", await ctx.get_shared("total", 0) + n)
        if n == self.pause_at:
            await ctx.send_message(Ticket(step=n, question=f"continue after {n}?"))
        elif n >= self.stop_at:
            await ctx.yield_output(f"done: seen={seen} total={await ctx.get_shared('total')}")
        else:
            await ctx.send_message(n + 1)

    @handler
    async def answered(self, answer: Answer, ctx: WorkflowContext[int, str]) -> None:
        seen = await ctx.get_state("seen", [])
        if not answer.approved:
            await ctx.yield_output(f"stopped at {seen[-1]}: {answer.note}")
            return
        await ctx.send_message(seen[-1] + 1)


class Exploder(Executor):
    @handler
    async def boom(self, n: int, ctx: WorkflowContext[int]) -> None:
        if n >= 2:
            raise RuntimeError(f"exploded at {n}")
        await ctx.send_message(n + 1)


def stepper_workflow(pause_at: int = 3, stop_at: int = 6, name: str = "stepper") -> Workflow:
    stepper = Stepper("stepper", pause_at, stop_at)
    port = RequestPort("approve", request_type=Ticket, response_type=Answer)
    return (
        WorkflowBuilder(name=name, start=stepper)
        .add_edge(stepper, stepper)
        .add_edge(stepper, port)
        .add_edge(port, stepper)
        .build()
    )


def changed_stepper_workflow() -> Workflow:
    """Same name, different graph: runs stored by ``stepper_workflow`` are stranded here."""
    stepper = Stepper("stepper")
    port = RequestPort("approve", request_type=Ticket, response_type=Answer)
    return (
        WorkflowBuilder(name="stepper", start=stepper)
        .add_edge(stepper, port)
        .add_edge(port, stepper)
        .add_edge(stepper, stepper)
        .add_edge(stepper, Exploder("extra"))
        .build()
    )


class AskAndCount(Executor):
    """Asks a question and, beside it, starts a count that an ``Exploder`` ends in failure."""

    @handler
    async def start(self, n: int, ctx: WorkflowContext[Ticket | int]) -> None:
        await ctx.send_message(Ticket(step=n, question="go on?"))
        await ctx.send_message(n)

    @handler
    async def answered(self, answer: Answer, ctx: WorkflowContext[None, str]) -> None:
        await ctx.yield_output(f"answered {answer.approved}")


def failing_with_a_question_workflow() -> Workflow:
    """Fails two supersteps after asking: the run ends failed with its request pending."""
    start, exploder = AskAndCount("start"), Exploder("exploder")
    port = RequestPort("approve", request_type=Ticket, response_type=Answer)
    return (
        WorkflowBuilder(name="failing_asker", start=start)
        .add_edge(start, port)
        .add_edge(port, start)
        .add_edge(start, exploder)
        .add_edge(exploder, exploder)
        .build()
    )


def exploding_workflow() -> Workflow:
    e = Exploder("exploder")
    return WorkflowBuilder(name="exploding", start=e).add_edge(e, e).build()


class _Asks(Executor):
    @handler
    async def ask(self, topic: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(topic)


class _Yields(Executor):
    @handler
    async def end(self, approved: bool, ctx: WorkflowContext[Never, bool]) -> None:
        await ctx.yield_output(approved)


def review_workflow() -> Workflow:
    """``review``: a topic asks the ``review`` port (str -> bool); the answer is the output."""
    ask, end = _Asks("ask"), _Yields("end")
    port = RequestPort("review", request_type=str, response_type=bool)
    return WorkflowBuilder("review", start=ask).add_edge(ask, port).add_edge(port, end).build()


def in_a_group_commit() -> bool:
    """Whether the caller runs inside a group commit of a ``SqliteStore`` (its write is one of
    several in one transaction): for a fault hook that simulates SQLite ending the group."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_write_batch":
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


async def cancel_stored_then_worker_died(store: RunStore, run_id: str) -> None:
    """A cancel stored for a worker that executed the run and then died: its lease taken by a
    process that has exited (so the next resume takes the run over at once), the cancel
    requested while it held the run, and never released. A store keeps a cancel request only
    for a run a worker holds."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    host = default_owner().partition(":")[0]  # (this host, as owner tokens name it)
    await store.acquire(run_id, f"{host}:{gone.pid}:died", 30)
    assert await store.request_cancel(run_id) is True


def following(checkpoint: Checkpoint, checkpoint_id: str) -> Checkpoint:
    """A checkpoint of the next superstep after ``checkpoint`` (for a store's own API)."""
    return checkpoint.model_copy(
        update={
            "checkpoint_id": checkpoint_id,
            "parent_id": checkpoint.checkpoint_id,
            "superstep": checkpoint.superstep + 1,
        }
    )


async def outcomes(jobs: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Run ``jobs`` concurrently (one task each, on any anyio backend); each one's result or
    the exception it raised, in the order given (``asyncio.gather(..., return_exceptions=True)``
    on trio too)."""
    results: list[Any] = [None] * len(jobs)

    async def one(index: int) -> None:
        try:
            results[index] = await jobs[index]()
        except Exception as exc:
            results[index] = exc

    async with anyio.create_task_group() as tg:
        for index in range(len(jobs)):
            tg.start_soon(one, index)
    return results


async def asked_after_a_crash(
    build: Callable[[], Workflow], db: Path, crash: type[BaseException]
) -> tuple[Runtime, ExternalRequest]:
    """Run ``build``'s workflow on ``db`` until ``crash`` (the process dying mid-effect) stops
    it, then resume it in a new runtime: that runtime and the request it pauses on (the
    question whether the effect happened)."""
    first = Runtime(SqliteStore(db))
    first.register(build)
    with pytest.raises(crash):
        await first.run(build().name, "pay please")
    await first.close()
    again = Runtime(SqliteStore(db))
    again.register(build)
    (run,) = await again.list_runs()
    [asked] = (await again.resume(run.run_id)).pending_requests
    return again, asked
