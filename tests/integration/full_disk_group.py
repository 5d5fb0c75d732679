"""Run inside a private mount namespace by ``test_group_commit``: a SQLite file on a tmpfs with
little room left, twenty small runs committing at the moment one run commits a value the disk
cannot hold. Prints the status each run ended with, as JSON.

    python full_disk_group.py DIR FREE_BYTES BIG_BYTES
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from typing import Any, Never

import anyio

from workflow_engine import Executor, Runtime, WorkflowBuilder, WorkflowContext, handler
from workflow_engine.storage import SqliteStore


class Says(Executor):
    """Outputs ``size`` characters."""

    @handler
    async def say(self, size: int, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output("x" * size)


async def main(where: str, free: int, big: int) -> None:
    runtime = Runtime(SqliteStore(os.path.join(where, "runs.db")))
    runtime.register(lambda: WorkflowBuilder("says", start=Says("says")).build())
    await runtime.list_runs()  # (the file and its schema, before the disk is filled)
    with open(os.path.join(where, "filler"), "wb") as filler:
        filler.write(b"\0" * max(0, shutil.disk_usage(where).free - free))
    ended: dict[str, Any] = {}

    async def run(run_id: str, size: int) -> None:
        try:
            result = await runtime.run("says", size, run_id=run_id)
            ended[run_id] = result.status.value
        except Exception as exc:  # (a store's error, raised to the caller)
            ended[run_id] = type(exc).__name__

    async with anyio.create_task_group() as group:
        for n in range(20):
            group.start_soon(run, f"small-{n}", 100)
            if n == 10:
                group.start_soon(run, "big", big)
    print(json.dumps(ended))
    await runtime.close()


anyio.run(main, sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
