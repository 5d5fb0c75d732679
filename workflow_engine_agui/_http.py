"""The HTTP boundary of the AG-UI server: who may call, what a request body may be, and what
the values in a response look like.

The threat is a web page the user happens to visit (or a DNS name rebound to 127.0.0.1) that
sends requests to the server on the user's machine. A browser sends a cross-site ``POST`` with
``Content-Type: text/plain`` without asking first (no CORS preflight), and it always says where
the request comes from in ``Origin``. So, for every state-changing request:

* an ``Origin`` that is neither the server's own nor one allowed by ``--cors-origin`` gets 403
  (a request without ``Origin`` -- curl, a server-side AG-UI runtime -- is not from a browser);
* without a token, the ``Host`` must be a loopback name (403 otherwise): a rebound DNS name
  would otherwise make the attacker's page "same-origin";
* the body must be ``application/json`` (415): browsers send that only after a preflight, which
  the CORS settings answer.

What goes out is the *wire form*, made for web pages and people rather than for storage: plain
JSON with no codec markers (``{"$type": ..., "data": ...}`` is how checkpoints store values,
never how clients see them). A model or dataclass is an object of its fields by field name, an
enum its value, a set or tuple a list, a datetime, date, time or timedelta ISO 8601 text, a
``Decimal``, UUID or path a string, bytes base64, a non-finite float ``null``. Where a client
needs to know what a value is, the event names its type next to it (``request_type``,
``type``) by the stable name the workflow registered it under (``__qualname__``,
``__workflow_type__`` or ``name=``): never a module path. SSE framing is escaped so that any
line reader splits events where SSE does.
"""

from __future__ import annotations

import base64
import dataclasses
import ipaddress
import json
import math
import re
from collections.abc import Iterable
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from ag_ui.core import BaseEvent
from ag_ui.encoder import EventEncoder
from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, RootModel, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from workflow_engine import TypeRegistry
from workflow_engine._input import InputError, InputTooLargeError
from workflow_engine._registry import display_name

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DEFAULT_PORTS = {"http": 80, "https": 443}


class AGUIError(Exception):
    """Ends a request with ``RUN_ERROR`` carrying ``code`` (or, before the stream starts, with
    a 422 ``refusal``); raised before anything is stored, so nothing was changed."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


MESSAGE_CHARS = 2_000
"""The longest error message sent to a client or logged: one may quote what the client sent
(an interrupt id, a value), and a 1 MB id came back whole, in the stream and in the log."""


def bounded(message: str, left_out: int = 0) -> str:
    """``message``, cut to ``MESSAGE_CHARS`` characters, saying how much was left out (with
    ``left_out`` characters cut from it before)."""
    rest = max(0, len(message) - MESSAGE_CHARS) + left_out
    if not rest:
        return message
    return f"{message[:MESSAGE_CHARS]}… ({rest:,} more characters)"


def refusal(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    """The JSON answer to a refused request: ``{"error": code, "message": ..., **extra}``."""
    return JSONResponse({"error": code, "message": bounded(message), **extra}, status_code=status)


# --- origins and hosts --------------------------------------------------------------------------


def normalize_origin(value: str) -> str | None:
    """``scheme://host[:port]`` in the form browsers send (lower case, no default port), or
    None if ``value`` is not an http(s) origin (``null``, a path, credentials...)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), parts.hostname
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    if parts.path or parts.query or parts.fragment or parts.username or parts.password:
        return None
    if ":" in host:
        host = f"[{host}]"
    suffix = "" if port is None or port == _DEFAULT_PORTS[scheme] else f":{port}"
    return f"{scheme}://{host}{suffix}"


def is_loopback(host: str) -> bool:
    """``localhost`` (and ``*.localhost``, which browsers resolve to loopback themselves) or
    a loopback address."""
    host = host.lower()
    host = host[:-1] if host.endswith(".") else host  # one trailing dot: the same name
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return unmapped(ipaddress.ip_address(host.strip("[]"))).is_loopback
    except ValueError:
        return False


def unmapped(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> Any:
    """An IPv4 address written as IPv6 (``::ffff:127.0.0.1``) as the IPv4 address it is, which
    Python 3.11 does not read as loopback (outside tester 207); any other as it is."""
    mapped = getattr(address, "ipv4_mapped", None)
    return address if mapped is None else mapped


_HOST = re.compile(
    r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.?)(?::[0-9]{1,5})?"
)
"""A ``Host`` header as RFC 9110 has it: a name of dot-separated labels (one trailing dot
allowed) or a bracketed IPv6 address, then an optional port -- nothing a URL parser would read
past (``evil@localhost``, ``localhost/evil``, ``a..localhost`` were taken: outside tester 111)."""


def host_name(host_header: str) -> str | None:
    """The name in a ``Host`` header (without the port), or None if it is malformed (a port
    that is not one included: ``127.0.0.1:99999`` was taken, outside tester 107)."""
    if not _HOST.fullmatch(host_header):
        return None
    try:
        parts = urlsplit(f"//{host_header}")
        port = parts.port  # (ValueError if out of range)
    except ValueError:
        return None
    return parts.hostname if port is None or port > 0 else None


class BrowserGuard:
    """ASGI middleware refusing state-changing requests a browser sends on another site's
    behalf (see the module docstring). Safe methods pass untouched."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        allowed_origins: Iterable[str] = (),
        loopback_hosts_only: bool = True,
    ) -> None:
        self.app = app
        origins = list(allowed_origins)
        self.any_origin = "*" in origins
        self.allowed = {o for o in map(normalize_origin, origins) if o is not None}
        self.loopback_hosts_only = loopback_hosts_only

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            refused = self.check(scope)
            if refused is not None:
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def check(self, scope: Scope) -> JSONResponse | None:
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if self.loopback_hosts_only:
            name = host_name(host)
            if name is None or not is_loopback(name):
                return refusal(
                    403,
                    "host_not_allowed",
                    f"this server answers only to loopback host names, not {host!r}; "
                    "serve with --token to use another name",
                )
        origins = headers.getlist("origin")
        if len(origins) > 1:  # (only the first was checked: outside tester 107)
            return refusal(
                403, "origin_not_allowed", "a request names one Origin; this one names several"
            )
        origin = origins[0] if origins else None
        if origin is None or self.any_origin:
            return None
        normalized = normalize_origin(origin)
        own = normalize_origin(f"{scope.get('scheme', 'http')}://{host}")
        if normalized is not None and (normalized in self.allowed or normalized == own):
            return None
        return refusal(
            403,
            "origin_not_allowed",
            f"requests from the web page at {origin!r} are not allowed; "
            "allow its origin with --cors-origin",
        )


# --- request bodies -----------------------------------------------------------------------------


def is_json_media_type(value: str | None) -> bool:
    """``application/json``, optionally with ``charset=utf-8``. Anything else -- notably
    ``text/plain``, which a browser sends cross-site without a preflight -- is refused."""
    if not value:
        return False
    media_type, *params = value.split(";")
    if media_type.strip().lower() != "application/json":
        return False
    for param in params:
        name, _, param_value = param.partition("=")
        charset = param_value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            return False
    return True


class ClientGoneError(InputError):
    """The client closed the connection before its request's body was whole."""

    code = "client_disconnected"
    status = 400


async def read_body(request: Request, limit: int) -> bytes:
    """The body, read no further than ``limit`` bytes (``InputTooLargeError`` beyond;
    ``ClientGoneError`` if the client hangs up before the body is whole: it was a traceback
    in the server's log)."""
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise InputTooLargeError(f"the body has {int(declared)} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise InputTooLargeError(f"the body has more than {limit} bytes, the limit")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ClientGoneError(
            f"the client closed the connection after {size} bytes of the body"
        ) from None
    return b"".join(chunks)


def describe_validation(exc: ValidationError) -> str:
    """The first problem pydantic found, as one line naming the field (not echoing input)."""
    errors = exc.errors(include_input=False, include_url=False)
    if not errors:
        return "the body is not a valid RunAgentInput"
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "body"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"invalid RunAgentInput: {where}: {first['msg']}{more}"


# --- what goes out: the wire form -------------------------------------------------------------


def wire_value(value: Any) -> Any:
    """``value`` in the wire form (see the module docstring): plain JSON, no type markers."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, Enum):
        return wire_value(value.value)
    if isinstance(value, int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    fields = object_fields(value)
    if fields is not None:
        return {name: wire_value(field) for name, field in fields.items()}
    if isinstance(value, RootModel):
        return wire_value(value.root)
    if isinstance(value, dict):
        return {_wire_key(k): wire_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [wire_value(v) for v in value]
    if isinstance(value, set | frozenset):  # in a canonical order, as the codec stores them
        items = [wire_value(v) for v in value]
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    return to_jsonable_python(value, fallback=_opaque)


def object_fields(value: Any) -> dict[str, Any] | None:
    """A pydantic model's fields (by field name, extra fields included) or a dataclass's, in
    declaration order; None for any other value."""
    if isinstance(value, BaseModel) and not isinstance(value, RootModel):
        fields = {name: getattr(value, name) for name in type(value).model_fields}
        fields.update(value.model_extra or {})
        return fields
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return None


def type_label(tp: Any, registry: TypeRegistry) -> str:
    """The name clients see for a type: the stable tag ``registry`` stores it under (its
    ``__qualname__``, ``__workflow_type__`` or ``name=``), spelled the same for a class it does
    not know; generics as ``list[Order] | None``. Never a module path."""
    return display_name(tp, registry)


def _wire_key(key: Any) -> str:
    if isinstance(key, str):
        return key
    plain = wire_value(key)
    return plain if isinstance(plain, str) else json.dumps(plain)


def _opaque(value: Any) -> str:
    """A value with no JSON form: named, never described (its repr may hold anything)."""
    return f"<{type(value).__qualname__}>"


# Line breaks to str.splitlines (and so to httpx's line reader, among others) that JSON leaves
# unescaped; SSE itself ends lines only at CR/LF. They can only occur inside JSON strings.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def encode_event(encoder: EventEncoder, event: BaseEvent) -> str:
    """One SSE event, safe for any line reader. A string that is not valid text (stored, say,
    by a library caller that bypassed this server) goes out as a JSON escape instead of breaking
    the stream; so do U+0085, U+2028 and U+2029, which some clients split lines at."""
    try:
        text = encoder.encode(event)
    except (PydanticSerializationError, UnicodeError):
        data = event.model_dump(mode="json", by_alias=True, exclude_none=True)
        return f"data: {json.dumps(data, ensure_ascii=True)}\n\n"
    return text.translate(_LINE_BREAKS)
