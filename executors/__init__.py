"""Agents, tools, chat clients, the agent host executor and orchestrations.

Everything here builds on the ``workflow_engine`` kernel; the kernel knows nothing of it.
"""

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
