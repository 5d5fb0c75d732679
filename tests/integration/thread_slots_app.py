"""The process the thread-slot test kills: bookings made by a sync tool, more at once than threads.

    python thread_slots_app.py DB LEDGER start N   # N runs at once under ONE worker thread;
                                                   # the first booking holds its thread forever
    python thread_slots_app.py DB LEDGER resume    # resume every run; print each one's outcome

``book`` is a blocking (sync) tool the engine does not know to be idempotent: a call cut off
by a crash after it started makes its run ask a person whether it happened. It appends one
JSON line per booking to LEDGER (one ``write`` on an ``O_APPEND`` descriptor) before it
returns; with ``HOLD_BOOKINGS`` set it then never returns, so the other runs' calls wait for
the one worker thread while the test kills the process.
"""

from __future__ import annotations

import json
import os
import sys
import time

import anyio

from workflow_engine import Runtime, WorkflowBuilder, WorkflowRunState
from workflow_engine.executors import Agent, Rule, ScriptedChatClient, ToolCall, tool
from workflow_engine.storage import SqliteStore

LEDGER = sys.argv[2]


@tool
def book(item: str, idempotency_key: str) -> str:
    """Book an item."""
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps({"item": item, "key": idempotency_key}) + "\n").encode())
    finally:
        os.close(fd)
    while os.environ.get("HOLD_BOOKINGS"):
        time.sleep(0.05)
    return f"booked {item}"


def build_booking():  # type: ignore[no-untyped-def]
    client = ScriptedChatClient(
        [
            Rule(user=r"book (?P<item>\w+)", calls=[ToolCall("book", {"item": "{item}"})]),
            Rule(after_tool="book", reply="Done."),
        ]
    )
    return WorkflowBuilder("booking", start=Agent("booker", "You book.", client, [book])).build()


async def main() -> None:
    db, mode = sys.argv[1], sys.argv[3]
    runtime = Runtime(SqliteStore(db))
    runtime.register(build_booking)
    if mode == "start":
        anyio.to_thread.current_default_thread_limiter().total_tokens = 1
        async with anyio.create_task_group() as tg:
            for i in range(int(sys.argv[4])):
                tg.start_soon(runtime.run, "booking", f"book item{i}")
        return
    outcomes = {}
    for run in await runtime.list_runs():
        result = await runtime.resume(run.run_id)
        asked = [type(r.data).__name__ for r in result.pending_requests]
        done = result.status is WorkflowRunState.IDLE
        outcomes[run.run_id] = "done" if done else f"{result.status.value}: {asked}"
    await runtime.close()
    print(json.dumps(outcomes))


if __name__ == "__main__":
    anyio.run(main)
