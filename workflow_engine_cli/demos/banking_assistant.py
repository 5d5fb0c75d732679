"""Seed 000: a banking assistant whose sensitive tools need approval.

``transfer_money`` and ``cancel_subscription`` require approval, ``check_balance`` does not. One
model turn may mix them: the batch waits for the decision, then the free call runs whatever the
guarded one's fate. Served over AG-UI at ``/banking`` by ``workflow-engine serve``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from workflow_engine import Workflow, WorkflowBuilder
from workflow_engine.executors import Agent, Rule, ScriptedChatClient, ToolCall, tool

BALANCES = {"checking": 2500.0, "savings": 10000.0}
SUBSCRIPTIONS = {"streamflix": 12.99, "gymplus": 39.0}
ACTIONS: list[str] = []


@tool(idempotent=True)  # it only reads: after a crash inside it, it runs again
def check_balance(
    account: Annotated[str, Field(description="checking or savings")] = "checking",
) -> str:
    """Look up an account's balance."""
    return f"{account}: {BALANCES.get(account, 0.0):.2f} EUR"


@tool(approval_mode="always_require")
def transfer_money(
    to_account: Annotated[str, Field(description="destination account")],
    amount: Annotated[float, Field(gt=0, description="amount in EUR")],
    from_account: Annotated[str, Field(description="source account")] = "checking",
) -> str:
    """Move money between accounts."""
    BALANCES[from_account] = BALANCES.get(from_account, 0.0) - amount
    BALANCES[to_account] = BALANCES.get(to_account, 0.0) + amount
    ACTIONS.append(f"transfer {amount} {from_account}->{to_account}")
    return f"Moved {amount:.2f} EUR from {from_account} to {to_account}."


@tool(approval_mode="always_require")
def cancel_subscription(name: Annotated[str, Field(description="subscription name")]) -> str:
    """Cancel a recurring subscription."""
    if name not in SUBSCRIPTIONS:
        raise ValueError(f"no subscription named {name!r}")
    del SUBSCRIPTIONS[name]
    ACTIONS.append(f"cancel {name}")
    return f"Cancelled {name}."


def banking_client() -> ScriptedChatClient:
    return ScriptedChatClient(
        [
            Rule(
                user=r"transfer (?P<amount>\d+(?:\.\d+)?) to (?P<to>\w+).*balance",
                reply="Transferring {amount} to {to} and checking your balance.",
                calls=[
                    ToolCall("transfer_money", {"to_account": "{to}", "amount": "{amount}"}),
                    ToolCall("check_balance", {"account": "checking"}),
                ],
            ),
            Rule(
                user=r"transfer (?P<amount>\d+(?:\.\d+)?) to (?P<to>\w+)",
                calls=[ToolCall("transfer_money", {"to_account": "{to}", "amount": "{amount}"})],
            ),
            Rule(
                user=r"cancel (?:my )?(?P<name>\w+)",
                calls=[ToolCall("cancel_subscription", {"name": "{name}"})],
            ),
            Rule(
                user=r"balance",
                calls=[ToolCall("check_balance", {"account": "checking"})],
            ),
            Rule(
                after_tool="check_balance",
                reply="{result}",
                rejected="I did not make the transfer since you declined. Balance: {result}",
            ),
            Rule(
                after_tool="transfer_money",
                reply="{result}",
                rejected="Okay, I did not transfer anything.",
            ),
            Rule(
                after_tool="cancel_subscription",
                reply="{result}",
                rejected="Okay, the subscription stays active.",
                failed="I could not cancel it: {result}",
            ),
        ],
        default="I can check balances, transfer money and cancel subscriptions.",
    )


def banking_agent() -> Agent:
    return Agent(
        "banking_assistant",
        "You are a careful banking assistant. Sensitive actions need the user's approval.",
        banking_client(),
        [check_balance, transfer_money, cancel_subscription],
    )


def build_workflow() -> Workflow:
    return WorkflowBuilder(name="banking", start=banking_agent()).build()


def build_served_workflow() -> Workflow:
    """The workflow ``serve`` runs at ``/banking`` (the agent, as an AG-UI endpoint serves an
    agent): built by the command line too, so that it continues those runs."""
    return banking_agent().as_workflow()
