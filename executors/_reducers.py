"""Chat reducers: what of a long conversation an agent sends its model.

A thread of a thousand turns is stored whole (each turn writes only its new messages), but a
model's context window is not: past it, every later turn of the thread is refused. A reducer
picks what the model is sent at each call; the stored conversation -- what a resume, a client's
history and the approvals read -- is never changed by it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from workflow_engine._errors import DefinitionError

from ._content import ChatMessage


@runtime_checkable
class ChatReducer(Protocol):
    """Chooses the messages an agent sends its model (after its instructions)."""

    def reduce(self, messages: Sequence[ChatMessage]) -> Sequence[ChatMessage]: ...


def _bookkeeping(message: ChatMessage) -> bool:
    """An approval request or answer: kept in the conversation, never sent to a model."""
    return bool(message.approval_requests or message.approval_responses)


def _answers_calls(message: ChatMessage) -> bool:
    """A message that only makes sense after the calls it answers (tool results, approvals):
    a model's API refuses a tool result whose call it was not sent."""
    return message.role == "tool" or bool(message.function_results) or _bookkeeping(message)


class MessageCountingChatReducer:
    """Sends the model the newest ``target_count`` messages (approval bookkeeping, which is
    never sent, not counted), and a system message that opens the conversation.

    The window never starts inside a tool call's exchange: where the newest messages begin with
    tool results, the window reaches back to the assistant message that made those calls, so
    it may hold a few more than ``target_count``. The newest message is always sent.
    """

    def __init__(self, target_count: int) -> None:
        if type(target_count) is not int or target_count < 1:
            raise DefinitionError(
                f"MessageCountingChatReducer: target_count must be a whole number of messages, "
                f"at least 1, not {target_count!r}"
            )
        self.target_count = target_count

    def __repr__(self) -> str:
        return f"MessageCountingChatReducer({self.target_count})"

    def reduce(self, messages: Sequence[ChatMessage]) -> Sequence[ChatMessage]:
        total = len(messages)
        start, counted = total, 0
        while start > 0 and counted < self.target_count:  # (reads only the newest messages)
            start -= 1
            if not _bookkeeping(messages[start]):
                counted += 1
        while start > 0 and _answers_calls(messages[start]):
            start -= 1
        if start == 0:
            return messages
        kept = list(messages[start:])
        first = messages[0]
        return [first, *kept] if first.role == "system" else kept


__all__ = ["ChatReducer", "MessageCountingChatReducer"]
