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
        return Path(env)
    xdg = os.environ.get("XDG_DATA_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else str(Path.home() / ".local" / "share")
    return Path(base) / "workflow-engine" / "runs.db"


def synchronous_mode(given: str | None = None) -> str | None:
    """The store's ``synchronous`` setting: ``given``, else ``$WORKFLOW_ENGINE_SQLITE_SYNC``,
    else ``NORMAL`` (upper-cased); None when it is not one the store takes (NORMAL, FULL)."""
    mode = (given or os.environ.get("WORKFLOW_ENGINE_SQLITE_SYNC") or "NORMAL").upper()
    return mode if mode in ("NORMAL", "FULL") else None
