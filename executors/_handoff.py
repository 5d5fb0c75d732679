"""Handoff orchestration: agents pass one shared conversation along declared routes.

``HandoffBuilder`` turns a set of agents into a normal ``Workflow``:

    user ──▶ coordinator ──HandoffTurn──▶ active agent ──handoff_to_<x>──▶ agent x ...
                 ▲   │                          │
                 │   └──▶ user_input port ◀─────┘ (answered without a handoff)
                 └───────────────────────────────

Each participant gets a ``handoff_to_<target>`` tool per declared route (never approval-
required); calling one ends its turn and the target continues the conversation. A model asking
for an undeclared target gets an error result (the tool does not exist for it). When the active
agent answers without a handoff and the termination condition does not hold, the workflow asks
the user through the ``user_input`` request port (``HandoffUserInputRequest``); the answer is the
user's next message, or ``{"end": true}``. Tool approvals work as in ``AgentHostExecutor``.

Storage: the conversation only grows, and each node (the coordinator, every participant) keeps
its own copy as an append-only list state, each a prefix of the whole. A turn or a handoff
carries only what its receiver has not seen (``messages`` from index ``start``); how far each
node has seen is a small map in shared state (``HANDOFF_SEEN_KEY``). So a turn writes its new
messages, however long the conversation already is -- not the whole conversation again in every
message and state, which made a long chat's storage grow with the square of its length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workflow_engine import (
    Executor,
    RequestPort,
    StateItems,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    response_handler,
)
from workflow_engine._errors import DefinitionError, UsageError
from workflow_engine._input import is_blank

from ._agent import Agent, AgentRunResponse
from ._content import ChatMessage, ToolApprovalRequestContent, ToolApprovalResponseContent
from ._host import AgentHostExecutor, AgentResponse, read_message, stored_message
from ._tools import Tool

TerminationCondition = Callable[[Sequence[ChatMessage]], bool]
COORDINATOR_ID = "handoff_coordinator"
USER_INPUT_PORT_ID = "user_input"
HANDOFF_SEEN_KEY = "workflow_engine.handoff.seen"
"""Shared-state key: node id -> how many messages of the conversation that node holds."""


def ends_with_case_complete(conversation: Sequence[ChatMessage]) -> bool:
    """The seed's rule: the newest assistant message ends with "case complete."."""
    said = said_since_the_user(conversation)
    return said is not None and said.strip().lower().endswith("case complete.")


def said_since_the_user(conversation: Sequence[ChatMessage]) -> str | None:
    """The newest assistant text since the user last spoke (None: none). A model's empty reply
    to a new message says nothing: the reply before it -- "... case complete." on a thread that
    went on -- ended the new run as completed, the user's message unanswered (outside tester
    159)."""
    for message in reversed(conversation):
        if message.role == "user":
            return None
        if message.role == "assistant" and message.text:
            return message.text
    return None


class HandoffTurn(BaseModel):
    """Your turn, ``agent``: continue the conversation. ``messages`` are the ones you have not
    seen, from index ``start`` of the conversation. (``conversation``: the whole conversation,
    as a run of an older version sent it.)"""

    agent: str
    messages: list[ChatMessage] = Field(default_factory=list)
    start: int = 0
    conversation: list[ChatMessage] = Field(default_factory=list)
    turn: int = 0
    handed_from: str | None = None


class HandoffTurnResult(BaseModel):
    """An agent finished its turn without handing off: the messages the coordinator has not
    seen, from index ``start`` (``conversation``: the whole one, from an older version)."""

    agent: str
    messages: list[ChatMessage] = Field(default_factory=list)
    start: int = 0
    conversation: list[ChatMessage] = Field(default_factory=list)
    turn: int


class HandoffUserInputRequest(BaseModel):
    """The workflow waits for the user's next message (or for them to end the conversation)."""

    agent: str
    message: str
    turn: int


class HandoffUserResponse(BaseModel):
    """The user's answer: a message, or `end: true` to finish the conversation -- exactly one.
    Anything else is refused, not read as an empty answer: ``{"approved": true}`` sent to this
    question used to end the customer's conversation."""

    model_config = ConfigDict(extra="forbid")

    message: str | None = None
    end: bool = False

    @model_validator(mode="after")
    def _one_answer(self) -> HandoffUserResponse:
        if self.end and self.message is not None:
            raise ValueError("give a message or end: true, not both")
        if not self.end and (self.message is None or is_blank(self.message)):
            raise ValueError("give a message (not empty) or end: true")
        return self


class HandoffOutcome(BaseModel):
    """The workflow's output when the conversation ends, and why it ended."""

    status: Literal["completed", "ended_by_user", "turn_limit_reached"]
    last_agent: str
    conversation: list[ChatMessage] = Field(default_factory=list)
    turns: int = 0

    @property
    def text(self) -> str:
        for message in reversed(self.conversation):
            if message.role == "assistant" and message.text:
                return message.text
        return ""


def handoff_tool(target: str, description: str) -> Tool:
    def handoff(reason: str = "") -> str:
        return f"Handed off to {target}."

    # pure (it only names the next agent): a crash during it re-runs it, never asks a person
    # whether the handoff "happened"
    return Tool(handoff, name=f"handoff_to_{target}", description=description, idempotent=True)


def _checked_turn_limit(limit: Any) -> int:
    """A turn limit, given to the builder or to ``with_turn_limit``: a whole number of at
    least 1 (the builder's took ``0``, and ``"5"`` failed with a raw ``TypeError``)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise UsageError(f"the turn limit must be a whole number of at least 1, not {limit!r}")
    return limit


class HandoffParticipant(AgentHostExecutor):
    """An agent host whose turns end in a handoff or a result for the coordinator."""

    def __init__(self, agent: Agent, routes: dict[str, str], turn_limit: int) -> None:
        for target in routes:
            if f"handoff_to_{target}" in agent.tools:  # (it was silently replaced, never run)
                raise DefinitionError(
                    f"agent {agent.name!r} has a tool of its own named 'handoff_to_{target}', "
                    f"the name of the tool its route to {target!r} gets: rename it"
                )
        tools = [*agent.tools.values()]
        tools += [handoff_tool(target, description) for target, description in routes.items()]
        participant = Agent(
            agent.name,
            agent.instructions,
            agent.client,
            tools,
            description=agent.description,
            max_round_trips=agent.max_round_trips,
            raise_tool_errors=agent.raise_tool_errors,
            chat_reducer=agent.chat_reducer,
        )
        super().__init__(participant)
        self.routes = dict(routes)
        self.turn_limit = turn_limit
        self.stop_after = frozenset(f"handoff_to_{t}" for t in routes)

    @handler
    async def on_handoff_turn(
        self, turn: HandoffTurn, ctx: WorkflowContext[HandoffTurn | HandoffTurnResult]
    ) -> None:
        await _catch_up(ctx, await self._conversation(ctx), turn)
        await ctx.set_state("turn", turn.turn)
        await self._turn(ctx)

    @response_handler
    async def on_handoff_approval(
        self,
        request: ToolApprovalRequestContent,
        response: ToolApprovalResponseContent,
        ctx: WorkflowContext[HandoffTurn | HandoffTurnResult],
    ) -> None:
        await self._record_approval(request, response, ctx)

    async def turn_done(
        self,
        ctx: WorkflowContext[Any, Any],
        held: Sequence[ChatMessage],
        response: AgentRunResponse,
    ) -> None:
        # (handing on needs the conversation's length and what the next node has not seen:
        # built whole, it decoded every stored message at a turn in a new process -- 18 ms at
        # 1,000 turns, outside tester 184)
        await self._hand_on(ctx, response.messages, _Continued(held, response.messages))

    async def deliver(self, ctx: WorkflowContext[Any, Any], result: AgentResponse) -> None:
        await self._hand_on(ctx, result.messages, result.conversation)

    async def _hand_on(
        self,
        ctx: WorkflowContext[Any, Any],
        said: Sequence[ChatMessage],
        conversation: _Continued | list[ChatMessage],
    ) -> None:
        """Hand the conversation (this agent's, so the whole: it just spoke) on: to the agent
        the turn (``said``) handed off to, else to the coordinator -- the part it has not seen."""
        turn = await ctx.get_state("turn", 0)
        target = _handoff_target(said, self.routes)
        seen = await ctx.get_shared(HANDOFF_SEEN_KEY, {})
        seen[self.id] = len(conversation)
        if target is not None and turn + 1 < self.turn_limit:
            start = _seen_by(seen, target, conversation)
            seen[target] = len(conversation)
            await ctx.set_shared(HANDOFF_SEEN_KEY, seen)
            await ctx.send_message(
                HandoffTurn(
                    agent=target,
                    messages=conversation[start:],
                    start=start,
                    turn=turn + 1,
                    handed_from=self.id,
                ),
                target_id=target,
            )
            return
        start = _seen_by(seen, COORDINATOR_ID, conversation)
        seen[COORDINATOR_ID] = len(conversation)
        await ctx.set_shared(HANDOFF_SEEN_KEY, seen)
        await ctx.send_message(
            HandoffTurnResult(
                agent=self.id, messages=conversation[start:], start=start, turn=turn + 1
            ),
            target_id=COORDINATOR_ID,
        )


class _Continued(Sequence[ChatMessage]):
    """A conversation held (a lazy view of the stored one) and a turn's messages after it, read
    only where sliced."""

    def __init__(self, held: Sequence[ChatMessage], said: Sequence[ChatMessage]) -> None:
        self._held, self._said = held, said

    def __len__(self) -> int:
        return len(self._held) + len(self._said)

    @overload
    def __getitem__(self, index: int) -> ChatMessage: ...
    @overload
    def __getitem__(self, index: slice) -> list[ChatMessage]: ...
    def __getitem__(self, index: int | slice) -> Any:
        at = range(len(self))[index]  # (negative indices and slices as a list takes them)
        return [self._at(i) for i in at] if isinstance(at, range) else self._at(at)

    def _at(self, i: int) -> ChatMessage:
        n = len(self._held)
        return self._held[i] if i < n else self._said[i - n]


def _seen_by(seen: dict[str, int], node: str, conversation: Sequence[ChatMessage]) -> int:
    """How many messages of ``conversation`` ``node`` holds (0: never part of it yet)."""
    count = seen.get(node, 0)
    return count if type(count) is int and 0 <= count <= len(conversation) else 0


async def _catch_up(
    ctx: WorkflowContext[Any, Any],
    held: Sequence[ChatMessage],
    news: HandoffTurn | HandoffTurnResult,
) -> None:
    """Bring this node's copy of the conversation (``held``) up to what ``news`` says it is:
    append the messages it has not seen. A message from an older version carries the whole
    conversation: it replaces the copy."""
    if news.conversation:
        await ctx.set_state("conversation", [stored_message(m) for m in news.conversation])
        return
    have, start = len(held), news.start
    if not start <= have <= start + len(news.messages):
        raise ValueError(
            f"handoff: {ctx.executor_id!r} holds {have} messages of the conversation, but the "
            f"{type(news).__name__} from {_sender(news)!r} continues it from message {start}"
        )
    fresh = news.messages[have - start :]
    if fresh:
        await ctx.append_state("conversation", [stored_message(m) for m in fresh])


def _sender(news: HandoffTurn | HandoffTurnResult) -> str:
    """Who sent ``news``: a result's agent; a turn's handing agent, else the coordinator."""
    if isinstance(news, HandoffTurnResult):
        return news.agent
    return news.handed_from or COORDINATOR_ID


def _handoff_target(messages: Sequence[ChatMessage], routes: dict[str, str]) -> str | None:
    for message in reversed(messages):
        for result in message.function_results:
            if result.name.startswith("handoff_to_") and result.error is None:
                target = result.name.removeprefix("handoff_to_")
                if target in routes:
                    return target
    return None


class HandoffCoordinator(Executor):
    """Starts the conversation, asks the user between turns and decides when it ends."""

    takes_input_while_waiting = False
    """A new message waits until the chat's questions are answered (see ``Workflow.run``):
    mid-turn, its agents hold more of the conversation than the coordinator."""

    def __init__(
        self, start_agent: str, termination: TerminationCondition, turn_limit: int
    ) -> None:
        super().__init__(COORDINATOR_ID)
        self.start_agent = start_agent
        self.termination = termination
        self.turn_limit = turn_limit

    @handler
    async def on_text(self, text: str, ctx: WorkflowContext[HandoffTurn]) -> None:
        await self._start(ctx, [ChatMessage.user(text)])

    @handler
    async def on_messages(
        self, messages: list[ChatMessage], ctx: WorkflowContext[HandoffTurn]
    ) -> None:
        await self._start(ctx, messages)

    async def _start(
        self, ctx: WorkflowContext[HandoffTurn], conversation: list[ChatMessage]
    ) -> None:
        held = await self._conversation(ctx)
        if len(held):
            await self._continue(ctx, conversation)
            return
        await ctx.set_state("active", self.start_agent)
        await ctx.set_state("conversation", [stored_message(m) for m in conversation])
        n = len(conversation)
        await ctx.set_shared(HANDOFF_SEEN_KEY, {COORDINATOR_ID: n, self.start_agent: n})
        await ctx.send_message(
            HandoffTurn(agent=self.start_agent, messages=conversation),
            target_id=self.start_agent,
        )

    async def _continue(self, ctx: WorkflowContext[HandoffTurn], said: list[ChatMessage]) -> None:
        """A new message after the chat ended (``run(message, checkpoint=...)``): the chat goes
        on with it, from the start agent, its turns counted anew (it failed the run: the start
        agent held the conversation the message did not continue -- outside tester 187)."""
        await ctx.set_state("active", self.start_agent)
        await ctx.set_state("turn", 0)
        await self._said_to(ctx, said, self.start_agent, 0)

    async def _said_to(
        self, ctx: WorkflowContext[HandoffTurn, Any], said: list[ChatMessage], agent: str, turn: int
    ) -> None:
        """The user ``said`` this: append it to the conversation, and hand ``agent`` the part
        of it the agent has not seen."""
        await ctx.append_state("conversation", [stored_message(m) for m in said])
        conversation = await self._conversation(ctx)
        seen = await ctx.get_shared(HANDOFF_SEEN_KEY, {})
        start = _seen_by(seen, agent, conversation)
        seen[COORDINATOR_ID] = seen[agent] = len(conversation)
        await ctx.set_shared(HANDOFF_SEEN_KEY, seen)
        await ctx.send_message(
            HandoffTurn(agent=agent, messages=conversation[start:], start=start, turn=turn),
            target_id=agent,
        )

    async def _conversation(self, ctx: WorkflowContext[Any, Any]) -> StateItems:
        """The coordinator's copy of the conversation, decoded lazily."""
        return await ctx.get_state_items("conversation", convert=read_message)

    @handler
    async def on_result(
        self,
        result: HandoffTurnResult,
        ctx: WorkflowContext[HandoffUserInputRequest, HandoffOutcome],
    ) -> None:
        await ctx.set_state("active", result.agent)
        await _catch_up(ctx, await self._conversation(ctx), result)
        await ctx.set_state("turn", result.turn)
        conversation = await self._conversation(ctx)
        ended: Literal["completed", "ended_by_user", "turn_limit_reached"] | None = (
            "completed" if self.termination(conversation) else None
        )
        if ended is None and result.turn >= self.turn_limit:
            ended = "turn_limit_reached"
        if ended is not None:
            await ctx.yield_output(
                HandoffOutcome(
                    status=ended,
                    last_agent=result.agent,
                    conversation=list(conversation),
                    turns=result.turn,
                )
            )
            return
        last = said_since_the_user(conversation) or ""
        await ctx.send_message(
            HandoffUserInputRequest(agent=result.agent, message=last, turn=result.turn)
        )

    @handler
    async def on_user_reply(
        self,
        reply: HandoffUserResponse,
        ctx: WorkflowContext[HandoffTurn, HandoffOutcome],
    ) -> None:
        active = await ctx.get_state("active", self.start_agent)
        turn = await ctx.get_state("turn", 0)
        if reply.end or is_blank(reply.message or ""):
            await ctx.yield_output(
                HandoffOutcome(
                    status="ended_by_user",
                    last_agent=active,
                    conversation=list(await self._conversation(ctx)),
                    turns=turn,
                )
            )
            return
        await self._said_to(ctx, [ChatMessage.user(reply.message or "")], active, turn)


class HandoffBuilder:
    """Compose agents into a handoff workflow (a normal, checkpointed ``Workflow``)."""

    def __init__(
        self,
        name: str = "handoff",
        participants: Sequence[Agent] = (),
        termination_condition: TerminationCondition | None = None,
        *,
        turn_limit: int = 20,
    ) -> None:
        self.name = name
        self.participants: dict[str, Agent] = {}
        if isinstance(participants, (str, Agent)) or not isinstance(participants, Sequence):
            raise UsageError(  # (a str was read letter by letter: AttributeError, tester 167)
                f"HandoffBuilder: participants is a list of agents, not {participants!r}"
            )
        for agent in participants:
            self.add_participant(agent)
        self.termination_condition = termination_condition or ends_with_case_complete
        self.turn_limit = _checked_turn_limit(turn_limit)
        self._routes: dict[str, dict[str, str]] = {}
        self._start: str | None = None

    def add_participant(self, agent: Agent) -> HandoffBuilder:
        if not isinstance(agent, Agent):
            raise UsageError(f"a handoff's participant is an Agent, not {agent!r}")
        if agent.name in self.participants:
            raise UsageError(f"two participants are named {agent.name!r}")
        if agent.name in (COORDINATOR_ID, USER_INPUT_PORT_ID):
            raise UsageError(f"{agent.name!r} is reserved by the handoff workflow")
        self.participants[agent.name] = agent
        return self

    def _name(self, agent: Agent | str) -> str:
        if not isinstance(agent, (Agent, str)):
            raise UsageError(f"{agent!r} is not a participant: name an Agent or its name")
        name = agent if isinstance(agent, str) else agent.name
        if name not in self.participants:
            raise UsageError(
                f"{name!r} is not a participant (participants: {', '.join(self.participants)})"
            )
        return name

    def add_handoff(
        self,
        source: Agent | str,
        targets: Sequence[Agent | str],
        description: str | None = None,
    ) -> HandoffBuilder:
        """Let ``source`` hand the conversation to each of ``targets``."""
        src = self._name(source)
        if isinstance(targets, (str, Agent)):  # one target (a name was read letter by letter)
            targets = [targets]
        elif not isinstance(targets, Sequence):
            raise UsageError(f"add_handoff: targets is a list of participants, not {targets!r}")
        routes = self._routes.setdefault(src, {})
        for target in targets:
            dst = self._name(target)
            if dst == src:
                raise UsageError(f"{src!r} cannot hand off to itself")
            agent = self.participants[dst]
            routes[dst] = description or agent.description or f"Hand the conversation to {dst}."
        return self

    def with_start_agent(self, agent: Agent | str) -> HandoffBuilder:
        self._start = self._name(agent)
        return self

    def with_turn_limit(self, limit: int) -> HandoffBuilder:
        self.turn_limit = _checked_turn_limit(limit)
        return self

    def build(self) -> Workflow:
        if not self.participants:
            raise UsageError("a handoff workflow needs at least one participant")
        start = self._start or next(iter(self.participants))
        coordinator = HandoffCoordinator(start, self.termination_condition, self.turn_limit)
        port = RequestPort(
            USER_INPUT_PORT_ID,
            request_type=HandoffUserInputRequest,
            response_type=HandoffUserResponse,
        )
        hosts = {
            name: HandoffParticipant(agent, self._routes.get(name, {}), self.turn_limit)
            for name, agent in self.participants.items()
        }
        builder = WorkflowBuilder(name=self.name, start=coordinator)
        builder.with_max_supersteps(self.turn_limit * 4 + 10)
        for host in hosts.values():
            builder.add_edge(coordinator, host)
            builder.add_edge(host, coordinator)
        for source, routes in self._routes.items():
            for target in routes:
                builder.add_edge(hosts[source], hosts[target])
        builder.add_edge(coordinator, port).add_edge(port, coordinator)
        return builder.build()
