"""A workflow whose one effect books a ledger line and then ends the process (``sys.exit``),
driven from a subprocess: ``start DB LEDGER`` prints the run id and executes it;
``show DB LEDGER RUN`` and ``resume DB LEDGER RUN`` print JSON about it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Never

import anyio

from workflow_engine import Executor, Runtime, WorkflowBuilder, WorkflowContext, handler
from workflow_engine.storage import SqliteStore


class ExitsInsideTheEffect(Executor):
    def __init__(self, executor_id: str, ledger: Path) -> None:
        super().__init__(executor_id)
        self.ledger = ledger

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def charge() -> str:
            with self.ledger.open("a") as f:
                f.write("charge\n")
            sys.exit(3)  # the process ends inside the effect, after it happened

        await ctx.yield_output(await ctx.run_once("charge", charge, description="the charge"))


async def main(mode: str, db: str, ledger: str, run_id: str = "") -> None:
    runtime = Runtime(SqliteStore(db))
    runtime.register(
        lambda: WorkflowBuilder("pay", start=ExitsInsideTheEffect("pay", Path(ledger))).build()
    )
    if mode == "start":
        run_id = await runtime.start("pay", 1)
        print(run_id, flush=True)
        await runtime.resume(run_id)
    elif mode == "show":
        info = await runtime.get_run(run_id)
        print(json.dumps([e.model_dump(mode="json") for e in info.effects_in_doubt]))
    else:
        result = await runtime.resume(run_id)
        asked = [type(r.data).__name__ for r in result.pending_requests]
        print(json.dumps({"status": result.status.value, "asked": asked}))
    await runtime.close()


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:])
