"""Agent: a model, instructions and tools, with the function-invocation loop.

One turn: ask the model; run the tool calls it makes; feed the results back; repeat until it
answers without calls (or the round-trip cap is hit). Calls whose tool requires approval stop the
turn: the whole batch waits, one ``ToolApprovalRequestContent`` per guarded call. When every
request of the batch has a ``ToolApprovalResponseContent`` in the conversation, the next turn runs
the batch by each call's decision -- approved calls run (with edited arguments if given), rejected
ones get a result saying so, free siblings run regardless -- and the model continues.

Every model call and every tool call goes through a *journal* (``ctx.run_once`` inside a
workflow), so a turn re-executed after a crash replays results instead of redoing side effects.
Steps are named by kind and call order within the handler invocation (``model#0``, ``tool#0``,
...), never by the model's call ids (a server may repeat or omit them), and a tool receives the
engine's idempotency key for its step.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, overload

import anyio
from pydantic_core import PydanticSerializationError, to_jsonable_python

from workflow_engine import InDoubtEffect, StateItems
from workflow_engine._errors import DefinitionError, UsageError
from workflow_engine._events import exception_text, valid_text

from ._clients import ChatClient, ChatResponseUpdate, message_from_updates
from ._content import (
    ChatMessage,
    Content,
    FunctionCallContent,
    FunctionResultContent,
    TextContent,
    ToolApprovalRequestContent,
    ToolApprovalResponseContent,
    approval_id,
    edited_arguments,
    plain_result,
)
from ._events import AgentRunUpdateEvent
from ._reducers import ChatReducer
from ._tools import Tool, ToolArgumentsError, thread_slot

if TYPE_CHECKING:
    from workflow_engine import Workflow


class Journal(Protocol):
    """``journal(kind, fn, idempotent=..., description=...)``: run the next step of ``kind``
    once; ``fn`` receives the step's idempotency key. In a workflow this is ``ctx.run_once``
    under ``ctx.next_step_name(kind)``."""

    def __call__(
        self,
        kind: str,
        fn: Callable[[str], Awaitable[Any]],
        *,
        idempotent: bool = False,
        description: Any = None,
    ) -> Awaitable[Any]: ...


UpdateSink = Callable[["AgentRunUpdateEvent"], Awaitable[None]]

REJECTED = "The user rejected this tool call; it was not executed."


async def _no_journal(
    kind: str,
    fn: Callable[[str], Awaitable[Any]],
    *,
    idempotent: bool = False,
    description: Any = None,
) -> Any:
    """Outside a workflow nothing is journaled; each call gets a fresh idempotency key."""
    return await fn(uuid.uuid4().hex)


@dataclass
class AgentRunResponse:
    """The messages one turn added, and the approvals it is waiting for (if any)."""

    messages: list[ChatMessage] = field(default_factory=list)
    pending_approvals: list[ToolApprovalRequestContent] = field(default_factory=list)
    round_trip_limit_hit: bool = False

    @property
    def text(self) -> str:
        return "\n".join(m.text for m in self.messages if m.role == "assistant" and m.text)


class Agent:
    """An LLM agent. Put it into a workflow directly; the builder hosts it in an
    ``AgentHostExecutor`` whose id is the agent's name."""

    def __init__(
        self,
        name: str,
        instructions: str = "",
        client: ChatClient | None = None,
        tools: Sequence[Tool] = (),
        *,
        description: str = "",
        max_round_trips: int = 8,
        raise_tool_errors: bool = False,
        chat_reducer: ChatReducer | None = None,
    ) -> None:
        if client is None:
            raise UsageError(f"agent {name!r} needs a chat client")
        if chat_reducer is not None and (
            isinstance(chat_reducer, type) or not callable(getattr(chat_reducer, "reduce", None))
        ):  # (the class itself failed the first turn: outside tester 173)
            raise DefinitionError(
                f"agent {name!r}: chat_reducer {chat_reducer!r} has no reduce(messages) method "
                "(e.g. MessageCountingChatReducer(40))"
            )
        self.chat_reducer = chat_reducer
        self.name = name
        self.instructions = instructions
        self.client = client
        self.description = description
        self.max_round_trips = max_round_trips
        self.raise_tool_errors = raise_tool_errors
        self.tools: dict[str, Tool] = {}
        for t in tools:
            self.add_tool(t)

    def add_tool(self, t: Tool) -> None:
        if not isinstance(t, Tool):
            raise DefinitionError(
                f"agent {self.name!r}: {t!r} is not a Tool (decorate it with @tool)"
            )
        known = self.tools.get(t.name)
        if known is not None and known is not t:  # (the second silently replaced the first)
            raise DefinitionError(
                f"agent {self.name!r} has two tools named {t.name!r}: a model calls a tool by "
                "its name, so give one another (@tool(name=...))"
            )
        limit = getattr(self.client, "max_tools", None)
        if type(limit) is int and t.name not in self.tools and len(self.tools) >= limit:
            raise DefinitionError(
                f"agent {self.name!r}: more than {limit} tools, the most its client "
                f"({type(self.client).__name__}) may offer a model in one request; split them "
                "among agents (a handoff's routes count as tools too)"
            )
        self.tools[t.name] = t

    def as_executor(self, **options: Any) -> Any:
        from ._host import AgentHostExecutor

        return AgentHostExecutor(self, **options)

    def as_workflow(self, name: str | None = None) -> Workflow:
        """A workflow of this agent alone, taking a turn on each message it is given (named as
        the agent, unless ``name``): what an AG-UI endpoint serves for an agent, and what a
        process continuing such a run builds to get the same graph."""
        from workflow_engine import WorkflowBuilder

        host = self.as_executor(run_on_message=True)
        return WorkflowBuilder(name=name or self.name, start=host).build()

    # --- one turn -------------------------------------------------------------------------------

    async def run(
        self,
        messages: Sequence[ChatMessage] | str,
        *,
        journal: Journal = _no_journal,
        on_update: UpdateSink | None = None,
        run_id: str = "local",
        stop_after: frozenset[str] = frozenset(),
        invocation_kwargs: dict[str, Any] | None = None,
    ) -> AgentRunResponse:
        """Run one turn over ``messages`` (or a user's text); returns what the turn added.

        ``stop_after``: tool names that end the turn once they ran (e.g. handoffs), instead of
        asking the model again. ``invocation_kwargs`` go to tools declaring ``**kwargs``.
        """
        if isinstance(messages, str):  # (it failed on the text's missing attributes)
            messages = [ChatMessage.user(messages)]
        extra = dict(invocation_kwargs or {})
        response = AgentRunResponse()
        # the stored conversation is not copied (nor decoded, if it is a lazy view): the turn's
        # messages are read after it
        base = messages if isinstance(messages, (StateItems, Joined)) else list(messages)
        conversation = Joined(base, response.messages)

        def add(message: ChatMessage) -> None:
            response.messages.append(message)

        batch = pending_batch(conversation)
        if batch is not None:
            calls, requests, answers = batch
            waiting = [r for r in requests if r.id not in answers]
            if waiting:
                response.pending_approvals = waiting
                return response
            add(await self._run_batch(calls, answers, journal, on_update, extra, stop_after))
            if any(c.name in stop_after for c in calls):
                return response

        for _ in range(self.max_round_trips):
            reply = await self._ask_model(conversation, journal, on_update)
            add(reply)
            calls = reply.function_calls
            if not calls:
                return response
            guarded = [c for c in calls if self._needs_approval(c)]
            if guarded:
                held = [
                    ToolApprovalRequestContent(id=approval_id(c.call_id), function_call=c)
                    for c in guarded
                ]
                add(ChatMessage(role="assistant", contents=_contents(held), author_name=self.name))
                response.pending_approvals = held
                return response
            add(await self._run_batch(calls, {}, journal, on_update, extra, stop_after))
            if any(c.name in stop_after for c in calls):
                return response
        response.round_trip_limit_hit = True
        add(
            ChatMessage.assistant(
                f"(stopped: {self.max_round_trips} model round trips in one turn)", self.name
            )
        )
        return response

    def _model_messages(self, conversation: Sequence[ChatMessage]) -> Sequence[ChatMessage]:
        """What the model is sent: the instructions, then the conversation (as the agent's
        ``chat_reducer`` picks it)."""
        if self.chat_reducer is not None:
            conversation = self.chat_reducer.reduce(conversation)
        if not self.instructions:
            return conversation
        system = [ChatMessage(role="system", contents=[TextContent(text=self.instructions)])]
        return Joined(system, conversation)

    async def _ask_model(
        self, conversation: Sequence[ChatMessage], journal: Journal, on_update: UpdateSink | None
    ) -> ChatMessage:
        specs = [t.spec for t in self.tools.values()]
        prompt = self._model_messages(Joined.copy_of(conversation))
        asked = False

        async def call(_key: str) -> ChatMessage:
            nonlocal asked
            asked = True
            updates: list[ChatResponseUpdate] = []
            async for update in self.client.get_streaming_response(prompt, tools=specs):
                updates.append(update)
                if on_update is not None:
                    await on_update(
                        AgentRunUpdateEvent(
                            executor_id=self.name,
                            kind=update.kind,
                            message_id=update.message_id,
                            text=update.text,
                            call_id=update.call_id,
                            name=update.name,
                            arguments_delta=update.arguments_delta,
                        )
                    )
            message = message_from_updates(updates)
            if on_update is not None and updates:
                await on_update(
                    AgentRunUpdateEvent(self.name, "message_end", message_id=updates[0].message_id)
                )
            return message.model_copy(update={"author_name": self.name})

        # asking a model again is harmless: a call cut off by a crash is simply asked again
        message = await journal("model", call, idempotent=True)
        if not asked and on_update is not None:
            await self._replay(message, on_update)
        return message

    async def _replay(self, message: ChatMessage, on_update: UpdateSink) -> None:
        """Stream a reply the journal kept (a superstep retried after a failure, or after a
        crash) as the model streamed it first: whoever watches this run sees what the agent
        said, not only the tool calls that follow from it."""
        # (the model server's id, as streamed first -- none is none: a random one made the
        # replayed reply another message to a client, outside tester 199)
        message_id = message.message_id or ""
        for content in message.contents:
            if isinstance(content, TextContent):
                update = AgentRunUpdateEvent(
                    self.name, "text", message_id=message_id, text=content.text
                )
            elif isinstance(content, FunctionCallContent):
                update = AgentRunUpdateEvent(
                    self.name,
                    "function_call",
                    message_id=message_id,
                    call_id=content.call_id,
                    name=content.name,
                    arguments_delta=json.dumps(content.arguments),
                )
            else:
                continue
            await on_update(update)
        if message.contents:
            await on_update(AgentRunUpdateEvent(self.name, "message_end", message_id=message_id))

    def _needs_approval(self, call: FunctionCallContent) -> bool:
        t = self.tools.get(call.name)
        if t is None:
            return False  # becomes an error result
        try:
            arguments = t.validate(call.arguments)
        except ToolArgumentsError:
            return False  # the model sees the validation error and may retry
        return t.needs_approval(arguments)

    async def _run_batch(
        self,
        calls: Sequence[FunctionCallContent],
        answers: dict[str, ToolApprovalResponseContent],
        journal: Journal,
        on_update: UpdateSink | None,
        extra: dict[str, Any],
        stop_after: frozenset[str] = frozenset(),
    ) -> ChatMessage:
        results = []
        ended_by: str | None = None  # the call of this batch that ends the turn (a handoff)
        for call in calls:
            answer = answers.get(approval_id(call.call_id))
            if ended_by is not None and call.name in stop_after:
                # one per turn: a second handoff was told it happened, and was not followed
                # (outside tester 109)
                result = FunctionResultContent(
                    call_id=call.call_id,
                    name=call.name,
                    error=f"not run: this turn already ends with {ended_by} (one per turn)",
                )
            elif answer is not None and not answer.approved:
                result = FunctionResultContent(
                    call_id=call.call_id,
                    name=call.name,
                    error=REJECTED + (f" Reason: {answer.reason}" if answer.reason else ""),
                )
            else:
                arguments = edited_arguments(call, answer)
                t = self.tools.get(call.name)
                # (a blocking call waits for its thread before it counts as started: a crash
                # meanwhile leaves it not run, never in doubt)
                async with thread_slot(t) as threads:

                    async def invoke(
                        key: str,
                        c: FunctionCallContent = call,
                        a: dict[str, Any] = arguments,
                        threads: anyio.CapacityLimiter | None = threads,
                    ) -> FunctionResultContent:
                        return await self._invoke(c, a, key, extra, threads)

                    result = await journal(
                        "tool",
                        invoke,
                        idempotent=t is None or t.idempotent,
                        description={
                            "tool": call.name,
                            "arguments": _as_run(t, arguments),
                            "call_id": call.call_id,
                            "agent": self.name,
                        },
                    )
            if call.name in stop_after and result.error is None and ended_by is None:
                ended_by = call.name
            results.append(result)
            if on_update is not None:
                await on_update(
                    AgentRunUpdateEvent(
                        self.name,
                        "function_result",
                        call_id=call.call_id,
                        name=call.name,
                        result=result.result,
                        error=result.error,
                    )
                )
        return ChatMessage(role="tool", contents=_contents(results), author_name=self.name)

    async def _invoke(
        self,
        call: FunctionCallContent,
        arguments: dict[str, Any],
        idempotency_key: str,
        extra: dict[str, Any],
        threads: anyio.CapacityLimiter | None = None,
    ) -> FunctionResultContent:
        t = self.tools.get(call.name)
        if t is None:
            return FunctionResultContent(
                call_id=call.call_id,
                name=call.name,
                error=f"there is no tool named {call.name!r} (tools: {', '.join(self.tools)})",
            )
        try:
            value = await t.invoke(
                arguments,
                idempotency_key=idempotency_key,
                invocation_kwargs=extra,
                thread_limiter=threads,
            )
        except ToolArgumentsError as exc:
            return FunctionResultContent(
                call_id=call.call_id, name=call.name, error=valid_text(str(exc))
            )
        except Exception as exc:
            if self.raise_tool_errors:
                raise
            # (a message quoting a file name decoded with surrogateescape failed the turn after
            # the tool ran, the call left in doubt: outside tester 173)
            said = valid_text(f"{type(exc).__name__}: {exception_text(exc)}")
            return FunctionResultContent(call_id=call.call_id, name=call.name, error=said)
        # (the tool ran: from here nothing may fail, or a resume would run it again)
        result = plain_result(value)
        return FunctionResultContent(call_id=call.call_id, name=call.name, result=result)


def tool_call_in_doubt(effect: InDoubtEffect) -> tuple[str, Any] | None:
    """The tool call a step in doubt was making, as ``(tool name, arguments)``; None for a
    step that is no agent's tool call (a ``run_once`` of a handler's own)."""
    described = effect.description
    if isinstance(described, dict) and isinstance(described.get("tool"), str):
        return described["tool"], described.get("arguments", {})
    return None


def _as_run(t: Tool | None, arguments: dict[str, Any]) -> Any:
    """The arguments as the tool runs with them (validated: ``"42"`` for a float is ``42.0``),
    for a person asked whether the call happened; as the model gave them if they do not
    validate (the tool then runs no effect)."""
    if t is None:
        return arguments
    try:
        return to_jsonable_python(t.validate(arguments))
    except (ToolArgumentsError, PydanticSerializationError):
        return arguments


def pending_batch(
    conversation: Sequence[ChatMessage],
) -> (
    tuple[
        list[FunctionCallContent],
        list[ToolApprovalRequestContent],
        dict[str, ToolApprovalResponseContent],
    ]
    | None
):
    """The newest batch of calls held for approval and not yet run, with the answers so far.

    A held batch is always the newest message that is not the user's (the turn stops there;
    only answers follow), so the scan stops at the first other message: a long conversation is
    not read back to its start."""
    for index in range(len(conversation) - 1, -1, -1):
        message = conversation[index]
        if message.approval_requests:
            requests = message.approval_requests
            calls_message = next(
                (
                    conversation[j]
                    for j in range(index - 1, -1, -1)
                    if conversation[j].function_calls
                ),
                None,
            )
            calls = calls_message.function_calls if calls_message else []
            answers = {
                r.id: r
                for j in range(index + 1, len(conversation))
                for r in conversation[j].approval_responses
                if r.id is not None
            }
            return calls, requests, answers
        if message.role != "user":
            return None  # the newest batch already ran, or the conversation moved on
    return None


class Joined(Sequence[ChatMessage]):
    """Sequences read as one without copying them: a long stored conversation (a lazy
    ``StateItems`` view) stays undecoded until a message is read. Later growth of a part
    shows through."""

    __slots__ = ("_parts",)
    _parts: tuple[Sequence[ChatMessage], ...]

    def __init__(self, *parts: Sequence[ChatMessage]) -> None:
        flat: list[Sequence[ChatMessage]] = []
        for part in parts:
            flat.extend(part._parts if isinstance(part, Joined) else [part])
        self._parts = tuple(flat)

    @classmethod
    def copy_of(cls, messages: Sequence[ChatMessage]) -> Joined:
        """``messages`` as they are now: lists copied, immutable views shared."""
        parts = messages._parts if isinstance(messages, Joined) else (messages,)
        return cls(*(p if isinstance(p, StateItems) else list(p) for p in parts))

    def __len__(self) -> int:
        return sum(len(p) for p in self._parts)

    @overload
    def __getitem__(self, index: int) -> ChatMessage: ...
    @overload
    def __getitem__(self, index: slice) -> list[ChatMessage]: ...
    def __getitem__(self, index: int | slice) -> ChatMessage | list[ChatMessage]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if index >= 0:
            for part in self._parts:
                if index < len(part):
                    return part[index]
                index -= len(part)
        raise IndexError("conversation index out of range")


def _contents(items: Sequence[Content]) -> list[Content]:
    """A message's contents from a homogeneous list (``list`` is invariant for type checkers)."""
    return list(items)
