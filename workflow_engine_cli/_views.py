"""Stored data as a person reads it, without building any workflow.

Listing commands open the store with no workflow registered (building the graphs is most of a
command's start-up time), so request data arrives encoded by the ``tagged-json/1`` codec.
:func:`plain` reads that documented format back into plain JSON for display; decoding into
Python objects still needs the workflow and happens only where a command acts on the data.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any


class DamagedValueError(ValueError):
    """Stored data that is not valid ``tagged-json/1``: a marker of the wrong shape."""


_SEQUENCES = ("$tuple", "$set", "$frozenset")


def plain(data: Any) -> Any:
    """Tagged JSON → the plain JSON a person expects: ``{"$type": T, "data": D}`` shows as
    ``D``, ``{"$tuple": [...]}`` as a list, escaped dicts as dicts, and so on.

    A marker object that is not a valid encoding (``{"$float": "x"}``, ``{"$items": 5}``)
    raises :class:`DamagedValueError`: it is shown as damaged, never as a plausible value."""
    if isinstance(data, list):
        return [plain(item) for item in data]
    if not isinstance(data, dict):
        return data
    first = next(iter(data), None)
    if not (isinstance(first, str) and first.startswith("$")):
        return {k: plain(v) for k, v in data.items()}
    if first == "$type":
        if set(data) != {"$type", "data"} or not isinstance(data["$type"], str):
            raise DamagedValueError("a $type object needs a string $type and data, only")
        return plain(data["data"])
    if len(data) != 1:
        raise DamagedValueError(f"a {first} object has other keys too")
    value = data[first]
    if first in _SEQUENCES:
        if not isinstance(value, list):
            raise DamagedValueError(f"{first} holds {type(value).__name__}, not a list")
        return [plain(item) for item in value]
    if first == "$dict":
        if not isinstance(value, dict):
            raise DamagedValueError(f"$dict holds {type(value).__name__}, not an object")
        return {k: plain(v) for k, v in value.items()}
    if first == "$items":
        if not isinstance(value, list) or not all(
            isinstance(pair, list) and len(pair) == 2 for pair in value
        ):
            raise DamagedValueError("$items must be a list of [key, value] pairs")
        return {str(plain(k)): plain(v) for k, v in value}
    _check_leaf(data)
    return value if first in ("$float", "$bytes") else data


def _check_leaf(data: dict[str, Any]) -> None:
    """A one-value marker (``$float``, ``$uuid``...) as the codec itself reads it."""
    from workflow_engine import SerializationError, TaggedJsonCodec, TypeRegistry

    try:
        TaggedJsonCodec(TypeRegistry()).decode(data)
    except SerializationError as exc:
        reason = str(exc).removeprefix("cannot decode data: ")
        raise DamagedValueError(reason.splitlines()[0] if reason else "not valid") from None


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def describe_request(data: Any, port_id: str = "") -> str:
    """One line saying what a pending request waits for (``data`` decoded or tagged JSON);
    data that is not a valid encoding says so."""
    try:
        value = plain(_jsonable(data))
    except DamagedValueError as exc:
        return f"damaged record, cannot be shown ({exc})"
    if isinstance(value, dict):
        call = value.get("function_call")
        if isinstance(call, dict) and "name" in call:
            return f"approve {call['name']}({compact(call.get('arguments', {}))})"
        if "agent" in value and "message" in value:
            return f"reply to {value['agent']}: {value['message']}"
        if value.keys() == {"agent_name", "text"}:  # (``AgentHostExecutor(ask_user=True)``)
            return f"reply to {value['agent_name']}: {value['text']}"
        if {"executor_id", "step", "idempotency_key", "question"} <= value.keys():
            # a step in doubt (an ``InDoubtEffect``): the question, not its fields (tester 67)
            effect = SimpleNamespace(**value)
            key = f" (idempotency key {effect.idempotency_key})" if effect.idempotency_key else ""
            return f"did it happen? {in_doubt_said(effect)}{key}"
    return f"{port_id}: {compact(value)}" if port_id else compact(value)


def answer_data(request: Any) -> Any:
    """A stored answer as plain JSON (None if its record is damaged)."""
    try:
        return plain(_jsonable(request.answer))
    except DamagedValueError:
        return None


def describe_answer(request: Any) -> str:
    """What a request answered and not applied yet asks and was given, on one line: an
    approval says approved (with the edited arguments it runs with) or rejected. ``runs show``
    said only the request's id, so an edit was invisible until the run applied it."""
    asks = describe_request(request.data, request.port_id)
    try:
        given = plain(_jsonable(request.answer))
    except DamagedValueError as exc:
        return f"{asks}: damaged answer, cannot be shown ({exc})"
    if asks.startswith("approve ") and isinstance(given, dict):
        decided = given.get("approved", given.get("accepted"))
        if decided is False:
            return f"{asks}: rejected"
        if decided is True:
            edits = given.get("arguments")
            return f"{asks}: approved" + (f", with {compact(edits)}" if edits else "")
    return f"{asks}: answered {compact(given)}"


def describe_effect(effect: Any) -> str:
    """What a step in doubt was doing (an ``InDoubtEffect``): a tool call as the call, any other
    step by its description, or its name when it has none."""
    from workflow_engine.executors import tool_call_in_doubt

    call = tool_call_in_doubt(effect)
    if call is not None:
        return f"call {call[0]}({compact(call[1])})"
    what = effect.description
    return f"step {effect.step}" + (f" ({compact(what)})" if what is not None else "")


def in_doubt_said(effect: Any) -> str:
    """``refund_agent's call submit_refund({...}) started before the run stopped ...``."""
    who = f"{effect.executor_id}'s " if effect.executor_id else ""
    return (
        f"{who}{describe_effect(effect)} started before the run stopped (a crash, a kill, an "
        "interruption; a process frozen past its lease, which may still complete it) and "
        "recorded no result -- or ran and its result could not be stored"
    )


def _jsonable(data: Any) -> Any:
    """Decoded objects (pydantic models, dataclasses) as JSON data; JSON data as it is."""
    if isinstance(data, dict | list | str | int | float | bool | None):
        return data
    from pydantic_core import to_jsonable_python

    return to_jsonable_python(data, fallback=str)


def shape(schema: dict[str, Any], defs: dict[str, Any] | None = None, depth: int = 0) -> str:
    """A JSON schema as a one-line example of its shape:
    ``{"approved": true|false, "feedback"?: "text"}`` (``?``: optional)."""
    defs = schema.get("$defs", defs or {})
    if "$ref" in schema:
        target = defs.get(schema["$ref"].rsplit("/", 1)[-1])
        return shape(target, defs, depth) if isinstance(target, dict) else "…"
    if depth > 3:
        return "…"
    if "const" in schema:
        return compact(schema["const"])
    if "enum" in schema:
        return "|".join(compact(v) for v in schema["enum"])
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return "|".join(shape(s, defs, depth) for s in schema[union])
    kind = schema.get("type")
    if isinstance(kind, list):
        return "|".join(shape({**schema, "type": k}, defs, depth) for k in kind)
    if kind == "object" or "properties" in schema:
        required = set(schema.get("required", []))
        fields = [
            f"{compact(name)}{'' if name in required else '?'}: {shape(sub, defs, depth + 1)}"
            for name, sub in schema.get("properties", {}).items()
        ]
        if not fields:
            return "{…}"
        return "{" + ", ".join(fields) + "}"
    if kind == "array":
        items = schema.get("items")
        return f"[{shape(items, defs, depth + 1)}, …]" if isinstance(items, dict) else "[…]"
    return {
        "string": '"text"',
        "boolean": "true|false",
        "integer": "integer",
        "number": "number",
        "null": "null",
    }.get(str(kind), "…")


def field_notes(schema: dict[str, Any]) -> list[tuple[str, str]]:
    """``(field, description)`` for the described properties of an object schema."""
    defs = schema.get("$defs", {})
    if "$ref" in schema:
        schema = defs.get(schema["$ref"].rsplit("/", 1)[-1], {})
    notes = []
    for name, sub in schema.get("properties", {}).items():
        if isinstance(sub, dict) and sub.get("description"):
            notes.append((name, str(sub["description"])))
    return notes


def describe_output(value: Any) -> str:
    """A workflow output on one line: an agent's reply as its text, a handoff's outcome in
    words, a dict or list as JSON (it was Python's repr), anything else as ``str``. The agent
    types are looked up only if their package is loaded (a value of them cannot exist
    otherwise), so listing an application's outputs does not import the agents."""
    agents = sys.modules.get("workflow_engine.executors")
    if agents is not None:
        if isinstance(value, agents.HandoffOutcome):
            status = value.status.replace("_", " ")
            return f"conversation {status} (last agent: {value.last_agent})"
        if isinstance(value, agents.AgentResponse):
            return str(value.text)
    if isinstance(value, dict | list):  # as stored, and as --json shows it: JSON, not a repr
        try:
            return json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            pass
    return str(value)
