"""Edges of the public API an outside tester tripped over: each gives the obvious answer."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Never

import anyio
import pytest
from pydantic import BaseModel

from tests.integration.workflows import cancel_stored_then_worker_died
from workflow_engine import (
    CheckpointNotFoundError,
    Executor,
    LeaseLostError,
    RequestAlreadyAnsweredError,
    RequestCancelledError,
    RequestPort,
    ResponseTypeError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    RunNotResumableError,
    Runtime,
    UsageError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowNotRegisteredError,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine.executors import Agent, ChatMessage, ChatResponseUpdate
from workflow_engine.executors._clients import message_from_updates
from workflow_engine.storage import InMemoryRunStore, SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


class Gate(Executor):
    @handler
    async def anything(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(f"str {message}")

    @handler
    async def yes(self, message: Literal["yes"], ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output("the yes handler")


def build_gate() -> Any:
    return WorkflowBuilder(name="gate", start=Gate("gate")).build()


async def test_a_literal_handler_wins_over_a_plain_one_whatever_the_order() -> None:
    workflow = build_gate()
    assert (await workflow.run("yes")).outputs == ["the yes handler"]
    assert (await workflow.run("no")).outputs == ["str no"]


async def test_max_supersteps_below_one_is_refused() -> None:
    with pytest.raises(UsageError, match="at least 1"):
        await build_gate().run("yes", max_supersteps=0)


def build_ask() -> Any:
    class Start(Executor):
        @handler
        async def go(self, message: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(message)

    start = Start("start")
    ask = RequestPort("ask", request_type=str, response_type=str)
    # (its answers go back to the start: a port needs somewhere to send them)
    return (
        WorkflowBuilder(name="ask", start=start).add_edge(start, ask).add_edge(ask, start).build()
    )


async def test_fork_defaults_to_the_latest_checkpoint_and_run_ids_are_unique(
    tmp_path: Path,
) -> None:
    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(build_ask)
    paused = await runtime.run("ask", "m", run_id="chosen")
    forked = await runtime.fork(paused.run_id)
    info = await runtime.get_run(forked)
    assert info.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    assert info.parent_run_id == "chosen"
    with pytest.raises(RunExistsError, match="'chosen' already exists"):
        await runtime.run("ask", "again", run_id="chosen")
    await runtime.close()


class PruningWhileForking(SqliteStore):
    """A store on which another process prunes right after ``history`` is read (every finished
    run, or all but the last checkpoint of every run): the moment a fork is between choosing
    its checkpoint and loading it -- or, forking the latest (no history read), right before
    reading it."""

    keep_last: int | None = None

    async def history(self, run_id: str) -> Any:
        found = await super().history(run_id)
        await self._prune()
        return found

    async def latest(self, run_id: str) -> Any:
        await self._prune()
        return await super().latest(run_id)

    async def _prune(self) -> None:
        if self.keep_last is None:
            await super().prune(finished_before=self.clock() + 1)
        else:
            await super().prune(keep_last=self.keep_last)


async def test_fork_by_checkpoint_id_takes_only_one_of_the_run_s_own(tmp_path: Path) -> None:
    """A named checkpoint is read as it is, not looked for in the run's history (a fork read
    every checkpoint's row: outside tester 119): one of another run is still refused."""
    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(build_ask)
    one = await runtime.run("ask", "m", run_id="one")
    other = await runtime.run("ask", "m", run_id="other")
    [first, *_] = await runtime.history(one.run_id)
    forked = await runtime.fork(one.run_id, checkpoint_id=first.checkpoint_id)
    assert (await runtime.get_run(forked)).parent_run_id == "one"
    [theirs, *_] = await runtime.history(other.run_id)
    for given in (theirs.checkpoint_id, "0" * 32):
        with pytest.raises(
            CheckpointNotFoundError,
            match=f"run 'one' has no checkpoint '{given}': none by that id is stored .a prune",
        ):
            await runtime.fork(one.run_id, checkpoint_id=given)
    await runtime.close()


async def test_forking_a_run_pruned_meanwhile_says_the_run_is_gone(tmp_path: Path) -> None:
    """It said ``no checkpoint '0661…'``: a checkpoint id the caller never gave."""
    runtime = Runtime(PruningWhileForking(tmp_path / "runs.db"))
    runtime.register(build_gate)
    done = await runtime.run("gate", "m", run_id="finished")
    assert done.status is WorkflowRunState.IDLE
    with pytest.raises(RunNotFoundError, match="'finished'"):
        await runtime.fork("finished")
    await runtime.close()


async def test_forking_a_checkpoint_pruned_meanwhile_names_the_run_and_superstep(
    tmp_path: Path,
) -> None:
    """It said ``no checkpoint '0661…'`` here too (only the run's old checkpoints went)."""
    store = PruningWhileForking(tmp_path / "runs.db")
    store.keep_last = 1
    runtime = Runtime(store)
    runtime.register(build_slow)
    done = await runtime.run("slow", 55, run_id="long")
    assert done.status is WorkflowRunState.IDLE
    with pytest.raises(CheckpointNotFoundError, match="run 'long' has no superstep 1 any more"):
        await runtime.fork("long", 1)
    await runtime.close()


async def test_forking_a_superstep_a_prune_took_says_so(tmp_path: Path) -> None:
    """After ``prune(keep_last=1)``, forking an earlier superstep said "has no superstep 1",
    of a superstep the run had passed (outside tester 149): it says a prune took it, and a
    superstep past the run's end says how far the run got."""
    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(build_slow)
    done = await runtime.run("slow", 3, run_id="short")
    assert await runtime.prune(keep_last=1) > 0
    last = (await runtime.get_run("short")).superstep
    pruned = (
        "has no superstep 1: it is no longer stored .a prune kept its checkpoints from "
        f"superstep {last} on"
    )
    with pytest.raises(CheckpointNotFoundError, match=pruned):
        await runtime.fork("short", 1)
    with pytest.raises(
        CheckpointNotFoundError, match=f"has no superstep 99 .it has reached superstep {last}"
    ):
        await runtime.fork("short", 99)
    assert done.status is WorkflowRunState.IDLE
    await runtime.close()


class Slow(Executor):
    @handler
    async def tick(self, n: int, ctx: WorkflowContext[int, str]) -> None:
        await anyio.sleep(0.02)
        if n >= 60:
            await ctx.yield_output("finished")
        else:
            await ctx.send_message(n + 1)


def build_slow() -> Any:
    slow = Slow("slow")
    return WorkflowBuilder(name="slow", start=slow).add_edge(slow, slow).build()


async def test_a_runtime_without_the_workflow_cancels_a_run_another_worker_executes(
    tmp_path: Path,
) -> None:
    """The command line cancelling an application's run: it was WorkflowNotRegisteredError."""
    db = tmp_path / "runs.db"
    worker = Runtime(SqliteStore(db))
    worker.register(build_slow)
    outsider = Runtime(SqliteStore(db))  # registers nothing
    results = []

    async def execute() -> None:
        results.append(await worker.run("slow", 0, run_id="busy"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(execute)
        while True:
            await anyio.sleep(0.01)
            with contextlib.suppress(RunNotFoundError):
                if (await outsider.get_run("busy")).superstep >= 2:
                    break
        info = await outsider.cancel("busy")
        assert info.status is WorkflowRunState.IN_PROGRESS  # stored: the worker stops it
        assert info.cancel_requested
    assert results[0].status is WorkflowRunState.CANCELLED
    assert results[0].outputs == []
    assert not (await outsider.get_run("busy")).cancel_requested  # honoured
    # a run no worker executes still needs its workflow to be cancelled
    worker.register(build_ask)
    await worker.run("ask", "m", run_id="resting")
    with pytest.raises(WorkflowNotRegisteredError, match="'ask'.*no worker is executing"):
        await outsider.cancel("resting")
    with pytest.raises(RunNotResumableError, match="'busy' is already cancelled"):
        await outsider.cancel("busy")  # as a process with the workflow says
    assert (await outsider.get_run("resting")).status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    await worker.close()
    await outsider.close()


async def admitted(runtime: Runtime, run_id: str) -> None:
    """Wait until another runtime's run ``run_id`` is admitted (its worker now executes it)."""
    while True:
        await anyio.sleep(0.02)
        with contextlib.suppress(RunNotFoundError):
            await runtime.get_run(run_id)
            return


class SlowLast(Executor):
    """One slow superstep that pauses the run (``ask``) or finishes it."""

    @handler
    async def go(self, then: str, ctx: WorkflowContext[str, str]) -> None:
        await anyio.sleep(0.3)
        if then == "ask":
            await ctx.send_message("may I?")
        else:
            await ctx.yield_output("finished")


def build_slow_last() -> Any:
    slow = SlowLast("slow")
    ask = RequestPort("ask", request_type=str, response_type=str)
    return (
        WorkflowBuilder(name="slow-last", start=slow)
        .add_edge(slow, ask)
        .add_edge(ask, slow)
        .build()
    )


@pytest.mark.parametrize("then", ["ask", "finish"])
@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_a_cancel_stored_during_the_superstep_that_rests_the_run_is_honoured(
    tmp_path: Path, then: str, kind: str
) -> None:
    """The commit that rested the run also ended its lease, so the worker could not honour a
    cancel stored meanwhile: ``run``/``resume`` raised RunBusyError and the run rested with the
    cancel still requested (its request answerable). The lease is kept for the cancel now --
    of a run that paused. One that finished stays finished, the cancel moot (it was marked
    cancelled after its effects ran: outside testers 110 and 111)."""
    store: Any = SqliteStore(tmp_path / "runs.db") if kind == "sqlite" else InMemoryRunStore()
    worker, outsider = Runtime(store), Runtime(store)
    worker.register(build_slow_last)
    outsider.register(build_slow_last)
    results = []

    async def execute() -> None:
        results.append(await worker.run("slow-last", then, run_id="r"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(execute)
        await admitted(outsider, "r")
        info = await outsider.cancel("r")  # stored: the worker is in its superstep
        assert info.status is WorkflowRunState.IN_PROGRESS
    ended = WorkflowRunState.CANCELLED if then == "ask" else WorkflowRunState.IDLE
    assert results[0].status is ended, results[0]
    info = await outsider.get_run("r")
    assert info.status is ended and info.pending_requests == []
    assert info.outputs == ([] if then == "ask" else ["finished"])
    assert not info.cancel_requested
    statuses = [i.status for i in await outsider.store.history("r")]
    assert statuses.count(WorkflowRunState.CANCELLED) == (then == "ask"), statuses
    assert await outsider.pending_requests() == []
    assert (await store.get_run("r")).owner is None  # the lease ended with the cancel
    if kind == "sqlite":
        with sqlite3.connect(tmp_path / "runs.db") as raw:
            assert raw.execute("SELECT cancel_requested FROM runs").fetchone()[0] == 0
    await worker.close()


@pytest.mark.parametrize("then", ["ask", "finish"])
@pytest.mark.parametrize("kind", ["sqlite", "memory"])
@pytest.mark.parametrize("knows_workflow", [True, False])
async def test_a_cancel_that_finds_the_run_at_rest_leaves_no_request_behind(
    tmp_path: Path, then: str, kind: str, knows_workflow: bool
) -> None:
    """``cancel`` found the run busy, and its worker rested the run before the cancel request
    was stored: the request stayed on the finished run for good (``idle, cancelling``; outside
    tester 79, 2 of 323 cancels). The store now refuses it for a run no worker holds, and
    ``cancel`` goes on from what the run is: a paused run is cancelled here, a finished one
    is said finished; a process without the workflow says what it said of any resting run."""
    store: Any = SqliteStore(tmp_path / "runs.db") if kind == "sqlite" else InMemoryRunStore()
    worker, outsider = Runtime(store), Runtime(store)
    worker.register(build_slow_last)
    if knows_workflow:
        outsider.register(build_slow_last)
    results: list[Any] = []
    real_request_cancel = store.request_cancel
    asked: list[bool] = []

    async def late_request_cancel(run_id: str) -> bool:
        while not results:  # the worker rests the run first: the race, made certain
            await anyio.sleep(0.01)
        stored = await real_request_cancel(run_id)
        asked.append(stored)
        return stored

    store.request_cancel = late_request_cancel

    async def execute() -> None:
        results.append(await worker.run("slow-last", then, run_id="r"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(execute)
        await admitted(outsider, "r")
        if then == "finish":
            with pytest.raises(RunNotResumableError, match="'r' is already finished .idle."):
                await outsider.cancel("r")
        elif knows_workflow:
            info = await outsider.cancel("r")
            assert info.status is WorkflowRunState.CANCELLED and info.pending_requests == []
        else:
            with pytest.raises(WorkflowNotRegisteredError, match="no worker is executing"):
                await outsider.cancel("r")
    assert asked == [False]  # refused: nothing stored for a run at rest
    rested = (
        WorkflowRunState.IDLE if then == "finish" else WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    )
    assert results[0].status is rested
    run = await store.get_run("r")
    assert not run.cancel_requested
    assert run.owner is None
    await worker.close()
    await outsider.close()


class Fails(Executor):
    @handler
    async def go(self, message: str, ctx: WorkflowContext[str]) -> None:
        await anyio.sleep(0.3)
        raise RuntimeError("broken")


def build_fails() -> Any:
    return WorkflowBuilder(name="fails", start=Fails("fails")).build()


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_a_run_that_fails_while_a_cancel_waits_keeps_no_cancel(
    tmp_path: Path, kind: str
) -> None:
    """It ended ``failed, cancelling``, and the flag stayed (outside tester 79): a run set
    FAILED is done with a cancel requested meanwhile."""
    store: Any = SqliteStore(tmp_path / "runs.db") if kind == "sqlite" else InMemoryRunStore()
    worker, outsider = Runtime(store), Runtime(store)
    worker.register(build_fails)
    outsider.register(build_fails)
    results: list[Any] = []

    async def execute() -> None:
        results.append(await worker.run("fails", "go", run_id="f"))

    async with anyio.create_task_group() as tg:
        tg.start_soon(execute)
        await admitted(outsider, "f")
        info = await outsider.cancel("f")  # stored: the worker is in its superstep
        assert info.cancel_requested
    assert results[0].status is WorkflowRunState.FAILED
    run = await store.get_run("f")
    assert run.status is WorkflowRunState.FAILED and not run.cancel_requested
    await worker.close()
    await outsider.close()


class Counted(Executor):
    """Asks, and counts every time its answer handler runs (a side effect)."""

    runs = 0

    @handler
    async def start(self, message: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(message)

    @handler
    async def answered(self, answer: bool, ctx: WorkflowContext[str, str]) -> None:
        Counted.runs += 1
        await ctx.yield_output("done")


def build_counted() -> Any:
    counted = Counted("counted")
    ask = RequestPort("ask", request_type=str, response_type=bool)
    return (
        WorkflowBuilder(name="counted", start=counted)
        .add_edge(counted, ask)
        .add_edge(ask, counted)
        .build()
    )


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_a_stored_cancel_is_honoured_before_a_resume_executes_anything(
    tmp_path: Path, kind: str
) -> None:
    """A cancel stored for a worker that then died: the next resume executed a superstep
    first (its side effects included), then cancelled."""
    store: Any = SqliteStore(tmp_path / "runs.db") if kind == "sqlite" else InMemoryRunStore()
    runtime = Runtime(store)
    runtime.register(build_counted)
    paused = await runtime.run("counted", "may I?", run_id="r")
    await runtime.respond(paused.pending_requests[0].request_id, True)
    await cancel_stored_then_worker_died(store, "r")  # from the command line, as a worker ran
    assert (await runtime.get_run("r")).cancel_requested
    assert [r.cancel_requested for r in await runtime.list_runs()] == [True]
    Counted.runs = 0
    result = await runtime.resume("r")
    assert result.status is WorkflowRunState.CANCELLED, result
    assert Counted.runs == 0 and result.outputs == []
    assert (await runtime.get_run("r")).status is WorkflowRunState.CANCELLED
    assert not (await runtime.get_run("r")).cancel_requested
    await runtime.close()


def test_tool_calls_from_a_client_that_gives_no_ids_get_ids_of_their_own() -> None:
    updates = [
        ChatResponseUpdate(
            message_id="m1", kind="function_call", name="lookup", arguments_delta='{"a"'
        ),
        ChatResponseUpdate(message_id="m1", kind="function_call", arguments_delta=": 1}"),
        ChatResponseUpdate(message_id="m1", kind="function_call", name="pay", arguments_delta="{}"),
    ]
    message = message_from_updates(updates)
    calls = message.function_calls
    assert [c.name for c in calls] == ["lookup", "pay"]
    assert calls[0].arguments == {"a": 1}
    assert calls[0].call_id and calls[1].call_id and calls[0].call_id != calls[1].call_id
    assert isinstance(message, ChatMessage) and Agent  # the public names stay importable


async def test_a_lease_lost_to_a_worker_that_is_done_does_not_name_none(tmp_path: Path) -> None:
    """It said ``being executed by another worker (None)``: no worker holds the run."""
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(build_ask)
    await runtime.run("ask", "m", run_id="r")
    frozen = SqliteStore(db)
    lease = await frozen.acquire("r", "frozen-worker", lease_seconds=0.05)
    await anyio.sleep(0.1)  # past its lease, as a process stopped for a while
    other = SqliteStore(db)
    await other.release(await other.acquire("r", "other-worker", lease_seconds=5))
    with pytest.raises(LeaseLostError) as lost:
        await frozen.renew(lease)
    assert "None" not in str(lost.value) and "'r'" in str(lost.value), lost.value
    await other.acquire("r", "third-worker", lease_seconds=5)
    with pytest.raises(LeaseLostError, match=r"another worker \(third-worker\)"):
        await frozen.renew(lease)
    for store in (frozen, other):
        await store.close()
    await runtime.close()


async def test_ids_that_are_not_valid_unicode_are_refused_in_the_error_tree(tmp_path: Path) -> None:
    """A run id, workflow name or executor id with a lone surrogate: a ``WorkflowError`` naming
    it, never a raw ``UnicodeEncodeError`` or pydantic error (outside tester)."""
    from workflow_engine import (
        DefinitionError,
        Executor,
        Runtime,
        UsageError,
        WorkflowBuilder,
        handler,
    )

    bad = "caf\udce9"

    class Echo(Executor):
        @handler
        async def echo(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.yield_output(message)

    with pytest.raises(DefinitionError, match="not valid Unicode"):
        WorkflowBuilder(name=bad, start=Echo("echo")).build()
    with pytest.raises(DefinitionError, match="not valid Unicode"):
        WorkflowBuilder(name="echo", start=Echo(bad)).build()
    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(lambda: WorkflowBuilder(name="echo", start=Echo("echo")).build())
    with pytest.raises(UsageError, match="not valid Unicode"):
        await runtime.run("echo", "hi", run_id=bad)
    with pytest.raises(UsageError, match="lone surrogate"):
        await runtime.get_run(bad)
    assert (await runtime.run("echo", "hi", run_id="fine")).outputs == ["hi"]
    await runtime.close()


_VERSIONED_REVIEW = """
import os, sys
from typing import Never

import anyio
from pydantic import BaseModel

from workflow_engine import Executor, Runtime, WorkflowBuilder, WorkflowContext, handler
from workflow_engine import response_handler
from workflow_engine.storage import SqliteStore


class Draft(BaseModel):
    text: str


class Decision(BaseModel):
    approved: bool
    if os.environ["VERSION"] == "2":
        reviewer: str  # version 2 requires a field version 1's answers lack


if os.environ["VERSION"] == "3":

    class Verdict(BaseModel):  # version 3 renamed the answer's type
        approved: bool

    Decision = Verdict  # noqa: F811


class Writer(Executor):
    @handler
    async def write(self, topic: str, ctx: WorkflowContext[Never]) -> None:
        await ctx.request_info(Draft(text=topic), Decision)

    @response_handler
    async def done(self, d: Draft, dec: Decision, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(str(dec))


async def main(db: str) -> None:
    rt = Runtime(SqliteStore(db))
    rt.register(WorkflowBuilder(name="review", start=Writer("writer")).build())
    if os.environ["VERSION"] == "1":
        paused = await rt.run("review", "a topic")
        if sys.argv[2:] == ["answer"]:
            await rt.respond(paused.pending_requests[0].request_id, {"approved": True})
    elif os.environ["VERSION"] == "2":
        (run,) = await rt.store.list_runs()
        try:
            await rt.resume(run.run_id)
        except Exception as exc:
            print(type(exc).__name__, exc)
    else:
        (run,) = await rt.store.list_runs()
        print("stranded", [r.run_id for r in await rt.stranded_runs()])
        print("decoded", (await rt.get_run(run.run_id)).decoded)
        (request,) = await rt.pending_requests()
        try:
            await rt.respond(request.request_id, {"approved": True})
        except Exception as exc:
            print(type(exc).__name__, exc)
        for act in (rt.resume, rt.cancel):
            try:
                await act(run.run_id)
            except Exception as exc:
                print(type(exc).__name__, exc)
    await rt.close()


anyio.run(main, sys.argv[1])
"""


def versioned_review(tmp_path: Path, db: Path) -> Callable[..., str]:
    """``run(version, *args)``: the review workflow of that version, in a process of its own
    on ``db`` (what it prints)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "versioned_review.py"
    script.write_text(_VERSIONED_REVIEW)

    def run(version: str, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(script), str(db), *args],
            env={**os.environ, "VERSION": version},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    return run


async def test_a_resume_refused_before_anything_ran_leaves_the_run_as_it_was(
    tmp_path: Path,
) -> None:
    """Version 2 of a workflow cannot decode the answer version 1 stored: the resume is refused,
    and the run still shows what it was (paused with an answer), not interrupted."""
    db = tmp_path / "runs.db"
    run = versioned_review(tmp_path, db)
    run("1", "answer")
    refused = run("2")
    # (the answer's class changed under the same name: a code change, not damage)
    assert refused.startswith("StoredTypeChangedError") and "reviewer" in refused
    store = SqliteStore(db)
    (record,) = await store.list_runs()
    assert record.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    assert record.owner is None and record.error is None
    (request,) = await store.list_requests(record.run_id, status="answered")
    assert request.answer is not None  # the answer stays, for version 1 to apply
    await store.close()


async def test_a_renamed_answer_type_strands_the_runs_that_wait_for_it(tmp_path: Path) -> None:
    """Version 3 renamed the type version 1's question expects as its answer (same graph): the
    run is listed as stranded, get_run shows it as stored, and respond names run and request."""
    db = tmp_path / "runs.db"
    run = versioned_review(tmp_path, db)
    run("1")
    store = SqliteStore(db)
    (record,) = await store.list_runs()
    (request,) = await store.list_requests(record.run_id)
    await store.close()
    stranded, decoded, refused, resumed, cancelled = run("3").splitlines()
    assert stranded == f"stranded {[record.run_id]}"
    assert decoded == "decoded False"
    assert refused.startswith("SignatureMismatchError") and "'Decision'" in refused
    assert record.run_id in refused and request.request_id in refused
    for said in (resumed, cancelled):  # a stranded run, not a damaged record
        assert said.startswith("SignatureMismatchError") and "stranded" in said, said
    store = SqliteStore(db)
    (after,) = await store.list_runs()
    assert after.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS and after.owner is None
    await store.close()


class AsksFive(Executor):
    """Asks five questions in one superstep (one commit: one ``created_at`` for all)."""

    @handler
    async def go(self, message: str, ctx: WorkflowContext[Never]) -> None:
        for n in range(5):
            await ctx.request_info(f"question {n}", str)

    @response_handler
    async def answered(self, question: str, answer: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(answer)


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_a_runs_requests_are_listed_in_the_order_it_asked_them(
    tmp_path: Path, kind: str
) -> None:
    """``pending_requests`` ordered requests of one commit by their random ids; ``get_run``
    in the order they were asked (outside tester)."""
    store = SqliteStore(tmp_path / "runs.db") if kind == "sqlite" else InMemoryRunStore()
    runtime = Runtime(store)
    runtime.register(lambda: WorkflowBuilder(name="five", start=AsksFive("asker")).build())
    try:
        result = await runtime.run("five", "go")
        asked = [r.request_id for r in result.pending_requests]
        assert [r.data for r in result.pending_requests] == [f"question {n}" for n in range(5)]
        assert [r.request_id for r in (await runtime.get_run(result.run_id)).pending_requests] == (
            asked
        )
        assert [r.request_id for r in await runtime.pending_requests(result.run_id)] == asked
        assert [r.request_id for r in await runtime.pending_requests()] == asked
        assert [r.request_id for r in await store.list_requests(result.run_id)] == asked
    finally:
        await runtime.close()


class SlowAnswerer(Executor):
    """Asks twice; takes a while over each answer (while its run's lease is held)."""

    def __init__(self, id: str, answering: anyio.Event) -> None:
        super().__init__(id)
        self.answering = answering

    @handler
    async def go(self, message: str, ctx: WorkflowContext[Never]) -> None:
        await ctx.request_info("first?", str)
        await ctx.request_info("second?", str)

    @response_handler
    async def answered(self, question: str, answer: str, ctx: WorkflowContext[Never, str]) -> None:
        self.answering.set()
        await anyio.sleep(0.2)  # (holding the lease while the other answer arrives)
        await ctx.yield_output(f"{question}={answer}")


@pytest.mark.parametrize("kind", ["sqlite", "memory"])
async def test_an_answer_to_a_run_busy_in_this_process_does_not_blame_another_worker(
    tmp_path: Path, kind: str
) -> None:
    """``respond_and_resume`` while this very process executes the run said "another worker"
    (outside tester): the answer is stored, and the execution in this process applies it."""
    answering = anyio.Event()
    store = SqliteStore(tmp_path / "runs.db") if kind == "sqlite" else InMemoryRunStore()
    runtime = Runtime(store)
    runtime.register(
        lambda: WorkflowBuilder(name="slow", start=SlowAnswerer("asker", answering)).build()
    )
    try:
        paused = await runtime.run("slow", "go")
        first, second = paused.pending_requests
        await runtime.respond(first.request_id, "a")
        refused: list[RunBusyError] = []
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(runtime.resume, paused.run_id)
            await answering.wait()
            with pytest.raises(RunBusyError) as busy:
                await runtime.respond_and_resume(second.request_id, "b")
            refused.append(busy.value)
        said = str(refused[0])
        assert "another execution in this process" in said and "another worker" not in said
        assert second.request_id in said and "is stored" in said
    finally:
        await runtime.close()


class Box(BaseModel):
    value: Any


class AsksForABox(Executor):
    @handler
    async def go(self, message: str, ctx: WorkflowContext[Never, Any]) -> None:
        await ctx.request_info(message, Box)

    @response_handler
    async def got(self, question: str, box: Box, ctx: WorkflowContext[Never, Any]) -> None:
        await ctx.yield_output(box.value)


def _cyclic_dict() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


def _cyclic_list() -> list[Any]:
    items: list[Any] = []
    items.append(items)
    return items


def _nested(levels: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value", [_cyclic_dict(), _cyclic_list(), _nested(3_000)], ids=["cycle", "list", "deep"]
)
async def test_an_answer_that_nests_without_end_is_refused_at_once(
    tmp_path: Path, value: Any
) -> None:
    """JSON-shaped, a cyclic answer (``d["self"] = d``) was walked for ever on the event loop's
    thread; 3,000 levels raised a bare RecursionError (outside tester 62)."""
    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(WorkflowBuilder(name="box", start=AsksForABox("asks")).build())
    paused = await runtime.run("box", "what is in it?")
    request_id = paused.pending_requests[0].request_id
    with anyio.fail_after(10), pytest.raises(ResponseTypeError) as refused:
        await runtime.respond(request_id, {"value": value})
    message = str(refused.value)
    assert request_id in message and "expected Box" in message
    assert "nests deeper than 180 levels (a cycle?)" in message
    done = await runtime.respond_and_resume(request_id, {"value": [1, {"a": None}]})
    assert done.outputs == [[1, {"a": None}]]
    await runtime.close()


async def test_an_invalid_answer_to_a_request_no_longer_waiting_says_so(tmp_path: Path) -> None:
    """A different answer to an answered request is a conflict, valid or not: an invalid one
    was a type mismatch, which told the client to fix its payload -- to meet the conflict
    next (outside tester 63). A cancelled request says it was cancelled."""
    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(WorkflowBuilder(name="box", start=AsksForABox("asks")).build())
    answered = (await runtime.run("box", "one?")).pending_requests[0].request_id
    await runtime.respond_and_resume(answered, {"value": 1})
    cancelled_run = await runtime.run("box", "two?")
    cancelled = cancelled_run.pending_requests[0].request_id
    await runtime.cancel(cancelled_run.run_id)
    for request_id, refused in (
        (answered, RequestAlreadyAnsweredError),
        (cancelled, RequestCancelledError),
    ):
        for wrong in ({}, {"value": 1, "extra": 2}, "not a box"):
            with pytest.raises(refused) as said:
                await runtime.respond(request_id, wrong)
            assert request_id in str(said.value)
    with pytest.raises(ResponseTypeError):  # a request still waiting: its payload is the issue
        await runtime.respond(
            (await runtime.run("box", "three?")).pending_requests[0].request_id, {}
        )
    await runtime.close()
