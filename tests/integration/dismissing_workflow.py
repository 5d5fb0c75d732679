"""A run paused on one question, dismissed (``cancel(unless_answered=...)``) by a process that
SIGKILLs itself at a named fault point of the store, for ``test_dismiss_crash.py``.

Run as a script, it starts run ``r1`` of ``DB`` (the stepper of ``workflows.py``), waits for it
to pause, prints its request id, then dismisses the pause, dying on the first call of the
store's fault hook with ``POINT``:

    python -m tests.integration.dismissing_workflow DB POINT
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

import anyio

from tests.integration.workflows import stepper_workflow
from workflow_engine import Runtime
from workflow_engine.storage import SqliteStore

RUN_ID = "r1"


def die_at(point: str) -> Callable[[str], None]:
    def hook(reached: str) -> None:
        if reached == point:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


async def main(db: str, point: str) -> None:
    store = SqliteStore(db)
    runtime = Runtime(store)
    runtime.register(stepper_workflow)
    paused = await runtime.run("stepper", 1, run_id=RUN_ID)
    request_id = paused.pending_requests[0].request_id
    print(request_id, flush=True)
    store.fault_hook = die_at(point)
    await runtime.cancel(RUN_ID, unless_answered=[request_id])
    await runtime.close()


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], sys.argv[2])
