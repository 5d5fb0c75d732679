"""Seed 003: tool approval inside a workflow, both ways.

An agent node's ``transfer(from_account, to_account, amount)`` tool needs approval.

* ``build_request_port_workflow()``: the agent host turns the held call into a
  ``RequestInfoEvent`` (data: ``ToolApprovalRequestContent``); the answer is an
  ``ExternalResponse`` carrying ``ToolApprovalResponseContent`` -- here: ``{"approved": ...}``.
* ``build_intercepting_workflow(ask)``: ``intercept_user_input_requests=True``; the agent's
  response goes to an approval executor that asks the user itself and sends the answers back
  over a conditional back-edge, followed by a ``TurnToken``.

Run it: ``python -m workflow_engine_cli.demos.bank_transfer`` (asks y/n on a terminal;
approves without one).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import anyio
from pydantic import Field

from workflow_engine import (
    Executor,
    RequestInfoEvent,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowOutputEvent,
    handler,
)
from workflow_engine.executors import (
    Agent,
    AgentResponse,
    ChatMessage,
    Rule,
    ScriptedChatClient,
    ToolApprovalRequestContent,
    ToolCall,
    TurnToken,
    tool,
)

LEDGER: list[dict[str, object]] = []
"""Transfers that really happened (a stand-in for the bank's system)."""


@tool(approval_mode="always_require")
def transfer(
    from_account: Annotated[str, Field(description="account to take the money from")],
    to_account: Annotated[str, Field(description="account to pay into")],
    amount: Annotated[float, Field(gt=0, description="amount in EUR")],
) -> str:
    """Transfer money between two accounts."""
    LEDGER.append({"from": from_account, "to": to_account, "amount": amount})
    return f"Transferred {amount:.2f} from {from_account} to {to_account}."


def bank_client() -> ScriptedChatClient:
    return ScriptedChatClient(
        [
            Rule(
                user=r"(?P<amount>\d+(?:\.\d+)?)\D+(?P<src>\d{6})\D+(?P<dst>\d{6})",
                reply="I'll transfer {amount} from {src} to {dst} once you approve.",
                calls=[
                    ToolCall(
                        "transfer",
                        {"from_account": "{src}", "to_account": "{dst}", "amount": "{amount}"},
                    )
                ],
            ),
            Rule(
                after_tool="transfer",
                reply="Done. {result}",
                rejected="The transfer was not made, because you did not approve it.",
                failed="The transfer failed: {result}",
            ),
        ],
        default="I can transfer money between accounts; tell me the amount and both accounts.",
    )


def bank_agent() -> Agent:
    return Agent(
        "bank_agent",
        "You move money between the user's accounts. Transfers need the user's approval.",
        bank_client(),
        [transfer],
    )


def build_request_port_workflow() -> Workflow:
    return WorkflowBuilder(name="bank_transfer", start=bank_agent()).build()


class ApprovalDesk(Executor):
    """Asks the user about each held call itself, then hands the answers back to the agent."""

    def __init__(self, ask: Callable[[ToolApprovalRequestContent], bool]) -> None:
        super().__init__("approval_desk")
        self.ask = ask

    @handler
    async def review(
        self, response: AgentResponse, ctx: WorkflowContext[ChatMessage | TurnToken, AgentResponse]
    ) -> None:
        if not response.pending_approvals:
            await ctx.yield_output(response)
            return
        answers = [r.create_response(self.ask(r)) for r in response.pending_approvals]
        await ctx.send_message(ChatMessage(role="user", contents=answers))
        await ctx.send_message(TurnToken())


def build_intercepting_workflow(ask: Callable[[ToolApprovalRequestContent], bool]) -> Workflow:
    agent = bank_agent().as_executor(intercept_user_input_requests=True)
    desk = ApprovalDesk(ask)
    return (
        WorkflowBuilder(name="bank_transfer_intercepted", start=agent)
        .add_edge(agent, desk)
        .add_edge(desk, agent, condition=lambda m: isinstance(m, ChatMessage | TurnToken))
        .build()
    )


def console_approval(request: ToolApprovalRequestContent) -> bool:
    call = request.function_call
    print(f"\nApprove {call.name}({call.arguments})? [y/N] ", end="")
    if not sys.stdin.isatty():
        print("y (no terminal: approving)")
        return True
    return input().strip().lower() in ("y", "yes")


async def main() -> None:
    workflow = build_request_port_workflow()
    message = "Please transfer 1000 from account 123456 to account 654321."
    print(f"User: {message}")
    stream = workflow.run_stream(message)
    checkpoint = None
    while True:
        answers = {}
        async for event in stream:
            if isinstance(event, RequestInfoEvent):
                answers[event.request_id] = {"approved": console_approval(event.data)}
            elif isinstance(event, WorkflowOutputEvent):
                print(f"Agent: {event.data.text}")
        checkpoint = stream.result.checkpoint if stream.result else None
        if not answers:
            break
        stream = workflow.run_stream(checkpoint=checkpoint, responses=answers)
    print(f"Ledger: {LEDGER}")


if __name__ == "__main__":
    anyio.run(main)
