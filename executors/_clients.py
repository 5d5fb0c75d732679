"""Chat clients: how an agent talks to a model.

A client answers a conversation (plus the tools it may call) with one assistant message, either
at once (``get_response``) or as a stream of deltas (``get_streaming_response``): text pieces and
function-call pieces as they arrive, which the AG-UI server forwards to browsers.

:class:`ScriptedChatClient` is a deterministic, offline model driven by rules -- the default for
demos and tests. ``OpenAIChatClient`` (``executors._openai``) speaks to any OpenAI-compatible
endpoint.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from ._content import ChatMessage, FunctionCallContent, TextContent
from ._tools import ToolSpec, call_arguments


class ChatResponseUpdate(BaseModel):
    """One streamed piece of an assistant message."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["text", "function_call"]
    message_id: str
    text: str = ""
    call_id: str | None = None
    name: str | None = None
    arguments_delta: str = ""


class ChatResponse(BaseModel):
    """A model's complete answer: normally one assistant message."""

    messages: list[ChatMessage]

    @property
    def message(self) -> ChatMessage:
        return self.messages[-1]


@runtime_checkable
class ChatClient(Protocol):
    async def get_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> ChatResponse: ...

    def get_streaming_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[ChatResponseUpdate]: ...


def message_from_updates(updates: Sequence[ChatResponseUpdate]) -> ChatMessage:
    """Assemble streamed pieces into the assistant message they describe."""
    text: list[str] = []
    calls: dict[str, dict[str, Any]] = {}
    message_id = updates[0].message_id if updates else None
    last_call: str | None = None
    for u in updates:
        if u.kind == "text":
            text.append(u.text)
        else:
            # a client that gives no call id: a fragment naming a tool starts a call with an id
            # of its own (the reply is journaled, so a replay sees the same id); one without a
            # name continues the previous call
            call_id = u.call_id or (
                last_call if last_call and not u.name else f"call_{uuid.uuid4().hex[:16]}"
            )
            last_call = call_id
            call = calls.setdefault(call_id, {"name": u.name or "", "args": []})
            if u.name:
                call["name"] = u.name
            call["args"].append(u.arguments_delta)
    contents: list[Any] = []
    if text:
        contents.append(TextContent(text="".join(text)))
    for call_id, call in calls.items():
        arguments = call_arguments("".join(call["args"]))
        contents.append(
            FunctionCallContent(call_id=call_id, name=call["name"], arguments=arguments)
        )
    return ChatMessage(role="assistant", contents=contents, message_id=message_id)


# --- the scripted model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """A call a rule makes. String values like ``"{amount}"`` are filled from the rule's regex
    groups; the tool's schema converts them (``"1000"`` for a ``float`` parameter is fine)."""

    name: str
    arguments: (
        Mapping[str, Any] | Callable[[Mapping[str, str], Sequence[ChatMessage]], dict[str, Any]]
    ) = field(default_factory=dict)
    """A dict of templates, or ``f(groups, messages) -> dict`` for anything cleverer."""


@dataclass(frozen=True)
class Rule:
    """When the conversation looks like this, answer like that.

    ``user``: a regex searched (case-insensitively) in the newest message when it is the user's.
    ``after_tool``: the newest message carries a result of this tool. ``when``: any predicate.
    ``reply`` may use ``{user}``, ``{result}`` and the regex's named groups (a callable ``reply``
    returns the text itself, used as it is); ``rejected`` replaces it when a result of the
    newest tool batch says the user rejected a call, ``failed`` when a tool errored.
    """

    reply: str | Callable[[Sequence[ChatMessage]], str] | None = None
    calls: Sequence[ToolCall] = ()
    user: str | None = None
    after_tool: str | None = None
    when: Callable[[Sequence[ChatMessage]], bool] | None = None
    rejected: str | None = None
    failed: str | None = None

    def match(self, messages: Sequence[ChatMessage]) -> re.Match[str] | bool | None:
        last = _last_relevant(messages)
        if last is None:
            return None
        if self.when is not None and not self.when(messages):
            return None
        if self.user is not None:
            if last.role != "user" or last.function_results or last.approval_responses:
                return None
            return re.search(self.user, last.text, re.IGNORECASE)
        if self.after_tool is not None:
            return any(r.name == self.after_tool for r in last.function_results) or None
        return True


def _last_relevant(messages: Sequence[ChatMessage]) -> ChatMessage | None:
    for m in reversed(messages):
        if m.role != "system" and not m.approval_requests:
            return m
    return None


def _fill(value: Any, groups: Mapping[str, str]) -> Any:
    if isinstance(value, str):
        return value.format_map(_Defaulting(groups)) if "{" in value else value
    if isinstance(value, dict):
        return {k: _fill(v, groups) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, groups) for v in value]
    return value


class _Defaulting(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


class ScriptedChatClient:
    """A deterministic model: the first rule that matches the conversation answers it.

    Call ids are ``call_<n>`` numbered across the conversation, so a replayed turn produces the
    same ids. ``chunk_size`` sets how many words each streamed text delta carries.
    """

    def __init__(
        self,
        rules: Sequence[Rule],
        *,
        default: str = "Sorry, I can't help with that.",
        chunk_size: int = 3,
        remember: Mapping[str, str] | None = None,
    ) -> None:
        self.rules = list(rules)
        self.remember = dict(remember or {})
        """name → regex: the newest user message matching it fills ``{name}`` for every rule."""
        self.default = default
        self.chunk_size = chunk_size
        self.calls = 0  # how many times the model was asked (for tests and demos)

    def _answer(self, messages: Sequence[ChatMessage]) -> ChatMessage:
        self.calls += 1
        last = _last_relevant(messages)
        user_text = next((m.text for m in reversed(messages) if m.role == "user" and m.text), "")
        result = last.function_results[-1] if last is not None and last.function_results else None
        message_id = f"msg_{len(messages)}"
        for rule in self.rules:
            found = rule.match(messages)
            if not found:
                continue
            groups: dict[str, str] = {"user": user_text, **self._memory(messages)}
            if isinstance(found, re.Match):
                groups.update({k: v for k, v in found.groupdict().items() if v is not None})
            if result is not None:
                groups["result"] = result.text
            contents: list[Any] = []
            template = rule.reply
            results = last.function_results if last is not None else []
            if any(r.error and "rejected" in r.error for r in results):
                template = rule.rejected if rule.rejected is not None else template
            elif any(r.error for r in results):
                template = rule.failed if rule.failed is not None else template
            # a callable builds the whole text: it is not a template (braces in what it
            # returns -- say, the user's own words -- are text)
            text = template(messages) if callable(template) else _fill(template, groups)
            if text:
                contents.append(TextContent(text=text))
            issued = sum(len(m.function_calls) for m in messages) if rule.calls else 0
            for index, call in enumerate(rule.calls):
                if callable(call.arguments):
                    arguments = call.arguments(groups, messages)
                else:
                    arguments = _fill(dict(call.arguments), groups)
                contents.append(
                    FunctionCallContent(
                        call_id=f"call_{issued + index + 1}", name=call.name, arguments=arguments
                    )
                )
            return ChatMessage(role="assistant", contents=contents, message_id=message_id)
        return ChatMessage(
            role="assistant", contents=[TextContent(text=self.default)], message_id=message_id
        )

    def _memory(self, messages: Sequence[ChatMessage]) -> dict[str, str]:
        found: dict[str, str] = {}
        for name, pattern in self.remember.items():
            for m in reversed(messages):
                hit = re.search(pattern, m.text, re.IGNORECASE) if m.role == "user" else None
                if hit:
                    found[name] = hit.group(1) if hit.groups() else hit.group(0)
                    break
        return found

    def knows(self, name: str, messages: Sequence[ChatMessage]) -> bool:
        """Whether a remembered value is in the conversation (for ``Rule(when=...)``)."""
        return name in self._memory(messages)

    async def get_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> ChatResponse:
        return ChatResponse(messages=[self._answer(messages)])

    async def get_streaming_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[ChatResponseUpdate]:
        message = self._answer(messages)
        message_id = message.message_id or "msg"
        for content in message.contents:
            if isinstance(content, TextContent):
                words = re.findall(r"\S+\s*", content.text) or [content.text]
                for i in range(0, len(words), self.chunk_size):
                    yield ChatResponseUpdate(
                        kind="text",
                        message_id=message_id,
                        text="".join(words[i : i + self.chunk_size]),
                    )
            elif isinstance(content, FunctionCallContent):
                raw = json.dumps(content.arguments)
                half = len(raw) // 2
                yield ChatResponseUpdate(
                    kind="function_call",
                    message_id=message_id,
                    call_id=content.call_id,
                    name=content.name,
                    arguments_delta=raw[:half],
                )
                yield ChatResponseUpdate(
                    kind="function_call",
                    message_id=message_id,
                    call_id=content.call_id,
                    arguments_delta=raw[half:],
                )
