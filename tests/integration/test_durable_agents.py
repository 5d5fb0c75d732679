"""Tool approval that survives a restart: pause, close everything, answer, resume elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.workflows import asked_after_a_crash
from workflow_engine import (
    Executor,
    ExternalResponse,
    ResponseTypeError,
    Runtime,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine.storage import SqliteStore
from workflow_engine_cli.demos import bank_transfer

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

MESSAGE = "Please transfer 1000 from account 123456 to account 654321."


def runtime(db: Path) -> Runtime:
    rt = Runtime(SqliteStore(db))
    rt.register(bank_transfer.build_request_port_workflow)
    return rt


@pytest.mark.parametrize("approved", [True, False])
async def test_approval_across_restart(tmp_path: Path, approved: bool) -> None:
    bank_transfer.LEDGER.clear()
    db = tmp_path / "runs.db"
    first = runtime(db)
    paused = await first.run("bank_transfer", MESSAGE)
    assert paused.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    await first.close()

    inbox = runtime(db)
    (pending,) = await inbox.pending_requests()
    assert pending.data.function_call.name == "transfer"
    with pytest.raises(ResponseTypeError, match="greater than 0"):
        await inbox.respond(pending.request_id, {"approved": True, "arguments": {"amount": 0}})
    assert (await inbox.get_request(pending.request_id)).status == "pending"  # unchanged
    await inbox.respond(pending.request_id, {"approved": approved})
    await inbox.close()

    worker = runtime(db)
    done = await worker.resume(paused.run_id)
    assert done.status is WorkflowRunState.IDLE
    assert len(bank_transfer.LEDGER) == (1 if approved else 0)
    info = await worker.get_run(paused.run_id)
    assert info.outputs[0].text.startswith("Done." if approved else "The transfer was not made")
    # a committed superstep is never re-executed, so its journal entries are compacted away
    assert await _journal_rows(db) == []
    await worker.close()


async def _journal_rows(db: Path) -> list[str]:
    import sqlite3

    with sqlite3.connect(db) as raw:
        return [key for (key,) in raw.execute("SELECT key FROM journal")]


async def test_a_retried_superstep_streams_the_agents_words_again(tmp_path: Path) -> None:
    """The commit after the approved transfer fails (a full disk); the retry takes the model's
    replies from the journal instead of asking again -- and still streams what the agent said,
    as the first attempt did (outside tester: the retry showed the tool calls without the text
    that came with them)."""
    from workflow_engine import StorageError
    from workflow_engine.executors import AgentRunUpdateEvent

    full = False

    def hook(point: str) -> None:
        if point == "commit:inside" and full:
            raise StorageError("database or disk is full")

    bank_transfer.LEDGER.clear()
    rt = Runtime(SqliteStore(tmp_path / "runs.db", fault_hook=hook))
    rt.register(bank_transfer.build_request_port_workflow)
    paused = await rt.run("bank_transfer", MESSAGE)
    await rt.respond(paused.pending_requests[0].request_id, {"approved": True})

    def said(events: list[object]) -> tuple[str, list[str | None]]:
        updates = [e for e in events if isinstance(e, AgentRunUpdateEvent)]
        text = "".join(u.text for u in updates if u.kind == "text")
        return text, [u.name for u in updates if u.kind == "function_call"]

    full = True
    first: list[object] = []
    with pytest.raises(StorageError):
        async for event in rt.resume_stream(paused.run_id):
            first.append(event)
    full = False
    retried = [event async for event in rt.resume_stream(paused.run_id)]
    text, calls = said(retried)
    assert text and (text, calls) == said(first)
    assert len(bank_transfer.LEDGER) == 1  # the approved transfer ran once
    await rt.close()


DIES_IN_TOOL = """
import os, sys
import anyio
from workflow_engine import Runtime
from workflow_engine.storage import SqliteStore
from workflow_engine_cli.demos.support_handoff import build_support_workflow

def build():
    workflow = build_support_workflow()
    for node in workflow.graph.nodes.values():
        agent = getattr(node, "agent", None)
        tool = agent.tools.get(sys.argv[2]) if agent is not None else None
        if tool is not None:
            tool.func = lambda **_: os._exit(9)  # the process dies inside the tool
    return workflow

async def main():
    rt = Runtime(SqliteStore(sys.argv[1]))
    rt.register(build, name="support")
    run_id = await rt.start("support", "I want a refund for order 12345")
    print(run_id, flush=True)
    await rt.resume(run_id)

anyio.run(main)
"""


@pytest.mark.slow  # a process that dies, then another
@pytest.mark.parametrize("tool", ["handoff_to_refund_agent", "lookup_order_details"])
async def test_a_crash_inside_a_tool_that_only_reads_reruns_it_and_asks_no_one(
    tmp_path: Path, tool: str
) -> None:
    """The engine's ``handoff_to_<agent>`` tools only name the next agent, and the demo's
    order lookup only reads: a process that dies inside one leaves nothing in doubt, and the
    next resume runs it again. Each used to pause the run with an ``InDoubtEffect`` asking a
    person (over AG-UI, the customer) whether it happened."""
    import subprocess
    import sys

    from workflow_engine_cli.demos.support_handoff import build_support_workflow

    db = tmp_path / "support.db"
    died = subprocess.run(
        [sys.executable, "-c", DIES_IN_TOOL, str(db), tool], capture_output=True, text=True
    )
    assert died.returncode == 9, died.stderr[-2000:]
    run_id = died.stdout.split()[0]
    rt = Runtime(SqliteStore(db))
    rt.register(build_support_workflow, name="support")
    result = await rt.resume(run_id)
    assert result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, result.error
    [pending] = result.pending_requests
    assert type(pending.data).__name__ == "ToolApprovalRequestContent", pending.data
    assert pending.data.function_call.name == "submit_refund"
    await rt.close()


class Crash(BaseException):
    """The process dies (not an error the agent turns into a tool result)."""


async def test_a_tool_call_cut_off_asks_with_the_arguments_it_ran_with_and_its_key(
    tmp_path: Path,
) -> None:
    """A person asked whether a call happened sees what the tool ran with (the model's ``"42"``
    validated to ``42.0``; the question showed ``"42"``) and the key the tool handed the outside
    service, to look the effect up by (outside tester)."""
    from workflow_engine import EffectResolution, InDoubtEffect, WorkflowBuilder
    from workflow_engine.executors import Agent, Rule, ScriptedChatClient, ToolCall, tool

    ran: list[tuple[float, str]] = []

    @tool
    def pay(amount: float, idempotency_key: str) -> str:
        """Pay an amount."""
        ran.append((amount, idempotency_key))
        if len(ran) == 1:
            raise Crash
        return "paid"

    def build() -> Any:
        model = ScriptedChatClient([Rule(user="pay", calls=[ToolCall("pay", {"amount": "42"})])])
        payer = Agent("payer", "You pay.", model, [pay])
        return WorkflowBuilder(name="payer", start=payer).build()

    again, asked = await asked_after_a_crash(build, tmp_path / "payer.db", Crash)
    assert isinstance(asked.data, InDoubtEffect) and asked.response_type is EffectResolution
    assert asked.data.description["arguments"] == {"amount": 42.0}
    assert asked.data.idempotency_key == ran[0][1]
    assert ran == [(42.0, ran[0][1])]  # never a blind repeat
    await again.close()


EDIT = {"from_account": "123456", "to_account": "654321"}


@pytest.mark.parametrize("where", ["sqlite", "memory"])
async def test_an_edit_sent_again_as_10_or_10_0_is_the_same_answer(
    tmp_path: Path, where: str
) -> None:
    """JSON does not tell ``10`` from ``10.0`` (a browser sends ``10.0`` as ``10``): an
    approval sent again through another client was refused as a different answer."""
    from workflow_engine import AnswerOutcome, RequestAlreadyAnsweredError
    from workflow_engine.storage import InMemoryRunStore

    bank_transfer.LEDGER.clear()
    rt = Runtime(SqliteStore(tmp_path / "runs.db") if where == "sqlite" else InMemoryRunStore())
    rt.register(bank_transfer.build_request_port_workflow)
    paused = await rt.run("bank_transfer", MESSAGE)
    (pending,) = paused.pending_requests
    rid = pending.request_id

    def edit(amount: Any) -> dict[str, Any]:
        return {"approved": True, "arguments": {**EDIT, "amount": amount}}

    assert await rt.respond(rid, edit(10)) is AnswerOutcome.STORED
    assert await rt.respond(rid, edit(10.0)) is AnswerOutcome.DUPLICATE  # waiting in the inbox
    with pytest.raises(RequestAlreadyAnsweredError, match=rid):
        await rt.respond(rid, edit(10.5))
    done = await rt.resume(paused.run_id)
    assert done.status is WorkflowRunState.IDLE
    assert await rt.respond(rid, edit(10.0)) is AnswerOutcome.DUPLICATE  # applied
    with pytest.raises(RequestAlreadyAnsweredError, match=rid):
        await rt.respond(rid, edit(11))
    assert [entry["amount"] for entry in bank_transfer.LEDGER] == [10.0]
    await rt.close()


async def test_a_checkpoint_takes_an_answer_again_as_10_or_10_0() -> None:
    """Without a store, a checkpoint keeps an applied answer whole, then as a digest; either
    way the same answer in the other form is a repeat (a no-op), a different one a conflict.
    A digest taken before integral floats were written as integers still matches its answer."""
    import hashlib
    import json

    from workflow_engine import RequestAlreadyAnsweredError

    bank_transfer.LEDGER.clear()
    workflow = bank_transfer.build_request_port_workflow()
    paused = await workflow.run(MESSAGE)
    (pending,) = paused.pending_requests
    rid = pending.request_id
    # (edits that change the call: a digest is compared with an answer as written, and fields
    # sent as proposed are not kept)
    answer = {"approved": True, "arguments": {"amount": 10.0}}
    done = await workflow.run(checkpoint=paused.checkpoint, responses={rid: answer})
    assert done.status is WorkflowRunState.IDLE and len(bank_transfer.LEDGER) == 1
    checkpoint = done.checkpoint
    assert checkpoint is not None and rid in checkpoint.answered_digests
    again = {"approved": True, "arguments": {"amount": 10}}
    repeat = await workflow.run(checkpoint=checkpoint, responses={rid: again})
    assert repeat.status is WorkflowRunState.IDLE and len(bank_transfer.LEDGER) == 1
    with pytest.raises(RequestAlreadyAnsweredError, match=rid):
        await workflow.run(checkpoint=checkpoint, responses={rid: {"approved": False}})

    # the digest as taken before: ``10.0`` written as such
    _, _, type_name = checkpoint.answered_digests[rid].partition(" ")
    encoded = workflow.codec.encode(
        workflow.coerce_response("r", rid, workflow.resolve_type(type_name), answer)
    )
    text = json.dumps(encoded, sort_keys=True, separators=(",", ":"))
    assert "10.0" in text
    old = hashlib.sha256(text.encode()).hexdigest()[:32]
    older = checkpoint.model_copy(
        update={"answered_digests": {**checkpoint.answered_digests, rid: f"{old} {type_name}"}}
    )
    repeat = await workflow.run(checkpoint=older, responses={rid: answer})
    assert repeat.status is WorkflowRunState.IDLE and len(bank_transfer.LEDGER) == 1
    with pytest.raises(RequestAlreadyAnsweredError, match=rid):
        await workflow.run(checkpoint=older, responses={rid: {"approved": False}})


class HowMany(Executor):
    """Asks for a count (an ``int`` answer), then yields it."""

    @handler
    async def ask(self, question: str, ctx: WorkflowContext[None, int]) -> None:
        await ctx.request_info(question, int)

    @response_handler
    async def counted(self, question: str, count: int, ctx: WorkflowContext[None, int]) -> None:
        await ctx.yield_output(count)


def count_workflow() -> Workflow:
    return WorkflowBuilder(name="count", start=HowMany("how_many")).build()


@pytest.mark.parametrize("where", ["sqlite", "memory"])
async def test_an_int_answer_given_again_as_10_0_is_the_same_answer(
    tmp_path: Path, where: str
) -> None:
    """``10.0`` is no ``int`` as a first answer; given again after ``10`` it is that answer (it
    was refused as a different value, tester 74). And ``respond_and_resume`` given an answer
    again after the run ended returns the run as it ended (it raised "nothing to resume"; the
    in-memory store raised that even for a different answer, hiding the conflict)."""
    from workflow_engine import AnswerOutcome, RequestAlreadyAnsweredError
    from workflow_engine.storage import InMemoryRunStore

    rt = Runtime(SqliteStore(tmp_path / "runs.db") if where == "sqlite" else InMemoryRunStore())
    rt.register(count_workflow)
    paused = await rt.run("count", "how many?")
    (pending,) = paused.pending_requests
    rid = pending.request_id
    with pytest.raises(ResponseTypeError, match="valid integer"):
        await rt.respond(rid, 10.5)
    with pytest.raises(ResponseTypeError, match="valid integer"):
        await rt.respond(rid, 10.0)
    assert await rt.respond(rid, 10) is AnswerOutcome.STORED
    assert await rt.respond(rid, 10.0) is AnswerOutcome.DUPLICATE
    for different in (11, 11.0, 10.5, True, "10"):
        with pytest.raises(RequestAlreadyAnsweredError, match=rid):
            await rt.respond(rid, different)
    done = await rt.respond_and_resume(rid, 10.0)
    assert done.status is WorkflowRunState.IDLE and done.outputs == [10]
    again = await rt.respond_and_resume(rid, 10.0)  # a retry after a lost reply
    assert again.status is WorkflowRunState.IDLE and again.outputs == []
    assert again.checkpoint is not None and again.checkpoint == done.checkpoint
    assert await rt.respond(rid, 10) is AnswerOutcome.DUPLICATE
    for different in (11, True):
        with pytest.raises(RequestAlreadyAnsweredError, match=rid):
            await rt.respond_and_resume(rid, different)
    assert (await rt.get_run(paused.run_id)).outputs == [10]
    await rt.close()

    # without a store, the checkpoint's record of the answer decides the same way
    workflow = count_workflow()
    paused_here = await workflow.run("how many?")
    (asked,) = paused_here.pending_requests
    ended = await workflow.run(checkpoint=paused_here.checkpoint, responses={asked.request_id: 10})
    assert ended.outputs == [10]
    repeat = await workflow.run(checkpoint=ended.checkpoint, responses={asked.request_id: 10.0})
    assert repeat.status is WorkflowRunState.IDLE and repeat.outputs == []
    with pytest.raises(RequestAlreadyAnsweredError):
        await workflow.run(checkpoint=ended.checkpoint, responses={asked.request_id: 11.0})


@pytest.mark.parametrize("where", ["sqlite", "memory", "no store"])
@pytest.mark.parametrize("echoed_first", [False, True])
async def test_an_approval_echoing_the_proposed_arguments_is_a_bare_approval(
    tmp_path: Path, where: str, echoed_first: bool
) -> None:
    """Approved from the command line, then again by a web client that echoes the arguments it
    showed (or the other way round): the same decision, refused as a conflict (tester 77)."""
    from workflow_engine import AnswerOutcome, RequestAlreadyAnsweredError
    from workflow_engine.storage import InMemoryRunStore

    bank_transfer.LEDGER.clear()
    workflow = bank_transfer.build_request_port_workflow()
    if where == "no store":
        paused = await workflow.run(MESSAGE)
    else:
        store: Any = SqliteStore(tmp_path / "r.db") if where == "sqlite" else InMemoryRunStore()
        rt = Runtime(store)
        rt.register(bank_transfer.build_request_port_workflow)
        paused = await rt.run("bank_transfer", MESSAGE)
    (pending,) = paused.pending_requests
    rid = pending.request_id
    proposed = dict(pending.data.function_call.arguments)
    bare = {"approved": True}
    echoed = {"approved": True, "arguments": proposed}
    first, then = (echoed, bare) if echoed_first else (bare, echoed)
    changed = {"approved": True, "arguments": {**proposed, "amount": 5}}
    if where == "no store":  # both in one call (a settled answer keeps only its digest)
        with pytest.raises(RequestAlreadyAnsweredError, match=rid):
            await workflow.run(
                checkpoint=paused.checkpoint,
                responses=[ExternalResponse(rid, first), ExternalResponse(rid, changed)],
            )
        done = await workflow.run(
            checkpoint=paused.checkpoint,
            responses=[ExternalResponse(rid, first), ExternalResponse(rid, then)],
        )
        assert done.status is WorkflowRunState.IDLE
    else:
        assert await rt.respond(rid, first) is AnswerOutcome.STORED
        assert await rt.respond(rid, then) is AnswerOutcome.DUPLICATE  # waiting
        with pytest.raises(RequestAlreadyAnsweredError, match=rid):
            await rt.respond(rid, changed)
        done = await rt.resume(paused.run_id)
        assert done.status is WorkflowRunState.IDLE
        assert await rt.respond(rid, then) is AnswerOutcome.DUPLICATE  # applied
        await rt.close()
    assert [entry["amount"] for entry in bank_transfer.LEDGER] == [1000.0]


async def _transfer_awaiting_approval(tmp_path: Path, where: str) -> tuple[Runtime, Any, Any]:
    """A runtime over a fresh store (``sqlite`` or ``memory``), the store, and a bank transfer
    run paused on its approval (the ledger emptied)."""
    from workflow_engine.storage import InMemoryRunStore

    bank_transfer.LEDGER.clear()
    store: Any = SqliteStore(tmp_path / "r.db") if where == "sqlite" else InMemoryRunStore()
    rt = Runtime(store)
    rt.register(bank_transfer.build_request_port_workflow)
    return rt, store, await rt.run("bank_transfer", MESSAGE)


@pytest.mark.parametrize("where", ["sqlite", "memory"])
async def test_an_edit_is_the_fields_it_changes(tmp_path: Path, where: str) -> None:
    """The whole call with one field changed, then that field alone: the same edit, and the
    call runs with it (the first was kept whole, and the second refused as a different
    answer: outside tester 103)."""
    from workflow_engine import AnswerOutcome

    rt, store, paused = await _transfer_awaiting_approval(tmp_path, where)
    rid = paused.pending_requests[0].request_id
    proposed = dict(paused.pending_requests[0].data.function_call.arguments)
    whole = {"approved": True, "arguments": {**proposed, "amount": 5}}
    assert await rt.respond(rid, whole) is AnswerOutcome.STORED
    assert await rt.respond(rid, {"approved": True, "arguments": {"amount": 5}}) is (
        AnswerOutcome.DUPLICATE
    )
    assert (await store.get_request(rid)).answer["data"]["arguments"] == {"amount": 5}
    done = await rt.resume(paused.run_id)
    assert done.status is WorkflowRunState.IDLE
    assert [entry["amount"] for entry in bank_transfer.LEDGER] == [5]
    await rt.close()


@pytest.mark.parametrize("where", ["sqlite", "memory"])
async def test_edits_are_compared_as_the_tool_reads_them(tmp_path: Path, where: str) -> None:
    """``1000.0`` for a proposed ``"1000"``, or a ``Decimal`` from a Python caller, changes
    nothing the tool runs with: a bare approval (the first was kept as an edit, so the bare
    approval after it was refused, and the second refused outright as not JSON: outside tester
    104). A ``Decimal`` that changes the amount is that edit."""
    from decimal import Decimal

    from workflow_engine import AnswerOutcome

    rt, store, paused = await _transfer_awaiting_approval(tmp_path, where)
    rid = paused.pending_requests[0].request_id
    assert paused.pending_requests[0].data.function_call.arguments["amount"] == "1000"
    echoed = {"approved": True, "arguments": {"amount": 1000.0, "to_account": "654321"}}
    assert await rt.respond(rid, echoed) is AnswerOutcome.STORED
    for same in ({"approved": True}, {"approved": True, "arguments": {"amount": Decimal(1000)}}):
        assert await rt.respond(rid, same) is AnswerOutcome.DUPLICATE
    assert (await store.get_request(rid)).answer["data"]["arguments"] is None
    await rt.close()
    rt, store, paused = await _transfer_awaiting_approval(tmp_path / "again", where)
    rid = paused.pending_requests[0].request_id
    five = {"approved": True, "arguments": {"amount": Decimal("5.0")}}
    assert await rt.respond(rid, five) is AnswerOutcome.STORED
    for same in (five, {"approved": True, "arguments": {"amount": 5}}):
        assert await rt.respond(rid, same) is AnswerOutcome.DUPLICATE  # (kept as 5.0)
    assert (await rt.resume(paused.run_id)).status is WorkflowRunState.IDLE
    assert [entry["amount"] for entry in bank_transfer.LEDGER] == [5.0]
    await rt.close()
    # a changed field is kept as the tool reads it: "250" from a form, 250 from a script and
    # the whole call with 250.0 are one edit (the text was kept, the rest refused: tester 105)
    rt, store, paused = await _transfer_awaiting_approval(tmp_path / "form", where)
    rid = paused.pending_requests[0].request_id
    proposed = dict(paused.pending_requests[0].data.function_call.arguments)
    assert await rt.respond(rid, {"approved": True, "arguments": {"amount": "250"}}) is (
        AnswerOutcome.STORED
    )
    for same in ({"amount": 250}, {**proposed, "amount": 250.0}):
        assert await rt.respond(rid, {"approved": True, "arguments": same}) is (
            AnswerOutcome.DUPLICATE
        )
    assert (await store.get_request(rid)).answer["data"]["arguments"] == {"amount": 250.0}
    await rt.close()


@pytest.mark.parametrize("where", ["sqlite", "memory"])
async def test_a_rejection_is_one_answer_whatever_arguments_come_with_it(
    tmp_path: Path, where: str
) -> None:
    """A rejection runs nothing: sent again with arguments (a client echoing the call it
    showed, or edits), it was refused as a different answer (outside tester 102). An approval
    after it still is."""
    from workflow_engine import AnswerOutcome, RequestAlreadyAnsweredError

    rt, store, paused = await _transfer_awaiting_approval(tmp_path, where)
    rid = paused.pending_requests[0].request_id
    proposed = dict(paused.pending_requests[0].data.function_call.arguments)
    assert await rt.respond(rid, {"approved": False, "arguments": proposed}) is AnswerOutcome.STORED
    assert await rt.respond(rid, {"approved": False}) is AnswerOutcome.DUPLICATE
    assert await rt.respond(rid, {"approved": False, "arguments": {}}) is AnswerOutcome.DUPLICATE
    with pytest.raises(RequestAlreadyAnsweredError, match=rid):
        await rt.respond(rid, {"approved": True})
    done = await rt.resume(paused.run_id)
    assert done.status is WorkflowRunState.IDLE and bank_transfer.LEDGER == []
    stored = await store.get_request(rid)
    assert stored.answer["data"]["arguments"] is None, stored.answer  # (as a bare rejection)
    await rt.close()
