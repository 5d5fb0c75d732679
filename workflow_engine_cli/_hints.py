"""What the commands the CLI prints to continue a run must repeat (set from the options)."""

from __future__ import annotations

import shlex
from pathlib import Path

REPLY_PLACEHOLDER = "<your reply>"
"""What a printed ``respond`` command holds where the person's words go; ``respond`` refuses it
as an answer (pasted as printed, a placeholder was stored for good)."""


class Hints:
    """`` --db PATH`` when the command was given a database, so that a printed
    ``workflow-engine resume RUN`` continues the same run (else nothing)."""

    db = ""

    @classmethod
    def given(cls, db: Path | None) -> None:
        # absolute: a command printed to continue "from another terminal" runs from any
        # directory (a relative path was not found from another one, tester 76)
        cls.db = f" --db {shell_quoted(str(Path(db).absolute()))}" if db is not None else ""


def shell_quoted(text: str) -> str:
    """``text`` as one shell word that survives being printed: ``shlex.quote``, or, for text
    with control characters (a tab, a newline), bash's ``$'...'`` with them escaped -- printed
    raw, a tab became spaces and a newline split the command (tester 77)."""
    if not any(map(_is_control, text)):
        return shlex.quote(text)
    escaped = {"\\": "\\\\", "'": "\\'", "\t": "\\t", "\n": "\\n", "\r": "\\r"}
    return (
        "$'"
        + "".join(escaped.get(c) or (f"\\x{ord(c):02x}" if _is_control(c) else c) for c in text)
        + "'"
    )


def _is_control(c: str) -> bool:
    return ord(c) < 32 or ord(c) == 127
