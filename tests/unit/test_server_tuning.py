"""``workflow-engine serve`` tunes the garbage collector for many runs in flight (a process-wide
setting, so only the command line's own server does it, never the engine)."""

from __future__ import annotations

import subprocess
import sys


def gc_after(code: str) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import gc\n{code}\nprint(gc.get_threshold()[0], gc.get_freeze_count() > 0)",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_the_server_raises_the_youngest_generation_and_freezes_start_up() -> None:
    code = "from workflow_engine_cli._app import tune_gc_for_a_server\ntune_gc_for_a_server()"
    assert gc_after(code) == "10000 True"


def test_the_engine_leaves_the_collector_alone() -> None:
    code = (
        "import workflow_engine, workflow_engine.storage\n"
        "from workflow_engine import Runtime\n"
        "from workflow_engine.storage import SqliteStore\n"
        "Runtime(SqliteStore(':memory:'))"
    )
    assert gc_after(code) == gc_after("")
