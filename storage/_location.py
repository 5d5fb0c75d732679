"""Where the SQLite store keeps its runs when it is not told, and how it syncs them: apart from
the store itself, so that a command that only needs these loads nothing else."""

from __future__ import annotations

import os
from pathlib import Path


def default_db_path() -> Path:
    """``$WORKFLOW_ENGINE_DB``, else ``$XDG_DATA_HOME/workflow-engine/runs.db`` (a relative
    ``XDG_DATA_HOME`` is ignored, as the XDG spec says: ``~/.local/share`` then)."""
    env = os.environ.get("WORKFLOW_ENGINE_DB")
    if env:
        return Path(os.path.expanduser(env))  # (a shell leaves "~" in VAR=~/x.db quoted)
    xdg = os.environ.get("XDG_DATA_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(home_directory(), ".local", "share")
    return Path(base) / "workflow-engine" / "runs.db"


def home_directory() -> str:
    """``$HOME``; when it is unset or empty, the user's entry in the password database (an
    empty one read as ``/`` put runs at the file system's root, tester 99). ``UsageError``
    when there is none, or when it begins with ``~`` (``Path.home()`` raised a bare
    ``RuntimeError`` for that)."""
    home = os.environ.get("HOME") or ""
    said = f"$HOME is {home!r}"
    if not home:
        said = "$HOME is not set" if "HOME" not in os.environ else "$HOME is empty"
        try:
            import pwd

            home = pwd.getpwuid(os.getuid()).pw_dir
        except (ImportError, KeyError):
            said += f", and user {os.getuid()} has no entry in the password database"
    if not home or home.startswith("~"):
        from workflow_engine._errors import UsageError

        raise UsageError(
            f"cannot tell where the default database is: {said}; give --db PATH, or set "
            "WORKFLOW_ENGINE_DB (or HOME)"
        )
    return home


def synchronous_mode(given: str | None = None) -> str | None:
    """The store's ``synchronous`` setting: ``given``, else ``$WORKFLOW_ENGINE_SQLITE_SYNC``,
    else ``NORMAL`` (upper-cased); None when it is not one the store takes (NORMAL, FULL)."""
    mode = (given or os.environ.get("WORKFLOW_ENGINE_SQLITE_SYNC") or "NORMAL").upper()
    return mode if mode in ("NORMAL", "FULL") else None
