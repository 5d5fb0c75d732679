"""Events agents add to a run's stream (kept apart from the agent so the host needs no agent
import at run time)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workflow_engine import WorkflowEvent


@dataclass(slots=True)
class AgentRunUpdateEvent(WorkflowEvent):
    """What an agent is doing, as it happens: streamed text, a tool call, a tool result.

    ``kind``: ``text`` (``text`` is a delta), ``function_call`` (``arguments_delta`` is a delta),
    ``function_result`` (``result``/``error``), ``message_end``.
    """

    executor_id: str
    kind: str
    message_id: str = ""
    text: str = ""
    call_id: str | None = None
    name: str | None = None
    arguments_delta: str = ""
    result: Any = None
    error: str | None = None
