"""A long-lived process that serves many long conversations holds a bounded amount of them.

An AG-UI thread starts a run per message, each with the thread's whole history: the store's
kept checkpoints and an agent host's decoded conversations grew with every such run (64 runs of
a 1,000-message thread: 900,000 objects, each full garbage collection of the server 0.4 s).
Measured from outside: the objects a process holds after serving runs, then as many again.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from workflow_engine import Runtime, WorkflowRunState
from workflow_engine.executors import Agent, ChatMessage, Rule, ScriptedChatClient
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

HISTORY = 1_200
"""Messages each run is given (a thread 600 exchanges long)."""


def history(n: int) -> list[ChatMessage]:
    return [
        ChatMessage.user(f"message {i} of run {n}: my order number is {10_000 + i}")
        if i % 2 == 0
        else ChatMessage.assistant(f"noted, {10_000 + i}")
        for i in range(HISTORY)
    ]


def held() -> tuple[int, int]:
    """(objects the collector tracks, chat messages alive) after a full collection."""
    gc.collect()
    objects = gc.get_objects()
    return len(objects), sum(1 for o in objects if type(o) is ChatMessage)


async def test_serving_many_long_conversations_holds_a_bounded_amount_of_them(
    tmp_path: Path,
) -> None:
    agent = Agent("clerk", client=ScriptedChatClient([Rule(reply="Noted.")]))
    store = SqliteStore(tmp_path / "runs.db")
    rt = Runtime(store)
    rt.register(agent.as_workflow())

    async def serve(runs: int, first: int) -> None:
        for n in range(first, first + runs):
            done = await rt.run("clerk", history(n))
            assert done.status is WorkflowRunState.IDLE, done.error

    await serve(20, 0)
    objects_after_20, messages_after_20 = held()
    await serve(20, 20)
    objects_after_40, messages_after_40 = held()
    # kept: a few runs' worth (what resuming the newest saves reading), not every run served
    assert max(messages_after_20, messages_after_40) <= 12_000, messages_after_40
    grown = objects_after_40 - objects_after_20
    assert grown <= 20_000, (objects_after_20, objects_after_40)
    await rt.close()
