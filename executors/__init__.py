"""Agents, tools, chat clients, the agent host executor and orchestrations.

Everything here builds on the ``workflow_engine`` kernel; the kernel knows nothing of it. Each
name is imported from its submodule on first use (PEP 562): a workflow using only the scripted
client never imports the OpenAI one.
"""

import typing as _typing
from importlib import import_module as _import_module

if _typing.TYPE_CHECKING:  # what type checkers and IDEs see; at run time see ``__getattr__``
    from ._agent import Agent, AgentRunResponse, AgentRunUpdateEvent, pending_batch
    from ._clients import (
        ChatClient,
        ChatResponse,
        ChatResponseUpdate,
        Rule,
        ScriptedChatClient,
        ToolCall,
        message_from_updates,
    )
    from ._content import (
        ChatMessage,
        Content,
        FunctionCallContent,
        FunctionResultContent,
        Role,
        TextContent,
        ToolApprovalRequestContent,
        ToolApprovalResponseContent,
    )
    from ._handoff import (
        HandoffBuilder,
        HandoffOutcome,
        HandoffTurn,
        HandoffTurnResult,
        HandoffUserInputRequest,
        HandoffUserResponse,
        ends_with_case_complete,
    )
    from ._host import AgentHostExecutor, AgentResponse, TurnToken, UserTurnRequest
    from ._openai import OpenAIChatClient
    from ._tools import IdempotencyKey, Tool, ToolArgumentsError, ToolSpec, tool

_EXPORTS: dict[str, tuple[str, ...]] = {
    "_agent": ("Agent", "AgentRunResponse", "AgentRunUpdateEvent", "pending_batch"),
    "_clients": (
        "ChatClient",
        "ChatResponse",
        "ChatResponseUpdate",
        "Rule",
        "ScriptedChatClient",
        "ToolCall",
        "message_from_updates",
    ),
    "_content": (
        "ChatMessage",
        "Content",
        "FunctionCallContent",
        "FunctionResultContent",
        "Role",
        "TextContent",
        "ToolApprovalRequestContent",
        "ToolApprovalResponseContent",
    ),
    "_handoff": (
        "HandoffBuilder",
        "HandoffOutcome",
        "HandoffTurn",
        "HandoffTurnResult",
        "HandoffUserInputRequest",
        "HandoffUserResponse",
        "ends_with_case_complete",
    ),
    "_host": ("AgentHostExecutor", "AgentResponse", "TurnToken", "UserTurnRequest"),
    "_openai": ("OpenAIChatClient",),
    "_tools": ("IdempotencyKey", "Tool", "ToolArgumentsError", "ToolSpec", "tool"),
}
"""Each submodule and the public names it provides, imported on first use (PEP 562)."""

_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = [
    "Agent",
    "AgentHostExecutor",
    "AgentResponse",
    "AgentRunResponse",
    "AgentRunUpdateEvent",
    "ChatClient",
    "ChatMessage",
    "ChatResponse",
    "ChatResponseUpdate",
    "Content",
    "FunctionCallContent",
    "FunctionResultContent",
    "HandoffBuilder",
    "HandoffOutcome",
    "HandoffTurn",
    "HandoffTurnResult",
    "HandoffUserInputRequest",
    "HandoffUserResponse",
    "IdempotencyKey",
    "OpenAIChatClient",
    "Role",
    "Rule",
    "ScriptedChatClient",
    "TextContent",
    "Tool",
    "ToolApprovalRequestContent",
    "ToolApprovalResponseContent",
    "ToolArgumentsError",
    "ToolCall",
    "ToolSpec",
    "TurnToken",
    "UserTurnRequest",
    "ends_with_case_complete",
    "message_from_updates",
    "pending_batch",
    "tool",
]


if not _typing.TYPE_CHECKING:  # hidden from type checkers, so a misspelt name stays an error

    def __getattr__(name: str) -> object:
        """A public name, imported from its submodule on first use (PEP 562) and then cached."""
        try:
            module = _MODULE_OF[name]
        except KeyError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        value = getattr(_import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
