"""Exactly once, for real: each failure users reported, reproduced on a real SQLite file.

Every test here failed before the step identity existed (journal keyed by checkpoint, request ids
restarting per resume, leases renewed only at commit, ...). A crash is a ``Crash``
(``BaseException``) raised inside a handler: it escapes the engine like a kill would, leaving
the store exactly as a dead process leaves it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal, Never

import anyio
import pytest
from pydantic import BaseModel

from workflow_engine import (
    Checkpoint,
    CheckpointNotLatestError,
    EffectResolution,
    Executor,
    InDoubtEffect,
    RequestPort,
    ResponseTypeError,
    RunBusyError,
    Runtime,
    UsageError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


class Box(BaseModel):
    n: int = 0


class Start(Executor):
    """Forwards the start message along its edges."""

    @handler
    async def go(self, message: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(message)


class Crash(BaseException):
    """Stands in for kill -9 inside the process."""


class Ledger:
    """The outside world: counts every effect, keyed by what the test calls it."""

    def __init__(self) -> None:
        self.effects: list[str] = []
        self.keys: list[str] = []  # the idempotency keys the effects were given

    def record(self, what: str) -> str:
        self.effects.append(what)
        return what


async def crashing(runtime_call: Any) -> None:
    with pytest.raises(Crash):
        await runtime_call


def open_runtime(db: Path, build: Any, **options: Any) -> Runtime:
    runtime = Runtime(SqliteStore(db), **options)
    runtime.register(build)
    return runtime


# --- journal identity -----------------------------------------------------------------------


def build_fan(ledger: Ledger, crash_once: list[bool]) -> Any:
    """start fans out to an effect executor and a request port; the port's answer goes on."""

    class Effect(Executor):
        @handler
        async def do(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
            done = await ctx.run_once("charge", lambda: _async(ledger.record(f"charge:{message}")))
            if crash_once and crash_once.pop():
                raise Crash
            await ctx.yield_output(done)

    class After(Executor):
        @handler
        async def got(self, answer: bool, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.yield_output(f"answered:{answer}")

    def build() -> Any:
        start, effect, after = Start("start"), Effect("effect"), After("after")
        ask = RequestPort("ask", request_type=str, response_type=bool)
        return (
            WorkflowBuilder(name="fan", start=start)
            .add_fan_out_edges(start, [effect, ask])
            .add_edge(ask, after)
            .build()
        )

    return build


async def _async(value: Any) -> Any:
    return value


async def test_an_answer_arriving_before_recovery_does_not_repeat_a_journaled_effect(
    tmp_path: Path,
) -> None:
    ledger, crash = Ledger(), [True]
    db = tmp_path / "runs.db"
    runtime = open_runtime(db, build_fan(ledger, crash))
    run_id = await runtime.start("fan", "x")
    # superstep 1 fans out (the port's request is committed); superstep 2 charges, then dies
    await crashing(runtime.resume(run_id))
    assert ledger.effects == ["charge:x"]
    (request,) = await runtime.pending_requests(run_id)
    await runtime.respond(request.request_id, True)  # an answer arrives before recovery
    await runtime.close()

    again = open_runtime(db, build_fan(ledger, crash))
    done = await again.resume(run_id)
    assert done.status is WorkflowRunState.IDLE
    assert ledger.effects == ["charge:x"]  # journaled before the crash: replayed, not re-run
    assert sorted(done.outputs) == ["answered:True", "charge:x"]
    await again.close()


async def test_answer_stored_between_crash_and_recovery_keeps_the_journal(
    tmp_path: Path,
) -> None:
    """The reported case: the crash comes first, then an answer, then recovery."""
    ledger, crash = Ledger(), [True]
    db = tmp_path / "runs.db"

    class Effect(Executor):
        @handler
        async def do(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.run_once("charge", lambda: _async(ledger.record(f"charge:{message}")))
            if crash and crash.pop():
                raise Crash
            await ctx.yield_output(f"charged:{message}")

        @handler
        async def answered(self, answer: bool, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.yield_output(f"answered:{answer}")

    def build() -> Any:
        start, effect = Start("start"), Effect("effect")
        ask = RequestPort("ask", request_type=str, response_type=bool)
        return (
            WorkflowBuilder(name="late", start=start)
            .add_edge(start, ask)
            .add_edge(ask, effect)
            .add_edge(start, effect)
            .build()
        )

    runtime = open_runtime(db, build)
    run_id = await runtime.start("late", "x")
    await crashing(runtime.resume(run_id))  # superstep 1 routes; 2 dies after the charge
    assert ledger.effects == ["charge:x"]
    (request,) = await runtime.pending_requests(run_id)
    await runtime.respond(request.request_id, True)  # arrives before recovery
    await runtime.close()

    again = open_runtime(db, build)
    done = await again.resume(run_id)
    assert ledger.effects == ["charge:x"]
    assert done.status is WorkflowRunState.IDLE, done.error
    await again.close()


def build_two_senders(ledger: Ledger) -> Any:
    class Split(Executor):
        @handler
        async def go(self, message: str, ctx: WorkflowContext[str]) -> None:
            await ctx.send_message(f"{message}-a")
            await ctx.send_message(f"{message}-b")

    class Payer(Executor):
        @handler
        async def pay(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
            paid = await ctx.run_once("pay", lambda: _async(ledger.record(message)))
            await ctx.yield_output(paid)

    def build() -> Any:
        split, payer = Split("split"), Payer("payer")
        return WorkflowBuilder(name="two", start=split).add_edge(split, payer).build()

    return build


async def test_two_messages_to_one_executor_in_one_superstep_are_two_steps(
    tmp_path: Path,
) -> None:
    ledger = Ledger()
    runtime = open_runtime(tmp_path / "runs.db", build_two_senders(ledger))
    result = await runtime.run("two", "m")
    assert result.outputs == ["m-a", "m-b"]  # the second did not get the first's result
    assert ledger.effects == ["m-a", "m-b"]
    await runtime.close()


async def test_the_same_key_in_a_loop_is_a_new_step_each_superstep(tmp_path: Path) -> None:
    ledger = Ledger()

    class Loop(Executor):
        @handler
        async def tick(self, n: int, ctx: WorkflowContext[int, int]) -> None:
            await ctx.run_once("tick", lambda: _async(ledger.record(f"tick{n}")))
            if n < 3:
                await ctx.send_message(n + 1)
            else:
                await ctx.yield_output(n)

    def build() -> Any:
        loop = Loop("loop")
        return WorkflowBuilder(name="loop", start=loop).add_edge(loop, loop).build()

    runtime = open_runtime(tmp_path / "runs.db", build)
    assert (await runtime.run("loop", 1)).outputs == [3]
    assert ledger.effects == ["tick1", "tick2", "tick3"]
    await runtime.close()


async def test_concurrent_run_once_with_one_key_is_one_step(tmp_path: Path) -> None:
    ledger = Ledger()

    class Twice(Executor):
        @handler
        async def go(self, message: str, ctx: WorkflowContext[Never, list[str]]) -> None:
            async def effect() -> str:
                await anyio.sleep(0.01)
                return ledger.record(message)

            results: list[str] = []

            async def call() -> None:
                results.append(await ctx.run_once("same", effect))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                tg.start_soon(call)
            await ctx.yield_output(results)

    def build() -> Any:
        return WorkflowBuilder(name="twice", start=Twice("twice")).build()

    runtime = open_runtime(tmp_path / "runs.db", build)
    assert (await runtime.run("twice", "m")).outputs == [["m", "m"]]
    assert ledger.effects == ["m"]
    await runtime.close()


async def test_idempotency_keys_differ_per_executor_and_are_stable(tmp_path: Path) -> None:
    keys: list[str] = []

    class Keyed(Executor):
        @handler
        async def go(self, message: str, ctx: WorkflowContext[str, str]) -> None:
            keys.append(ctx.idempotency_key("tool#0"))
            keys.append(ctx.idempotency_key("tool#0"))
            if ctx.successor_ids:
                await ctx.send_message(message)
            else:
                await ctx.yield_output(message)

    def build() -> Any:
        a, b = Keyed("a"), Keyed("b")
        return WorkflowBuilder(name="keys", start=a).add_edge(a, b).build()

    runtime = open_runtime(tmp_path / "runs.db", build)
    result = await runtime.run("keys", "m")
    assert keys[0] == keys[1] and keys[2] == keys[3]  # stable within a step
    assert keys[0] != keys[2]  # two executors never share one
    assert all(k.startswith(f"{result.run_id}:") and len(k.split(":")[-1]) == 32 for k in keys)
    await runtime.close()


# --- request identity -----------------------------------------------------------------------


def build_chained_ports() -> Any:
    class End(Executor):
        @handler
        async def done(self, answer: int, ctx: WorkflowContext[Never, int]) -> None:
            await ctx.yield_output(answer)

    def build() -> Any:
        start, end = Start("start"), End("end")
        first = RequestPort("first", request_type=str, response_type=str)
        second = RequestPort("second", request_type=str, response_type=int)
        return (
            WorkflowBuilder(name="chain", start=start)
            .add_edge(start, first)
            .add_edge(first, second)
            .add_edge(second, end)
            .build()
        )

    return build


async def test_answers_routed_into_another_port_get_fresh_request_ids(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    runtime = open_runtime(db, build_chained_ports())
    paused = await runtime.run("chain", "go")
    (first,) = paused.pending_requests
    await runtime.respond(first.request_id, "one")
    second_pause = await runtime.resume(paused.run_id)
    (second,) = second_pause.pending_requests
    assert second.request_id != first.request_id
    assert len(second.request_id) == 32 and int(second.request_id, 16) >= 0  # 128 bits, hex
    await runtime.respond(second.request_id, 7)
    done = await runtime.resume(paused.run_id)
    assert done.status is WorkflowRunState.IDLE and done.outputs == [7]
    ids = [r.request_id for r in await runtime.store.list_requests(paused.run_id, status=None)]
    assert len(ids) == len(set(ids)) == 2
    await runtime.close()


async def test_two_runs_of_one_workflow_never_share_a_request_id(tmp_path: Path) -> None:
    runtime = open_runtime(tmp_path / "runs.db", build_chained_ports())
    a = await runtime.run("chain", "go", run_id="same-shape-1")
    b = await runtime.run("chain", "go", run_id="same-shape-2")
    assert a.pending_requests[0].request_id != b.pending_requests[0].request_id
    await runtime.close()


# --- history --------------------------------------------------------------------------------


async def test_continuing_from_an_older_checkpoint_is_refused_and_prune_still_works(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    runtime = open_runtime(db, build_chained_ports())
    paused = await runtime.run("chain", "go")
    old: Checkpoint = paused.checkpoint  # type: ignore[assignment]
    await runtime.respond(paused.pending_requests[0].request_id, "one")
    await runtime.resume(paused.run_id)  # history moved on
    wf = runtime.workflow("chain")
    store = runtime.store
    lease = await store.acquire(paused.run_id, "someone", 30)
    with pytest.raises(CheckpointNotLatestError, match="latest checkpoint"):
        await store.commit(lease, old.model_copy(update={"checkpoint_id": "f" * 32}))
    await store.release(lease)
    # the store is intact: latest, history and prune all work, and a fork branches properly
    assert (await store.latest(paused.run_id)) is not None
    forked = await runtime.fork(paused.run_id, 1)
    assert (await runtime.get_run(forked)).status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    assert await runtime.prune(keep_last=1) >= 1
    assert wf.signature == (await store.get_run(forked)).workflow_signature
    await runtime.close()


# --- leases ---------------------------------------------------------------------------------


@pytest.mark.slow  # a 2.5 s step, longer than its lease: `make test` runs it, the fast tier not
async def test_a_superstep_longer_than_the_lease_keeps_its_run(tmp_path: Path) -> None:
    ledger = Ledger()
    db = tmp_path / "runs.db"

    class Slow(Executor):
        @handler
        async def go(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
            await anyio.sleep(2.5)  # an agent turn with several model round trips
            await ctx.yield_output(
                await ctx.run_once("effect", lambda: _async(ledger.record(message)))
            )

    def build() -> Any:
        return WorkflowBuilder(name="slow", start=Slow("slow")).build()

    first = open_runtime(db, build, lease_seconds=1.0)
    second = open_runtime(db, build, lease_seconds=1.0)
    run_id = await first.start("slow", "m")
    outcome: dict[str, Any] = {}

    async def take_over() -> None:
        await anyio.sleep(1.6)  # well past one lease length
        try:
            await second.resume(run_id)
            outcome["second"] = "ran"
        except RunBusyError:
            outcome["second"] = "busy"

    async with anyio.create_task_group() as tg:
        tg.start_soon(take_over)
        result = await first.resume(run_id)
    assert outcome["second"] == "busy"
    assert result.status is WorkflowRunState.IDLE and ledger.effects == ["m"]
    await first.close()
    await second.close()


@pytest.mark.slow  # 40 steps of 50 ms, given up part-way: `make test` runs it
async def test_a_resumer_cancelled_mid_run_releases_the_lease_at_once(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"

    class Sleepy(Executor):
        @handler
        async def go(self, n: int, ctx: WorkflowContext[int, int]) -> None:
            await anyio.sleep(0.05)
            if n < 40:
                await ctx.send_message(n + 1)
            else:
                await ctx.yield_output(n)

    def build() -> Any:
        sleepy = Sleepy("sleepy")
        return WorkflowBuilder(name="sleepy", start=sleepy).add_edge(sleepy, sleepy).build()

    runtime = open_runtime(db, build, lease_seconds=60)
    run_id = await runtime.start("sleepy", 1)
    with anyio.move_on_after(0.4):  # the client gives up part-way, maybe mid-commit
        await runtime.resume(run_id)
    other = open_runtime(db, build, lease_seconds=60)
    done = await other.resume(run_id)  # no 60-second wait for a lease nobody holds
    assert done.status is WorkflowRunState.IDLE and done.outputs == [40]
    await runtime.close()
    await other.close()


async def test_prune_keeps_a_failed_run_that_is_being_retried(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    attempts: list[int] = []
    retrying = anyio.Event()
    go_on = anyio.Event()

    class Flaky(Executor):
        @handler
        async def go(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
            attempts.append(1)
            if len(attempts) == 1:
                raise RuntimeError("first attempt fails")
            retrying.set()
            await go_on.wait()
            await ctx.yield_output(message)

    def build() -> Any:
        return WorkflowBuilder(name="flaky", start=Flaky("flaky")).build()

    runtime = open_runtime(db, build)
    failed = await runtime.run("flaky", "m")
    assert failed.status is WorkflowRunState.FAILED
    async with anyio.create_task_group() as tg:
        tg.start_soon(runtime.resume, failed.run_id)
        await retrying.wait()
        assert await runtime.prune(finished_before=time.time() + 60) == 0
        go_on.set()
    assert (await runtime.get_run(failed.run_id)).status is WorkflowRunState.IDLE
    await runtime.close()


async def test_cancel_of_an_executing_run_is_honoured_between_supersteps(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    started = anyio.Event()

    class Ticker(Executor):
        @handler
        async def tick(self, n: int, ctx: WorkflowContext[int, int]) -> None:
            started.set()
            await anyio.sleep(0.02)
            await ctx.send_message(n + 1)

    def build() -> Any:
        ticker = Ticker("ticker")
        return (
            WorkflowBuilder(name="ticker", start=ticker)
            .with_max_supersteps(10_000)
            .add_edge(ticker, ticker)
            .build()
        )

    worker = open_runtime(db, build, lease_seconds=0.6)
    other = open_runtime(db, build)
    run_id = await worker.start("ticker", 0)
    async with anyio.create_task_group() as tg:
        results: list[Any] = []

        async def execute() -> None:
            results.append(await worker.resume(run_id))

        tg.start_soon(execute)
        await started.wait()
        info = await other.cancel(run_id)  # durable request; the worker is mid-run
        assert info.status is WorkflowRunState.IN_PROGRESS
    (result,) = results
    assert result.status is WorkflowRunState.CANCELLED
    assert (await other.get_run(run_id)).status is WorkflowRunState.CANCELLED
    await worker.close()
    await other.close()


# --- effects cut off mid-flight ---------------------------------------------------------------


def build_in_doubt(ledger: Ledger, crash: list[bool], *, idempotent: bool) -> Any:
    class Payer(Executor):
        @handler
        async def pay(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
            async def effect() -> str:
                ledger.record(message)
                ledger.keys.append(ctx.idempotency_key("pay"))
                if crash and crash.pop():
                    raise Crash  # died after the effect, before its result was journaled
                return f"paid:{message}"

            paid = await ctx.run_once(
                "pay", effect, idempotent=idempotent, description={"paying": message}
            )
            await ctx.yield_output(paid)

    def build() -> Any:
        return WorkflowBuilder(name="doubt", start=Payer("payer")).build()

    return build


async def cut_off_mid_effect(tmp_path: Path, ledger: Ledger) -> tuple[Runtime, str]:
    """A run whose process died inside its effect, then a runtime of a new process: (that
    runtime, the run id)."""
    crash = [True]
    db = tmp_path / "runs.db"
    runtime = open_runtime(db, build_in_doubt(ledger, crash, idempotent=False))
    run_id = await runtime.start("doubt", "m")
    await crashing(runtime.resume(run_id))
    await runtime.close()
    return open_runtime(db, build_in_doubt(ledger, crash, idempotent=False)), run_id


@pytest.mark.parametrize("happened", [True, False])
async def test_an_effect_cut_off_mid_flight_asks_a_person(tmp_path: Path, happened: bool) -> None:
    ledger = Ledger()
    again, run_id = await cut_off_mid_effect(tmp_path, ledger)
    paused = await again.resume(run_id)
    assert ledger.effects == ["m"]  # never a blind repeat
    assert paused.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    (request,) = paused.pending_requests
    assert isinstance(request.data, InDoubtEffect)
    assert request.data.description == {"paying": "m"} and request.data.step == "pay"
    assert request.response_type is EffectResolution
    # what a person looks the effect up by in the outside system (it was not in the question)
    assert request.data.idempotency_key == ledger.keys[0]
    assert request.data.idempotency_key.startswith(f"{run_id}:")
    answer = {"happened": True, "result": "paid:m"} if happened else {"happened": False}
    await again.respond(request.request_id, answer)
    done = await again.resume(run_id)
    assert done.status is WorkflowRunState.IDLE, done.error
    assert done.outputs == ["paid:m"]
    assert ledger.effects == (["m"] if happened else ["m", "m"])
    await again.close()


async def test_a_resolution_with_a_misspelt_result_is_refused_not_recorded_as_none(
    tmp_path: Path,
) -> None:
    ledger = Ledger()
    again, run_id = await cut_off_mid_effect(tmp_path, ledger)
    (request,) = (await again.resume(run_id)).pending_requests
    with pytest.raises(ResponseTypeError, match="results"):
        await again.respond(request.request_id, {"happened": True, "results": "paid:m"})
    # nor is a result for an effect that did not happen (it was dropped without a word)
    with pytest.raises(ResponseTypeError, match="a result goes with happened: true"):
        await again.respond(request.request_id, {"happened": False, "result": "paid:m"})
    await again.respond(request.request_id, {"happened": True, "result": "paid:m"})
    done = await again.resume(run_id)
    assert done.status is WorkflowRunState.IDLE, done.error
    assert done.outputs == ["paid:m"] and ledger.effects == ["m"]
    await again.close()


async def test_an_idempotent_effect_cut_off_mid_flight_is_retried(tmp_path: Path) -> None:
    ledger, crash = Ledger(), [True]
    db = tmp_path / "runs.db"
    runtime = open_runtime(db, build_in_doubt(ledger, crash, idempotent=True))
    run_id = await runtime.start("doubt", "m")
    await crashing(runtime.resume(run_id))
    done = await open_runtime(db, build_in_doubt(ledger, crash, idempotent=True)).resume(run_id)
    assert done.status is WorkflowRunState.IDLE and done.outputs == ["paid:m"]
    assert ledger.effects == ["m", "m"]  # retried (with the same idempotency key)


# --- isolation and failure semantics ------------------------------------------------------------


async def test_each_receiver_gets_its_own_copy_of_a_message(tmp_path: Path) -> None:
    class Split(Executor):
        @handler
        async def go(self, items: list[int], ctx: WorkflowContext[list[int]]) -> None:
            await ctx.send_message(items)

    class Mutator(Executor):
        @handler
        async def take(self, items: list[int], ctx: WorkflowContext[Never, list[int]]) -> None:
            items.append(99)
            await ctx.yield_output(items)

    def build() -> Any:
        split, a, b = Split("split"), Mutator("a"), Mutator("b")
        return WorkflowBuilder(name="copies", start=split).add_fan_out_edges(split, [a, b]).build()

    runtime = open_runtime(tmp_path / "runs.db", build)
    result = await runtime.run("copies", [1])
    assert result.outputs == [[1, 99], [1, 99]]
    await runtime.close()


async def test_outputs_of_a_failed_superstep_are_not_results(tmp_path: Path) -> None:
    failures = [True]

    class Both(Executor):
        @handler
        async def go(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.yield_output(f"out:{message}")
            if failures and failures.pop():
                raise RuntimeError("then fails")

    def build() -> Any:
        return WorkflowBuilder(name="both", start=Both("both")).build()

    runtime = open_runtime(tmp_path / "runs.db", build)
    failed = await runtime.run("both", "m")
    assert failed.status is WorkflowRunState.FAILED and failed.outputs == []
    retried = await runtime.resume(failed.run_id)
    assert retried.outputs == ["out:m"]
    assert (await runtime.get_run(failed.run_id)).outputs == ["out:m"]
    await runtime.close()


async def test_literal_handlers_dispatch_on_the_value(tmp_path: Path) -> None:
    class Gate(Executor):
        @handler
        async def yes(self, message: Literal["yes"], ctx: WorkflowContext[Never, str]) -> None:
            await ctx.yield_output("said yes")

        @handler
        async def other(self, message: str, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.yield_output(f"said {message}")

    def build() -> Any:
        return WorkflowBuilder(name="gate", start=Gate("gate")).build()

    runtime = open_runtime(tmp_path / "runs.db", build)
    assert (await runtime.run("gate", "yes")).outputs == ["said yes"]
    assert (await runtime.run("gate", "no")).outputs == ["said no"]
    assert (await runtime.run("gate", "yes")).outputs == ["said yes"]
    await runtime.close()


async def test_a_value_that_cannot_be_stored_fails_the_run_with_the_error_recorded(
    tmp_path: Path,
) -> None:
    class Opaque:
        pass

    class Sender(Executor):
        @handler
        async def go(self, message: str, ctx: WorkflowContext[Never, Any]) -> None:
            await ctx.yield_output(Opaque())

    def build() -> Any:
        return WorkflowBuilder(name="opaque", start=Sender("sender")).build()

    runtime = open_runtime(tmp_path / "runs.db", build)
    result = await runtime.run("opaque", "m")
    assert result.status is WorkflowRunState.FAILED
    info = await runtime.get_run(result.run_id)
    assert info.status is WorkflowRunState.FAILED
    assert info.error is not None and "Opaque" in info.error["message"]
    await runtime.close()


async def test_damaged_stored_state_stops_the_run_and_records_no_failure(tmp_path: Path) -> None:
    """A state value that no longer decodes is damage to the store, not the handler's fault:
    the resume raises ``StoreCorruptError`` naming the run, and the run is not marked FAILED."""
    import json
    import sqlite3

    from workflow_engine import StoreCorruptError

    class Keeper(Executor):
        @handler
        async def keep(self, message: str, ctx: WorkflowContext[str]) -> None:
            await ctx.set_state("count", 1)
            await ctx.send_message(message)

        @handler
        async def answered(self, answer: bool, ctx: WorkflowContext[Never, int]) -> None:
            await ctx.yield_output(await ctx.get_state("count"))

    def build() -> Any:
        keeper = Keeper("keeper")
        ask = RequestPort("ask", request_type=str, response_type=bool)
        return (
            WorkflowBuilder(name="keeper", start=keeper)
            .add_edge(keeper, ask)
            .add_edge(ask, keeper)
            .build()
        )

    db = tmp_path / "runs.db"
    runtime = open_runtime(db, build)
    paused = await runtime.run("keeper", "m")
    await runtime.respond(paused.pending_requests[0].request_id, True)
    await runtime.close()
    with sqlite3.connect(db) as raw:
        for seq, text in raw.execute(
            "SELECT seq, body FROM checkpoints WHERE run_id = ? ORDER BY seq DESC",
            (paused.run_id,),
        ).fetchall():
            body = json.loads(text)
            if "count" in body.get("executor_states", {}).get("keeper", {}):
                body["executor_states"]["keeper"]["count"] = {"$float": "x"}
                raw.execute(
                    "UPDATE checkpoints SET body = ? WHERE run_id = ? AND seq = ?",
                    (json.dumps(body), paused.run_id, seq),
                )
                break
        else:
            raise AssertionError("the state was not found in any checkpoint")
    again = open_runtime(db, build)
    with pytest.raises(StoreCorruptError, match=paused.run_id):
        await again.resume(paused.run_id)
    info = await again.get_run(paused.run_id)
    assert info.status is not WorkflowRunState.FAILED
    assert (await again.store.get_run(paused.run_id)).owner is None  # the lease was released
    await again.close()


async def test_a_message_is_what_it_was_when_sent(tmp_path: Path) -> None:
    """Sending or yielding one object, changed between sends, delivers and stores each
    version (a snapshot at the call), as state writes always were."""

    class Sender(Executor):
        @handler
        async def go(self, message: str, ctx: WorkflowContext[Box, Box]) -> None:
            box = Box()
            for i in range(3):
                box.n = i
                await ctx.send_message(box)
                await ctx.yield_output(box)

    class Receiver(Executor):
        @handler
        async def got(self, box: Box, ctx: WorkflowContext[Never, Box]) -> None:
            await ctx.yield_output(box)

    def build() -> Any:
        sender, receiver = Sender("sender"), Receiver("receiver")
        return (
            WorkflowBuilder(name="boxes", start=sender)
            .add_edge(sender, receiver)
            .register_types(Box)
            .build()
        )

    runtime = open_runtime(tmp_path / "runs.db", build)
    result = await runtime.run("boxes", "m")
    assert [b.n for b in result.outputs] == [0, 1, 2, 0, 1, 2]
    assert [b.n for b in (await runtime.get_run(result.run_id)).outputs] == [0, 1, 2, 0, 1, 2]
    await runtime.close()


async def test_an_answer_stored_while_the_run_executes_is_applied(tmp_path: Path) -> None:
    """The answerer's own resume finds the run busy; the worker executing it must apply the
    answer before resting, instead of pausing on a request that is already answered."""

    class Slow(Executor):
        @handler
        async def got(self, answer: int, ctx: WorkflowContext[Never, int]) -> None:
            await anyio.sleep(0.4)
            await ctx.yield_output(answer)

    def build() -> Any:
        start, slow = Start("start"), Slow("slow")
        first = RequestPort("first", request_type=str, response_type=int)
        second = RequestPort("second", request_type=str, response_type=int)
        return (
            WorkflowBuilder(name="two_answers", start=start)
            .add_fan_out_edges(start, [first, second])
            .add_edge(first, slow)
            .add_edge(second, slow)
            .build()
        )

    runtime = open_runtime(tmp_path / "runs.db", build)
    paused = await runtime.run("two_answers", "m")
    one, two = paused.pending_requests
    await runtime.respond(one.request_id, 1)
    results: list[Any] = []

    async def worker() -> None:
        results.append(await runtime.resume(paused.run_id))

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker)
        await anyio.sleep(0.15)  # the worker is inside its slow superstep
        await runtime.respond(two.request_id, 2)
        with pytest.raises(RunBusyError):
            await runtime.resume(paused.run_id)
    (result,) = results
    assert result.status is WorkflowRunState.IDLE, result.pending_requests
    assert sorted(result.outputs) == [1, 2]
    assert await runtime.pending_requests(paused.run_id) == []
    await runtime.close()


# --- what a handler gets back is what it would get without a store ---------------------------


def build_key_order() -> Any:
    """``run_once`` returns a dict and a person answers with one: the handler lists the keys."""

    class Asker(Executor):
        @handler
        async def go(self, topic: str, ctx: WorkflowContext[str, Any]) -> None:
            async def effect() -> dict[str, int]:
                return {"zeta": 1, "alpha": 2, "mid": 3}

            got = await ctx.run_once("effect", effect)
            await ctx.yield_output(("run_once", list(got)))
            await ctx.send_message(topic)

    class Told(Executor):
        @handler
        async def told(self, answer: dict[str, int], ctx: WorkflowContext[Never, Any]) -> None:
            await ctx.yield_output(("answer", list(answer)))

    def build() -> Any:
        asker, told = Asker("asker"), Told("told")
        ask = RequestPort("ask", request_type=str, response_type=dict[str, int])
        return (
            WorkflowBuilder(name="key-order", start=asker)
            .add_edge(asker, ask)
            .add_edge(ask, told)
            .build()
        )

    return build


@pytest.mark.parametrize("store", ["sqlite", "memory"])
async def test_dict_keys_keep_their_order_through_the_store(tmp_path: Path, store: str) -> None:
    """A ``run_once`` result and an answer reach the handler with their keys in the order they
    had, as in a run without a store (outside tester: the stores sorted them); the same answer
    with its keys in another order is a duplicate, not a conflict."""
    from workflow_engine import AnswerOutcome, RequestAlreadyAnsweredError
    from workflow_engine.storage import InMemoryRunStore

    build = build_key_order()
    answer = {"zeta": 1, "alpha": 2, "mid": 3}
    plain = build()
    paused = await plain.run("topic")
    done = await plain.run(
        checkpoint=paused.checkpoint, responses={paused.pending_requests[0].request_id: answer}
    )
    expected = paused.outputs + done.outputs
    assert expected == [
        ("run_once", ["zeta", "alpha", "mid"]),
        ("answer", ["zeta", "alpha", "mid"]),
    ]

    rt = Runtime(SqliteStore(tmp_path / "runs.db") if store == "sqlite" else InMemoryRunStore())
    rt.register(build)
    first = await rt.run("key-order", "topic")
    request_id = first.pending_requests[0].request_id
    assert await rt.respond(request_id, answer) is AnswerOutcome.STORED
    reordered = {"alpha": 2, "mid": 3, "zeta": 1}
    assert await rt.respond(request_id, reordered) is AnswerOutcome.DUPLICATE
    with pytest.raises(RequestAlreadyAnsweredError):
        await rt.respond(request_id, {"zeta": 1, "alpha": 2, "mid": 4})
    last = await rt.resume(first.run_id)
    assert [tuple(o) for o in first.outputs + last.outputs] == expected
    await rt.close()


async def test_an_answer_is_stored_as_utf8_and_an_escaped_one_still_matches(tmp_path: Path) -> None:
    """Non-ASCII text in an answer takes its UTF-8 bytes in the database, not six or twelve
    bytes of escape per character (outside tester: a 1,200-byte emoji answer took 3,602); an
    answer an older version stored escaped is still the same answer."""
    import json
    import sqlite3

    from workflow_engine import AnswerOutcome

    db = tmp_path / "runs.db"
    rt = Runtime(SqliteStore(db))
    rt.register(build_key_order())
    first = await rt.run("key-order", "topic")
    request_id = first.pending_requests[0].request_id
    answer = {"\N{GRINNING FACE}" * 300: 1, "caf\u00e9": 2}
    assert await rt.respond(request_id, answer) is AnswerOutcome.STORED
    with sqlite3.connect(db) as raw:
        (stored,) = raw.execute(
            "SELECT CAST(answer AS BLOB) FROM requests WHERE request_id = ?", (request_id,)
        ).fetchone()
        assert len(stored) < 1_300 and "\N{GRINNING FACE}".encode() in stored
        escaped = json.dumps(json.loads(stored), separators=(",", ":"))  # as before
        raw.execute("UPDATE requests SET answer = ? WHERE request_id = ?", (escaped, request_id))
    assert await rt.respond(request_id, answer) is AnswerOutcome.DUPLICATE
    done = await rt.resume(first.run_id)
    assert done.outputs == [("answer", list(answer))]
    await rt.close()


async def test_text_that_is_not_valid_unicode_fails_the_run_with_the_error_recorded(
    tmp_path: Path,
) -> None:
    """An output with a lone surrogate (bytes decoded with ``surrogateescape``): the same
    FAILED run with and without a store, the error recorded -- not a run left ``in_progress``
    whose every resume fails to save (outside tester)."""

    name = b"caf\xe9".decode("utf-8", "surrogateescape")

    class Namer(Executor):
        @handler
        async def go(self, where: str, ctx: WorkflowContext[Never, Any]) -> None:
            if where == "output":
                await ctx.yield_output(name)
            elif where == "state":
                await ctx.set_state("files", [name])
            else:  # a list of plain values in shared state (outside tester 185: not checked)
                await ctx.set_shared("files", ["a", name])

    def build() -> Any:
        return WorkflowBuilder(name="namer", start=Namer("namer")).build()

    runtime = open_runtime(tmp_path / "runs.db", build)
    for where in ("output", "state", "shared"):
        plain = await build().run(where)
        assert plain.status is WorkflowRunState.FAILED and plain.error is not None, where
        assert "lone surrogate" in plain.error.message, (where, plain.error.message)
        result = await runtime.run("namer", where)
        assert result.status is WorkflowRunState.FAILED, where
        info = await runtime.get_run(result.run_id)
        assert info.status is WorkflowRunState.FAILED
        assert info.error is not None and "lone surrogate" in info.error["message"], where
    await runtime.close()


async def test_an_answer_that_is_not_valid_unicode_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    from workflow_engine import ResponseTypeError

    class Greet(Executor):
        @handler
        async def greet(self, name: str, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.yield_output(f"hello {name}")

    def build() -> Any:
        start, greet = Start("start"), Greet("greet")
        ask = RequestPort("ask", request_type=str, response_type=str)
        return (
            WorkflowBuilder(name="ask-name", start=start)
            .add_edge(start, ask)
            .add_edge(ask, greet)
            .build()
        )

    runtime = open_runtime(tmp_path / "runs.db", build)
    paused = await runtime.run("ask-name", "name?")
    request_id = paused.pending_requests[0].request_id
    with pytest.raises(ResponseTypeError, match="lone surrogate") as info:
        await runtime.respond(request_id, "caf\udce9")
    assert request_id in str(info.value)
    with pytest.raises(ResponseTypeError, match="lone surrogate"):
        await runtime.respond_and_resume(request_id, "caf\udce9")
    assert [r.request_id for r in await runtime.pending_requests(paused.run_id)] == [request_id]
    done = await runtime.respond_and_resume(request_id, "café")
    assert done.status is WorkflowRunState.IDLE and done.outputs == ["hello café"]
    await runtime.close()


@pytest.mark.parametrize("call", ["set_state", "append_state", "set_shared"])
@pytest.mark.parametrize("key", [5, None, (1, 2)])
async def test_a_state_key_that_is_not_text_fails_its_superstep(
    tmp_path: Path, call: str, key: Any
) -> None:
    """A checkpoint stores state keys as JSON object keys (text): an int key was committed,
    then read back as "5" -- and after a restart the run could not be read at all (outside
    tester 108). Refused when written, by name; the run ends FAILED, readable."""

    class Keeper(Executor):
        @handler
        async def go(self, message: str, ctx: WorkflowContext[Never, Any]) -> None:
            value = ["v"] if call == "append_state" else "v"
            await getattr(ctx, call)(key, value)
            await ctx.request_info("more?", str)

        @response_handler
        async def more(self, question: str, answer: str, ctx: WorkflowContext[Never, Any]) -> None:
            await ctx.yield_output(answer)

    def build() -> Any:
        return WorkflowBuilder(name="keeper", start=Keeper("keeper")).build()

    runtime = open_runtime(tmp_path / "runs.db", build)
    failed = await runtime.run("keeper", "m")
    await runtime.close()
    assert failed.status is WorkflowRunState.FAILED and failed.error is not None
    assert failed.error.error_type == "UsageError"
    assert f"{call} in executor 'keeper': state keys are text (str)" in failed.error.message
    assert repr(key) in failed.error.message
    fresh = open_runtime(tmp_path / "runs.db", build)
    assert (await fresh.get_run(failed.run_id)).status is WorkflowRunState.FAILED
    await fresh.close()


@pytest.mark.parametrize("where", ["error message", "state key", "shared key"])
async def test_a_lone_surrogate_in_an_error_or_a_key_fails_only_its_run(
    tmp_path: Path, where: str
) -> None:
    """A handler that raises with a non-UTF-8 file name in its message, or uses one as a state
    key: that run ends FAILED with the error recorded (escaped), with and without a store, and
    every other run stays readable (outside tester: the stored error made ``list_runs`` and the
    CLI's listings fail for the whole database; a key left the run in_progress)."""
    name = b"caf\xe9.txt".decode("utf-8", "surrogateescape")

    class Importer(Executor):
        @handler
        async def go(self, message: str, ctx: WorkflowContext[Never, Any]) -> None:
            if where == "error message":
                raise ValueError(f"cannot import {name}")
            if where == "state key":
                await ctx.set_state(name, 1)
            else:
                await ctx.set_shared(name, 1)

    def build() -> Any:
        return WorkflowBuilder(name="importer", start=Importer("importer")).build()

    plain = await build().run("m")
    assert plain.status is WorkflowRunState.FAILED and plain.error is not None
    runtime = open_runtime(tmp_path / "runs.db", build)
    other = await runtime.run("importer", "m")
    failed = await runtime.run("importer", "m")
    assert failed.status is WorkflowRunState.FAILED and failed.error is not None
    assert failed.error.message == plain.error.message
    assert "caf\\udce9" in failed.error.message
    await runtime.close()
    fresh = open_runtime(tmp_path / "runs.db", build)
    listed = await fresh.list_runs()
    assert {r.run_id for r in listed} == {other.run_id, failed.run_id}
    info = await fresh.get_run(failed.run_id)
    assert info.status is WorkflowRunState.FAILED
    assert info.error is not None and info.error["message"] == failed.error.message
    await fresh.close()


class _Charger(Executor):
    """Runs one effect under ``key`` and yields what it returned and the key it was handed."""

    def __init__(self, id: str, key: str, ran: list[str]) -> None:
        super().__init__(id)
        self.key = key
        self.ran = ran

    @handler
    async def go(self, m: str, ctx: WorkflowContext[Never, Any]) -> None:
        handed = ctx.idempotency_key(self.key)

        async def effect() -> str:
            self.ran.append(self.id)
            return f"{self.id} done"

        await ctx.yield_output((await ctx.run_once(self.key, effect), handed))


class _Fan(Executor):
    @handler
    async def go(self, m: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(m)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        # executor ids and keys holding the separators: each pair named one step (tester 166)
        (("a", "X/1.0:src>a/1.0:src>a/X/K"), ("a/1.0:src>a/X", "K")),
        # (the same once "/" is escaped, unless "%" is too)
        (("a/1.0:src>a/X", "K"), ("a%2F1.0:src>a%2FX", "K")),
    ],
)
async def test_steps_of_executors_and_keys_holding_separators_are_different_steps(
    tmp_path: Path, first: tuple[str, str], second: tuple[str, str]
) -> None:
    ran: list[str] = []
    src = _Fan("src")
    one, two = _Charger(*first, ran), _Charger(*second, ran)
    wf = WorkflowBuilder(name="separators", start=src).add_fan_out_edges(src, [one, two]).build()
    runtime = Runtime(SqliteStore(tmp_path / "s.db"))
    try:
        name = runtime.register(wf)
        result = await runtime.run(name, "go")
    finally:
        await runtime.close()
    assert result.status is WorkflowRunState.IDLE, result.pending_requests
    assert sorted(ran) == sorted([first[0], second[0]])
    said = dict(result.outputs)
    assert said.keys() == {f"{first[0]} done", f"{second[0]} done"}
    assert len(set(said.values())) == 2  # two idempotency keys


@pytest.mark.parametrize("key", [1, b"1", None, ""])
async def test_a_step_key_that_is_not_text_is_refused(key: Any) -> None:
    """``run_once(1, f)`` and ``run_once("1", g)`` were one step: ``g`` never ran and got
    ``f``'s result (outside tester 166)."""
    seen: list[str] = []

    class Keyed(Executor):
        @handler
        async def go(self, m: str, ctx: WorkflowContext[Never, Any]) -> None:
            try:
                await ctx.run_once(key, lambda: "ran")
            except UsageError as exc:
                seen.append(str(exc))
            try:
                ctx.idempotency_key(key)
            except UsageError as exc:
                seen.append(str(exc))

    await WorkflowBuilder(name="k", start=Keyed("k")).build().run("x")
    assert len(seen) == 2, seen
    assert all("step keys are non-empty text" in s for s in seen), seen


async def test_a_str_enum_key_is_the_step_of_its_value() -> None:
    """``run_once(Kind.CHARGE)`` was named "Kind.CHARGE": the same step as a key spelt so, and
    another than ``"charge"``, which it equals (outside tester 173)."""
    import enum

    class Kind(str, enum.Enum):  # noqa: UP042 (the case: its str() is "Kind.CHARGE")
        CHARGE = "charge"

    ran: list[str] = []

    class Keyed(Executor):
        @handler
        async def go(self, m: str, ctx: WorkflowContext[Never, Any]) -> None:
            def effect(name: str) -> Any:
                return lambda: ran.append(name) or name

            first = await ctx.run_once(Kind.CHARGE, effect("enum"))
            again = await ctx.run_once("charge", effect("text"))
            other = await ctx.run_once("Kind.CHARGE", effect("other"))
            same = ctx.idempotency_key(Kind.CHARGE) == ctx.idempotency_key("charge")
            await ctx.yield_output([first, again, other, same])

    done = await WorkflowBuilder(name="k", start=Keyed("k")).build().run("x")
    assert done.outputs == [["enum", "enum", "other", True]], done.outputs
    assert ran == ["enum", "other"]


async def test_a_step_key_holding_a_lone_surrogate_is_refused_by_name() -> None:
    """It was accepted in memory, and failed a durable commit without naming the key (outside
    tester 173)."""
    from workflow_engine import SerializationError

    said: list[str] = []

    class Keyed(Executor):
        @handler
        async def go(self, m: str, ctx: WorkflowContext[Never, Any]) -> None:
            try:
                await ctx.run_once("pay\ud800", lambda: "ran")
            except SerializationError as exc:
                said.append(str(exc))

    await WorkflowBuilder(name="k", start=Keyed("k")).build().run("x")
    assert len(said) == 1 and "the step key" in said[0] and "lone surrogate" in said[0], said


class _Charge(Executor):
    """Asks how much to charge, then charges it under one step, handing the key to a ledger."""

    def __init__(self, booked: dict[str, float]) -> None:
        super().__init__("charge")
        self.booked = booked  # (the payment service: one charge per idempotency key)

    @handler
    async def ask(self, order: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.request_info(order, float)

    @response_handler
    async def answered(self, order: str, amount: float, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(await _pay_once(ctx, self.booked, amount))


async def _pay_once(ctx: WorkflowContext[Any, Any], booked: dict[str, float], amount: float) -> str:
    """Charge ``amount`` as one step, the payment service booking each idempotency key once."""
    key = ctx.idempotency_key("pay")

    async def pay() -> str:
        booked.setdefault(key, amount)
        return f"charged {booked[key]}"

    return await ctx.run_once("pay", pay)


async def test_one_saved_pause_answered_two_ways_without_a_store_is_two_branches() -> None:
    """Without a store a checkpoint may be continued more than once. Answered 10 and then 99,
    both continuations handed the charge one idempotency key: the payment service booked 10
    once and the second branch was told of a 99 charge that never happened (outside tester
    178). Branches answered differently hand out different keys; the same answer again (a
    retry) the same key."""
    booked: dict[str, float] = {}
    wf = WorkflowBuilder(name="charge", start=_Charge(booked)).build()
    paused = await wf.run("order 7")
    saved = paused.checkpoint.to_json()
    (request,) = paused.pending_requests
    outputs = []
    for amount in (10.0, 99.0, 10.0):
        again = await wf.run(
            checkpoint=Checkpoint.from_json(saved), responses={request.request_id: amount}
        )
        outputs.append(again.outputs)
    assert outputs == [["charged 10.0"], ["charged 99.0"], ["charged 10.0"]]
    assert sorted(booked.values()) == [10.0, 99.0]  # the retry booked nothing more


class _ChargeEach(Executor):
    """Charges each amount it is sent under one step, booking by idempotency key."""

    def __init__(self, booked: dict[str, float]) -> None:
        super().__init__("charge")
        self.booked = booked

    @handler
    async def charge(self, amount: float, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(await _pay_once(ctx, self.booked, amount))


async def test_one_saved_checkpoint_sent_two_messages_without_a_store_is_two_branches() -> None:
    """The same with a new message instead of an answer: 10, then 99, sent to one finished
    run's checkpoint shared one key, and the 99 charge was booked as the 10 (outside tester
    179)."""
    booked: dict[str, float] = {}
    wf = WorkflowBuilder(name="charge", start=_ChargeEach(booked)).build()
    done = await wf.run(1.0)
    saved = done.checkpoint.to_json()
    outputs = []
    for amount in (10.0, 99.0, 10.0):
        again = await wf.run(amount, checkpoint=Checkpoint.from_json(saved))
        outputs.append(again.outputs)
    assert outputs == [["charged 10.0"], ["charged 99.0"], ["charged 10.0"]]
    assert sorted(booked.values()) == [1.0, 10.0, 99.0]
