"""``parse_json``: untrusted JSON read within limits, each refusal by name, in linear time."""

from __future__ import annotations

import time

import pytest

from workflow_engine._input import (
    InputTooDeepError,
    MalformedJsonError,
    json_depth,
    parse_json,
)


def test_brackets_in_strings_do_not_count_and_escaped_quotes_do_not_end_them() -> None:
    assert json_depth('["[[[", {"a": "\\"]]]{{"}, [[]]]') == 3
    assert parse_json(b'["\\"[", [1]]') == ['"[', [1]]


def test_too_deep_is_refused_by_its_depth() -> None:
    with pytest.raises(InputTooDeepError, match="nests 65 levels deep; the limit is 64"):
        parse_json(b"[" * 65 + b"]" * 65)


@pytest.mark.parametrize(
    "body",
    [b'"' + b'\\"' * 300_000, b'["' + b"[" * 300_000, b'{"a": "' + b'\\"[' * 200_000],
    ids=["escaped quotes", "brackets", "both"],
)
def test_a_string_left_open_is_malformed_and_read_once(body: bytes) -> None:
    """Each quote inside a string left open began a new reading to the end: 120 KB of ``\\"``
    held a server 45 s (outside tester 207). Read once, it is refused as malformed."""
    started = time.perf_counter()
    with pytest.raises(MalformedJsonError, match="Unterminated string"):
        parse_json(body)
    assert time.perf_counter() - started < 10  # (linear: milliseconds)
