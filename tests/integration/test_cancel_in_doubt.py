"""A run cancelled while a step of it is in doubt says so.

A step cut off mid-effect (a kill, a second Ctrl-C) journals an intent and no result; the next
resume asks a person whether it happened. A cancel honoured before that -- ``cancel`` on the
stopped run, or a cancel stored while it was held and honoured by the next resume -- ended the
run ``cancelled`` and nobody was ever told a refund might have been made (outside tester 65).
The cancelled run now reports each such step in ``RunInfo.effects_in_doubt``, with the key the
step handed the outside service.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Never

import pytest
from pydantic import BaseModel

from tests.integration.workflows import cancel_stored_then_worker_died
from workflow_engine import (
    EffectInDoubtEvent,
    Executor,
    ExecutorFailedEvent,
    InDoubtEffect,
    RunStore,
    Runtime,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.storage import InMemoryRunStore, SqliteStore

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Hangs(Executor):
    """One effect that never ends (a call without a timeout)."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def forever() -> str:
            await asyncio.Event().wait()
            return "never"

        charge = ctx.run_once("charge/card", forever, description="the charge")
        await ctx.yield_output(await charge)


def runtime(store: RunStore) -> Runtime:
    rt = Runtime(store)
    rt.register(lambda: WorkflowBuilder("pay", start=Hangs("pay/desk")).build())
    return rt


@pytest.fixture(params=["sqlite", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> RunStore:
    return SqliteStore(tmp_path / "runs.db") if request.param == "sqlite" else InMemoryRunStore()


async def cut_off(rt: Runtime) -> str:
    """A run whose charge started and was cut off (a second Ctrl-C): in doubt."""
    run_id = await rt.start("pay", 1)
    task = asyncio.get_running_loop().create_task(rt.resume(run_id))
    await asyncio.sleep(0.1)
    task.cancel()  # waits for the effect
    await asyncio.sleep(0.1)
    task.cancel()  # stops waiting
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    return run_id


def assert_the_charge(effects: list[InDoubtEffect], run_id: str) -> None:
    [effect] = effects
    assert effect.executor_id == "pay/desk"  # (ids and keys hold the key's separator)
    assert effect.step == "charge/card"
    assert effect.description == "the charge"
    assert effect.idempotency_key.startswith(f"{run_id}:")


async def test_cancelling_a_run_cut_off_mid_effect_reports_the_step(store: RunStore) -> None:
    rt = runtime(store)
    run_id = await cut_off(rt)
    info = await rt.cancel(run_id)
    assert info.status is WorkflowRunState.CANCELLED
    assert_the_charge(info.effects_in_doubt, run_id)
    assert_the_charge((await rt.get_run(run_id)).effects_in_doubt, run_id)
    await rt.close()


async def test_a_stored_cancel_honoured_on_resume_reports_the_step(store: RunStore) -> None:
    """Another process asked to cancel while the run was held; the resume honours it before
    any step runs, so the question is never asked."""
    rt = runtime(store)
    run_id = await cut_off(rt)
    await cancel_stored_then_worker_died(store, run_id)
    ended = await rt.resume(run_id)
    assert ended.status is WorkflowRunState.CANCELLED
    assert not ended.pending_requests
    assert_the_charge((await rt.get_run(run_id)).effects_in_doubt, run_id)
    await rt.close()


async def test_a_question_asked_then_cancelled_reports_the_step(store: RunStore) -> None:
    rt = runtime(store)
    run_id = await cut_off(rt)
    asked = await rt.resume(run_id)
    [question] = asked.pending_requests
    assert isinstance(question.data, InDoubtEffect)
    info = await rt.cancel(run_id)
    assert info.status is WorkflowRunState.CANCELLED
    [effect] = info.effects_in_doubt
    assert effect.idempotency_key == question.data.idempotency_key
    assert question.data.step == "charge/card"  # (it was "card", tester 66)
    await rt.close()


async def test_the_question_is_streamed_after_an_effect_in_doubt_event(store: RunStore) -> None:
    """The step cut off is streamed as ``effect_in_doubt``, not ``executor_failed`` (a reader
    of the events took the run for failed, outside tester 67); it still is an
    ``ExecutorFailedEvent`` for code that handles failures."""
    rt = runtime(store)
    run_id = await cut_off(rt)
    stream = rt.resume_stream(run_id)
    events = [event async for event in stream]
    [doubt] = [e for e in events if isinstance(e, ExecutorFailedEvent)]
    assert isinstance(doubt, EffectInDoubtEvent)
    assert doubt.type == "effect_in_doubt" and doubt.to_dict()["type"] == "effect_in_doubt"
    assert doubt.executor_id == "pay/desk" and doubt.step_key.endswith("/charge/card")
    assert doubt.error.code == "effect_in_doubt"
    [asked] = [e for e in events if e.type == "request_info"]
    assert events.index(doubt) < events.index(asked)
    assert stream.result is not None
    assert stream.result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    await rt.close()


class HangsTwo(Executor):
    """Two effects that never end, started together."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def forever() -> str:
            await asyncio.Event().wait()
            return "never"

        await asyncio.gather(ctx.run_once("a", forever), ctx.run_once("b", forever))


async def test_each_step_in_doubt_is_streamed(store: RunStore) -> None:
    """Two steps cut off together: both were asked about, one was streamed as in doubt
    (tester 70)."""
    rt = Runtime(store)
    rt.register(lambda: WorkflowBuilder("pay", start=HangsTwo("pay/desk")).build())
    run_id = await cut_off(rt)
    stream = rt.resume_stream(run_id)
    events = [event async for event in stream]
    said = sorted(
        e.step_key.rsplit("/", 1)[-1] for e in events if isinstance(e, EffectInDoubtEvent)
    )
    asked = [e for e in events if e.type == "request_info"]
    assert said == ["a", "b"] and len(asked) == 2, [e.type for e in events]
    await rt.close()


@pytest.mark.parametrize("happened", [True, False])
async def test_a_step_a_person_answered_for_is_not_in_doubt(
    store: RunStore, happened: bool
) -> None:
    """They said what happened; the cancel came before the run applied it."""
    rt = runtime(store)
    run_id = await cut_off(rt)
    [question] = (await rt.resume(run_id)).pending_requests
    answer = {"happened": True, "result": "charged"} if happened else {"happened": False}
    await rt.respond(question.request_id, answer)
    info = await rt.cancel(run_id)
    assert info.status is WorkflowRunState.CANCELLED
    assert info.effects_in_doubt == []
    await rt.close()


async def test_a_cancelled_run_with_nothing_in_doubt_reports_nothing(store: RunStore) -> None:
    rt = runtime(store)
    run_id = await rt.start("pay", 1)
    assert (await rt.cancel(run_id)).effects_in_doubt == []
    await rt.close()


async def test_the_report_survives_a_new_runtime(tmp_path: Path) -> None:
    """It is read from the store: another process (here, another runtime on the file) sees it."""
    rt = runtime(SqliteStore(tmp_path / "runs.db"))
    run_id = await cut_off(rt)
    await rt.cancel(run_id)
    await rt.close()
    other = runtime(SqliteStore(tmp_path / "runs.db"))
    assert_the_charge((await other.get_run(run_id)).effects_in_doubt, run_id)
    await other.close()


async def test_a_run_stopped_mid_step_reports_the_step_until_resume_asks(store: RunStore) -> None:
    """Stopped mid-step, no worker executes it: the step is in doubt already, and says so
    (tester 66: only a cancelled run did); the resume then asks about it."""
    rt = runtime(store)
    run_id = await cut_off(rt)
    info = await rt.get_run(run_id)
    assert info.status is WorkflowRunState.IN_PROGRESS
    assert_the_charge(info.effects_in_doubt, run_id)
    asked = await rt.resume(run_id)
    [question] = asked.pending_requests
    assert question.data.idempotency_key == info.effects_in_doubt[0].idempotency_key
    await rt.close()


async def test_a_step_under_way_is_not_in_doubt(store: RunStore) -> None:
    """While a worker executes the run, its step's intent is an effect running, not one in
    doubt."""
    rt = runtime(store)
    run_id = await rt.start("pay", 1)
    task = asyncio.get_running_loop().create_task(rt.resume(run_id))
    await asyncio.sleep(0.1)
    assert (await rt.get_run(run_id)).effects_in_doubt == []
    task.cancel()
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    await rt.close()


def drive_effect_edges(tmp_path: Path, mode: str, *run_id: str) -> subprocess.CompletedProcess[str]:
    """``effect_edges_workflow.py MODE DB LEDGER [RUN]`` over ``tmp_path``'s files."""
    script = Path(__file__).with_name("effect_edges_workflow.py")
    db, ledger = tmp_path / "runs.db", tmp_path / "ledger.txt"
    return subprocess.run(
        [sys.executable, str(script), mode, str(db), str(ledger), *run_id],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def assert_asked_not_charged_again(tmp_path: Path, run_id: str) -> None:
    """The run lists its step in doubt, and its resume asks about it instead of charging."""
    shown = drive_effect_edges(tmp_path, "show", run_id)
    [effect] = json.loads(shown.stdout)
    assert effect["step"] == "charge" and effect["description"] == "the charge"
    resumed = drive_effect_edges(tmp_path, "resume", run_id)
    assert json.loads(resumed.stdout) == {
        "status": "idle_with_pending_requests",
        "asked": ["InDoubtEffect"],
    }, resumed.stderr[-2000:]
    assert (tmp_path / "ledger.txt").read_text() == "charge\n"  # not charged again


def test_an_effect_that_ends_the_process_is_in_doubt_not_repeated(tmp_path: Path) -> None:
    """The effect booked its charge, then ``sys.exit``: the process died inside it. That was
    taken for a clean failure, its intent cleared, and the resume charged again without
    asking (tester 68). It is in doubt: listed, and asked about; and the process ends with
    the exit code it was given, without a traceback."""
    started = drive_effect_edges(tmp_path, "start")
    assert started.returncode == 3, started.stderr[-2000:]
    # the process ends as sys.exit ends it: no "Task exception was never retrieved" (tester 69)
    assert "Traceback" not in started.stderr, started.stderr[-2000:]
    assert (tmp_path / "ledger.txt").read_text() == "charge\n"
    assert_asked_not_charged_again(tmp_path, started.stdout.split()[0])


def test_an_effect_whose_result_a_full_disk_keeps_from_the_journal_says_it_ran(
    tmp_path: Path,
) -> None:
    """The effect booked its charge, then the disk filled: its result could not be journaled.
    The caller got the store's bare "disk I/O error", naming neither the step nor that it had
    run (outside tester 146) -- as the codec's refusal of a result does. It stays in doubt,
    and the resume asks."""
    started = drive_effect_edges(tmp_path, "full-start")
    assert started.returncode == 0 and "Traceback" not in started.stderr, started.stderr[-2000:]
    run_id, line = started.stdout.splitlines()
    error = json.loads(line)
    assert error["error"] == "StoreUnavailableError", error
    said = "step 'charge' of executor 'pay' ran, but its result was not recorded"
    assert said in error["message"]
    assert "disk I/O error" in error["message"]
    assert_asked_not_charged_again(tmp_path, run_id)


class Receipt(BaseModel):
    number: str


class ReturnsWhatCannotBeStored(Executor):
    """Its effect books, then returns a model the workflow's registry does not know."""

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def charge() -> Receipt:
            BOOKED.append("charge")
            return Receipt(number="R1")

        await ctx.run_once("charge", charge)
        await ctx.yield_output("paid")


BOOKED: list[str] = []


async def test_an_effect_whose_result_cannot_be_stored_says_it_ran(store: RunStore) -> None:
    """The run failed with a bare "cannot encode" naming neither the step nor that the effect
    had run, and did not list it in doubt until cancelled (tester 68)."""
    BOOKED.clear()
    rt = Runtime(store)
    rt.register(lambda: WorkflowBuilder("pay", start=ReturnsWhatCannotBeStored("pay")).build())
    run_id = await rt.start("pay", 1)
    failed = await rt.resume(run_id)
    assert failed.status is WorkflowRunState.FAILED
    assert failed.error is not None
    assert "step 'charge' of executor 'pay' ran, but its result cannot be stored" in str(
        failed.error.message
    )
    [effect] = (await rt.get_run(run_id)).effects_in_doubt
    assert effect.step == "charge"
    asked = await rt.resume(run_id)  # asked, not run again
    assert [type(r.data) for r in asked.pending_requests] == [InDoubtEffect]
    assert BOOKED == ["charge"]
    await rt.close()


@pytest.mark.parametrize("with_nan", [False, True])
async def test_a_description_json_cannot_hold_is_stored_as_its_json_form(
    store: RunStore, with_nan: bool
) -> None:
    """A model, a date, a Decimal or a set as a step's description failed durable runs with a
    bare "not JSON serializable" (tester 68); it is shown as its JSON form (what JSON cannot
    hold at all, NaN, as its repr)."""

    class Described(Executor):
        @handler
        async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
            async def forever() -> str:
                await asyncio.Event().wait()
                return "never"

            what = {
                "receipt": Receipt(number="R1"),
                "when": datetime.date(2026, 12, 2),
                "amount": decimal.Decimal("1.50"),
                "tags": {"a"},
                **({"ratio": math.nan} if with_nan else {}),
            }
            await ctx.yield_output(await ctx.run_once("charge", forever, description=what))

    rt = Runtime(store)
    rt.register(lambda: WorkflowBuilder("pay", start=Described("pay/desk")).build())
    run_id = await cut_off(rt)
    [effect] = (await rt.get_run(run_id)).effects_in_doubt
    if with_nan:
        assert isinstance(effect.description, str)
        assert "Receipt(number='R1')" in effect.description and "nan" in effect.description
    else:
        assert effect.description == {
            "receipt": {"number": "R1"},
            "when": "2026-12-02",
            "amount": "1.50",
            "tags": ["a"],
        }
    await rt.close()


@pytest.mark.parametrize("damaged", ["null", "[]", '"intent"', "7"])
async def test_a_journal_entry_damaged_into_other_json_is_damage_not_a_result(
    tmp_path: Path, damaged: str
) -> None:
    """An intent's entry written over with JSON of another shape (``null``): read as no entry,
    the step in doubt went unsaid, and the resume ran the charge again -- never to be done
    blindly (outside tester 210). It is a damaged record, named; nothing runs."""
    import sqlite3

    from workflow_engine import StoreCorruptError

    rt = runtime(SqliteStore(tmp_path / "runs.db"))
    run_id = await cut_off(rt)
    await rt.close()
    with sqlite3.connect(tmp_path / "runs.db") as raw:
        assert raw.execute("UPDATE journal SET value = ?", (damaged,)).rowcount == 1
    other = runtime(SqliteStore(tmp_path / "runs.db"))
    try:
        for read in (other.get_run, other.resume):
            with pytest.raises(StoreCorruptError) as info:
                await read(run_id)
            assert run_id in str(info.value) and "journal entry" in str(info.value), info.value
    finally:
        await other.close()


async def test_a_journaled_result_that_does_not_decode_stops_the_run_named(tmp_path: Path) -> None:
    """A step's journaled result damaged inside (``{"value": {"$type": 5}}``): replayed, it
    failed the run as if the handler had failed, naming neither the run nor the entry (outside
    tester 211). It stops the run's execution as a damaged record, the run left as it was."""
    import sqlite3

    from workflow_engine import StoreCorruptError

    rt = runtime(SqliteStore(tmp_path / "runs.db"))
    run_id = await cut_off(rt)
    await rt.close()
    with sqlite3.connect(tmp_path / "runs.db") as raw:
        raw.execute("UPDATE journal SET value = ?", ('{"value": {"$type": 5}}',))
    other = runtime(SqliteStore(tmp_path / "runs.db"))
    try:
        before = await other.store.get_run(run_id)
        with pytest.raises(StoreCorruptError) as info:
            await other.resume(run_id)
        assert run_id in str(info.value) and "journal entry" in str(info.value), info.value
        after = await other.store.get_run(run_id)
        assert (after.status, after.error, after.owner) == (before.status, None, None)
    finally:
        await other.close()
