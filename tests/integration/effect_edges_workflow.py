"""A workflow whose one effect books a ledger line and then ends the process (``sys.exit``),
driven from a subprocess: ``start DB LEDGER`` prints the run id and executes it;
``show DB LEDGER RUN`` and ``resume DB LEDGER RUN`` print JSON about it. With ``full-start``,
the effect leaves the process no room to write any file instead (a full disk, as the kernel
says it: ``RLIMIT_FSIZE``), and the error the run ends with is printed as JSON."""

from __future__ import annotations

import json
import resource
import signal
import sys
from pathlib import Path
from typing import Never

import anyio

from workflow_engine import (
    Executor,
    Runtime,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowError,
    handler,
)
from workflow_engine.storage import SqliteStore


class ExitsInsideTheEffect(Executor):
    def __init__(self, executor_id: str, ledger: Path, fills_the_disk: bool) -> None:
        super().__init__(executor_id)
        self.ledger = ledger
        self.fills_the_disk = fills_the_disk

    @handler
    async def pay(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def charge() -> str:
            with self.ledger.open("a") as f:
                f.write("charge\n")
            if self.fills_the_disk:  # from now on, no file of this process can grow
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
                resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
                return "charged"
            sys.exit(3)  # the process ends inside the effect, after it happened

        await ctx.yield_output(await ctx.run_once("charge", charge, description="the charge"))


async def main(mode: str, db: str, ledger: str, run_id: str = "") -> None:
    runtime = Runtime(SqliteStore(db))
    full = mode == "full-start"
    pay = ExitsInsideTheEffect("pay", Path(ledger), full)
    runtime.register(lambda: WorkflowBuilder("pay", start=pay).build())
    if mode.endswith("start"):
        run_id = await runtime.start("pay", 1)
        print(run_id, flush=True)
        try:
            await runtime.resume(run_id)
        except WorkflowError as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
            return
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
