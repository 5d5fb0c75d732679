"""Agents, tools, chat clients, the agent host executor and orchestrations.

Everything here builds on the ``workflow_engine`` kernel; the kernel knows nothing of it. Each
name is imported from its submodule on first use (PEP 562): a workflow using only the scripted
client never imports the OpenAI one.
"""

import typing as _typing

if _typing.TYPE_CHECKING:  # what type checkers and IDEs see; at run time see ``__getattr__``
    from ._agent import (
        Agent,
        AgentRunResponse,
        AgentRunUpdateEvent,
        pending_batch,
        tool_call_in_doubt,
    )
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
    from ._reducers import ChatReducer, MessageCountingChatReducer
    from ._tools import (
        IdempotencyKey,
        Tool,
        ToolArgumentsError,
        ToolSpec,
        calls_in_threads,
        tool,
    )

_EXPORTS: dict[str, tuple[str, ...]] = {
    "_agent": (
        "Agent",
        "AgentRunResponse",
        "AgentRunUpdateEvent",
        "pending_batch",
        "tool_call_in_doubt",
    ),
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
    "_reducers": ("ChatReducer", "MessageCountingChatReducer"),
    "_tools": (
        "IdempotencyKey",
        "Tool",
        "ToolArgumentsError",
        "ToolSpec",
        "calls_in_threads",
        "tool",
    ),
}
"""Each submodule and the public names it provides, imported on first use (PEP 562)."""


__all__ = [
    "Agent",
    "AgentHostExecutor",
    "AgentResponse",
    "AgentRunResponse",
    "AgentRunUpdateEvent",
    "ChatClient",
    "ChatMessage",
    "ChatReducer",
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
    "MessageCountingChatReducer",
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
    "calls_in_threads",
    "ends_with_case_complete",
    "message_from_updates",
    "pending_batch",
    "tool",
    "tool_call_in_doubt",
]


if not _typing.TYPE_CHECKING:  # hidden from type checkers, so a misspelt name stays an error
    from workflow_engine._lazy import lazy_exports as _lazy_exports

    __getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
