"""JSON codecs: how messages, state, requests and outputs become JSON and come back.

A codec turns any supported value into a JSON-compatible structure and back, exactly:
``decode(encode(v)) == v`` with the same types at every depth. The default,
:class:`TaggedJsonCodec` (name ``tagged-json/1``), keeps JSON primitives as they are and wraps
everything else in a marker object whose first key starts with ``$``:

    null, true/false, integers, strings, finite floats   as they are
    [...]                                  a list
    {...}                                  a dict whose keys are strings not starting with "$"
    {"$dict": {...}}                       a dict with str keys, some starting with "$"
    {"$items": [[k, v], ...]}              a dict with a key that is not a str
    {"$tuple": [...]}  {"$set": [...]}  {"$frozenset": [...]}   (set items in a canonical order)
    {"$float": "nan" | "inf" | "-inf"}     a non-finite float (-0.0 is stored as -0.0)
    {"$bytes": "<base64>"}
    {"$decimal": "1.10"}                   str(Decimal): keeps the exponent, NaN and Infinity
    {"$uuid": "<canonical form>"}
    {"$date": "2024-05-01"}
    {"$datetime": "<isoformat()>"}         naive, or aware with a fixed UTC offset
    {"$datetime": ["<isoformat()>", zone, fold]}   when the text alone is not exact: zone is
                                           an IANA name (zoneinfo; the text has no offset), an
                                           offset in microseconds (not whole minutes), or null
    {"$time": ...}                         like $datetime
    {"$timedelta": [days, seconds, microseconds]}
    {"$type": "<tag>", "data": ...}        a registered class (see below)

``data`` of a ``$type`` is, for a pydantic model, an object of its fields by field name (never by
alias) plus any extra fields (``extra="allow"``); for a ``RootModel`` its root; for a dataclass
an object of all its fields; for an enum its member's value; for a ``NamedTuple`` a ``$tuple``;
for any other class pydantic's Python (else JSON) form. Every field value is encoded by these
same rules, so a datetime in an ``Any`` field, or a subclass instance in a base-typed field, comes
back as it was. Decoding validates the decoded Python values against the class by field name, so
declared types are still checked; data that fails is a :class:`CorruptValueError`.

Which classes can be decoded comes from a :class:`TypeRegistry` (``_registry``) that the workflow
fills from its own annotations and ``register_types`` calls. Tags are stable names, not module
paths: ``name=``, else a ``__workflow_type__ = "Name"`` set in the class body, else
``__qualname__``; the ``module.qualname`` tags older versions wrote still decode. A subclass of a
registered class gets its own tag and decodes wherever it is imported. Nothing named only by the
data is ever imported or constructed, so a checkpoint cannot run arbitrary code.

Values may nest at most :data:`MAX_DEPTH` JSON arrays/objects deep (so that a checkpoint holding
them stays within the 200 levels pydantic's JSON parser accepts). Anything that cannot be encoded,
and any stored data that is not a valid encoding, raises a :class:`SerializationError` naming what
was wrong and where (a path such as ``data.order.items[3]``). No pickle anywhere.
"""

from __future__ import annotations

import base64
import collections
import datetime as _dt
import json
import math
import operator
import re
import uuid
from collections.abc import Callable, Collection, Iterable
from decimal import Decimal
from typing import Any, Protocol, runtime_checkable
from zoneinfo import ZoneInfo

from pydantic import ValidationError
from pydantic_core import from_json

from ._errors import (
    CorruptValueError,
    NoLongerFitsError,
    SerializationError,
    StorageError,
    StoreCorruptError,
    StoredTypeChangedError,
    UnregisteredTypeError,
    WorkflowError,
)
from ._registry import (
    DATACLASS,
    ENUM,
    MODEL,
    NAMEDTUPLE,
    ROOT,
    AmbiguousTagError,
    TypeEntry,
    TypeRegistry,
)
from ._stored_items import StoredItem, resolved
from ._types import type_name

JSONValue = Any
"""A value made only of dict (str keys), list, str, int, float, bool and None."""

MAX_DEPTH = 180
"""How many JSON arrays/objects an encoded value may nest (encoding and decoding both refuse
more). A checkpoint wraps values in a few more levels; pydantic's JSON parser stops at 200."""

_PRIMITIVES = frozenset({str, int, bool, type(None)})
_SCALARS = frozenset({str, int, bool, float, type(None)})
"""JSON scalars: encoded as they are (floats if finite) and decoded as they are. A list or dict
of only these is encoded and decoded by copying it, after one type check over its items."""
_STR_ONLY = frozenset({str})
_NON_FINITE = frozenset({"nan", "inf", "-inf"})
_NONE = type(None)
_MINUTE = _dt.timedelta(minutes=1)
_MICROSECOND = _dt.timedelta(microseconds=1)


_INT_LIMIT = 10**4300
"""An int of more digits than this has is written as JSON, but no JSON reader here reads it
back (pydantic's "number out of range", Python's digit limit): refused when encoded."""


UNREADABLE_INT = (
    "an integer of more than 4,300 digits, which no JSON reader reads back (keep such a number "
    "as text: str(n))"
)
"""What a refusal of such a number says, wherever it is met."""
_TOO_LONG_INT = f"it holds {UNREADABLE_INT}"


def _too_long_int(at: str) -> str:
    return f"cannot encode {at}: {_TOO_LONG_INT}"


def holds_unreadable_number(text: str) -> bool:
    """Whether JSON ``text`` holds an int that no JSON reader here reads back (more than
    4,300 digits: pydantic writes it, then says "number out of range" reading it)."""
    if len(text) <= _LONGEST_INT or not _long_digit_run(text):
        return False
    try:  # (digits in a string are text: the parse tells them apart)
        from_json(text)
    except ValueError as exc:
        return "number out of range" in str(exc)
    return False


def _long_digit_run(text: str) -> bool:
    """Whether ``text`` has a run of more than 4,300 ASCII digits. Looked for only where such
    a run must be, around two consecutive sample points that are both digits: some 240 looks
    at 500 KB of text, where a regex took 18 ms."""
    behind = False
    for k in range(0, len(text), _SAMPLE):
        here = "0" <= text[k] <= "9"
        if here and behind:
            start = k
            while start and "0" <= text[start - 1] <= "9" and k - start <= _LONGEST_INT:
                start -= 1
            if _DIGITS_FROM.match(text, k).end() - start > _LONGEST_INT:  # type: ignore[union-attr]
                return True
        behind = here
    return False


_LONGEST_INT = 4300
"""Digits of the longest int JSON readers here read back (pydantic, Python's ``json``)."""
_SAMPLE = (_LONGEST_INT + 1) // 2
"""A run of more digits than that covers two consecutive multiples of this."""
_DIGITS_FROM = re.compile(r"[0-9]*")


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


# --- errors collected on the way out of the recursion -----------------------------------------


def require_text(values: Collection[Any], at: str) -> None:
    """Every str among ``values`` is valid Unicode (no lone surrogate, which UTF-8 cannot
    hold: a checkpoint or an answer holding one could never be stored or read back)."""
    try:
        joined = "".join(values)  # (only text: one C-level pass)
    except TypeError:
        joined = "".join([v for v in values if isinstance(v, str)])
    if joined.isascii():
        return
    for text in values:
        if not isinstance(text, str):
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SerializationError(f"cannot encode {at}: {unicode_problem(exc)}") from None


def _scalar_list_copy(value: list[Any], types: set[type], at: str) -> list[Any]:
    """A copy of a list of JSON scalars (``types``: its items' types), its text checked."""
    if str in types:
        require_text(value, at)
    return value.copy()


def is_text(value: str) -> bool:
    """Valid Unicode text: UTF-8 can hold it (no lone surrogate)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unicode_problem(exc: UnicodeEncodeError) -> str:
    """What a text that UTF-8 cannot hold holds, and what to do about it."""
    bad = exc.object[exc.start : exc.end]
    return (
        f"it holds text with a lone surrogate ({bad!r}), which is not valid Unicode and "
        "cannot be stored; decode bytes with errors='replace', or keep them as bytes"
    )


class _Failure(Exception):
    """Raised deep inside encode/decode; each level it passes adds its path segment, and the
    public entry point turns it into ``error`` with the whole path in the message."""

    def __init__(self, error: type[SerializationError], reason: str) -> None:
        super().__init__(reason)
        self.error = error
        self.reason = reason
        self.segments: list[str] = []  # innermost first

    def at(self, segment: str) -> _Failure:
        self.segments.append(segment)
        return self

    def public(self, verb: str, root: str) -> SerializationError:
        segments = self.segments[::-1]
        if len(segments) > 16:
            hidden = len(segments) - 12
            segments = [*segments[:8], f"...({hidden} more)...", *segments[-4:]]
        return self.error(f"cannot {verb} {root}{''.join(segments)}: {self.reason}")


def _corrupt(reason: str) -> _Failure:
    return _Failure(CorruptValueError, reason)


def _too_deep(verb: str) -> _Failure:
    if verb == "decode":
        return _corrupt(f"it nests deeper than {MAX_DEPTH} levels")
    return _Failure(SerializationError, f"it nests deeper than {MAX_DEPTH} levels (a cycle?)")


def _key(key: str) -> str:
    return f".{key}" if key.isidentifier() else f"[{key!r}]"


def _kind(data: Any) -> str:
    """How a stored value looks, for error messages."""
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if data is None:
        return "null"
    if type(data) in (int, float):
        return "a number"
    return names.get(type(data), type(data).__name__)


# --- the codec ----------------------------------------------------------------------------------


def _zone_key(tz: Any) -> str | None:
    return tz.key if type(tz) is ZoneInfo else None


class TaggedJsonCodec:
    """The default codec: JSON primitives verbatim, everything else as a tagged object."""

    name = "tagged-json/1"

    def __init__(self, registry: TypeRegistry) -> None:
        self.registry = registry

    # public -------------------------------------------------------------------------------------

    def encode(self, value: Any, *, at: str = "value") -> JSONValue:
        """JSON-compatible data for ``value``; ``at`` names it in error messages. Text must be
        valid Unicode (a str with a lone surrogate cannot be written as UTF-8 JSON)."""
        t = type(value)
        if t in _PRIMITIVES:
            if t is str and not value.isascii():
                require_text((value,), at)
            elif t is int and not -_INT_LIMIT < value < _INT_LIMIT:
                raise SerializationError(_too_long_int(at))
            return value
        if t is float:
            return value if math.isfinite(value) else {"$float": repr(value)}
        if t is list:
            # fast path: a list of JSON scalars (one C-level type pass) is copied as it is
            types = set(map(type, value))
            if types <= _PRIMITIVES or (types <= _SCALARS and _finite(value)):
                return _scalar_list_copy(value, types, at)
        elif (
            t is dict
            and _STR_ONLY.issuperset(map(type, value))
            and _SCALARS.issuperset(map(type, value.values()))
            and not any(k.startswith("$") for k in value)
            and _finite(value.values())
        ):
            require_text(value, at)
            require_text(value.values(), at)
            return value.copy()  # fast path: plain keys, JSON scalar values
        try:
            encoded = self._enc(value, 1)
        except _Failure as failure:
            raise failure.public("encode", at) from failure.__cause__
        except SerializationError:
            raise
        except Exception as exc:  # a case no rule foresaw: still a clear, typed error
            raise SerializationError(f"cannot encode {at}: {type(exc).__name__}: {exc}") from exc
        try:
            json.dumps(encoded, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise SerializationError(f"cannot encode {at}: {unicode_problem(exc)}") from None
        except ValueError as exc:  # (Python's limit on an int's digits: JSON readers' too)
            said = _too_long_int(at) if "digits" in str(exc) else f"cannot encode {at}: {exc}"
            raise SerializationError(said) from None
        return encoded

    def decode(self, data: JSONValue, *, at: str = "data") -> Any:
        """The value ``data`` encodes; any problem is a :class:`SerializationError` naming the
        place (``at`` is the name of the root in that path)."""
        t = type(data)
        try:
            if t is dict:
                if not data:
                    return {}
                first = next(iter(data))
                if type(first) is str and not first.startswith("$"):
                    if _SCALARS.issuperset(map(type, data.values())):
                        return data.copy()  # fast path: nothing nested, nothing tagged
                    return self._dec_object(data, 2)
                return self._dec(data, 1)
            if t is list:
                if _SCALARS.issuperset(map(type, data)):
                    return data.copy()
                return self._dec_seq(data, 2)
            if t in _SCALARS:
                return data
            return self._dec(data, 1)
        except _Failure as failure:
            raise failure.public("decode", at) from failure.__cause__
        except (SerializationError, StorageError):  # (a stored item that could not be read)
            raise
        except Exception as exc:  # a shape no check foresaw: still a clear, typed error
            raise CorruptValueError(f"cannot decode {at}: {type(exc).__name__}: {exc}") from exc

    def encode_checked(self, value: Any, *, at: str = "value") -> JSONValue:
        """``encode``, and prove the result decodes -- what is stored must be readable. Plain
        JSON (scalars, a list or flat dict of them) always decodes, so it skips the proof."""
        t = type(value)
        if t in _PRIMITIVES and (t is not str or value.isascii()):
            if t is int and not -_INT_LIMIT < value < _INT_LIMIT:
                raise SerializationError(_too_long_int(at))
            return value
        if t is list:
            types = set(map(type, value))
            if types <= _PRIMITIVES:
                return _scalar_list_copy(value, types, at)
        encoded = self.encode(value, at=at)
        if encoded is not value and not (
            type(encoded) is dict
            and _STR_ONLY.issuperset(map(type, encoded))
            and _PRIMITIVES.issuperset(map(type, encoded.values()))
            and not any(k.startswith("$") for k in encoded)
        ):
            read_back(self, encoded, at)
        return encoded

    def copy(self, value: Any) -> Any:
        """An independent deep copy of ``value`` made by encoding and decoding it: what a
        receiver or a restored run would get. Raises like :meth:`encode` if it is not storable."""
        t = type(value)
        if t in _SCALARS:
            if t is str and not value.isascii():
                require_text((value,), "value")
            return value
        if t is list:
            types = set(map(type, value))
            if types <= _SCALARS:
                return _scalar_list_copy(value, types, "value")
        if (
            t is dict
            and _SCALARS.issuperset(map(type, value))
            and _SCALARS.issuperset(map(type, value.values()))
        ):
            require_text(value, "value")
            require_text(value.values(), "value")
            return value.copy()
        return self.decode(self.encode(value))

    # encode -------------------------------------------------------------------------------------
    # ``depth`` is the JSON nesting level the encoded value will sit at (the root is 1).

    def _enc(self, value: Any, depth: int) -> JSONValue:
        t = type(value)
        if t in _PRIMITIVES:
            return value
        if t is float:
            return value if math.isfinite(value) else {"$float": repr(value)}
        if depth > MAX_DEPTH:
            raise _too_deep("encode")
        if t is list:
            if _SCALARS.issuperset(map(type, value)) and _finite(value):
                return value.copy()
            return self._enc_seq(value, depth + 1)
        if t is dict:
            return self._enc_dict(value, depth)
        leaf = _LEAF_ENCODERS.get(t)
        if leaf is not None:
            return leaf(self, value, depth)
        try:
            entry = self.registry.entry_for_class(t)
        except SerializationError as exc:
            raise _Failure(type(exc), str(exc)) from exc
        if entry is None:
            refused = self.registry.why_refused(t)
            raise _Failure(
                UnregisteredTypeError,
                f"a value of type {type_name(t)} is not a JSON type and not registered with the "
                "workflow (declare it in a handler annotation or call "
                "WorkflowBuilder.register_types)"
                if refused is None
                else f"a value of type {type_name(t)} cannot be stored: it is declared (or a "
                f"class it derives from is), but pydantic has no schema for it ({refused}); "
                "send, keep or yield it as a type pydantic knows (int for an int subclass, say) "
                "or as a model",
            )
        try:
            payload = self._enc_payload(entry, value, depth + 1)
        except _Failure:
            raise
        except Exception as exc:  # e.g. a field missing from a model_construct()ed instance
            raise _Failure(
                SerializationError, f"cannot read a {type_name(t)}: {type(exc).__name__}: {exc}"
            ) from exc
        return {"$type": entry.tag, "data": payload}

    def _enc_seq(self, values: Iterable[Any], depth: int) -> list[JSONValue]:
        """Encode items that sit at ``depth`` (inside an array one level up)."""
        if depth - 1 > MAX_DEPTH:
            raise _too_deep("encode")
        out: list[JSONValue] = []
        append, enc = out.append, self._enc
        for i, item in enumerate(values):
            if type(item) in _PRIMITIVES:
                append(item)
                continue
            try:
                append(enc(item, depth))
            except _Failure as failure:
                raise failure.at(f"[{i}]") from failure.__cause__
        return out

    def _enc_object(self, value: dict[str, Any], depth: int) -> JSONValue:
        """Encode a dict with str keys as an object at ``depth`` (escaped if a key starts
        with "$")."""
        escaped = any(k.startswith("$") for k in value)
        inner = depth + 1 if escaped else depth
        if inner > MAX_DEPTH:
            raise _too_deep("encode")
        out: dict[str, JSONValue] = {}
        enc = self._enc
        for k, item in value.items():
            if type(item) in _PRIMITIVES:
                out[k] = item
                continue
            try:
                out[k] = enc(item, inner + 1)
            except _Failure as failure:
                raise failure.at(_key(k)) from failure.__cause__
        return {"$dict": out} if escaped else out

    def _enc_dict(self, value: dict[Any, Any], depth: int) -> JSONValue:
        if _STR_ONLY.issuperset(map(type, value)):
            return self._enc_object(value, depth)
        if depth + 2 > MAX_DEPTH:
            raise _too_deep("encode")
        pairs: list[JSONValue] = []
        enc = self._enc
        for i, (k, item) in enumerate(value.items()):
            try:
                key = enc(k, depth + 3)
            except _Failure as failure:
                raise failure.at(f"{{key #{i}}}") from failure.__cause__
            try:
                pairs.append([key, enc(item, depth + 3)])
            except _Failure as failure:
                raise failure.at(f"[{k!r}]") from failure.__cause__
        return {"$items": pairs}

    def _enc_tuple(self, value: tuple[Any, ...], depth: int) -> JSONValue:
        return {"$tuple": self._enc_seq(value, depth + 2)}

    def _enc_set(self, value: set[Any] | frozenset[Any], depth: int) -> JSONValue:
        # Sets iterate in an order that changes between processes: sort the encoded items so the
        # same set is always stored the same way (reprs of JSON data are deterministic).
        try:
            items = sorted(self._enc_seq(value, depth + 2), key=repr)
        except ValueError:  # (the repr of an int past Python's digit limit)
            raise _Failure(SerializationError, _TOO_LONG_INT) from None
        return {"$set" if type(value) is set else "$frozenset": items}

    def _enc_bytes(self, value: bytes, depth: int) -> JSONValue:
        return {"$bytes": base64.b64encode(value).decode("ascii")}

    def _enc_clock(self, value: _dt.datetime | _dt.time, depth: int) -> JSONValue:
        marker = "$datetime" if type(value) is _dt.datetime else "$time"
        tz = value.tzinfo
        zone: str | int | None = None  # an IANA key, or an offset in microseconds
        if type(tz) is ZoneInfo and tz.key is not None:
            zone = tz.key
        elif tz is not None:
            offset = value.utcoffset()
            if offset is None:
                raise _Failure(
                    SerializationError,
                    f"{marker[1:]} with a tzinfo that has no UTC offset ({tz!r}) is not supported",
                )
            if offset % _MINUTE:  # isoformat() writes it, fromisoformat() may not read it back
                zone = offset // _MICROSECOND
        if zone is None and not value.fold:
            return {marker: value.isoformat()}  # naive, or a whole-minute offset in the text
        if depth + 1 > MAX_DEPTH:
            raise _too_deep("encode")
        text = (value.replace(tzinfo=None) if zone is not None else value).isoformat()
        return {marker: [text, zone, value.fold]}

    def _enc_date(self, value: _dt.date, depth: int) -> JSONValue:
        return {"$date": value.isoformat()}

    def _enc_timedelta(self, value: _dt.timedelta, depth: int) -> JSONValue:
        if depth + 1 > MAX_DEPTH:
            raise _too_deep("encode")
        return {"$timedelta": [value.days, value.seconds, value.microseconds]}

    def _enc_decimal(self, value: Decimal, depth: int) -> JSONValue:
        return {"$decimal": str(value)}

    def _enc_uuid(self, value: uuid.UUID, depth: int) -> JSONValue:
        return {"$uuid": str(value)}

    def _enc_payload(self, entry: TypeEntry, value: Any, depth: int) -> JSONValue:
        """The ``data`` of a ``$type`` object (at ``depth``)."""
        kind = entry.kind
        if kind == MODEL:
            fields = {}  # (loops: see ``_keys_but``)
            for name in entry.fields:
                fields[name] = getattr(value, name)
            extra = value.__pydantic_extra__
            if extra:
                fields.update(extra)
            return self._enc_object(fields, depth)
        if kind == DATACLASS:
            fields = {}
            for name in entry.fields:
                fields[name] = getattr(value, name)
            return self._enc_object(fields, depth)
        if kind == ENUM:
            return self._enc(value.value, depth)
        if kind == ROOT:
            return self._enc(value.root, depth)
        if kind == NAMEDTUPLE:
            return self._enc(tuple(value), depth)
        return self._enc(self._other_form(entry, value), depth)

    def _other_form(self, entry: TypeEntry, value: Any) -> Any:
        """Pydantic's form of a value of a class the codec has no rule for, checked to validate
        back to an equal value (so e.g. a SecretStr is refused rather than stored masked)."""
        try:  # (pydantic's warnings about an unexpected value: the failure below says it)
            form = entry.adapter.dump_python(value, mode="python", warnings=False)
            if isinstance(form, entry.cls):  # (a path, say) the class's own JSON form
                form = entry.adapter.dump_python(value, mode="json", warnings=False)
            back = entry.adapter.validate_python(form)
        except Exception as exc:
            raise _Failure(
                UnregisteredTypeError, f"{type_name(entry.cls)} cannot be serialized: {exc}"
            ) from exc
        if type(back) is not type(value) or back != value or not _same_beyond_eq(back, value):
            raise _Failure(
                SerializationError,
                f"a {type_name(entry.cls)} cannot be stored exactly: pydantic's serialized form "
                f"of it ({form!r}) reads back as {back!r}, not {value!r}",
            )
        return form

    # decode -------------------------------------------------------------------------------------
    # ``depth`` is the JSON nesting level of ``data`` (the root is 1).

    def _dec(self, data: JSONValue, depth: int) -> Any:
        t = type(data)
        if t is list:
            if depth > MAX_DEPTH:
                raise _too_deep("decode")
            if _SCALARS.issuperset(map(type, data)):
                return data.copy()
            return self._dec_seq(data, depth + 1)
        if t is not dict:
            if t in _SCALARS:
                return data
            if t is StoredItem:  # an item a store reads when first needed
                return self._dec(data.value, depth)
            raise _corrupt(f"{_kind(data)} is not JSON data")
        if depth > MAX_DEPTH:
            raise _too_deep("decode")
        if not data:
            return {}
        first = next(iter(data))
        if type(first) is str and first.startswith("$"):
            handler = _MARKERS.get(first)
            if handler is None:
                raise _corrupt(f"unknown marker {first!r}")
            if len(data) != 1 and first != "$type":
                raise _corrupt(f"a {first} object has other keys too ({_keys_but(data, first)})")
            return handler(self, data, depth)
        if _SCALARS.issuperset(map(type, data.values())):
            return data.copy()
        return self._dec_object(data, depth + 1)

    def _dec_seq(self, data: list[JSONValue], depth: int) -> list[Any]:
        """Decode the items of an array; they sit at ``depth``."""
        out: list[Any] = []
        append, dec = out.append, self._dec
        for i, item in enumerate(data):
            if type(item) in _SCALARS:
                append(item)
                continue
            try:
                append(dec(item, depth))
            except _Failure as failure:
                raise failure.at(f"[{i}]") from failure.__cause__
        return out

    def _dec_object(self, data: dict[str, JSONValue], depth: int) -> dict[str, Any]:
        """Decode the values of an object; they sit at ``depth``."""
        out: dict[str, Any] = {}
        dec = self._dec
        for k, item in data.items():
            if type(k) is not str:
                raise _corrupt(f"object key {k!r} is not a string")
            if type(item) in _SCALARS:
                out[k] = item
                continue
            try:
                out[k] = dec(item, depth)
            except _Failure as failure:
                raise failure.at(_key(k)) from failure.__cause__
        return out

    @staticmethod
    def _body(data: dict[str, Any], marker: str, kind: type, depth: int) -> Any:
        """The body of a marker object, checked to be a ``kind`` (list/dict/str)."""
        body = data[marker]
        if type(body) is not kind:
            names: dict[type, str] = {list: "an array", dict: "an object", str: "a string"}
            expected = names[kind]
            raise _corrupt(f"{marker} must hold {expected}, not {_kind(body)}")
        if kind is not str and depth + 1 > MAX_DEPTH:
            raise _too_deep("decode")
        return body

    def _dec_type(self, data: dict[str, Any], depth: int) -> Any:
        tag = data["$type"]
        if type(tag) is not str:
            raise _corrupt(f"$type must be a string, not {_kind(tag)}")
        if "data" not in data or len(data) != 2:
            extra = _keys_but(data, "$type", "data")
            raise _corrupt(
                "a $type object needs exactly the keys '$type' and 'data'"
                + (f" (it also has {extra})" if extra else " ('data' is missing)")
            )
        try:
            entry = self.registry.entry_for_tag(tag)
        except SerializationError as exc:
            raise _Failure(type(exc), str(exc)) from exc
        if entry is None:
            names = self.registry.names()
            shown = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "")
            raise _Failure(
                UnregisteredTypeError,
                f"stored data names type {tag!r}, which this workflow does not register "
                f"(registered: {shown or 'none'})",
            )
        return self._rebuild(entry, self._dec(data["data"], depth + 1))

    @staticmethod
    def _rebuild(entry: TypeEntry, value: Any) -> Any:
        """The instance of ``entry``'s class for its decoded ``data``, validated by field name."""
        kind, cls = entry.kind, entry.cls
        try:
            if kind in (MODEL, DATACLASS):
                if type(value) is not dict:
                    raise _corrupt(
                        f"stored {entry.tag} must be an object of fields, not {_kind(value)}"
                    )
                if not entry.open and not entry.names.issuperset(value):
                    # a field the class no longer has (removed, or renamed to one with a
                    # default): validating would drop its value without a word (tester 97)
                    gone = _keys_but(value, *entry.names)
                    raise _Failure(
                        NoLongerFitsError,
                        f"stored {entry.tag} has {gone}, which the class has no field for",
                    )
            if kind == MODEL:  # (model_validate, minus a wrapper call)
                validator = cls.__pydantic_validator__  # type: ignore[attr-defined]
                return validator.validate_python(value, by_alias=False, by_name=True)
            if kind == DATACLASS:
                late = {}  # (a loop: see ``_keys_but``)
                for k in entry.late:
                    if k in value:
                        late[k] = value.pop(k)
                obj = entry.adapter.validate_python(value, by_alias=False, by_name=True)
                for name, item in late.items():  # init=False fields: set as they were
                    object.__setattr__(obj, name, item)
                return obj
            if kind == ENUM:
                try:
                    return cls(value)
                except ValueError:
                    pass  # some other form pydantic accepts, or a clear validation error
            return entry.adapter.validate_python(value)
        except _Failure:
            raise
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or '(value)'}: {e['msg']}" for e in exc.errors()
            )
            raise _Failure(
                NoLongerFitsError, f"stored {entry.tag} does not validate: {problems}"
            ) from exc
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            raise _corrupt(f"stored {entry.tag} cannot be rebuilt: {reason}") from exc

    def _dec_dict(self, data: dict[str, Any], depth: int) -> Any:
        return self._dec_object(self._body(data, "$dict", dict, depth), depth + 2)

    def _dec_items(self, data: dict[str, Any], depth: int) -> Any:
        body = self._body(data, "$items", list, depth)
        if depth + 2 > MAX_DEPTH:
            raise _too_deep("decode")
        out: dict[Any, Any] = {}
        for i, pair in enumerate(body):
            if type(pair) is not list or len(pair) != 2:
                raise _corrupt(f"$items[{i}] must be a [key, value] pair, not {_kind(pair)}")
            try:
                key = self._dec(pair[0], depth + 3)
            except _Failure as failure:
                raise failure.at(f"{{key #{i}}}") from failure.__cause__
            try:
                item = self._dec(pair[1], depth + 3)
            except _Failure as failure:
                raise failure.at(f"[{key!r}]") from failure.__cause__
            try:
                out[key] = item
            except TypeError:
                raise _corrupt(f"$items[{i}] has a key that is not hashable ({key!r})") from None
        return out

    def _dec_tuple(self, data: dict[str, Any], depth: int) -> Any:
        return tuple(self._dec_seq(self._body(data, "$tuple", list, depth), depth + 2))

    def _dec_set(self, data: dict[str, Any], depth: int) -> Any:
        marker = next(iter(data))
        items = self._dec_seq(self._body(data, marker, list, depth), depth + 2)
        try:
            return set(items) if marker == "$set" else frozenset(items)
        except TypeError as exc:
            raise _corrupt(f"{marker} holds an item that is not hashable: {exc}") from None

    def _dec_float(self, data: dict[str, Any], depth: int) -> Any:
        body = data["$float"]
        if type(body) is not str or body not in _NON_FINITE:
            raise _corrupt(f'$float must be "nan", "inf" or "-inf", not {body!r}')
        return float(body)  # a new object each time: a set may hold several NaNs

    def _dec_bytes(self, data: dict[str, Any], depth: int) -> Any:
        body = self._body(data, "$bytes", str, depth)
        try:
            return base64.b64decode(body, validate=True)
        except ValueError as exc:  # binascii.Error, or non-ASCII text
            raise _corrupt(f"$bytes is not valid base64: {exc}") from None

    def _dec_text(self, data: dict[str, Any], marker: str, parse: Callable[[str], Any]) -> Any:
        body = self._body(data, marker, str, 0)
        try:
            return parse(body)
        except Exception as exc:
            raise _corrupt(f"{marker} {body!r} is not valid: {exc}") from None

    def _dec_decimal(self, data: dict[str, Any], depth: int) -> Any:
        return self._dec_text(data, "$decimal", Decimal)

    def _dec_uuid(self, data: dict[str, Any], depth: int) -> Any:
        return self._dec_text(data, "$uuid", uuid.UUID)

    def _dec_date(self, data: dict[str, Any], depth: int) -> Any:
        return self._dec_text(data, "$date", _dt.date.fromisoformat)

    def _dec_clock(self, data: dict[str, Any], depth: int) -> Any:
        marker = next(iter(data))
        parse = _dt.datetime.fromisoformat if marker == "$datetime" else _dt.time.fromisoformat
        if type(data[marker]) is str:
            return self._dec_text(data, marker, parse)
        body = self._body(data, marker, list, depth)
        shape = f"{marker} must be [text, zone (IANA name, offset in microseconds or null), fold]"
        if len(body) != 3 or type(body[0]) is not str or type(body[1]) not in (str, int, _NONE):
            raise _corrupt(f"{shape}, not {body!r}")
        text, zone, fold = body
        if type(fold) is not int or fold not in (0, 1):
            raise _corrupt(f"{shape}, not {body!r}")
        try:
            value = parse(text)
        except ValueError as exc:
            raise _corrupt(f"{marker} {text!r} is not valid: {exc}") from None
        if zone is not None:
            if value.tzinfo is not None:
                raise _corrupt(f"{marker} {text!r} has both an offset and the zone {zone!r}")
            try:
                tz = ZoneInfo(zone) if type(zone) is str else _dt.timezone(zone * _MICROSECOND)
            except Exception as exc:
                raise _corrupt(f"{marker} has an unknown time zone {zone!r}: {exc}") from None
            value = value.replace(tzinfo=tz)
        return value.replace(fold=fold)

    def _dec_timedelta(self, data: dict[str, Any], depth: int) -> Any:
        body = self._body(data, "$timedelta", list, depth)
        if len(body) != 3 or any(type(n) is not int for n in body):
            raise _corrupt(f"$timedelta must be [days, seconds, microseconds], not {body!r}")
        try:
            return _dt.timedelta(days=body[0], seconds=body[1], microseconds=body[2])
        except OverflowError as exc:
            raise _corrupt(f"$timedelta {body!r} is out of range: {exc}") from None


_LEAF_ENCODERS: dict[type, Callable[[TaggedJsonCodec, Any, int], JSONValue]] = {
    tuple: TaggedJsonCodec._enc_tuple,
    bytes: TaggedJsonCodec._enc_bytes,
    set: TaggedJsonCodec._enc_set,
    frozenset: TaggedJsonCodec._enc_set,
    _dt.datetime: TaggedJsonCodec._enc_clock,
    _dt.time: TaggedJsonCodec._enc_clock,
    _dt.date: TaggedJsonCodec._enc_date,
    _dt.timedelta: TaggedJsonCodec._enc_timedelta,
    Decimal: TaggedJsonCodec._enc_decimal,
    uuid.UUID: TaggedJsonCodec._enc_uuid,
}

_MARKERS: dict[str, Callable[[TaggedJsonCodec, dict[str, Any], int], Any]] = {
    "$type": TaggedJsonCodec._dec_type,
    "$dict": TaggedJsonCodec._dec_dict,
    "$items": TaggedJsonCodec._dec_items,
    "$tuple": TaggedJsonCodec._dec_tuple,
    "$set": TaggedJsonCodec._dec_set,
    "$frozenset": TaggedJsonCodec._dec_set,
    "$float": TaggedJsonCodec._dec_float,
    "$bytes": TaggedJsonCodec._dec_bytes,
    "$decimal": TaggedJsonCodec._dec_decimal,
    "$uuid": TaggedJsonCodec._dec_uuid,
    "$date": TaggedJsonCodec._dec_date,
    "$datetime": TaggedJsonCodec._dec_clock,
    "$time": TaggedJsonCodec._dec_clock,
    "$timedelta": TaggedJsonCodec._dec_timedelta,
}


def _keys_but(data: dict[str, Any], *but: str) -> str:
    """``data``'s keys other than ``but``, for an error message. (A function of its own: a
    comprehension in the codec's per-value methods makes the variables it reads cells, which
    Python 3.11 allocates at every call of the method, error or not.)"""
    return ", ".join(repr(k) for k in data if k not in but)


def read_back(codec: JsonCodec, encoded: JSONValue, at: str = "value") -> Any:
    """Decode what was just encoded -- the proof that a value about to be stored (or sent)
    is readable. Failing, it is the value given that is at fault, not stored data: a
    ``SerializationError`` saying so, not a ``CorruptValueError``."""
    try:
        return codec.decode(encoded)
    except CorruptValueError as exc:
        said = str(exc).replace("cannot decode ", "", 1).replace(": stored ", ": ", 1)
        raise SerializationError(
            f"cannot store {at}: it would not read back ({said}); a model built with "
            "model_construct or changed after validation can hold values its fields do not "
            "allow"
        ) from exc


def snapshot(codec: JsonCodec, value: Any) -> tuple[Any, JSONValue]:
    """``value``'s encoding and the copy a receiver gets (decoded from it, so proven
    readable)."""
    encoded = codec.encode(value)
    return read_back(codec, encoded), encoded


def encode_checked(codec: JsonCodec, value: Any) -> JSONValue:
    """Encode ``value`` and prove it decodes -- what is stored must be readable (cheaply,
    when the codec knows how: ``TaggedJsonCodec.encode_checked``)."""
    checked = getattr(codec, "encode_checked", None)
    if checked is not None:
        return checked(value)
    encoded = codec.encode(value)
    read_back(codec, encoded)
    return encoded


def decode_stored(codec: JsonCodec, data: JSONValue, run_id: str, what: str) -> Any:
    """Decode a value read back from a store. It was proven readable when written, so a
    failure means the code changed since (``StoredTypeChangedError``: a class it names no
    longer takes it, or is no longer registered) or the record is damaged
    (``StoreCorruptError``), each naming the run and ``what`` the record is -- never a raw
    codec error, never a handler's failure."""
    if not isinstance(codec, TaggedJsonCodec):  # (which reads a store's placeholders itself)
        data = data.value if type(data) is StoredItem else resolved(data)
    try:
        return codec.decode(data)
    except (SerializationError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise stored_value_error(exc, f"run {run_id!r}: {what}") from exc


def stored_value_error(exc: Exception, where: str) -> WorkflowError:
    """The error for a stored value that does not decode (``where``: which run and record)."""
    if isinstance(exc, UnregisteredTypeError):
        # (a subclass registered when first stored is found again only among the imported
        # subclasses of the class it extends: one whose module this process did not import
        # yet was blamed on a change of the code -- outside tester 178)
        return StoredTypeChangedError(
            f"{where} does not fit the workflow's types as this process knows them: {exc}. "
            "A class the workflow's annotations do not name (a subclass) is found again only "
            "once its module is imported: import it (or register it, "
            "WorkflowBuilder.register_types) before resuming; else the code changed since it "
            "was stored (a class renamed or removed?): continue the run with the code it "
            "started with"
        )
    if isinstance(exc, AmbiguousTagError):
        # (a module imported since, holding a class of the same name: not damage -- outside
        # tester 185)
        return StoredTypeChangedError(
            f"{where} does not decode in this process: {exc}; the stored value is intact -- "
            "resume it where only the class that stored it is imported, or name that class "
            "as it was stored (register_types(cls, name=...)) and the other otherwise"
        )
    if isinstance(exc, NoLongerFitsError):
        # (a type's fields changed; a stored record, written whole and read back at once
        # when it was stored, rarely damages into valid JSON of that shape)
        return StoredTypeChangedError(
            f"{where} does not fit the workflow's types as its code defines them now: {exc}. "
            "The code changed since it was stored (a field added, removed or renamed?): "
            "continue the run with the code it started with; else the record is damaged"
        )
    return StoreCorruptError(f"{where} does not decode: {exc}")


def _same_beyond_eq(back: Any, value: Any) -> bool:
    """What ``==`` does not compare, for the classes pydantic stores that have some: a deque's
    ``maxlen``, the signs of a complex's zero parts."""
    if isinstance(value, collections.deque):
        return back.maxlen == value.maxlen
    if isinstance(value, complex):
        return math.copysign(1.0, back.real) == math.copysign(1.0, value.real) and (
            math.copysign(1.0, back.imag) == math.copysign(1.0, value.imag)
        )
    return True


def strictly_equal(a: Any, b: Any) -> bool:
    """Encoded values that are equal *and* encode the same: ``==`` alone says ``True == 1 ==
    1.0`` and ``-0.0 == 0.0``, and ignores the order of a dict's keys."""
    if a is b:
        return True
    kind = type(a)
    if kind is StoredItem or type(b) is StoredItem:  # (what a store reads when first needed)
        return strictly_equal(
            a.value if kind is StoredItem else a, b.value if type(b) is StoredItem else b
        )
    if kind is not type(b):
        return False
    if kind is list:
        return len(a) == len(b) and all(map(strictly_equal, a, b))
    if kind is dict:
        return list(a) == list(b) and all(strictly_equal(v, b[k]) for k, v in a.items())
    if kind is float:
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


def starts_with(new: list[Any], old: list[Any]) -> bool:
    """``new`` begins with exactly the items of ``old`` (what lets a delta store only the rest).
    The same objects (what appending to a copy leaves) are checked at C speed; only lists
    rebuilt item by item are compared type by type."""
    n = len(old)
    if len(new) < n or new[:n] != old:
        return False
    return all(map(operator.is_, new, old)) or all(map(strictly_equal, new, old))
