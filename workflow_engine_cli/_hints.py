"""What the commands the CLI prints to continue a run must repeat (set from the options)."""

from __future__ import annotations

import shlex
from pathlib import Path


class Hints:
    """`` --db PATH`` when the command was given a database, so that a printed
    ``workflow-engine resume RUN`` continues the same run (else nothing)."""

    db = ""

    @classmethod
    def given(cls, db: Path | None) -> None:
        cls.db = f" --db {shlex.quote(str(db))}" if db is not None else ""
