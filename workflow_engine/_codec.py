"""JSON codecs: how messages, state, requests and outputs become JSON and come back.

A codec turns any supported value into a JSON-compatible structure and back, exactly. The default,
:class:`TaggedJsonCodec` (name ``tagged-json/1``), keeps JSON primitives as they are and wraps
everything else in a one-key marker object, so a stored record can always be decoded to the same
Python types it was written from:

    {"$type": "<registered name>", "data": {...}}   pydantic model, dataclass, enum, ...
    {"$tuple": [...]}  {"$bytes": "<base64>"}  {"$float": "nan"}
    {"$dict": {...}}   a dict whose keys start with "$" (escaped)
    {"$items": [[k, v], ...]}   a dict with non-string keys

Which classes can be decoded comes from a :class:`TypeRegistry` that the workflow fills from its own
annotations (and explicit ``register_types`` calls) -- never from a module path found in the data,
so a checkpoint cannot make the process import or construct arbitrary code. No pickle anywhere.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from ._errors import SerializationError, UnregisteredTypeError
from ._types import type_name

JSONValue = Any
"""A value made only of dict (str keys), list, str, int, float, bool and None."""

_PRIMITIVES = frozenset({str, int, bool, type(None)})
_SCALARS = frozenset({str, int, bool, float, type(None)})
"""JSON scalars: encoded as they are (floats if finite) and decoded as they are. A list or dict
of only these is encoded and decoded by copying it, after one type check over its items."""
_STR_ONLY = frozenset({str})


def _finite(values: Iterable[Any]) -> bool:
    """No float in ``values`` is NaN or infinite (those are encoded as ``{"$float": ...}``)."""
    isfinite = math.isfinite
    return all(isfinite(v) for v in values if type(v) is float)


@runtime_checkable
class JsonCodec(Protocol):
    """Turns values into JSON-compatible data and back. ``name`` is stored with every record."""

    name: str

    def encode(self, value: Any) -> JSONValue: ...

    def decode(self, data: JSONValue) -> Any: ...


class TypeRegistry:
    """The closed set of classes a workflow may decode, keyed by a stable name."""

    def __init__(self) -> None:
        self._adapters: dict[str, TypeAdapter[Any]] = {}
        self._names: dict[type, str] = {}

    def register(self, cls: type, name: str | None = None) -> str:
        """Allow ``cls`` to be encoded and decoded under ``name`` (default: module.qualname)."""
        if cls in self._names:
            return self._names[cls]
        tag = name or type_name(cls)
        known = self._adapters.get(tag)
        if known is not None:
            raise SerializationError(
                f"type name {tag!r} is already registered for another class; pass name=... "
                "to register_types to tell them apart"
            )
        self._adapters[tag] = TypeAdapter(cls)
        self._names[cls] = tag
        return tag

    def name_of(self, cls: type) -> str | None:
        return self._names.get(cls)

    def adapter(self, name: str) -> TypeAdapter[Any] | None:
        return self._adapters.get(name)

    def names(self) -> list[str]:
        return sorted(self._adapters)

    def __contains__(self, cls: object) -> bool:
        return cls in self._names


class TaggedJsonCodec:
    """The default codec: JSON primitives verbatim, everything else as a tagged object."""

    name = "tagged-json/1"

    def __init__(self, registry: TypeRegistry) -> None:
        self.registry = registry

    # encode ------------------------------------------------------------------------------------

    def encode(self, value: Any) -> JSONValue:
        t = type(value)
        if t in _PRIMITIVES:
            return value
        if t is float:
            return value if math.isfinite(value) else {"$float": repr(value)}
        if t is list:
            # fast path: a list of JSON scalars (one C-level type pass) is copied as it is
            if _PRIMITIVES.issuperset(map(type, value)):
                return value.copy()
            if _SCALARS.issuperset(map(type, value)) and _finite(value):
                return value.copy()
            return [self.encode(v) for v in value]
        if t is dict:
            return self._encode_dict(value)
        tag = self.registry.name_of(t)
        if tag is not None:
            # Dump to Python values, then encode those ourselves: pydantic's JSON mode would let
            # non-finite floats through and refuses bytes that are not UTF-8.
            if isinstance(value, BaseModel):
                dumped = value.model_dump(mode="python")
            else:
                adapter = self.registry.adapter(tag)
                assert adapter is not None
                dumped = adapter.dump_python(value, mode="python")
            return {"$type": tag, "data": self._encode_fields(dumped)}
        if t is tuple:
            return {"$tuple": [self.encode(v) for v in value]}
        if t is bytes:
            return {"$bytes": base64.b64encode(value).decode("ascii")}
        raise UnregisteredTypeError(
            f"cannot serialize a value of type {type_name(t)}: it is not a JSON type and not "
            "registered with the workflow (declare it in a handler annotation or call "
            "WorkflowBuilder.register_types)"
        )

    def _encode_fields(self, value: Any) -> JSONValue:
        """Encode a model's dumped fields. Leaves pydantic validates from their JSON form
        (datetime, UUID, Decimal, enums, sets...) are stored in that form."""
        t = type(value)
        if t in _PRIMITIVES or t is float or t is bytes:
            return self.encode(value)
        if t is list:
            return [self._encode_fields(v) for v in value]
        if t is tuple:
            return {"$tuple": [self._encode_fields(v) for v in value]}
        if t is dict:
            if all(type(k) is str for k in value):
                encoded = {k: self._encode_fields(v) for k, v in value.items()}
                return {"$dict": encoded} if any(k.startswith("$") for k in value) else encoded
            return {
                "$items": [
                    [self._encode_fields(k), self._encode_fields(v)] for k, v in value.items()
                ]
            }
        try:
            return to_jsonable_python(value)
        except PydanticSerializationError as exc:
            raise UnregisteredTypeError(
                f"cannot serialize a field value of type {type_name(t)}: {exc}"
            ) from exc

    def _encode_dict(self, value: dict[Any, Any]) -> JSONValue:
        if (
            _STR_ONLY.issuperset(map(type, value))
            and _SCALARS.issuperset(map(type, value.values()))
            and not any(k.startswith("$") for k in value)
            and _finite(value.values())
        ):
            return value.copy()  # fast path: plain keys, JSON scalar values
        if all(type(k) is str for k in value):
            encoded = {k: self.encode(v) for k, v in value.items()}
            if any(k.startswith("$") for k in value):
                return {"$dict": encoded}
            return encoded
        return {"$items": [[self.encode(k), self.encode(v)] for k, v in value.items()]}

    # decode ------------------------------------------------------------------------------------

    def decode(self, data: JSONValue) -> Any:
        t = type(data)
        if t is list:
            if _SCALARS.issuperset(map(type, data)):
                return data.copy()  # fast path: nothing nested, nothing tagged
            return [self.decode(v) for v in data]
        if t is not dict:
            return data
        if not data:
            return {}
        marker = next(iter(data))
        if not marker.startswith("$"):
            if _SCALARS.issuperset(map(type, data.values())):
                return data.copy()
            return {k: self.decode(v) for k, v in data.items()}
        body = data[marker]
        if marker == "$type":
            return self._decode_tagged(body, data.get("data"))
        if marker == "$dict":
            return {k: self.decode(v) for k, v in body.items()}
        if marker == "$items":
            return {self.decode(k): self.decode(v) for k, v in body}
        if marker == "$tuple":
            return tuple(self.decode(v) for v in body)
        if marker == "$bytes":
            return base64.b64decode(body)
        if marker == "$float":
            return float(body)
        raise SerializationError(f"unknown marker {marker!r} in encoded data")

    def _decode_tagged(self, tag: str, payload: JSONValue) -> Any:
        adapter = self.registry.adapter(tag)
        if adapter is None:
            raise UnregisteredTypeError(
                f"stored data names type {tag!r}, which this workflow does not register "
                f"(registered: {', '.join(self.registry.names()) or 'none'})"
            )
        try:
            return adapter.validate_python(self.decode(payload))
        except ValidationError as exc:
            raise SerializationError(f"stored {tag} does not validate: {exc}") from exc
