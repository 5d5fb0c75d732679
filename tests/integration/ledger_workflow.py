"""The workflow the side-effect crash tests kill: an agent whose approved transfers hit a "bank".

The bank is two files, named by environment variables (each test sets its own):

* ``$LEDGER_FILE``: one JSON line per transfer that *happened*, with the idempotency key the
  engine handed the tool. The engine never repeats a transfer blindly: a transfer cut off by a
  crash after it started is not run again until a person said it did not happen (the run asks:
  an ``InDoubtEffect`` request). ``transfer`` still deduplicates by key, as a real bank would,
  but logs every time it has to: a test asserts it never does.
* ``$LEDGER_INVOCATIONS_FILE``: one JSON line per time a tool function was *entered*
  (``"event": "invoked"``: tool, key, arguments, pid), written before it touches the ledger, so
  the test tells re-executions from duplicates; and one ``"event": "deduplicated"`` line per
  call that found its key already in the ledger.

Every line is one ``write`` on an ``O_APPEND`` descriptor, so it is there whole or not at all
when the process is SIGKILLed. ``transfer`` is not idempotent as far as the engine knows (it
records an intent before it and asks when in doubt); ``balance`` is a read, declared
``idempotent=True``: the engine simply runs it again, with the same key, when in doubt. The
model is a ``ScriptedChatClient``: a single transfer ("Transfer 250 from 111111 to 222222") or
a mixed batch ("Pay 100 from 111111 to 222222, pay 900 from 111111 to 333333 and check 111111":
two approval-required transfers and a free ``balance`` call, in that order).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from workflow_engine import Workflow, WorkflowBuilder
from workflow_engine.executors import Agent, ChatMessage, Rule, ScriptedChatClient, ToolCall, tool

WORKFLOW_NAME = "ledger_transfer"
AGENT_NAME = "bank_agent"
LEDGER_ENV = "LEDGER_FILE"
INVOCATIONS_ENV = "LEDGER_INVOCATIONS_FILE"
OPENING_BALANCE = 1000.0

SINGLE_PROMPT = "Transfer 250 from 111111 to 222222."
BATCH_PROMPT = "Pay 100 from 111111 to 222222, pay 900 from 111111 to 333333 and check 111111."


def _append(path: str, record: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def read_lines(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines()]


def _invoked(name: str, key: str, arguments: dict[str, Any]) -> None:
    _append(
        os.environ[INVOCATIONS_ENV],
        {"event": "invoked", "tool": name, "key": key, "pid": os.getpid(), "arguments": arguments},
    )


@tool(approval_mode="always_require")
def transfer(
    from_account: Annotated[str, Field(description="account to take the money from")],
    to_account: Annotated[str, Field(description="account to pay into")],
    amount: Annotated[float, Field(gt=0, description="amount in EUR")],
    idempotency_key: str,
) -> str:
    """Transfer money between two accounts."""
    _invoked(
        "transfer", idempotency_key, {"from": from_account, "to": to_account, "amount": amount}
    )
    path = os.environ[LEDGER_ENV]
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # the bank's own serialization of one account's ledger
        for entry in read_lines(path):
            if entry["key"] == idempotency_key:  # a retry: the first call's answer, no transfer
                _append(
                    os.environ[INVOCATIONS_ENV],
                    {
                        "event": "deduplicated",
                        "tool": "transfer",
                        "key": idempotency_key,
                        "pid": os.getpid(),
                    },
                )
                return str(entry["result"])
        result = f"Transferred {amount:.2f} from {from_account} to {to_account}."
        entry = {
            "key": idempotency_key,
            "from": from_account,
            "to": to_account,
            "amount": amount,
            "result": result,
            "pid": os.getpid(),
        }
        os.write(fd, (json.dumps(entry, sort_keys=True) + "\n").encode())
        return result
    finally:
        os.close(fd)


@tool(idempotent=True)  # a read: asking again is harmless
def balance(
    account: Annotated[str, Field(description="the account to look at")],
    idempotency_key: str,
) -> str:
    """The balance of an account."""
    _invoked("balance", idempotency_key, {"account": account})
    spent = sum(e["amount"] for e in read_lines(os.environ[LEDGER_ENV]) if e["from"] == account)
    return f"Balance of {account}: {OPENING_BALANCE - spent:.2f} EUR."


def _summary(messages: Sequence[ChatMessage]) -> str:
    """The model's last word: every result of the batch that just ran, in order."""
    results = messages[-1].function_results
    parts = [f"{r.name}: {r.error if r.error else r.text}" for r in results]
    return "Done. " + " | ".join(parts)


def ledger_client() -> ScriptedChatClient:
    return ScriptedChatClient(
        [
            Rule(
                user=(
                    r"pay (?P<a1>\d+) from (?P<s1>\d{6}) to (?P<d1>\d{6}), "
                    r"pay (?P<a2>\d+) from (?P<s2>\d{6}) to (?P<d2>\d{6}) and check (?P<c>\d{6})"
                ),
                reply="Two transfers (they need your approval) and a balance check.",
                calls=[
                    ToolCall(
                        "transfer", {"from_account": "{s1}", "to_account": "{d1}", "amount": "{a1}"}
                    ),
                    ToolCall(
                        "transfer", {"from_account": "{s2}", "to_account": "{d2}", "amount": "{a2}"}
                    ),
                    ToolCall("balance", {"account": "{c}"}),
                ],
            ),
            Rule(
                user=r"transfer (?P<amount>\d+) from (?P<src>\d{6}) to (?P<dst>\d{6})",
                reply="I'll transfer {amount} from {src} to {dst} once you approve.",
                calls=[
                    ToolCall(
                        "transfer",
                        {"from_account": "{src}", "to_account": "{dst}", "amount": "{amount}"},
                    )
                ],
            ),
            Rule(after_tool="transfer", reply=_summary),
        ],
        default="Tell me what to transfer.",
    )


def build_workflow() -> Workflow:
    agent = Agent(
        AGENT_NAME,
        "You move money between accounts. Transfers need the user's approval.",
        ledger_client(),
        [transfer, balance],
    )
    return WorkflowBuilder(name=WORKFLOW_NAME, start=agent).build()
