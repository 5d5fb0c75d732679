"""A workflow whose one step charges a card, for ``test_in_doubt_kept``: its name comes from
``STEP_NAME`` (version 1 of an application says ``charge``; version 2, deployed after a crash,
``charge_card``). Every charge appends a line to the ledger file ``LEDGER``. Run as a script,
it starts run ``r`` in ``DB`` and SIGKILLs itself inside the charge (after it reached the
ledger): the step is left in doubt.

    python renamed_step_workflow.py DB
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Never

import anyio

from workflow_engine import Executor, Runtime, Workflow, WorkflowBuilder, WorkflowContext, handler
from workflow_engine.storage import SqliteStore


class Charge(Executor):
    @handler
    async def charge(self, order: str, ctx: WorkflowContext[Never, str]) -> None:
        name = os.environ.get("STEP_NAME", "charge")
        key = ctx.idempotency_key(name)

        async def effect() -> str:
            with open(os.environ["LEDGER"], "a") as ledger:
                ledger.write(json.dumps({"step": name, "key": key}) + "\n")
            if os.environ.get("KILL_IN_EFFECT"):
                os.kill(os.getpid(), signal.SIGKILL)
            return f"receipt for {order}"

        receipt = await ctx.run_once(name, effect, description=f"charge 10 EUR for {order}")
        await ctx.yield_output(receipt)


def build() -> Workflow:
    return WorkflowBuilder("charges", start=Charge("card")).build()


async def main(db: str) -> None:
    runtime = Runtime(SqliteStore(db))
    runtime.register(build)
    await runtime.run("charges", "order 7", run_id="r")


if __name__ == "__main__":  # (as the module the test imports: the graph's signature names it)
    from tests.integration.renamed_step_workflow import main as run_main

    anyio.run(run_main, sys.argv[1])
