"""Graph validation, signatures and pictures."""

from __future__ import annotations

from typing import Never

import pytest
from pydantic import BaseModel

from workflow_engine import (
    DuplicateExecutorError,
    EdgeTypeMismatchError,
    Executor,
    FanInTypeMismatchError,
    GraphValidationError,
    MissingStartError,
    RequestPort,
    UnknownExecutorError,
    UnreachableExecutorError,
    WorkflowBuilder,
    WorkflowContext,
    handler,
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
