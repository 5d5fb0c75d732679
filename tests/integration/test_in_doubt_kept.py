"""A step in doubt is never dropped: whatever the code does next, a person is asked about it.

A step whose effect may have happened with no result recorded -- the process stopped inside it,
or the result could not be stored -- used to be asked about only when the code called it again
and let its error through. Outside tester 193 found three ways it vanished, the run committing
as if nothing had run: the code deployed before the resume named the step differently (a
customer charged twice, under two keys); a handler caught the "ran, but its result cannot be
stored" error and went on; or caught the "was not recorded" error of a failed write. And a
fork of a run paused on such a question asked about the source's effect, by the source's key.
Likewise an answer stored and not applied is never lost from view (the last test).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Never

import pytest

from tests.integration import renamed_step_workflow
from tests.integration.workflows import review_workflow
from workflow_engine import (
    EffectInDoubtEvent,
    Executor,
    InDoubtEffect,
    Runtime,
    StorageError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.storage import SqliteStore

ROOT = Path(__file__).resolve().parents[2]
WAITING = WorkflowRunState.IDLE_WITH_PENDING_REQUESTS

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def ledger_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def killed_inside_the_charge(db: Path, ledger: Path) -> None:
    """Run ``r`` started in a process SIGKILLed inside its charge (which reached the ledger)."""
    env = {**os.environ, "LEDGER": str(ledger), "KILL_IN_EFFECT": "1", "STEP_NAME": "charge"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    script = Path(renamed_step_workflow.__file__)
    done = subprocess.run([sys.executable, str(script), str(db)], env=env, timeout=60, check=False)
    assert done.returncode == -9, done
    assert [e["step"] for e in ledger_of(ledger)] == ["charge"]


@pytest.mark.slow  # a process SIGKILLed inside the charge
@pytest.mark.parametrize("resume", ["resume", "resume_stream"])
@pytest.mark.parametrize("step_name", ["charge", "charge_card"])
async def test_a_step_cut_off_by_a_crash_is_asked_about_before_anything_runs_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step_name: str, resume: str
) -> None:
    """Resumed by code that calls the step as before, or names it ``charge_card`` (a fix
    deployed between the crash and the resume): either way the run asks about ``charge``
    first, and nothing is charged meanwhile -- on the streamed resume too, the command line's
    and the AG-UI server's (it ran the renamed step, outside tester 194)."""
    db, ledger = tmp_path / "runs.db", tmp_path / "ledger.jsonl"
    killed_inside_the_charge(db, ledger)
    monkeypatch.setenv("LEDGER", str(ledger))
    monkeypatch.setenv("STEP_NAME", step_name)
    runtime = Runtime(SqliteStore(db))
    runtime.register(renamed_step_workflow.build)
    [listed] = (await runtime.get_run("r")).effects_in_doubt
    if resume == "resume":
        paused = await runtime.resume("r")
    else:
        stream = runtime.resume_stream("r")
        async for _ in stream:
            pass
        assert stream.result is not None
        paused = stream.result
    assert paused.status is WAITING, paused.error
    [question] = paused.pending_requests
    assert isinstance(question.data, InDoubtEffect)
    assert (question.data.step, question.data.idempotency_key) == ("charge", listed.idempotency_key)
    assert question.data.description == "charge 10 EUR for order 7"
    assert len([e for e in paused.events if isinstance(e, EffectInDoubtEvent)]) == 1
    assert len(ledger_of(ledger)) == 1  # nothing charged before the answer
    # the person says it happened: the run goes on; only a step of another name runs anew
    answer = {"happened": True, "result": "receipt for order 7"}
    done = await runtime.respond_and_resume(question.request_id, answer)
    assert done.status is WorkflowRunState.IDLE, done.error
    assert done.outputs == ["receipt for order 7"]
    charged = [e["step"] for e in ledger_of(ledger)]
    assert charged == (["charge"] if step_name == "charge" else ["charge", "charge_card"])
    assert (await runtime.get_run("r")).effects_in_doubt == []
    await runtime.close()


class Unreadable:
    """What a client library might return: nothing a workflow's codec can store."""


class CatchesEverything(Executor):
    """Charges, and catches whatever the step raises -- three times over (a retry wrapper)."""

    charges: list[str]

    @handler
    async def charge(self, how: str, ctx: WorkflowContext[Never, str]) -> None:
        async def effect() -> Any:
            self.charges.append(how)
            return Unreadable() if how == "unreadable" else "receipt"

        for _ in range(3):
            try:
                receipt = await ctx.run_once("charge", effect, description="charge 10 EUR")
                break
            except Exception as exc:
                receipt = f"caught {type(exc).__name__}"
        await ctx.yield_output(receipt)


def _journal_write_fails(point: str) -> None:
    if point == "journal:before":
        raise StorageError("cannot write the database: database or disk is full")


@pytest.mark.parametrize("how", ["unreadable", "unrecorded"])
async def test_a_caught_error_of_a_step_that_ran_still_asks_about_it(
    tmp_path: Path, how: str
) -> None:
    """The effect ran and its result cannot be stored (``unreadable``) or was not recorded
    (``unrecorded``: the journal write fails): the handler catches the error -- and calls the
    step twice more -- but the run pauses with one question about it instead of committing
    its fallback; answered, the step's result is the answer's and nothing runs again."""
    executor = CatchesEverything("card")
    executor.charges = []
    store = SqliteStore(tmp_path / "runs.db")
    runtime = Runtime(store)
    runtime.register(lambda: WorkflowBuilder("charges", start=executor).build())
    if how == "unrecorded":
        store.fault_hook = _journal_write_fails
    paused = await runtime.run("charges", how)
    store.fault_hook = None
    assert paused.status is WAITING, (paused.status, paused.outputs, paused.error)
    assert paused.outputs == []
    [question] = paused.pending_requests
    assert isinstance(question.data, InDoubtEffect) and question.data.step == "charge"
    assert question.data.description == "charge 10 EUR"
    doubts = [e for e in paused.events if isinstance(e, EffectInDoubtEvent)]
    assert len(doubts) == 1, doubts
    assert "ran, but its result" in doubts[0].error.message, doubts[0]
    done = await runtime.respond_and_resume(
        question.request_id, {"happened": True, "result": "receipt 42"}
    )
    assert done.status is WorkflowRunState.IDLE, done.error
    assert done.outputs == ["receipt 42"]
    assert executor.charges == [how]  # once, before the question
    await runtime.close()


async def test_an_uncaught_unreadable_result_still_fails_the_run_and_the_resume_asks(
    tmp_path: Path,
) -> None:
    """Let through, the "cannot be stored" error fails the run as before (the README says so);
    its resume asks about the step."""

    class LetsItThrough(Executor):
        @handler
        async def charge(self, how: str, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.run_once("charge", Unreadable, description="charge 10 EUR")

    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(lambda: WorkflowBuilder("charges", start=LetsItThrough("card")).build())
    failed = await runtime.run("charges", "x", run_id="r")
    assert failed.status is WorkflowRunState.FAILED
    assert "ran, but its result cannot be stored" in failed.error.message  # type: ignore[union-attr]
    asked = await runtime.resume("r")
    [question] = asked.pending_requests
    assert isinstance(question.data, InDoubtEffect) and question.data.step == "charge"
    await runtime.close()


async def test_a_description_with_a_lone_surrogate_is_kept_as_its_repr(tmp_path: Path) -> None:
    """A file name decoded with ``surrogateescape`` in a step's description failed the run on
    SQLite with an error naming nothing (outside tester 193): what a store cannot hold is kept
    as its repr, as what JSON cannot hold already was."""
    name = os.fsdecode(b"report-\xff.pdf")

    class Uploads(Executor):
        @handler
        async def upload(self, how: str, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.yield_output(
                await ctx.run_once("upload", lambda: "uploaded", description={"file": name})
            )

    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(lambda: WorkflowBuilder("uploads", start=Uploads("up")).build())
    done = await runtime.run("uploads", "x")
    assert done.status is WorkflowRunState.IDLE, done.error
    assert done.outputs == ["uploaded"]
    await runtime.close()


@pytest.mark.slow  # a process SIGKILLed inside the charge
async def test_a_fork_of_a_run_asking_about_an_effect_runs_the_step_as_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fork's steps are new ones, under its own keys: it does not ask about the source's
    effect (by the source's key), it runs its own."""
    db, ledger = tmp_path / "runs.db", tmp_path / "ledger.jsonl"
    killed_inside_the_charge(db, ledger)
    monkeypatch.setenv("LEDGER", str(ledger))
    runtime = Runtime(SqliteStore(db))
    runtime.register(renamed_step_workflow.build)
    asked = await runtime.resume("r")
    [question] = asked.pending_requests
    fork = await runtime.fork("r")
    assert (await runtime.get_run(fork)).pending_requests == []
    done = await runtime.resume(fork)
    assert done.status is WorkflowRunState.IDLE, done.error
    charges = ledger_of(ledger)
    assert [e["step"] for e in charges] == ["charge", "charge"]
    assert charges[1]["key"].startswith(f"{fork}:")
    assert charges[1]["key"] != question.data.idempotency_key
    # the source still asks, by its own key
    [still] = (await runtime.get_run("r")).pending_requests
    assert still.request_id == question.request_id
    await runtime.close()


async def test_a_run_whose_answers_wait_for_a_resume_says_so(tmp_path: Path) -> None:
    """A process that stored an answer and stopped before resuming left a run that the
    documented queries showed as merely paused -- no pending request, no answer waiting -- so
    a recovery loop left it paused for good (outside tester 192). ``get_run`` names the
    answers waiting, and the store lists them."""
    db = tmp_path / "runs.db"
    first = Runtime(SqliteStore(db))
    first.register(review_workflow)
    paused = await first.run("review", "a topic", run_id="r")
    [request] = paused.pending_requests
    await first.respond(request.request_id, True)
    await first.close()  # (stopped before its resume)

    later = Runtime(SqliteStore(db))
    later.register(review_workflow)
    info = await later.get_run("r")
    assert (info.status, info.pending_requests) == (WAITING, [])
    assert info.answered_requests == [request.request_id]
    waiting = {r.run_id for r in await later.store.list_requests(status="answered")}
    assert waiting == {"r"}
    done = await later.resume("r")
    assert done.outputs == [True]
    assert (await later.get_run("r")).answered_requests == []
    await later.close()


class Killed(BaseException):
    """Stands for the process dying inside an effect (it is no ``Exception``)."""


@pytest.mark.parametrize("then", ["calls it again", "catches it", "skips it"])
async def test_a_workflow_continued_from_its_store_asks_about_a_step_cut_off(then: str) -> None:
    """Without a runtime, a workflow continued from its checkpoint store after an effect was
    cut off asked only when the code called the step again and let its error through: a
    handler that caught it, or code that no longer called it, committed as if nothing had run
    (outside tester 194)."""
    from workflow_engine import InMemoryCheckpointStore

    charged: list[str] = []
    mode = {"kill": True, "then": then}

    class Charges(Executor):
        @handler
        async def charge(self, order: str, ctx: WorkflowContext[Never, str]) -> None:
            async def effect() -> str:
                charged.append(order)
                if mode["kill"]:
                    raise Killed
                return "receipt"

            if not mode["kill"] and mode["then"] == "skips it":
                await ctx.yield_output("skipped")
                return
            try:
                receipt = await ctx.run_once("charge", effect, description="charge 10 EUR")
            except Exception:
                if mode["then"] != "catches it":
                    raise
                receipt = "fallback"
            await ctx.yield_output(receipt)

    workflow = WorkflowBuilder("charges", start=Charges("card")).build()
    store = InMemoryCheckpointStore()
    with pytest.raises(Killed):
        await workflow.run("order 7", checkpoint_store=store, run_id="r")
    latest = await store.latest("r")
    mode["kill"] = False
    asked = await workflow.run(checkpoint=latest, checkpoint_store=store)
    assert asked.status is WAITING, (asked.status, asked.outputs)
    [question] = asked.pending_requests
    assert isinstance(question.data, InDoubtEffect) and question.data.step == "charge"
    assert charged == ["order 7"]


async def test_a_description_of_an_integer_past_what_json_reads_is_kept_as_it_can_be(
    tmp_path: Path,
) -> None:
    """A bare integer of more than 4,300 digits as a step's description failed the durable
    run, naming nothing, at every resume (outside tester 197); in a dict it was kept."""

    class Counts(Executor):
        @handler
        async def count(self, how: str, ctx: WorkflowContext[Never, str]) -> None:
            said = await ctx.run_once("count", lambda: "counted", description=10**5000)
            await ctx.yield_output(said)

    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(lambda: WorkflowBuilder("counts", start=Counts("c")).build())
    done = await runtime.run("counts", "x")
    assert done.status is WorkflowRunState.IDLE, done.error
    assert done.outputs == ["counted"]
    await runtime.close()
