"""Where the SQLite store keeps its runs when it is not told: apart from the store itself, so
that a command that only needs the path loads nothing else."""

from __future__ import annotations

import os
from pathlib import Path


def default_db_path() -> Path:
    """``$WORKFLOW_ENGINE_DB``, else ``$XDG_DATA_HOME/workflow-engine/runs.db``."""
    env = os.environ.get("WORKFLOW_ENGINE_DB")
    if env:
        return Path(env)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "workflow-engine" / "runs.db"
