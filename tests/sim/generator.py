"""Random workflows from a seed, built from a small vocabulary of executor kinds.

A :class:`WorkflowSpec` is plain data drawn from ``random.Random(seed)``: a chain of segments
between a start relay and a sink. :meth:`WorkflowSpec.build` turns it into a real ``Workflow``,
shared by every ``Runtime`` of the seed; its executors report their crash points to the
simulated process executing them (``here()``).

Segments (every one takes a ``Msg`` and sends ``Msg``\\ s on):

* ``relay`` -- ``ctx.run_once`` a side effect, then send;
* ``loop`` -- a counter with a conditional back edge (plain conditions or a switch-case);
* ``ports`` -- a request port whose answer flows into a second request port (or one port), then
  a receiver with a side effect;
* ``ask`` -- an executor calling ``ctx.request_info``; its ``@response_handler`` does the effect;
* ``fan`` -- a splitter fanning out to branches joined by a fan-in joiner;
* ``merge`` -- a splitter fanning out to branches that all feed one relay (several messages
  reach it in one superstep: the relay's multiplicity grows);
* ``agent`` -- an ``executors.Agent`` on a scripted model, with a free ``lookup``, an
  approval-required ``pay`` and a free ``audit`` tool.

Every effect's identity is derived from the executor and the content it received (which carries
the whole lineage of the message), so the same logical effect has the same identity in every
run of the seed, whatever the engine's keys. Some executors declare their step idempotent
(``run_once(..., idempotent=True)``: retried after a crash, with the same idempotency key); the
others are not, so a crash between their effect and its journal entry makes the run ask
whether the effect happened -- :func:`resolution_for` answers from the outside ledger. The
agent's ``lookup`` tool is idempotent, ``pay`` and ``audit`` are not; model calls are retried.

Fan-ins and agents only ever see one message at a time (the generator keeps them where the
multiplicity is 1), which makes what they receive independent of answer timing: outputs are
equal as a multiset even when answers arrive at different supersteps, and equal in order when
the schedule of answers is the same.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Never

from pydantic import BaseModel

from tests.sim.world import Ledger, current_branch, digest, here, receipt_of
from workflow_engine import (
    Case,
    Default,
    EffectResolution,
    Executor,
    InDoubtEffect,
    RequestPort,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    response_handler,
)
from workflow_engine.executors import (
    Agent,
    AgentResponse,
    ChatMessage,
    ChatResponse,
    ChatResponseUpdate,
    FunctionCallContent,
    Rule,
    ScriptedChatClient,
    TextContent,
    ToolApprovalRequestContent,
    ToolCall,
    tool,
)

MAX_MULTIPLICITY = 4


# --- messages -------------------------------------------------------------------------------------


class Msg(BaseModel):
    """The token flowing through a generated workflow; ``trail`` is its lineage."""

    trail: list[str]
    loop: str = ""
    left: int = 0


class Hop(BaseModel):
    """The answer of a first request port, and the request of the second."""

    msg: Msg
    note: str


class Answer(BaseModel):
    msg: Msg
    note: str


class Question(BaseModel):
    msg: Msg
    asker: str


class Reply(BaseModel):
    msg: Msg
    verdict: str


# --- the side effect, as every executor performs it -----------------------------------------------


async def effect(
    ctx: WorkflowContext[Any, Any], kind: str, content: Any, keyed: bool, idempotent: bool = False
) -> str:
    """Hit the outside world once for ``content`` through ``ctx.run_once``; return the receipt.

    ``keyed``: the run_once key names the content (a careful user); otherwise it is constant,
    as the docs allow (a step is named by its superstep, executor and delivery too).
    ``idempotent``: the step is declared safe to repeat with its idempotency key; otherwise the
    effect's description (its logical identity, what a person would look up) goes with the
    intent the engine journals.
    """
    proc = here()
    world = proc.world
    identity = f"{world.branch(ctx.run_id)}|{ctx.executor_id}|{kind}|{digest(content)}"
    expected = receipt_of(identity)
    await proc.user_point(f"{ctx.executor_id}:before")
    key = f"effect:{digest(content)}" if keyed else "effect"
    step = ctx.step_key(key)
    engine_key = ctx.idempotency_key(key)

    async def once() -> str:
        stale = not world.holds(proc, ctx.run_id)
        receipt = world.ledger.perform(
            proc, identity, engine_key, idempotent=idempotent, step=step, stale=stale
        )
        await proc.user_point(f"{ctx.executor_id}:inside")  # done, not journaled yet
        return receipt

    got = await ctx.run_once(
        key, once, idempotent=idempotent, description=None if idempotent else {"effect": identity}
    )
    if got != expected:
        world.ledger.mismatch(
            f"{identity}: run_once({key!r}) returned {got} ({world.ledger.by_receipt.get(got)})"
        )
    await proc.user_point(f"{ctx.executor_id}:after")
    return got


# --- executor kinds -------------------------------------------------------------------------------


class Relay(Executor):
    def __init__(self, id: str, keyed: bool, idempotent: bool = False) -> None:
        super().__init__(id)
        self.keyed = keyed
        self.idempotent = idempotent

    @handler
    async def on_msg(self, msg: Msg, ctx: WorkflowContext[Msg]) -> None:
        receipt = await effect(ctx, "relay", msg, self.keyed, self.idempotent)
        await ctx.send_message(Msg(trail=[*msg.trail, receipt]))


class Looper(Executor):
    """Counts ``rounds`` passes of each message through itself (the back edge is conditional)."""

    def __init__(self, id: str, rounds: int, keyed: bool, idempotent: bool = False) -> None:
        super().__init__(id)
        self.rounds = rounds
        self.keyed = keyed
        self.idempotent = idempotent

    @handler
    async def on_msg(self, msg: Msg, ctx: WorkflowContext[Msg]) -> None:
        left = msg.left if msg.loop == self.id else self.rounds
        receipt = await effect(ctx, f"loop{left}", msg, self.keyed, self.idempotent)
        await ctx.send_message(Msg(trail=[*msg.trail, receipt], loop=self.id, left=left - 1))


class Receiver(Executor):
    """Takes what a chain of request ports answered."""

    def __init__(self, id: str, keyed: bool, idempotent: bool = False) -> None:
        super().__init__(id)
        self.keyed = keyed
        self.idempotent = idempotent

    @handler
    async def on_answer(self, answer: Hop | Answer, ctx: WorkflowContext[Msg]) -> None:
        receipt = await effect(ctx, "receive", answer, self.keyed, self.idempotent)
        await ctx.send_message(Msg(trail=[*answer.msg.trail, answer.note, receipt]))


class Asker(Executor):
    """Asks through ``ctx.request_info``; the answer's handler does the side effect."""

    def __init__(self, id: str, keyed: bool, idempotent: bool = False) -> None:
        super().__init__(id)
        self.keyed = keyed
        self.idempotent = idempotent

    @handler
    async def on_msg(self, msg: Msg, ctx: WorkflowContext) -> None:
        await here().user_point(f"{self.id}:ask")
        await ctx.request_info(Question(msg=msg, asker=self.id), Reply)

    @response_handler
    async def on_reply(self, question: Question, reply: Reply, ctx: WorkflowContext[Msg]) -> None:
        receipt = await effect(ctx, "reply", [question, reply], self.keyed, self.idempotent)
        await ctx.send_message(Msg(trail=[*question.msg.trail, reply.verdict, receipt]))


class Joiner(Executor):
    def __init__(self, id: str, keyed: bool, idempotent: bool = False) -> None:
        super().__init__(id)
        self.keyed = keyed
        self.idempotent = idempotent

    @handler
    async def on_batch(self, batch: list[Msg], ctx: WorkflowContext[Msg]) -> None:
        receipt = await effect(ctx, "join", batch, self.keyed, self.idempotent)
        await ctx.send_message(Msg(trail=[f"join:{digest(batch)}", receipt]))


class Prompter(Executor):
    """Turns a token into the agent's order: ``order <ref> amount <n>``."""

    def __init__(self, id: str) -> None:
        super().__init__(id)

    @handler
    async def on_msg(self, msg: Msg, ctx: WorkflowContext[str]) -> None:
        await here().user_point(f"{self.id}:prompt")
        ref = digest(msg, 8)
        await ctx.send_message(f"order {ref} amount {int(ref[:2], 16) % 90 + 10}")


class Summarizer(Executor):
    """Checks that every tool result answers its own call, and turns the turn into a token."""

    def __init__(self, id: str) -> None:
        super().__init__(id)

    @handler
    async def on_response(self, response: AgentResponse, ctx: WorkflowContext[Msg]) -> None:
        await here().user_point(f"{self.id}:summary")
        for problem in tool_result_problems(response.conversation):
            here().world.ledger.mismatch(f"{ctx.executor_id}: {problem}")
        texts = [m.text for m in response.conversation if m.role == "assistant" and m.text]
        await ctx.send_message(Msg(trail=[f"agent:{digest(texts)}", texts[-1] if texts else ""]))


class Sink(Executor):
    def __init__(self, id: str) -> None:
        super().__init__(id)

    @handler
    async def on_msg(self, msg: Msg, ctx: WorkflowContext[Never, Msg]) -> None:
        receipt = await effect(ctx, "sink", msg, True)
        await ctx.yield_output(Msg(trail=[*msg.trail, receipt]))


# --- the agent: a scripted model and three tools --------------------------------------------------


def _paid(messages: Sequence[ChatMessage]) -> bool:
    last = messages[-1]
    return any(r.name == "pay" and not r.error for r in last.function_results)


AGENT_RULES = [
    Rule(
        user=r"order (?P<ref>\w+) amount (?P<amount>\d+)",
        reply="Looking up order {ref}.",
        calls=[ToolCall("lookup", {"ref": "{ref}"})],
    ),
    Rule(
        after_tool="lookup",
        reply="Paying {amount} for {ref}.",
        calls=[ToolCall("pay", {"ref": "{ref}", "amount": "{amount}"})],
    ),
    Rule(
        after_tool="pay",
        when=_paid,
        reply="Auditing {ref}.",
        calls=[ToolCall("audit", {"ref": "{ref}"})],
    ),
    Rule(after_tool="pay", reply="Payment for {ref} was rejected."),
    Rule(after_tool="audit", reply="Done with {ref}: {result}"),
]
AGENT_MEMORY = {"ref": r"order (\w+)", "amount": r"amount (\d+)"}


def tool_line(name: str, arguments: dict[str, Any]) -> str:
    return f"{name} {json.dumps(arguments, sort_keys=True)}"


def tool_result_problems(conversation: Sequence[ChatMessage]) -> list[str]:
    """Tool results that do not belong to the call they answer (a journal mix-up)."""
    problems = []
    for index, message in enumerate(conversation):
        calls = message.function_calls
        if not calls:
            continue
        results = next(
            (m.function_results for m in conversation[index + 1 :] if m.role == "tool"), []
        )
        for call, result in zip(calls, results, strict=False):
            if result.error is not None or not isinstance(result.result, str):
                continue
            arguments = {k: str(v) for k, v in call.arguments.items()}
            if not result.result.startswith(tool_line(call.name, arguments)):
                problems.append(
                    f"call {call.call_id} {tool_line(call.name, arguments)} got {result.result!r}"
                )
    return problems


class SimModel:
    """A scripted model (``ScriptedChatClient`` rules) that is also an outside service: every
    call is a logical side effect. ``repeat_ids``: call ids restart at ``call_1`` in every
    response, as some providers do."""

    def __init__(self, agent_id: str, repeat_ids: bool) -> None:
        self.agent_id = agent_id
        self.repeat_ids = repeat_ids
        self.script = ScriptedChatClient(AGENT_RULES, remember=AGENT_MEMORY)

    async def _reply(self, messages: Sequence[ChatMessage]) -> ChatMessage:
        proc = here()
        world = proc.world
        branch = current_branch.get()
        identity = f"{branch}|{self.agent_id}|model|{digest(list(messages))}"
        stale = not world.holds(proc, world.run_of(branch))  # as the step starts
        await proc.user_point(f"{self.agent_id}:model")
        receipt = world.ledger.perform(proc, identity, idempotent=True, stale=stale)
        message = (await self.script.get_response(messages)).message
        contents: list[Any] = []
        calls = 0
        for content in message.contents:
            if isinstance(content, TextContent):
                content = TextContent(text=f"{content.text} [{receipt}]")
            elif isinstance(content, FunctionCallContent) and self.repeat_ids:
                calls += 1
                content = content.model_copy(update={"call_id": f"call_{calls}"})
            contents.append(content)
        await proc.user_point(f"{self.agent_id}:model-done")
        return message.model_copy(update={"contents": contents})

    async def get_response(self, messages: Sequence[ChatMessage], *, tools: Any = ()) -> Any:
        return ChatResponse(messages=[await self._reply(messages)])

    async def get_streaming_response(
        self, messages: Sequence[ChatMessage], *, tools: Any = ()
    ) -> Any:
        message = await self._reply(messages)
        message_id = message.message_id or "msg"
        for content in message.contents:
            if isinstance(content, TextContent):
                yield ChatResponseUpdate(kind="text", message_id=message_id, text=content.text)
            elif isinstance(content, FunctionCallContent):
                yield ChatResponseUpdate(
                    kind="function_call",
                    message_id=message_id,
                    call_id=content.call_id,
                    name=content.name,
                    arguments_delta=json.dumps(content.arguments),
                )


IDEMPOTENT_TOOLS = frozenset({"lookup"})
"""Tools declared ``@tool(idempotent=True)`` (a read); the others pause the run when in doubt."""


def tool_identity(branch: str, agent_id: str, name: str, arguments: dict[str, Any]) -> str:
    return f"{branch}|{agent_id}|tool|{tool_line(name, {k: str(v) for k, v in arguments.items()})}"


def make_tools(agent_id: str) -> list[Any]:
    async def hit(name: str, arguments: dict[str, Any], key: str) -> str:
        proc = here()
        world = proc.world
        branch = current_branch.get()
        line = tool_line(name, {k: str(v) for k, v in arguments.items()})
        identity = tool_identity(branch, agent_id, name, arguments)
        stale = not world.holds(proc, world.run_of(branch))  # as the step starts
        await proc.user_point(f"{agent_id}:{name}")
        receipt = world.ledger.perform(
            proc, identity, engine_key=key, idempotent=name in IDEMPOTENT_TOOLS, stale=stale
        )
        await proc.user_point(f"{agent_id}:{name}-done")
        return f"{line} {receipt}"

    async def lookup(ref: str, idempotency_key: str) -> str:
        """Look an order up."""
        return await hit("lookup", {"ref": ref}, idempotency_key)

    async def pay(ref: str, amount: int, idempotency_key: str) -> str:
        """Pay an order (needs approval)."""
        return await hit("pay", {"ref": ref, "amount": amount}, idempotency_key)

    async def audit(ref: str, idempotency_key: str) -> str:
        """Record an audit entry."""
        return await hit("audit", {"ref": ref}, idempotency_key)

    return [tool(idempotent=True)(lookup), tool(approval_mode="always_require")(pay), tool(audit)]


# --- the spec -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    kind: str
    sid: str
    keyed: bool = False
    rounds: int = 0  # loop
    switch: bool = False  # loop: switch-case instead of two conditional edges
    chain: int = 0  # ports: one or two request ports
    branches: tuple[Segment, ...] = ()  # fan, merge
    idempotent: bool = False  # its run_once steps are declared idempotent

    def describe(self) -> str:
        idem = "/idem" if self.idempotent else ""
        if self.kind == "loop":
            return f"{self.sid}:loopx{self.rounds}{'/switch' if self.switch else ''}{idem}"
        if self.kind == "ports":
            return f"{self.sid}:portsx{self.chain}{idem}"
        if self.branches:
            inner = ",".join(b.describe() for b in self.branches)
            return f"{self.sid}:{self.kind}{idem}[{inner}]"
        if self.kind == "agent":
            return f"{self.sid}:agent"
        return f"{self.sid}:{self.kind}{'' if self.keyed else '/const-key'}{idem}"


@dataclass(frozen=True)
class WorkflowSpec:
    seed: int
    segments: tuple[Segment, ...]
    repeat_ids: bool = False  # the agent's model reuses call ids
    start_keyed: bool = True
    start_idempotent: bool = False

    @property
    def name(self) -> str:
        return f"sim{self.seed}"

    @property
    def has_agent(self) -> bool:
        return any(s.kind == "agent" for s in self.segments)

    def describe(self) -> str:
        start = "s0:relay" + ("/idem" if self.start_idempotent else "")
        parts = [start, *(s.describe() for s in self.segments), "out:sink"]
        return " → ".join(parts) + (" (model repeats call ids)" if self.repeat_ids else "")

    def start_message(self) -> Msg:
        return Msg(trail=[f"in{self.seed}"])

    def build(self) -> Workflow:
        """The workflow (one shared object: executors find their process with ``here()``)."""
        return _build(self)


def generate(seed: int, rng: random.Random | None = None) -> WorkflowSpec:
    """The workflow of ``seed`` (1 to 5 segments; fan-ins and agents only at multiplicity 1)."""
    rng = rng or random.Random(f"workflow:{seed}")
    segments: list[Segment] = []
    multiplicity = 1
    agents = 0
    for index in range(rng.randint(1, 5)):
        sid = f"g{index + 1}"
        kinds = ["relay", "loop", "ports", "ask"]
        weights = [3, 2, 3, 2]
        if multiplicity == 1:
            kinds += ["fan"]
            weights += [2]
            if agents == 0:
                kinds += ["agent"]
                weights += [2]
        if multiplicity * 2 <= MAX_MULTIPLICITY:
            kinds += ["merge"]
            weights += [2]
        kind = rng.choices(kinds, weights)[0]
        if kind in ("fan", "merge"):
            width = rng.randint(2, 3 if kind == "fan" else MAX_MULTIPLICITY // multiplicity)
            inner = ["relay", "ports", "ask"] + (["loop"] if kind == "merge" else [])
            branches = tuple(
                _simple(rng, rng.choice(inner), f"{sid}b{i + 1}") for i in range(width)
            )
            keyed = rng.random() >= CONSTANT_KEY_SHARE
            segments.append(Segment(kind, sid, keyed=keyed, branches=branches))
            if kind == "merge":
                multiplicity *= width
        elif kind == "agent":
            agents += 1
            segments.append(Segment("agent", sid))
        else:
            segments.append(_simple(rng, kind, sid))
    spec = WorkflowSpec(
        seed,
        tuple(segments),
        repeat_ids=rng.random() < REPEATED_IDS_SHARE,
        start_keyed=rng.random() >= CONSTANT_KEY_SHARE,
    )
    return declare_idempotency(spec)


def declare_idempotency(spec: WorkflowSpec) -> WorkflowSpec:
    """Which executors declare their steps idempotent, from a stream of its own (so a seed's
    graph is the one it always was)."""
    rng = random.Random(f"idempotent:{spec.seed}")

    def mark(segment: Segment) -> Segment:
        branches = tuple(mark(b) for b in segment.branches)
        idempotent = segment.kind != "agent" and rng.random() < IDEMPOTENT_SHARE
        return dataclasses.replace(segment, branches=branches, idempotent=idempotent)

    return dataclasses.replace(
        spec,
        segments=tuple(mark(s) for s in spec.segments),
        start_idempotent=rng.random() < IDEMPOTENT_SHARE,
    )


CONSTANT_KEY_SHARE = 0.3
"""How often an executor uses one constant run_once key instead of naming the content."""
REPEATED_IDS_SHARE = 0.3
"""How often the agent's model restarts its call ids in every response."""
IDEMPOTENT_SHARE = 0.35
"""How often an executor declares its ``run_once`` step idempotent (retried, never asked)."""


def _simple(rng: random.Random, kind: str, sid: str) -> Segment:
    keyed = rng.random() >= CONSTANT_KEY_SHARE
    if kind == "loop":
        return Segment("loop", sid, keyed, rounds=rng.randint(1, 3), switch=rng.random() < 0.5)
    if kind == "ports":
        return Segment("ports", sid, keyed, chain=rng.randint(1, 2))
    return Segment(kind, sid, keyed)


@functools.lru_cache(maxsize=4)
def _build(spec: WorkflowSpec) -> Workflow:
    return _Assembly(spec).build()


@dataclass
class _Assembly:
    """Builds a spec's graph."""

    spec: WorkflowSpec
    builder: WorkflowBuilder = field(init=False)

    def build(self) -> Workflow:
        start = Relay("s0", self.spec.start_keyed, self.spec.start_idempotent)
        self.builder = WorkflowBuilder(name=self.spec.name, start=start).with_max_supersteps(500)
        connect = self._edge_from(start.id)
        for segment in self.spec.segments:
            entry, connect_next = self._segment(segment)
            connect(entry)
            connect = connect_next
        connect(Sink("out"))
        return self.builder.build()

    def _edge_from(self, node: Any) -> Callable[[Any], None]:
        def connect(target: Any) -> None:
            self.builder.add_edge(node, target)

        return connect

    def _segment(self, s: Segment) -> tuple[Any, Callable[[Any], None]]:
        """The segment's entry node and how to connect its exit to the next entry."""
        if s.kind == "relay":
            node = Relay(s.sid, s.keyed, s.idempotent)
            return node, self._edge_from(node)
        if s.kind == "loop":
            return self._loop(s)
        if s.kind == "ports":
            first = RequestPort(f"{s.sid}p1", request_type=Msg, response_type=Hop)
            receiver = Receiver(f"{s.sid}r", s.keyed, s.idempotent)
            if s.chain == 2:
                second = RequestPort(f"{s.sid}p2", request_type=Hop, response_type=Answer)
                self.builder.add_chain([first, second, receiver])
            else:
                self.builder.add_edge(first, receiver)
            return first, self._edge_from(receiver)
        if s.kind == "ask":
            node = Asker(s.sid, s.keyed, s.idempotent)
            return node, self._edge_from(node)
        if s.kind == "agent":
            prompter = Prompter(f"{s.sid}in")
            agent = Agent(
                f"{s.sid}agent",
                "You pay orders: look them up, pay them (with approval), audit them.",
                SimModel(f"{s.sid}agent", self.spec.repeat_ids),
                make_tools(f"{s.sid}agent"),
            )
            summarizer = Summarizer(f"{s.sid}out")
            self.builder.add_chain([prompter, agent, summarizer])
            return prompter, self._edge_from(summarizer)
        splitter = Relay(f"{s.sid}split", s.keyed, s.idempotent)
        entries = []
        connects = []
        for branch in s.branches:
            entry, connect = self._segment(branch)
            entries.append(entry)
            connects.append(connect)
        self.builder.add_fan_out_edges(splitter, entries)
        if s.kind == "fan":
            joiner = Joiner(f"{s.sid}join", s.keyed, s.idempotent)
            exits = [self._exit_of(branch) for branch in s.branches]
            self.builder.add_fan_in_edges(exits, joiner)
            return splitter, self._edge_from(joiner)
        merged = Relay(f"{s.sid}merge", s.keyed, s.idempotent)
        for connect in connects:
            connect(merged)
        return splitter, self._edge_from(merged)

    def _exit_of(self, branch: Segment) -> str:
        """The node whose messages leave a (fan) branch."""
        if branch.kind == "ports":
            return f"{branch.sid}r"
        return branch.sid

    def _loop(self, s: Segment) -> tuple[Any, Callable[[Any], None]]:
        node = Looper(s.sid, s.rounds, s.keyed, s.idempotent)

        async def again(m: Msg) -> bool:
            here().point(f"{s.sid}:again?")
            return m.loop == s.sid and m.left > 0

        async def done(m: Msg) -> bool:
            here().point(f"{s.sid}:done?")
            return not (m.loop == s.sid and m.left > 0)

        def connect(target: Any) -> None:
            if s.switch:
                self.builder.add_switch_case_edge_group(node, [Case(again, node), Default(target)])
            else:
                self.builder.add_edge(node, node, again)
                self.builder.add_edge(node, target, done)

        return node, connect


# --- answers: a pure function of the request ----------------------------------------------------


IN_DOUBT = "in-doubt|"
"""The prefix of an in-doubt question's identity (they exist only in runs that crashed)."""


def request_identity(port_id: str, data: Any) -> str:
    """What a request *is*, whatever id the engine gave it (an in-doubt question: what the
    step it asks about was doing)."""
    if isinstance(data, InDoubtEffect):
        return f"{IN_DOUBT}{port_id}|{data.step.partition(':')[0]}|{digest(data.description)}"
    return f"{port_id}|{digest(data)}"


def effect_of(question: InDoubtEffect, branch: str) -> tuple[str, Any] | None:
    """The logical identity of the effect an in-doubt question is about, and the step result
    it would have had -- read from the question's description, as a person would."""
    described = question.description if isinstance(question.description, dict) else {}
    if "effect" in described:  # a run_once step of ``effect``: its result is the receipt
        identity = str(described["effect"])
        return identity, receipt_of(identity)
    if "tool" in described:  # an agent's tool call: its result is the tool's text
        name, arguments = str(described["tool"]), dict(described.get("arguments") or {})
        identity = tool_identity(branch, question.executor_id, name, arguments)
        line = tool_line(name, {k: str(v) for k, v in arguments.items()})
        return identity, f"{line} {receipt_of(identity)}"
    return None


def resolution_for(question: InDoubtEffect, branch: str, ledger: Ledger) -> dict[str, Any]:
    """The truthful answer to an in-doubt question: the outside ledger says whether the effect
    happened, and if it did, what it returned (JSON, as a client would send it)."""
    found = effect_of(question, branch)
    if found is None:
        raise AssertionError(f"an in-doubt question about an unknown step: {question!r}")
    identity, result = found
    if ledger.happened(identity):
        return EffectResolution(happened=True, result=result).model_dump(mode="json")
    return EffectResolution(happened=False).model_dump(mode="json")


def answer_for(data: Any) -> Any:
    """The answer a deterministic user gives to a request with this data (JSON, as a client
    would send it)."""
    if isinstance(data, Msg):
        return Hop(msg=data, note=f"h{digest(data, 4)}").model_dump(mode="json")
    if isinstance(data, Hop):
        return Answer(msg=data.msg, note=f"a{digest(data, 4)}").model_dump(mode="json")
    if isinstance(data, Question):
        return Reply(msg=data.msg, verdict=f"v{digest(data, 4)}").model_dump(mode="json")
    if isinstance(data, ToolApprovalRequestContent):
        arguments = data.function_call.arguments
        return {"approved": int(digest(arguments), 16) % 4 != 0}
    raise AssertionError(f"no answer for a request of {type(data).__name__}")
