"""A run whose worker was SIGKILLed mid-step reads as ``interrupted`` at once, not as running.

The lease it held runs on for its length, but a process on this host that has exited holds
nothing: ``resume`` takes such a lease over at once, and the CLI shows the run as interrupted
(``--json``: status ``in_progress``, worker null) from the moment the process is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.cli_harness import Cli

WORKER = textwrap.dedent(
    """
    import sys
    import anyio
    from workflow_engine import Executor, Runtime, WorkflowBuilder, WorkflowContext, handler
    from workflow_engine.storage import SqliteStore

    class Slow(Executor):
        @handler
        async def go(self, text: str, ctx: WorkflowContext[None, str]) -> None:
            print("working", flush=True)
            await anyio.sleep(120)
            await ctx.yield_output(text)

    async def main() -> None:
        runtime = Runtime(SqliteStore(sys.argv[1]), lease_seconds=600)
        runtime.register(WorkflowBuilder("slow", start=Slow("slow")).build())
        await runtime.run("slow", "hello", run_id=sys.argv[2])

    anyio.run(main)
    """
)
RUN_ID = "d" * 32


@contextmanager
def worker_in_its_step(cli: Cli) -> Iterator[subprocess.Popen[str]]:
    """A worker process inside run ``RUN_ID``'s long step; SIGKILLed when the block ends."""
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(cli.db), RUN_ID],
        stdout=subprocess.PIPE,
        text=True,
        env=cli.env,
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "working"
        yield worker
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        if worker.stdout is not None:
            worker.stdout.close()


@pytest.mark.slow  # a worker process killed with SIGKILL
def test_a_killed_worker_leaves_its_run_interrupted(tmp_path: Path) -> None:
    cli = Cli(tmp_path)
    with worker_in_its_step(cli) as worker:
        [running] = cli.json("runs", "list")
        assert running["status"] == "in_progress" and running["worker"] is not None
        assert str(worker.pid) in running["worker"]
        assert "interrupted" not in cli.expect(0, "runs", "list").out
        # filtering by what the list shows: a run its live worker executes is not interrupted
        assert cli.json("runs", "list", "--status", "interrupted") == []
    [run] = cli.json("runs", "list")
    assert run["status"] == "in_progress" and run["worker"] is None  # its lease runs 10 min more
    assert "interrupted" in cli.expect(0, "runs", "list").out
    [found] = cli.json("runs", "list", "--status", "interrupted")
    assert found["run_id"] == RUN_ID
    assert RUN_ID[:8] in cli.expect(0, "runs", "list", "--status", "interrupted").out
    shown = cli.json("runs", "show", RUN_ID)
    assert shown["status"] == "in_progress" and shown["worker"] is None
    assert "· interrupted ·" in cli.expect(0, "runs", "show", RUN_ID).out


@pytest.mark.slow  # a worker process killed with SIGKILL
def test_a_cancel_the_command_line_stored_shows_until_it_is_honoured(tmp_path: Path) -> None:
    """``workflow-engine cancel`` on an application's run (a workflow the command line does not
    have) stores the cancel for its worker; the run reads as cancelling until that worker, or
    the next one to resume it, honours it."""
    cli = Cli(tmp_path)
    with worker_in_its_step(cli):
        said = cli.expect(0, "cancel", RUN_ID).out.strip()
        assert said.startswith(f"Run {RUN_ID} in_progress, cancelling: the worker"), said
        [running] = cli.json("runs", "list")
        assert running["cancel_requested"] is True and running["worker"] is not None
        assert "in_progress, cancelling" in cli.expect(0, "runs", "list").out
    shown = cli.json("runs", "show", RUN_ID)
    assert shown["cancel_requested"] is True and shown["status"] == "in_progress"
    assert "· interrupted, cancelling ·" in cli.expect(0, "runs", "show", RUN_ID).out
