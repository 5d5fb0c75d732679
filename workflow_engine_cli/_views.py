"""Stored data as a person reads it, without building any workflow.

Listing commands open the store with no workflow registered (building the graphs is most of a
command's start-up time), so request data arrives encoded by the ``tagged-json/1`` codec.
:func:`plain` reads that documented format back into plain JSON for display; decoding into
Python objects still needs the workflow and happens only where a command acts on the data.
"""

from __future__ import annotations

import json
from typing import Any


def plain(data: Any) -> Any:
    """Tagged JSON → the plain JSON a person expects: ``{"$type": T, "data": D}`` shows as
    ``D``, ``{"$tuple": [...]}`` as a list, escaped dicts as dicts, and so on."""
    if isinstance(data, list):
        return [plain(item) for item in data]
    if not isinstance(data, dict):
        return data
    if len(data) == 2 and "$type" in data and "data" in data:
        return plain(data["data"])
    if len(data) == 1:
        [(key, value)] = data.items()
        if key in ("$tuple", "$float", "$bytes"):
            return plain(value)
        if key == "$dict" and isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if key == "$items" and isinstance(value, list):
            return {str(plain(k)): plain(v) for k, v in value}
    return {k: plain(v) for k, v in data.items()}


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def describe_request(data: Any, port_id: str = "") -> str:
    """One line saying what a pending request waits for (``data`` decoded or tagged JSON)."""
    value = plain(_jsonable(data))
    if isinstance(value, dict):
        call = value.get("function_call")
        if isinstance(call, dict) and "name" in call:
            return f"approve {call['name']}({compact(call.get('arguments', {}))})"
        if "agent" in value and "message" in value:
            return f"reply to {value['agent']}: {value['message']}"
    return f"{port_id}: {compact(value)}" if port_id else compact(value)


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
