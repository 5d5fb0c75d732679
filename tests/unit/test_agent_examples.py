"""The seed examples with agents run approved and rejected, in-process (no store)."""

from __future__ import annotations

import pytest

from workflow_engine import RequestInfoEvent, ResponseTypeError, WorkflowRunState
from workflow_engine.executors import AgentRunUpdateEvent, ToolApprovalRequestContent
from workflow_engine_cli.demos import bank_transfer, banking_assistant

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

MESSAGE = "Please transfer 1000 from account 123456 to account 654321."


@pytest.fixture(autouse=True)
def clean_ledgers() -> None:
    bank_transfer.LEDGER.clear()
    banking_assistant.ACTIONS.clear()
    banking_assistant.BALANCES.update({"checking": 2500.0, "savings": 10000.0})
    banking_assistant.SUBSCRIPTIONS.update({"streamflix": 12.99, "gymplus": 39.0})


@pytest.mark.parametrize("approved", [True, False])
async def test_seed_003_request_port_variant(approved: bool) -> None:
    wf = bank_transfer.build_request_port_workflow()
    paused = await wf.run(MESSAGE)
    assert paused.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    (event,) = [e for e in paused.events if isinstance(e, RequestInfoEvent)]
    assert isinstance(event.data, ToolApprovalRequestContent)
    call = event.data.function_call
    assert (call.name, call.arguments["from_account"], call.arguments["to_account"]) == (
        "transfer",
        "123456",
        "654321",
    )
    streamed = "".join(
        e.text for e in paused.events if isinstance(e, AgentRunUpdateEvent) and e.kind == "text"
    )
    assert streamed == "I'll transfer 1000 from 123456 to 654321 once you approve."
    done = await wf.run(
        checkpoint=paused.checkpoint, responses={event.request_id: {"approved": approved}}
    )
    assert done.status is WorkflowRunState.IDLE
    (output,) = done.outputs
    if approved:
        assert output.text == "Done. Transferred 1000.00 from 123456 to 654321."
        assert bank_transfer.LEDGER == [{"from": "123456", "to": "654321", "amount": 1000.0}]
    else:
        assert output.text == "The transfer was not made, because you did not approve it."
        assert bank_transfer.LEDGER == []


@pytest.mark.parametrize("approved", [True, False])
async def test_seed_003_intercepting_variant(approved: bool) -> None:
    asked = []

    def ask(request: ToolApprovalRequestContent) -> bool:
        asked.append(request.function_call.name)
        return approved

    wf = bank_transfer.build_intercepting_workflow(ask)
    result = await wf.run(MESSAGE)
    assert result.status is WorkflowRunState.IDLE and result.pending_requests == []
    assert asked == ["transfer"]
    expected = "Done." if approved else "The transfer was not made"
    assert result.outputs[0].text.startswith(expected)
    assert len(bank_transfer.LEDGER) == (1 if approved else 0)


async def test_edited_arguments_are_validated_at_answer_time() -> None:
    wf = bank_transfer.build_request_port_workflow()
    paused = await wf.run(MESSAGE)
    rid = paused.pending_requests[0].request_id
    with pytest.raises(ResponseTypeError, match="amount: Input should be greater than 0"):
        await wf.run(
            checkpoint=paused.checkpoint,
            responses={rid: {"approved": True, "arguments": {"amount": -5}}},
        )
    with pytest.raises(ResponseTypeError, match="names call 'approval_call_99'"):
        await wf.run(
            checkpoint=paused.checkpoint,
            responses={rid: {"approved": True, "id": "approval_call_99"}},
        )
    done = await wf.run(
        checkpoint=paused.checkpoint,
        responses={rid: {"approved": True, "arguments": {"amount": 250}}},
    )
    assert done.outputs[0].text == "Done. Transferred 250.00 from 123456 to 654321."


@pytest.mark.parametrize("approved", [True, False])
async def test_seed_000_mixed_batch(approved: bool) -> None:
    wf = banking_assistant.build_workflow()
    paused = await wf.run("Please transfer 300 to savings and show my balance")
    (request,) = paused.pending_requests
    assert request.data.function_call.name == "transfer_money"
    done = await wf.run(
        checkpoint=paused.checkpoint, responses={request.request_id: {"approved": approved}}
    )
    text = done.outputs[0].text
    if approved:
        assert banking_assistant.ACTIONS == ["transfer 300.0 checking->savings"]
        assert text == "checking: 2200.00 EUR"
    else:  # the free sibling (check_balance) still ran
        assert banking_assistant.ACTIONS == []
        assert (
            text == "I did not make the transfer since you declined. Balance: checking: 2500.00 EUR"
        )


async def test_seed_000_failing_tool_is_reported_not_crashed() -> None:
    wf = banking_assistant.build_workflow()
    paused = await wf.run("cancel my netflix")
    rid = paused.pending_requests[0].request_id
    done = await wf.run(checkpoint=paused.checkpoint, responses={rid: {"approved": True}})
    assert done.status is WorkflowRunState.IDLE
    assert (
        done.outputs[0].text
        == "I could not cancel it: Error: ValueError: no subscription named 'netflix'"
    )


async def test_free_tool_needs_no_approval() -> None:
    result = await banking_assistant.build_workflow().run("what's my balance?")
    assert result.status is WorkflowRunState.IDLE
    assert result.outputs[0].text == "checking: 2500.00 EUR"
