"""Bounded parsing of untrusted input: HTTP bodies, ``--data``/``--arguments`` and argv.

Everything that enters from outside goes through here first, so what reaches the engine is
plain JSON of bounded size and depth whose strings are real Unicode text:

* **size** is checked before parsing (``InputTooLargeError``, HTTP 413);
* **depth** is measured without recursion, before ``json.loads`` (whose C decoder recurses once
  per ``[``/``{``: 50,000 levels end in ``RecursionError``), so a deep document is refused
  cleanly instead of crashing whatever walks it later;
* **text**: bytes must be UTF-8, and no string may hold a lone surrogate (``"\\ud800"`` is valid
  JSON but cannot be encoded again: it would break the SSE stream, SQLite or the terminal);
* non-standard JSON (``NaN``, ``Infinity``, numbers that overflow a float) is refused.

Each refusal is an ``InputError`` with a stable ``code`` and a one-line message.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Iterable
from itertools import accumulate, repeat
from typing import Any

MAX_JSON_DEPTH = 64
"""Nesting levels of arrays and objects accepted (tool arguments need a handful)."""
MAX_JSON_BYTES = 1_000_000

# (the closing quote optional: a string left open runs to the end, read once -- required, each
# quote inside it began a new match that read on to the end: 120 KB of ``\\"`` held a server's
# loop 45 s, outside tester 207; the text is refused as malformed JSON after)
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
# opening brackets become 2 and closing ones 0, so that (byte - 1) is the change in depth
_DEPTH_STEPS = str.maketrans({"[": "\x02", "{": "\x02", "]": "\x00", "}": "\x00"})


class InputError(ValueError):
    """Input refused at the boundary; ``code`` is stable, the message is one line."""

    code = "invalid_input"
    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)


class InputTooLargeError(InputError):
    code = "request_too_large"
    status = 413


class InputTooDeepError(InputError):
    code = "json_too_deep"


class InvalidTextError(InputError):
    """Bytes that are not UTF-8, or a string with a lone surrogate."""

    code = "invalid_text"


class MalformedJsonError(InputError):
    """Not JSON at all (HTTP 422, as for a body that is JSON but not a valid request)."""

    code = "malformed_json"
    status = 422


def json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in ``text``, ignoring brackets inside strings.

    Runs in C-level loops (regex, translate, accumulate) with no recursion, so it is safe and
    fast on a megabyte of brackets. For malformed text it may over-count; the caller then
    refuses the text as too deep, which is still a clear answer.
    """
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    if not brackets:
        return 0
    steps = brackets.translate(_DEPTH_STEPS).encode("latin-1")
    return max(0, max(accumulate(map(operator.sub, steps, repeat(1)))))


def is_blank(text: str) -> bool:
    """Nothing to see: white space and characters that show nothing alone (a zero-width
    space, a byte order mark, a Hangul filler, a variation selector, the blank braille
    pattern). A message of those is no message, wherever it comes from: ``str.strip()`` kept
    ``"\u200b"`` (outside testers 106, 113, 114)."""
    if text.isascii():  # (no ASCII character is a format character or default-ignorable)
        return not text.strip(_ASCII_BLANK)
    import unicodedata  # (on first use: importing it is a search of the path, ~0.3 ms)

    return all(
        c.isspace() or unicodedata.category(c) in ("Cf", "Cc") or _shows_nothing(ord(c))
        for c in text
    )


_ASCII_BLANK = "".join(map(chr, range(0x21))) + "\x7f"
"""White space and control characters: a NUL alone was a reply (outside tester 150)."""


_SHOWS_NOTHING = (
    # Unicode's default-ignorable code points that are not format characters (Cf), and U+2800
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x2800, 0x2800),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFF8),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)


def _shows_nothing(code: int) -> bool:
    return any(low <= code <= high for low, high in _SHOWS_NOTHING)


def check_text(value: str, what: str) -> str:
    """``value`` if it encodes as UTF-8; ``InvalidTextError`` naming ``what`` otherwise."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidTextError(f"{what} is not valid text: {_describe(exc)}") from None
    return value


def check_texts(values: Iterable[str], what: str) -> None:
    for position, value in enumerate(values):
        check_text(value, f"{what} {position}")


def _describe(exc: UnicodeEncodeError | UnicodeDecodeError, *, from_argv: bool = True) -> str:
    bad = exc.object[exc.start : exc.end]
    if isinstance(bad, str):
        code = ord(bad[0])
        if from_argv and 0xDC80 <= code <= 0xDCFF:  # how Python carries a byte that was not UTF-8
            return f"byte 0x{code - 0xDC00:02x} at position {exc.start} is not UTF-8"
        return f"a lone surrogate U+{code:04X}"
    return f"byte 0x{bad[0]:02x} at position {exc.start} is not UTF-8"


def _refuse_constant(name: str) -> Any:
    raise MalformedJsonError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise MalformedJsonError(f"the number {text[:40]} is out of range")
    return value


def parse_json(
    data: bytes | str,
    *,
    what: str = "the body",
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Parse untrusted JSON within limits; every refusal is an :class:`InputError`."""
    if isinstance(data, bytes):
        size = len(data)
        if size > max_bytes:
            raise InputTooLargeError(f"{what} has {size} bytes; the limit is {max_bytes}")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidTextError(f"{what} is not valid text: {_describe(exc)}") from None
    else:
        text = check_text(data, what)
        size = len(text.encode("utf-8"))
        if size > max_bytes:
            raise InputTooLargeError(f"{what} has {size} bytes; the limit is {max_bytes}")
    depth = json_depth(text)
    if depth > max_depth:
        raise InputTooDeepError(f"{what} nests {depth} levels deep; the limit is {max_depth}")
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except InputError as exc:
        raise MalformedJsonError(f"{what} is malformed JSON: {exc}") from None
    except RecursionError:  # unreachable after the depth check; kept as a last guard
        raise InputTooDeepError(f"{what} nests too deep") from None
    except json.JSONDecodeError as exc:
        raise MalformedJsonError(f"{what} is malformed JSON: {exc}") from None
    except ValueError:  # an integer beyond int_max_str_digits
        raise MalformedJsonError(f"{what} holds a number with too many digits") from None
    try:
        # The only way to carry a lone surrogate in UTF-8 JSON is an escape: catch it here,
        # in keys and values alike, before anything stores or echoes it.
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidTextError(
            f"{what} holds a string that is not valid text: {_describe(exc, from_argv=False)}"
        ) from None
    return value
