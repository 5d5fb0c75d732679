"""A long chat with one agent (``ask_user=True``), for the conversation-growth tests.

The model reports how many messages it was handed and what the first and previous user messages
said, so a resumed run shows whether the agent saw the whole history, in order. Run as a script
(``python chat_workflow.py DB RUN_ID REQUEST_ID TURN``) it answers one turn in a fresh process and
prints the reply.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Sequence

import anyio

from workflow_engine import Runtime, Workflow, WorkflowBuilder, WorkflowRunState
from workflow_engine.executors import (
    Agent,
    AgentHostExecutor,
    ChatMessage,
    ChatResponse,
    ChatResponseUpdate,
    ToolSpec,
)
from workflow_engine.storage import SqliteStore

NAME = "long-chat"


def user_message(turn: int) -> str:
    return f"user {turn}"


class HistoryClient:
    """Replies with a digest of every message it was handed (so it reads all of them)."""

    def reply(self, messages: Sequence[ChatMessage]) -> str:
        users = [m.text for m in messages if m.role == "user"]
        expected = [user_message(i) for i in range(len(users))]
        in_order = users == expected
        replies = [m.text for m in messages if m.role == "assistant"]
        return f"seen {len(messages)} in order {in_order} replies {len(replies)}"

    async def get_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> ChatResponse:
        return ChatResponse(messages=[ChatMessage.assistant(self.reply(messages))])

    async def get_streaming_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[ChatResponseUpdate]:
        yield ChatResponseUpdate(kind="text", message_id="m", text=self.reply(messages))


def build_chat() -> Workflow:
    host = AgentHostExecutor(Agent("assistant", client=HistoryClient()), ask_user=True)
    return WorkflowBuilder(NAME, start=host).build()


async def one_turn(db: str, run_id: str, request_id: str, turn: int) -> None:
    runtime = Runtime(SqliteStore(db))
    runtime.register(build_chat)
    await runtime.respond(request_id, user_message(turn))
    result = await runtime.resume(run_id)
    assert result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, result.error
    request = result.pending_requests[0]
    print(request.request_id, request.data.text, sep="\t")
    await runtime.close()


if __name__ == "__main__":
    db, run_id, request_id, turn = sys.argv[1:]
    anyio.run(one_turn, db, run_id, request_id, int(turn))
