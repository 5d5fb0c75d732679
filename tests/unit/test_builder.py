"""Graph validation, signatures and pictures."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Never, NewType, Protocol, TypedDict, runtime_checkable

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict as ExtTypedDict

from workflow_engine import (
    Case,
    Default,
    DefinitionError,
    DuplicateExecutorError,
    EdgeTypeMismatchError,
    Executor,
    FanInTypeMismatchError,
    GraphValidationError,
    MissingStartError,
    RequestPort,
    UnknownExecutorError,
    UnreachableExecutorError,
    UsageError,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    response_handler,
)


class Order(BaseModel):
    sku: str


class Counter(Executor):
    @handler
    async def count(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n + 1)


class Texter(Executor):
    @handler
    async def text(self, s: str, ctx: WorkflowContext[str]) -> None: ...


class Collector(Executor):
    @handler
    async def collect(self, items: list[int], ctx: WorkflowContext[Never, int]) -> None: ...


def test_duplicate_ids_are_refused() -> None:
    with pytest.raises(DuplicateExecutorError, match="'a'"):
        WorkflowBuilder(start=Counter("a")).add_edge("a", Counter("a")).build()


def test_unknown_id_names_the_id_and_the_known_ones() -> None:
    with pytest.raises(UnknownExecutorError, match="'ghost'.*known: a"):
        WorkflowBuilder(start=Counter("a")).add_edge("a", "ghost").build()


def test_missing_start_is_refused() -> None:
    with pytest.raises(MissingStartError):
        WorkflowBuilder().add_edge(Counter("a"), Counter("b")).build()


def test_unreachable_executor_is_named() -> None:
    a, b, c = Counter("a"), Counter("b"), Counter("c")
    with pytest.raises(UnreachableExecutorError, match="'c'"):
        WorkflowBuilder(start=a).add_edge(a, b).add_edge(c, b).build()


def test_edge_type_mismatch_names_both_executors_and_types() -> None:
    with pytest.raises(EdgeTypeMismatchError) as info:
        WorkflowBuilder(start=Counter("count")).add_edge("count", Texter("text")).build()
    message = str(info.value)
    assert "'count'" in message and "'text'" in message
    assert "sends int" in message and "accepts str" in message


class IntToStr(Executor):
    @handler
    async def convert(self, n: int, ctx: WorkflowContext[str]) -> None: ...


def test_fan_in_sources_must_agree_with_the_target_list_type() -> None:
    start = Counter("start")
    good = (
        WorkflowBuilder(start=start)
        .add_fan_out_edges(start, [Counter("a"), Counter("b")])
        .add_fan_in_edges(["a", "b"], Collector("sink"))
    )
    assert good.build().signature
    with pytest.raises(FanInTypeMismatchError, match="'b' sends str.*list\\[int\\]"):
        (
            WorkflowBuilder(start=start)
            .add_fan_out_edges(start, [Counter("a"), IntToStr("b")])
            .add_fan_in_edges(["a", "b"], Collector("sink"))
            .build()
        )


def test_fan_in_target_must_take_a_list() -> None:
    a, b = Counter("a"), Counter("b")
    with pytest.raises(FanInTypeMismatchError, match="give it a handler for list"):
        WorkflowBuilder(start=a).add_edge(a, b).add_fan_in_edges([a, b], Counter("c")).build()


def test_a_port_that_starts_the_workflow_or_leads_nowhere_is_refused_at_build() -> None:
    """Both built, then failed at run time: a port as the start raised a bare AssertionError,
    and a port without an outgoing edge took a person's answer and then left the run stuck
    in progress (outside tester)."""
    port = RequestPort("ask", request_type=int, response_type=str)
    with pytest.raises(GraphValidationError, match="starts at request port 'ask'"):
        WorkflowBuilder(start=port).add_edge(port, Texter("t")).build()
    with pytest.raises(GraphValidationError, match="request port 'ask' has no outgoing edge"):
        WorkflowBuilder(name="w", start=Counter("a")).add_edge("a", port).build()


def test_a_node_named_twice_in_one_fan_in_or_fan_out_is_refused() -> None:
    """A fan-in listing a source twice delivered each of its messages squared (outside
    tester)."""
    a = Counter("a")
    with pytest.raises(UsageError, match="source 'a' is named more than once"):
        WorkflowBuilder(start=a).add_fan_in_edges([a, "a"], Collector("c"))
    with pytest.raises(UsageError, match="target 'b' is named more than once"):
        WorkflowBuilder(start=a).add_fan_out_edges(a, [Counter("b"), "b"])
    with pytest.raises(UsageError, match="at least one source"):
        WorkflowBuilder(start=a).add_fan_in_edges([], Collector("c"))


def test_conditions_must_be_callable_and_a_switch_needs_a_case() -> None:
    """``condition=42`` built, and failed the run with "'int' object is not callable"."""
    a = Counter("a")
    with pytest.raises(UsageError, match="add_edge: condition must be callable, not int"):
        WorkflowBuilder(start=a).add_edge(a, Counter("b"), condition=42)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="selection_func must be callable"):
        WorkflowBuilder(start=a).add_fan_out_edges(a, [Counter("b")], "b")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="a Case's condition must be callable"):
        WorkflowBuilder(start=a).add_switch_case_edge_group(a, [Case(True, Counter("b"))])  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="needs at least one Case or Default"):
        WorkflowBuilder(start=a).add_switch_case_edge_group(a, [])


class Flag(Executor):
    @handler
    async def flag(self, n: int, ctx: WorkflowContext[bool]) -> None: ...


def test_a_bool_cannot_go_where_an_int_or_float_is_taken_at_build_as_at_run_time() -> None:
    """The build let ``bool`` into a handler of ``int`` (bool is an int subclass); at run time
    such a handler is never given True, so the run failed (outside tester)."""
    with pytest.raises(EdgeTypeMismatchError, match="'f' sends bool but 'n' accepts int"):
        WorkflowBuilder(start=Flag("f")).add_edge("f", Counter("n")).build()


class Pair(Executor):
    @handler
    async def pair(self, p: tuple[int, int], ctx: WorkflowContext[Never, int]) -> None:
        await ctx.yield_output(p[0] + p[1])


class SendsMany(Executor):
    @handler
    async def go(self, n: int, ctx: WorkflowContext[tuple[int, ...]]) -> None: ...


class TakesMany(Executor):
    @handler
    async def take(self, ns: tuple[int, ...], ctx: WorkflowContext[Never, int]) -> None: ...


class SendsPair(Executor):
    @handler
    async def go(self, n: int, ctx: WorkflowContext[tuple[int, int]]) -> None: ...


def test_edges_between_tuples_of_any_length_build() -> None:
    """``tuple[int, ...]`` into ``tuple[int, ...]`` (or a pair into it) was refused: "can
    never carry a message" (outside tester). A tuple of another item type still is."""
    for sender in (SendsMany("s"), SendsPair("s")):
        WorkflowBuilder(start=sender).add_edge(sender, TakesMany("t")).build()
        WorkflowBuilder(start=sender).add_edge(sender, Pair("p")).build()
    with pytest.raises(EdgeTypeMismatchError):
        WorkflowBuilder(start=Texter("x")).add_edge("x", TakesMany("t")).build()


@pytest.mark.anyio
async def test_a_tuple_handler_takes_only_tuples_of_its_shape() -> None:
    """``tuple[int, int]`` took ``("a", "b")``, ``(1, 2, 3)`` and ``()`` (list items were
    checked, tuple items were not)."""
    from workflow_engine import MessageNotHandledError

    wf = WorkflowBuilder(start=Pair("p")).build()
    assert (await wf.run((1, 2))).outputs == [3]
    for wrong in (("a", "b"), (1, 2, 3), (), (1, True)):
        with pytest.raises(MessageNotHandledError):
            await wf.run(wrong)


def test_a_type_pydantic_cannot_describe_is_refused_by_name_at_build() -> None:
    """``register_types(bytearray)`` raised pydantic's own schema error, with its advice to set
    ``arbitrary_types_allowed`` (outside tester)."""
    from workflow_engine import DefinitionError

    with pytest.raises(DefinitionError, match=r"workflow 'w': register_types\(bytearray\)") as e:
        WorkflowBuilder(name="w", start=Counter("a")).register_types(bytearray).build()
    assert "arbitrary_types_allowed" not in str(e.value)


class Cents(int):
    """An int subclass: pydantic has no schema for it."""


class SendsCents(Executor):
    @handler
    async def on_int(self, n: int, ctx: WorkflowContext[Cents]) -> None:
        await ctx.send_message(Cents(n))


class SendsSubCents(Executor):
    @handler
    async def on_int(self, n: int, ctx: WorkflowContext[Cents]) -> None:
        await ctx.send_message(SubCents(n))


class SubCents(Cents):
    """Derives from a declared class pydantic cannot describe."""


class TakesCents(Executor):
    @handler
    async def on_cents(self, c: Cents, ctx: WorkflowContext[Never, int]) -> None:
        await ctx.yield_output(int(c))


@pytest.mark.anyio
async def test_a_declared_type_that_cannot_be_stored_fails_saying_why() -> None:
    """A handler declared ``Cents`` (an int subclass); the run failed with "not registered ...
    declare it in a handler annotation", which it was (outside tester)."""
    a, b = SendsCents("a"), TakesCents("b")
    result = await WorkflowBuilder(name="w", start=a).add_edge(a, b).build().run(3)
    assert result.error is not None and result.error.code == "unregistered_type"
    said = result.error.message
    assert "Cents cannot be stored: it is declared" in said
    assert "pydantic has no schema for it" in said
    assert "declare it" not in said and "arbitrary_types_allowed" not in said
    # a subclass of it: the same cause, named (registering the subclass cannot help)
    c, d = SendsSubCents("c"), TakesCents("d")
    result = await WorkflowBuilder(name="w2", start=c).add_edge(c, d).build().run(3)
    assert result.error is not None and "SubCents cannot be stored" in result.error.message
    assert "Cents: " in result.error.message and "declare it" not in result.error.message


def test_loops_are_legal() -> None:
    a = Counter("a")
    wf = WorkflowBuilder(start=a).add_edge(a, a, condition=lambda n: n < 3).build()
    assert wf.start_executor_id == "a"


def test_all_errors_share_one_root() -> None:
    assert issubclass(EdgeTypeMismatchError, GraphValidationError)


def build_chain(extra_edge: bool = False, port_response: type = str):
    a, b = Counter("a"), Counter("b")
    port = RequestPort("ask", request_type=int, response_type=port_response)
    builder = WorkflowBuilder(name="w", start=a).add_chain([a, b]).add_edge(b, port)
    builder.add_edge(port, Texter("t") if port_response is str else Counter("t"))
    if extra_edge:
        builder.add_edge(b, a)
    return builder.build()


def test_signature_is_stable_and_follows_structure() -> None:
    assert build_chain().signature == build_chain().signature
    assert build_chain().signature != build_chain(extra_edge=True).signature
    assert build_chain().signature != build_chain(port_response=int).signature


def test_pictures_show_every_node_and_edge() -> None:
    wf = build_chain(extra_edge=True)
    mermaid = wf.to_mermaid()
    assert mermaid.startswith("flowchart TD")
    assert "n_a --> n_b" in mermaid and "n_b --> n_ask" in mermaid and "n_b --> n_a" in mermaid
    dot = wf.to_dot()
    assert '"a" -> "b";' in dot and '"ask" [shape=hexagon]' in dot


def test_as_executor_hook_lets_other_packages_add_nodes() -> None:
    class Wrapper:
        def as_executor(self) -> Counter:
            return Counter("wrapped")

    wf = WorkflowBuilder(start=Wrapper()).build()
    assert wf.start_executor_id == "wrapped"


class Settings(TypedDict):
    retries: int


class Options(ExtTypedDict):  # the kind pydantic needs before Python 3.12
    verbose: bool


class TakesOptions(Executor):
    @handler
    async def on_options(self, options: Options, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(repr(options))


class TakesSettings(Executor):
    @handler
    async def on_settings(self, settings: Settings, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(repr(settings))


class SendsText(Executor):
    @handler
    async def on_text(self, text: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(text)


def test_a_typeddict_is_refused_as_a_message_or_answer_type_by_name() -> None:
    """Its values are plain dicts at run time: no check can route them (it used to crash the
    build with "TypedDict does not support instance and class checks" -- outside tester 45)."""
    from workflow_engine import DefinitionError

    with pytest.raises(DefinitionError, match=r"Settings is a TypedDict"):
        WorkflowBuilder("w", start=TakesSettings("t")).build()
    with pytest.raises(DefinitionError, match=r"Options is a TypedDict"):
        WorkflowBuilder("w", start=TakesOptions("t")).build()
    with pytest.raises(DefinitionError, match=r"request port 'ask'.*Settings is a TypedDict"):
        RequestPort("ask", request_type=str, response_type=Settings)


class Plain:
    """A class pydantic has no schema for: its values cannot be stored."""

    def __init__(self, x: int = 1) -> None:
        self.x = x


class Sized(Protocol):
    def size(self) -> int: ...


UserId = NewType("UserId", int)


@runtime_checkable
class RuntimeSized(Protocol):
    def size(self) -> int: ...


def asking_for(answer_type: Any) -> Executor:
    """An executor that asks with ``request_info`` and takes answers of ``answer_type``."""

    class Asker(Executor):
        @handler
        async def ask(self, text: str, ctx: WorkflowContext[Never, str]) -> None:
            await ctx.request_info(text, answer_type)

        @response_handler
        async def answered(
            self, question: str, answer: object, ctx: WorkflowContext[Never, str]
        ) -> None:
            await ctx.yield_output("answered")

    Asker.answered.__annotations__["answer"] = answer_type  # (a local: no string can name it)
    return Asker("asker")


@pytest.mark.parametrize(
    ("answer_type", "said"),
    [
        (Settings, "Settings is a TypedDict"),
        (list[Settings], "Settings is a TypedDict"),
        (Sized, "Sized is a Protocol not marked @runtime_checkable"),
        (UserId, "UserId is a NewType, whose values are plain int"),
        (Annotated[int, "positive"], "is not supported as a message or answer type"),
        (Plain, "expects answers of .*Plain, which cannot be stored"),
        (type, "expects answers of type, which cannot be stored"),
        (Callable[[], int], "which cannot be stored: .*Callable.* holds classes or functions"),
        (Callable, "which cannot be stored: .*Callable holds classes or functions"),
        (RuntimeSized, "which cannot be stored: .*RuntimeSized is a Protocol"),
    ],
)
def test_an_answer_type_no_answer_can_have_is_refused_at_build(answer_type: Any, said: str) -> None:
    """The build was taken, the run paused and a person was asked -- and every answer was
    refused, with bare pydantic and Python errors (outside tester 147). The build refuses it
    now, naming the handler; a request port the same."""
    with pytest.raises(DefinitionError, match=said):
        WorkflowBuilder("w", start=asking_for(answer_type)).build()
    start, sink = SendsText("start"), Sink("sink")
    by_port = said.replace("expects", "request port 'ask' expects")
    with pytest.raises(DefinitionError, match=f"request port 'ask': its answer type: |{by_port}"):
        port = RequestPort("ask", request_type=str, response_type=answer_type)
        WorkflowBuilder("w", start=start).add_edge(start, port).add_edge(port, sink).build()


class Sink(Executor):
    @handler
    async def take(self, anything: Any, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output("taken")


def test_two_handlers_of_one_type_an_executor_without_handlers_are_refused_at_build() -> None:
    """Two handlers for ``int``: the first took every int, the second never ran; an executor
    with no handler built and failed at run time, "it accepts " nothing (outside tester 149).
    Both are refused when built, naming the handlers or the executor."""

    class Twice(Executor):
        @handler
        async def first(self, n: int, ctx: WorkflowContext[Never, str]) -> None: ...

        @handler
        async def second(self, n: int, ctx: WorkflowContext[Never, str]) -> None: ...

    class Mute(Executor):
        pass

    with pytest.raises(DefinitionError, match=r"Twice.first and .*Twice.second both take int"):
        WorkflowBuilder("w", start=Twice("twice")).build()
    start = SendsText("start")
    with pytest.raises(DefinitionError, match=r"executor 'mute' \(Mute\) has no @handler"):
        WorkflowBuilder("w", start=start).add_edge(start, Mute("mute")).build()


def test_a_handler_whose_context_is_not_annotated_takes_a_bare_context() -> None:
    """It was refused as "expected a WorkflowContext[...] annotation, got typing.Any", naming
    no handler (outside tester 149); a context annotated otherwise is refused naming it."""

    class Bare(Executor):
        @handler
        async def take(self, text: str, ctx) -> None:  # type: ignore[no-untyped-def]
            pass

    class Wrong(Executor):
        @handler
        async def take(self, text: str, ctx: int) -> None: ...

    assert WorkflowBuilder("w", start=Bare("bare")).build().start_executor_id == "bare"
    with pytest.raises(DefinitionError, match=r"handler .*Wrong.take: expected a WorkflowContext"):
        WorkflowBuilder("w", start=Wrong("wrong")).build()


def test_a_built_workflow_s_name_and_signature_cannot_be_changed() -> None:
    """Renamed after ``build()`` (or after ``register``), a workflow stored its runs under a
    name no process had registered, or one the builder refuses (outside tester 147); a
    signature set by hand let a run continue on another graph (outside tester 151)."""
    workflow = WorkflowBuilder("w", start=SendsText("start")).build()
    with pytest.raises(AttributeError):
        workflow.name = "renamed"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        workflow.signature = "0" * 16  # type: ignore[misc]
    assert workflow.name == "w"


async def _picks(message: Any, targets: list[str]) -> list[str]:
    return targets


def test_an_async_fan_out_selection_is_refused() -> None:
    """It was never awaited: the run failed on "a coroutine" with a RuntimeWarning."""
    start = SendsText("start")
    with pytest.raises(UsageError, match="selection_func must be a plain function"):
        WorkflowBuilder("w", start=start).add_fan_out_edges(start, [Sink("a")], _picks)


def test_handler_definitions_that_could_never_run_are_refused_at_build() -> None:
    """Each built and then silently did something else (outside tester 151): a subclass's plain
    method over a base's handler (the base's ran), a handler with a parameter no one gives
    (every message failed it with a bare TypeError), two response handlers for one request and
    answer (the second never ran)."""

    class Base(Executor):
        @handler
        async def take(self, text: str, ctx: WorkflowContext[Never, str]) -> None: ...

    class Overrides(Base):
        async def take(self, text: str, ctx: WorkflowContext[Never, str]) -> None: ...  # type: ignore[override]

    class Extra(Executor):
        @handler
        async def take(self, text: str, ctx: WorkflowContext[Never, str], more: int) -> None: ...

    class AnswersTwice(Executor):
        @handler
        async def ask(self, text: str, ctx: WorkflowContext[Never, str]) -> None: ...

        @response_handler
        async def first(self, q: str, a: bool, ctx: WorkflowContext[Never, str]) -> None: ...

        @response_handler
        async def second(self, q: str, a: bool, ctx: WorkflowContext[Never, str]) -> None: ...

    said = r"Overrides.take overrides the handler .*Base.take without @handler"
    with pytest.raises(DefinitionError, match=said):
        WorkflowBuilder("w", start=Overrides("o")).build()
    with pytest.raises(DefinitionError, match=r"its parameter\(s\) more would never be given"):
        WorkflowBuilder("w", start=Extra("e")).build()
    with pytest.raises(DefinitionError, match=r"AnswersTwice.first and .*second both take"):
        WorkflowBuilder("w", start=AnswersTwice("a")).build()


@runtime_checkable
class HasOk(Protocol):
    ok: bool


class Decision(BaseModel):
    ok: bool


class SendsDecision(Executor):
    @handler
    async def go(self, text: str, ctx: WorkflowContext[Decision]) -> None:
        await ctx.send_message(Decision(ok=True))


class TakesHasOk(Executor):
    @handler
    async def take(self, decision: HasOk, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(f"ok={decision.ok}")


class AsksWithRoom(Executor):
    """Asks for a ``Decision``; its answer handler takes ``Decision | None``, has a parameter
    of its own with a default, and the ask is also reachable under an older name."""

    @handler
    async def ask(self, text: str, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.request_info(text, Decision)

    older_name = ask

    @response_handler
    async def answered(
        self,
        question: str,
        answer: Decision | None,
        ctx: WorkflowContext[Never, str],
        tag: str = "t",
        **more: Any,
    ) -> None:
        await ctx.yield_output(f"{question}: {answer} {tag}")


@pytest.mark.anyio
async def test_what_the_new_checks_must_still_take() -> None:
    """Valid workflows the checks refused (outside tester 152): a runtime-checkable Protocol
    with data members as a message type (a bare TypeError out of build()), a handler under a
    second name (two handlers "for one type"), a response handler with a defaulted parameter
    or ``**kwargs`` of its own, and a request whose answer type appears only inside the
    handler's annotation (``Decision | None``: the run failed as declared nowhere)."""
    start = SendsDecision("start")
    protocol = WorkflowBuilder("p", start=start).add_edge(start, TakesHasOk("take")).build()
    assert (await protocol.run("x")).outputs == ["ok=True"]
    asks = WorkflowBuilder("a", start=AsksWithRoom("asks")).build()
    paused = await asks.run("q")
    (request,) = paused.pending_requests
    done = await asks.run(
        checkpoint=paused.checkpoint, responses={request.request_id: {"ok": True}}
    )
    assert done.outputs == ["q: ok=True t"]


@dataclass
class _Event:
    n: int = 0


@dataclass
class _Created(_Event):
    pass


@dataclass
class _Deleted(_Event):
    pass


class _Emits(Executor):
    @handler
    async def emit(self, n: int, ctx: WorkflowContext[_Event]) -> None:
        await ctx.send_message(_Created() if n else _Deleted())


class _OnCreated(Executor):
    @handler
    async def on(self, e: _Created, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output("created")


class _OnDeleted(Executor):
    @handler
    async def on(self, e: _Deleted, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output("deleted")


@pytest.mark.anyio
async def test_an_edge_from_a_base_class_sender_to_a_subclass_handler_carries_it() -> None:
    """It was refused as one that "can never carry a message" (outside tester 170)."""
    source = _Emits("source")
    wf = (
        WorkflowBuilder(start=source)
        .register_types(_Created, _Deleted)
        .add_switch_case_edge_group(
            source,
            [
                Case(condition=lambda e: isinstance(e, _Created), target=_OnCreated("c")),
                Default(target=_OnDeleted("d")),
            ],
        )
        .build()
    )
    assert (await wf.run(1)).outputs == ["created"]
    assert (await wf.run(0)).outputs == ["deleted"]


def test_a_callable_answer_type_is_refused_as_a_definition_not_an_edge_mismatch() -> None:
    """It was an ``EdgeTypeMismatchError`` naming the same type twice (outside tester 170)."""
    from collections.abc import Callable

    class TakesFunctions(Executor):
        @handler
        async def on(self, f: Callable[[int], int], ctx: WorkflowContext[Never]) -> None: ...

    port = RequestPort("port", int, Callable[[int], int])
    with pytest.raises(
        DefinitionError, match="request port 'port' expects answers of .*which cannot be stored"
    ):
        WorkflowBuilder(start=Counter("c")).add_edge("c", port).add_edge(
            port, TakesFunctions("t")
        ).build()


class _HoldsAFunction(BaseModel):
    f: Callable[[], int]


class _WrapsIt(BaseModel):
    inner: list[_HoldsAFunction]


class _TakesWrapped(Executor):
    @handler
    async def on(self, a: _WrapsIt, ctx: WorkflowContext[Never]) -> None: ...


def test_an_answer_model_with_a_callable_field_is_refused_when_built() -> None:
    """A ``Callable`` answer type was refused, a model holding one as a field was not: the
    run asked, and no answer could ever be given (outside tester 173)."""
    port = RequestPort("port", int, _WrapsIt)
    with pytest.raises(DefinitionError, match=r"expects answers of .*_WrapsIt.*cannot be stored"):
        WorkflowBuilder(start=Counter("c")).add_edge("c", port).add_edge(
            port, _TakesWrapped("t")
        ).build()
