"""Seed 004's customer-support handoff -- ``triage_agent`` routes to ``refund_agent``
(tools ``lookup_order_details``, ``submit_refund``) and ``order_agent``
(``lookup_order_details``, ``submit_replacement``); ``submit_*`` need approval. Handoffs:
triage→refund, triage→order, refund→order, order→triage. The run ends when an assistant message
ends with "case complete.".

Offline by default (``ScriptedChatClient`` rules for refund, replacement and "both" requests, and
a polite answer for anything else). With ``OPENAI_API_KEY`` or ``OPENAI_BASE_URL`` set (or
``model=...``), the same agents run on a real model; ``client=...`` gives them a chat client the
caller configured, and ``offline=True`` keeps the scripted rules whatever the environment says.
Which model answers never changes the graph: its signature is the same either way.

``WORKFLOW_ENGINE_DEMO_LEDGER=<file>`` makes ``submit_refund``/``submit_replacement`` append one
JSON line per *new* idempotency key to that file -- the outside system a real tool would call,
deduplicating by the key it is given.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from workflow_engine import Workflow
from workflow_engine.executors import (
    Agent,
    ChatClient,
    ChatMessage,
    HandoffBuilder,
    IdempotencyKey,
    OpenAIChatClient,
    Rule,
    ScriptedChatClient,
    ToolCall,
    tool,
)

ORDERS: dict[str, dict[str, Any]] = {
    "12345": {"item": "wireless headphones", "total": 89.99, "status": "delivered"},
    "67890": {"item": "coffee grinder", "total": 54.5, "status": "delivered"},
    "24680": {"item": "desk lamp", "total": 32.0, "status": "in transit"},
}
ORDER_PATTERN = r"\b(\d{5})\b"
NO_KEY = IdempotencyKey("")


def _order(order_id: str) -> dict[str, Any]:
    known = ORDERS.get(order_id)
    if known is None:
        return {
            "order_id": order_id,
            "item": "standard parcel",
            "total": 25.0,
            "status": "delivered",
        }
    return {"order_id": order_id, **known}


def _ledger(kind: str, key: str, payload: dict[str, Any]) -> None:
    path = os.environ.get("WORKFLOW_ENGINE_DEMO_LEDGER")
    if not path:
        return
    ledger = Path(path)
    if ledger.exists():
        for line in ledger.read_text().splitlines():
            if line and json.loads(line)["key"] == key:
                return  # the outside system already has this call: idempotent
    with ledger.open("a") as f:
        f.write(json.dumps({"kind": kind, "key": key, **payload}) + "\n")
        f.flush()
        os.fsync(f.fileno())


@tool(idempotent=True)  # it only reads: after a crash inside it, it runs again
def lookup_order_details(
    order_id: Annotated[str, Field(description="the 5-digit order number")],
) -> dict[str, Any]:
    """Look up an order: item, total and delivery status."""
    return _order(order_id)


@tool(approval_mode="always_require")
def submit_refund(
    order_id: Annotated[str, Field(description="the order to refund")],
    amount: Annotated[float, Field(gt=0, description="refund amount")],
    reason: Annotated[str, Field(description="why the customer wants a refund")] = "",
    key: IdempotencyKey = NO_KEY,
) -> str:
    """Refund an order (needs the customer's approval)."""
    _ledger("refund", key, {"order_id": order_id, "amount": amount})
    return f"Refund of {amount:.2f} for order {order_id} submitted."


@tool(approval_mode="always_require")
def submit_replacement(
    order_id: Annotated[str, Field(description="the order whose item is replaced")],
    item: Annotated[str, Field(description="the item to send again")],
    key: IdempotencyKey = NO_KEY,
) -> str:
    """Ship a replacement item (needs the customer's approval)."""
    _ledger("replacement", key, {"order_id": order_id, "item": item})
    return f"Replacement {item} for order {order_id} is on its way."


def _wants_both(messages: Sequence[ChatMessage]) -> bool:
    text = " ".join(m.text.lower() for m in messages if m.role == "user")
    return "both" in text or (
        "refund" in text and re.search(r"replace|replacement", text) is not None
    )


def _from_lookup(groups: Mapping[str, str], messages: Sequence[ChatMessage]) -> dict[str, Any]:
    for message in reversed(messages):
        for result in message.function_results:
            if result.name == "lookup_order_details" and isinstance(result.result, dict):
                return result.result
    return _order(groups.get("order", "00000"))


def _refund_arguments(groups: Mapping[str, str], messages: Sequence[ChatMessage]) -> dict[str, Any]:
    order = _from_lookup(groups, messages)
    return {"order_id": order["order_id"], "amount": order["total"], "reason": "customer request"}


def _replacement_arguments(
    groups: Mapping[str, str], messages: Sequence[ChatMessage]
) -> dict[str, Any]:
    order = _from_lookup(groups, messages)
    return {"order_id": order["order_id"], "item": order["item"]}


def _lookup(groups: Mapping[str, str], messages: Sequence[ChatMessage]) -> dict[str, Any]:
    return {"order_id": groups["order"]}


def _knows_order(client: ScriptedChatClient) -> Any:
    return lambda messages: client.knows("order", messages)


def _triage_client() -> ScriptedChatClient:
    return ScriptedChatClient(
        [
            Rule(
                user=r"\bboth\b|refund.*replace|replace.*refund",
                reply="I'll start with your refund; our order team will then arrange the "
                "replacement.",
                calls=[ToolCall("handoff_to_refund_agent", {"reason": "refund, then replacement"})],
            ),
            Rule(
                user=r"refund|money back",
                reply="I'll hand you to our refunds specialist.",
                calls=[ToolCall("handoff_to_refund_agent", {"reason": "refund"})],
            ),
            Rule(
                user=r"replace|replacement|broken|damaged|exchange",
                reply="I'll hand you to our order specialist.",
                calls=[ToolCall("handoff_to_order_agent", {"reason": "replacement"})],
            ),
            Rule(
                user=r"\b(no|nothing|that's all|thanks|thank you)\b",
                reply="Glad I could help. case complete.",
            ),
        ],
        default="Hello! I can help with refunds and replacements of your orders. "
        "What can I do for you?",
    )


def _specialist_client(kind: str) -> ScriptedChatClient:
    client = ScriptedChatClient([], remember={"order": ORDER_PATTERN})
    knows = _knows_order(client)
    entry = f"handoff_to_{kind}_agent"
    submit = "submit_refund" if kind == "refund" else "submit_replacement"
    arguments = _refund_arguments if kind == "refund" else _replacement_arguments
    rules = [
        Rule(
            after_tool=entry,
            when=knows,
            reply="Let me look up order {order}.",
            calls=[ToolCall("lookup_order_details", _lookup)],
        ),
        Rule(after_tool=entry, reply=f"I can help with the {kind}. What is your order number?"),
        Rule(
            user=ORDER_PATTERN.replace(r"(\d{5})", r"(?P<order>\d{5})"),
            reply="Let me look up order {order}.",
            calls=[ToolCall("lookup_order_details", _lookup)],
        ),
        Rule(
            after_tool="lookup_order_details",
            reply=(
                "I found order {order}. I'll submit a refund for the full amount."
                if kind == "refund"
                else "I found order {order}. I'll ship a replacement."
            ),
            calls=[ToolCall(submit, arguments)],
        ),
    ]
    if kind == "refund":
        rules += [
            Rule(
                after_tool="submit_refund",
                when=_wants_both,
                reply="{result} Now our order team will arrange your replacement.",
                calls=[ToolCall("handoff_to_order_agent", {"reason": "replacement after refund"})],
                rejected="Okay, I did not submit the refund. Is there anything else I can do?",
            ),
            Rule(
                after_tool="submit_refund",
                reply="{result} case complete.",
                rejected="Okay, I did not submit the refund. Is there anything else I can do?",
            ),
        ]
    else:
        rules += [
            Rule(
                after_tool="submit_replacement",
                reply="{result} case complete.",
                rejected="Okay, no replacement was sent. Is there anything else I can do?",
            ),
            Rule(
                user=r"something else|another question|other",
                reply="Let me bring you back to triage.",
                calls=[ToolCall("handoff_to_triage_agent", {"reason": "other topic"})],
            ),
        ]
    rules.append(
        Rule(
            user=r"\b(no|nothing|that's all|thanks|thank you)\b",
            reply="You're welcome. case complete.",
        )
    )
    client.rules = rules
    client.default = "Could you tell me your order number?"
    return client


def _real_model(model: str | None, client: ChatClient | None, offline: bool) -> ChatClient | None:
    """The chat client every agent talks to, or None for each agent's scripted rules."""
    if client is not None and (model or offline):
        raise ValueError("give either a client, or a model name or offline=True")
    if client is not None or offline:
        return client
    if model or os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
        return OpenAIChatClient(model)
    return None


def support_agents(
    model: str | None = None, *, client: ChatClient | None = None, offline: bool = False
) -> tuple[Agent, Agent, Agent]:
    """The three agents; see the module docstring for how their model is chosen."""
    real = _real_model(model, client, offline)
    triage = Agent(
        "triage_agent",
        "You are the first contact of customer support. Find out whether the customer wants a "
        "refund, a replacement or both, and hand off to the right specialist. Never process "
        "refunds or replacements yourself.",
        _triage_client() if real is None else real,
        description="Routes customers to the right specialist.",
    )
    refund = Agent(
        "refund_agent",
        "You handle refunds. Get the order number, look up the order, then submit the refund "
        "(the customer approves it). If the customer also wants a replacement, hand off to the "
        "order agent. When done, end your message with 'case complete.'.",
        _specialist_client("refund") if real is None else real,
        [lookup_order_details, submit_refund],
        description="Handles refunds for orders.",
    )
    order = Agent(
        "order_agent",
        "You handle replacements. Get the order number, look up the order, then submit the "
        "replacement (the customer approves it). For other topics hand back to triage. When "
        "done, end your message with 'case complete.'.",
        _specialist_client("order") if real is None else real,
        [lookup_order_details, submit_replacement],
        description="Handles replacements and order questions.",
    )
    return triage, refund, order


def build_support_workflow(
    model: str | None = None, *, client: ChatClient | None = None, offline: bool = False
) -> Workflow:
    triage, refund, order = support_agents(model, client=client, offline=offline)
    return (
        HandoffBuilder(name="support", participants=[triage, refund, order])
        .add_handoff(triage, [refund, order])
        .add_handoff(refund, [order])
        .add_handoff(order, [triage])
        .with_start_agent(triage)
        .build()
    )
