"""A run paused on one question, dismissed (``cancel(unless_answered=...)``) by a process that
SIGKILLs itself at a named fault point of the store, for ``test_dismiss_crash.py``.

Run as a script, it starts run ``r1`` of ``DB``, waits for it to pause, prints its request id,
then dismisses the pause, dying on the first call of the store's fault hook with ``POINT``:

    python -m tests.integration.dismissing_workflow DB POINT
"""

from __future__ import annotations

import os
import signal
import sys

import anyio

from workflow_engine import (
    Executor,
    RequestPort,
    Runtime,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)
from workflow_engine.storage import SqliteStore

RUN_ID = "r1"


class Ask(Executor):
    @handler
    async def on_topic(self, topic: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(f"Publish the note about {topic}?")


class Publish(Executor):
    @handler
    async def on_answer(self, approved: bool, ctx: WorkflowContext[None, str]) -> None:
        await ctx.yield_output("published" if approved else "dropped")


def build() -> Workflow:
    ask, publish = Ask("ask"), Publish("publish")
    review = RequestPort("review", request_type=str, response_type=bool)
    return (
        WorkflowBuilder("dismissing", start=ask).add_edge(ask, review).add_edge(review, publish)
    ).build()


def die_at(point: str) -> object:
    def hook(reached: str) -> None:
        if reached == point:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


async def main(db: str, point: str) -> None:
    store = SqliteStore(db)
    runtime = Runtime(store)
    runtime.register(build)
    paused = await runtime.run("dismissing", "releases", run_id=RUN_ID)
    request_id = paused.pending_requests[0].request_id
    print(request_id, flush=True)
    store.fault_hook = die_at(point)  # type: ignore[assignment]
    await runtime.cancel(RUN_ID, unless_answered=[request_id])
    await runtime.close()


if __name__ == "__main__":
    # (by its module's name, as the test that reads the run registers it: a class of
    # ``__main__`` would give the graph another signature)
    from tests.integration import dismissing_workflow

    anyio.run(dismissing_workflow.main, sys.argv[1], sys.argv[2])
