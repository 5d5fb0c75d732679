"""AgentHostExecutor: an Agent as a node of a workflow.

It keeps the conversation in its durable state. A ``str`` or an ``AgentResponse`` from another
agent starts a turn at once; ``ChatMessage``s accumulate until a ``TurnToken`` arrives (or on
every message with ``run_on_message=True``, and when they are the run's input: nothing upstream
would send the token -- an AG-UI client's messages to a workflow that starts with an agent).
After a turn it sends an ``AgentResponse`` along its edges -- or yields it as the workflow's
output when it has none.

Tool approvals: every ``ToolApprovalRequestContent`` the turn left unanswered goes out through
the executor's own request port (``ctx.request_info``): a ``RequestInfoEvent`` whose data is the
content, answered by an ``ExternalResponse`` carrying a ``ToolApprovalResponseContent``
(``{"approved": true}`` is enough). When the batch is fully answered the agent continues by
itself. With ``intercept_user_input_requests=True`` no request is made: the response carrying
the approval requests goes downstream, and whoever asks the user sends back a ``ChatMessage``
with the answers followed by a ``TurnToken``.

Chat loop: with ``ask_user=True`` the host asks the user for the next message after every reply,
through its own request port: a ``UserTurnRequest`` carrying only the reply's text, answered
with the user's next message (a ``str``; an empty one ends the conversation, and the host then
sends on -- or yields -- the whole conversation once). A turn then writes only its new messages:
the conversation is an append-only list state (``ctx.append_state``) of messages stored as JSON
text (:func:`stored_message`), read lazily (``ctx.get_state_items``), so a run resumed after
thousands of messages decodes only those the agent and its model client read.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, ValidationError

from workflow_engine import (
    EffectResolution,
    Executor,
    InDoubtEffect,
    StateItems,
    WorkflowContext,
    handler,
    response_handler,
)
from workflow_engine._codec import UNREADABLE_INT
from workflow_engine._errors import SerializationError, UsageError
from workflow_engine._input import is_blank

from ._events import AgentRunUpdateEvent

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._agent import Agent, AgentRunResponse
from ._content import (
    MAX_NESTING,
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    TextContent,
    ToolApprovalRequestContent,
    ToolApprovalResponseContent,
    edited_arguments,
    nests_within,
    plain_result,
    same_argument,
)

_PLAIN = (int, float, str, bool)
"""What a tool reads an argument as that is kept as such in an edit (JSON's own scalars)."""

INVOCATION_KWARGS_KEY = "function_invocation_kwargs"
"""Shared-state key whose dict reaches tools declaring ``**kwargs`` (never the model)."""


class TurnToken(BaseModel):
    """Tells an agent host to run a turn over the messages it has accumulated."""

    emit_updates: bool = True


class AgentResponse(BaseModel):
    """What a turn produced, with the whole conversation so the next node can continue it."""

    agent_name: str
    messages: list[ChatMessage] = Field(default_factory=list)
    conversation: list[ChatMessage] = Field(default_factory=list)
    pending_approvals: list[ToolApprovalRequestContent] = Field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(m.text for m in self.messages if m.role == "assistant" and m.text)


class UserTurnRequest(BaseModel):
    """The agent replied (``text``); the run waits for the user's next message
    (``ask_user=True``). Small on purpose: a run keeps every answered request."""

    agent_name: str
    text: str = ""


_CONFIRMED = "done (a person confirmed it happened)"


def stored_message(message: ChatMessage) -> ChatMessage | str:
    """How a conversation stores a message: its JSON text when that reads back the same, type
    for type (a checkpoint parses a string far faster than the tagged objects, and a lazy view
    decodes it only when read), else the message itself (the codec stores any value exactly).
    Unset fields (``None``) are left out: a fifth of a user message's bytes, parsed at every
    resume."""
    return _stored_and_read(message)[0]


def _stored_and_read(message: ChatMessage) -> tuple[ChatMessage | str, ChatMessage | None]:
    """:func:`stored_message`, and the message as :func:`read_message` reads it back from the
    text (None when stored as itself)."""
    if type(message) is ChatMessage and _plain(message):
        try:
            text = message.model_dump_json(exclude_none=True)
        except ValueError:  # (a lone surrogate: the codec refuses it by name)
            return message, None
        try:
            back = ChatMessage.model_validate_json(text)
        except ValueError as exc:
            # an integer of more than 4,300 digits: JSON readers refuse it, so no checkpoint
            # holding it could be read back -- refused before anything is stored
            said = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            raise SerializationError(
                f"a chat message (role {message.role!r}) cannot be stored: its JSON does not "
                f"read back ({said}): it holds {UNREADABLE_INT}?"
            ) from None
        if back == message:
            return text, back
    # (``==`` alone let a str enum in a tool's arguments through as text: it read back a str)
    return message, None


_MESSAGE_MODELS = (
    ChatMessage,
    TextContent,
    FunctionCallContent,
    FunctionResultContent,
    ToolApprovalRequestContent,
    ToolApprovalResponseContent,
)
_MESSAGE_PARTS = frozenset(_MESSAGE_MODELS)


def _plain(value: Any) -> bool:
    """Whether ``value`` is what its JSON text reads back as, type for type: JSON's own
    values (finite floats, dicts with text keys) and the message models made of them."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is list:
        return all(map(_plain, value))
    if kind is dict:
        return all(type(key) is str for key in value) and all(map(_plain, value.values()))
    if kind in _MESSAGE_PARTS:
        return not value.__pydantic_extra__ and all(map(_plain, value.__dict__.values()))
    return False


def read_message(stored: ChatMessage | str) -> ChatMessage:
    """The message :func:`stored_message` stored."""
    return ChatMessage.model_validate_json(stored) if isinstance(stored, str) else stored


_VIEWS_KEPT = 64
"""Runs whose decoded conversation a host keeps between supersteps (the newest ones)..."""
_VIEW_MESSAGES_KEPT = 4_000
"""... while their conversations hold this many messages in all (the newest one whatever its
length). A decoded message is some seven objects that every full garbage collection walks:
an AG-UI thread starts a run per message, and 64 views of a 1,000-message thread (none of them
read again) held 900,000 objects, each full collection of the server 0.4 s."""


_APPENDED_KEPT = 16
"""Runs whose just-appended messages a host keeps for the turn after (consumed at once)."""


class AgentHostExecutor(Executor):
    """Hosts an :class:`Agent` in a workflow (id defaults to the agent's name)."""

    serializable_types = (
        *_MESSAGE_MODELS,
        AgentResponse,
        TurnToken,
        UserTurnRequest,
    )

    def __init__(
        self,
        agent: Agent,
        *,
        id: str | None = None,
        intercept_user_input_requests: bool = False,
        run_on_message: bool = False,
        stream_updates: bool = True,
        ask_user: bool = False,
    ) -> None:
        super().__init__(id or agent.name)
        self.agent = agent
        self.wrapped = agent
        self.intercept_user_input_requests = intercept_user_input_requests
        self.run_on_message = run_on_message
        self.stream_updates = stream_updates
        self.ask_user = ask_user
        self._views: OrderedDict[str, StateItems] = OrderedDict()
        """run id -> the conversation as last read: its decoded messages are reused."""
        self._appended: dict[str, tuple[list[Any], list[ChatMessage | None]]] = {}
        """run id -> the messages a handler appended (as stored, and as read back) that the
        turn after it has not read yet."""

    # --- inputs ---------------------------------------------------------------------------------

    @handler
    async def on_text(self, text: str, ctx: WorkflowContext[AgentResponse, AgentResponse]) -> None:
        await self._append(ctx, [ChatMessage.user(text)])
        await self._turn(ctx)

    @handler
    async def on_message(
        self, message: ChatMessage, ctx: WorkflowContext[AgentResponse, AgentResponse]
    ) -> None:
        await self._append(ctx, [message])
        if self.run_on_message or ctx.from_input:
            await self._turn(ctx)

    @handler
    async def on_messages(
        self, messages: list[ChatMessage], ctx: WorkflowContext[AgentResponse, AgentResponse]
    ) -> None:
        await self._append(ctx, messages)
        if self.run_on_message or ctx.from_input:
            await self._turn(ctx)

    @handler
    async def on_turn_token(
        self, token: TurnToken, ctx: WorkflowContext[AgentResponse, AgentResponse]
    ) -> None:
        await self._turn(ctx, emit_updates=token.emit_updates)

    @handler
    async def on_agent_response(
        self, response: AgentResponse, ctx: WorkflowContext[AgentResponse, AgentResponse]
    ) -> None:
        """Another agent handed over: continue its conversation. When what this host holds is
        the start of it (an agent it answered before, in a loop), only the rest is written."""
        incoming = response.conversation
        held = await self._conversation(ctx)
        n = len(held)
        if 0 < n <= len(incoming) and all(held[i] == incoming[i] for i in range(n)):
            if n < len(incoming):
                await self._append(ctx, incoming[n:])
        else:
            await ctx.set_state("conversation", [stored_message(m) for m in incoming])
        await self._turn(ctx)

    @response_handler
    async def on_approval(
        self,
        request: ToolApprovalRequestContent,
        response: ToolApprovalResponseContent,
        ctx: WorkflowContext[AgentResponse, AgentResponse],
    ) -> None:
        await self._record_approval(request, response, ctx)

    @response_handler
    async def on_user_turn(
        self,
        request: UserTurnRequest,
        reply: str,
        ctx: WorkflowContext[AgentResponse, AgentResponse],
    ) -> None:
        """The user's next message (``ask_user=True``); an empty one ends the conversation."""
        if is_blank(reply):
            conversation = await self._conversation(ctx)
            await self.deliver(
                ctx, AgentResponse(agent_name=self.agent.name, conversation=list(conversation))
            )
            return
        await self._append(ctx, [ChatMessage.user(reply)])
        await self._turn(ctx)

    async def _record_approval(
        self,
        request: ToolApprovalRequestContent,
        response: ToolApprovalResponseContent,
        ctx: WorkflowContext[Any, Any],
    ) -> None:
        """Collect one answer; when the batch is complete, continue the turn."""
        answer = response.model_copy(
            update={"id": request.id, "function_call": request.function_call}
        )
        answers: list[ToolApprovalResponseContent] = await ctx.get_state("answers", [])
        answers.append(answer)
        awaiting: list[str] = await ctx.get_state("awaiting", [])
        if {a.id for a in answers} < set(awaiting):
            await ctx.set_state("answers", answers)
            return
        await ctx.set_state("answers", [])
        await ctx.set_state("awaiting", [])
        # in the order the calls were held, whatever order the answers arrived in
        answers.sort(key=lambda a: awaiting.index(a.id) if a.id in awaiting else len(awaiting))
        await self._append(ctx, [ChatMessage(role="user", contents=list(answers))])
        await self._turn(ctx)

    def resolve_in_doubt(self, question: InDoubtEffect, resolution: EffectResolution) -> Any:
        """A person said an in-doubt tool call happened: its result, as the turn expects it."""
        described = question.description if isinstance(question.description, dict) else {}
        result = resolution.result
        return FunctionResultContent(
            call_id=str(described.get("call_id", "")),
            name=str(described.get("tool", "")),
            # as a tool's own result is kept: a set or a Decimal from Python was stored as
            # given, then failed every resume (outside tester 109)
            result=plain_result(result) if result is not None else _CONFIRMED,
        )

    def validate_response(self, request: Any, response: Any) -> Any:
        """Refuse an approval before it is stored: wrong call, or edited arguments that fail
        the tool's schema (``ValueError``; the runtime reports it as a ResponseTypeError).
        Of an approval's edits only those that change the call are kept: "edits" that leave it
        as proposed (a client echoing the arguments it showed) are a bare approval (tester
        77), and the whole call with one field changed is that field's edit (tester 103). A
        rejection keeps no arguments: it runs nothing (tester 102). A user's next message
        that is blank but not empty (spaces, a zero-width space) is refused: only the empty
        string ends the chat, so one stray space does not end it for good (outside testers
        148, 149)."""
        if isinstance(request, UserTurnRequest):
            if isinstance(response, str) and response and is_blank(response):
                raise ValueError(
                    f"the reply to {request.agent_name} is blank (white space or invisible "
                    "characters alone): write a message, or answer with the empty string to "
                    "end the chat"
                )
            return None
        if not isinstance(request, ToolApprovalRequestContent):
            return None
        if response.id is not None and response.id != request.id:
            raise UsageError(
                f"this approval names call {response.id!r}, but the request is for "
                f"{request.id!r} ({request.function_call.name})"
            )
        named = response.function_call
        if named is not None and named.call_id != request.function_call.call_id:
            raise UsageError(
                f"this approval names call {named.call_id!r} ({named.name}), but the request "
                f"is for {request.function_call.call_id!r} ({request.function_call.name})"
            )
        if response.id is not None or named is not None:
            # which call it answers is the request's to say (the host fills it in): kept, an
            # answer made by ``create_response`` and a bare ``{"approved": true}`` were two
            # answers -- a conflict, or two branches' keys (outside tester 181)
            bare = response.model_copy(update={"id": None, "function_call": None})
            return self.validate_response(request, bare) or bare
        if not response.approved and response.arguments is not None:
            return response.model_copy(update={"arguments": None})
        if response.approved and response.arguments is not None:
            if not nests_within(response.arguments):
                # (a model's call that deep is refused to it: one a person edits in would be
                # run, then fail to be stored at every resume -- outside tester 187)
                raise ValueError(
                    f"the edited arguments of call {request.function_call.call_id!r} "
                    f"({request.function_call.name}) nest deeper than {MAX_NESTING} levels"
                )
            call = request.function_call
            proposed = dict(call.arguments)
            runs_with = edited_arguments(call, response)
            t = self.agent.tools.get(call.name)
            if t is not None:
                # compared as the tool reads them: "300" proposed and 300 sent, or a default
                # sent for a field the proposal left out, change nothing (outside tester 104)
                runs_with = t.validate(runs_with)
                with contextlib.suppress(ValueError):  # (a proposal its own tool refuses)
                    proposed = t.validate(proposed)
            changed = {
                # a number, text or boolean kept as the tool reads it: "250" from a form and
                # 250 from a script are one edit (outside tester 105)
                name: runs_with[name] if type(runs_with.get(name)) in _PLAIN else value
                for name, value in response.arguments.items()
                if name not in proposed or not same_argument(runs_with.get(name), proposed[name])
            }
            given = response.arguments
            # (by identity: a Decimal 5.0 read as the float 5.0 is == to it, yet replaced)
            if len(changed) < len(given) or any(changed[k] is not given[k] for k in changed):
                return response.model_copy(update={"arguments": changed or None})
            if not changed:  # (no edits at all: ``{}``)
                return response.model_copy(update={"arguments": None})
        return None

    # --- the turn -------------------------------------------------------------------------------

    async def _append(self, ctx: WorkflowContext[Any, Any], messages: list[ChatMessage]) -> None:
        stored, read = [], []
        for message in messages:
            text, back = _stored_and_read(message)
            stored.append(text)
            read.append(back)
        await ctx.append_state("conversation", stored)
        # the turn takes what storing them as text read back, not parsing the text again (an
        # AG-UI run's are the thread's whole history) -- if it reads the very items appended
        appended = self._appended
        appended[ctx.run_id] = (stored, read)
        while len(appended) > _APPENDED_KEPT:  # (appended by a handler whose turn never came)
            del appended[next(iter(appended))]

    async def _conversation(self, ctx: WorkflowContext[Any, Any]) -> StateItems:
        """The stored conversation, lazily decoded, reusing what this host decoded before."""
        views = self._views
        view = await ctx.get_state_items(
            "conversation", reuse=views.pop(ctx.run_id, None), convert=read_message
        )
        appended = self._appended.pop(ctx.run_id, None)
        if appended is not None:
            view.preload(*appended)
        views[ctx.run_id] = view
        held = sum(map(len, views.values()))
        while len(views) > _VIEWS_KEPT or (held > _VIEW_MESSAGES_KEPT and len(views) > 1):
            held -= len(views.popitem(last=False)[1])
        return view

    stop_after: frozenset[str] = frozenset()
    """Tool names that end a turn once they ran (handoff participants set this)."""

    async def _turn(self, ctx: WorkflowContext[Any, Any], emit_updates: bool = True) -> None:
        if await ctx.get_state("awaiting", []):
            return  # still waiting for approvals; they restart the turn when all are in
        conversation = await self._conversation(ctx)

        async def journal(
            kind: str, fn: Any, *, idempotent: bool = False, description: Any = None
        ) -> Any:
            name = ctx.next_step_name(kind)
            key = ctx.idempotency_key(name)
            return await ctx.run_once(
                name, lambda: fn(key), idempotent=idempotent, description=description
            )

        async def on_update(event: AgentRunUpdateEvent) -> None:
            event.executor_id = self.id
            await ctx.add_event(event)

        stream = self.stream_updates and emit_updates
        try:
            response = await self.agent.run(
                conversation,
                journal=journal,
                on_update=on_update if stream else None,
                run_id=ctx.run_id,
                stop_after=self.stop_after,
                invocation_kwargs=await ctx.get_shared(INVOCATION_KWARGS_KEY, None),
            )
        except BaseException:
            # the superstep fails: its retry reads the stored conversation, not messages a
            # client may have changed in place before it failed (outside tester 129)
            self._views.pop(ctx.run_id, None)
            raise
        await self._append(ctx, response.messages)
        if response.pending_approvals and not self.intercept_user_input_requests:
            for request in response.pending_approvals:
                await ctx.request_info(request, ToolApprovalResponseContent)
            await ctx.set_state("awaiting", [r.id for r in response.pending_approvals])
            return
        if self.ask_user and not response.pending_approvals:
            ask = UserTurnRequest(agent_name=self.agent.name, text=response.text)
            await ctx.request_info(ask, str)
            return
        await self.turn_done(ctx, conversation, response)

    async def turn_done(
        self,
        ctx: WorkflowContext[Any, Any],
        held: Sequence[ChatMessage],
        response: AgentRunResponse,
    ) -> None:
        """A finished turn: ``response``, with the conversation (``held``, then the turn's
        messages), goes on (``deliver``)."""
        result = AgentResponse(
            agent_name=self.agent.name,
            messages=response.messages,
            conversation=[*held, *response.messages],
            pending_approvals=response.pending_approvals,
        )
        await self.deliver(ctx, result)

    async def deliver(self, ctx: WorkflowContext[Any, Any], result: AgentResponse) -> None:
        """Where a finished turn goes: along the edges, or out as the workflow's output."""
        if ctx.successor_ids:
            await ctx.send_message(result)
        else:
            await ctx.yield_output(result)
