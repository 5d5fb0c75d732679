"""Terminal output and prompts: stream a run's events readably, ask for approvals and input.

Colours only on a TTY (rich decides); ``--json`` prints one JSON object per event instead.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.markup import escape

from executors import (
    AgentResponse,
    AgentRunUpdateEvent,
    HandoffOutcome,
    HandoffUserInputRequest,
    ToolApprovalRequestContent,
)
from workflow_engine import (
    ExecutorFailedEvent,
    ExternalRequest,
    JsonCodec,
    WorkflowEvent,
    WorkflowFailedEvent,
    WorkflowOutputEvent,
)


def describe_output(value: Any) -> str:
    if isinstance(value, HandoffOutcome):
        return f"conversation {value.status.replace('_', ' ')} (last agent: {value.last_agent})"
    if isinstance(value, AgentResponse):
        return value.text
    return str(value)


class EventPrinter:
    """Prints a run's events as they stream: agent text live, tool calls, handoffs, results."""

    def __init__(self, console: Console, *, json_mode: bool, codec: JsonCodec | None) -> None:
        self.console = console
        self.json_mode = json_mode
        self.codec = codec
        self._open_line: str | None = None  # the agent whose text line is open
        self._calls: dict[str, dict[str, Any]] = {}

    def _close_line(self) -> None:
        if self._open_line is not None:
            self.console.print()
            self._open_line = None

    def show(self, event: WorkflowEvent) -> None:
        if self.json_mode:
            print(json.dumps(event.to_dict(self.codec), default=str), flush=True)
            return
        if isinstance(event, AgentRunUpdateEvent):
            self._agent_update(event)
        elif isinstance(event, ExecutorFailedEvent | WorkflowFailedEvent):
            self._close_line()
            self.console.print(f"[bold red]✗ {escape(event.error.message)}[/]")
        elif isinstance(event, WorkflowOutputEvent):
            self._close_line()
            if not isinstance(event.data, HandoffOutcome | AgentResponse):
                self.console.print(f"[bold green]output:[/] {escape(describe_output(event.data))}")

    def _agent_update(self, event: AgentRunUpdateEvent) -> None:
        if event.kind == "text":
            if self._open_line != event.executor_id:
                self._close_line()
                self.console.print(f"[bold cyan]{event.executor_id}:[/] ", end="")
                self._open_line = event.executor_id
            self.console.print(escape(event.text), end="", soft_wrap=True)
        elif event.kind == "function_call" and event.call_id:
            call = self._calls.setdefault(event.call_id, {"name": event.name, "args": ""})
            call["name"] = event.name or call["name"]
            call["args"] += event.arguments_delta
        elif event.kind == "message_end":
            self._close_line()
            for call in self._calls.values():
                name = call["name"] or "?"
                if name.startswith("handoff_to_"):
                    target = name.removeprefix("handoff_to_")
                    self.console.print(f"  [magenta]↪ handoff to {target}[/]")
                else:
                    self.console.print(f"  [yellow]→ {escape(name)}({escape(call['args'])})[/]")
            self._calls.clear()
        elif event.kind == "function_result":
            if (event.name or "").startswith("handoff_to_"):
                return
            text = f"error: {event.error}" if event.error else json.dumps(event.result)
            self.console.print(f"  [dim]← {escape(event.name or '')}: {escape(text)}[/]")

    def finish(self) -> None:
        self._close_line()


@dataclass
class AnswerPolicy:
    """How pending requests get answered: by asking on the terminal, or from flags."""

    interactive: bool
    approvals: str = "ask"  # ask | approve | reject
    replies: list[str] = field(default_factory=list)
    end_when_out_of_replies: bool = False
    console: Console = field(default_factory=Console)
    read: Callable[[str], str] = field(default=lambda prompt: interruptible_input(prompt))

    def answer(self, request: ExternalRequest) -> Any | None:
        """The answer to send, or None to leave the run paused."""
        data = request.data
        if isinstance(data, ToolApprovalRequestContent):
            return self._approval(data)
        if isinstance(data, HandoffUserInputRequest):
            return self._user_input(data)
        if self.interactive:
            self.console.print(f"[bold]Request {request.request_id}[/] ({request.port_id}):")
            self.console.print(escape(json.dumps(data, default=str)))
            return json.loads(self.read("Answer (JSON): "))
        return None

    def _approval(self, request: ToolApprovalRequestContent) -> Any | None:
        call = request.function_call
        arguments = json.dumps(call.arguments)
        if self.approvals in ("approve", "reject"):
            verdict = "approved" if self.approvals == "approve" else "rejected"
            self.console.print(
                f"[bold]Approval:[/] {escape(call.name)}({escape(arguments)}) {verdict}"
            )
            return {"approved": self.approvals == "approve"}
        if not self.interactive:
            return None
        self.console.print(
            f"[bold yellow]Approval needed:[/] {escape(call.name)}({escape(arguments)})"
        )
        while True:
            choice = self.read("Approve? [y]es / [n]o / [e]dit arguments: ").strip().lower()
            if choice in ("y", "yes"):
                return {"approved": True}
            if choice in ("n", "no"):
                return {"approved": False}
            if choice in ("e", "edit"):
                raw = self.read("New arguments as JSON (only the fields to change): ")
                try:
                    edits = json.loads(raw)
                except json.JSONDecodeError as exc:
                    self.console.print(f"[red]not JSON: {exc}[/]")
                    continue
                return {"approved": True, "arguments": edits}

    def _user_input(self, request: HandoffUserInputRequest) -> Any | None:
        if self.replies:
            reply = self.replies.pop(0)
            self.console.print(f"[bold]You:[/] {escape(reply)}")
            return {"message": reply}
        if not self.interactive:
            return {"end": True} if self.end_when_out_of_replies else None
        reply = self.read("You (empty or /end to finish): ").strip()
        if not reply or reply == "/end":
            return {"end": True}
        return {"message": reply}


def interruptible_input(prompt: str) -> str:
    """``input()`` that a single Ctrl-C interrupts.

    Under ``anyio.run`` asyncio's runner owns SIGINT and only cancels the main task, which a
    blocking ``input()`` never notices; restore Python's default handler while we wait.
    """
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return input(prompt)
    finally:
        signal.signal(signal.SIGINT, previous)


def stdin_is_tty() -> bool:
    return sys.stdin.isatty()
