"""The pure planner on plain data: which executors run and where messages go."""

from __future__ import annotations

from typing import Never

import pytest

from workflow_engine import (
    Case,
    Default,
    Executor,
    MessageNotHandledError,
    RequestPort,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)
from workflow_engine._planner import (
    Envelope,
    Send,
    conditional_groups,
    deliver,
    plan_superstep,
    targets_for,
)


class IntSink(Executor):
    @handler
    async def take(self, n: int, ctx: WorkflowContext[Never, int]) -> None: ...


class StrSink(Executor):
    @handler
    async def take(self, s: str, ctx: WorkflowContext) -> None: ...


class ListSink(Executor):
    @handler
    async def take(self, items: list[int], ctx: WorkflowContext[Never, int]) -> None: ...


class Source(Executor):
    @handler
    async def take(self, n: int, ctx: WorkflowContext[int | str]) -> None: ...


def graph_of(builder: WorkflowBuilder):
    return builder.build().graph


def test_plan_groups_inbox_by_target_in_graph_order() -> None:
    src, a, b = Source("src"), IntSink("a"), IntSink("b")
    graph = graph_of(WorkflowBuilder(start=src).add_fan_out_edges(src, [a, b]))
    inbox = [Envelope("src", "b", 1), Envelope("src", "a", 2), Envelope("src", "b", 3)]
    plan = plan_superstep(graph, inbox)
    assert [(t, [e.data for e in envs]) for t, envs in plan] == [("a", [2]), ("b", [1, 3])]


def test_type_based_routing_picks_the_target_that_accepts() -> None:
    src, ints, strs = Source("src"), IntSink("ints"), StrSink("strs")
    graph = graph_of(WorkflowBuilder(start=src).add_edge(src, ints).add_edge(src, strs))
    d = deliver(graph, [Send("src", 5), Send("src", "five")], [{}, {}], {})
    assert [(e.target_id, e.data) for e in d.inbox] == [("ints", 5), ("strs", "five")]


def test_message_no_target_accepts_is_an_error() -> None:
    src, ints = Source("src"), IntSink("ints")
    graph = graph_of(WorkflowBuilder(start=src).add_edge(src, ints))
    with pytest.raises(MessageNotHandledError, match="'src' sent str.*'ints'"):
        deliver(graph, [Send("src", "x")], [{}], {})


def test_message_from_executor_without_edges_is_an_error() -> None:
    src = Source("src")
    graph = graph_of(WorkflowBuilder(start=src))
    with pytest.raises(MessageNotHandledError, match="no outgoing edges"):
        deliver(graph, [Send("src", 1)], [{}], {})


def test_false_condition_routes_nowhere_without_error() -> None:
    src, ints = Source("src"), IntSink("ints")
    graph = graph_of(WorkflowBuilder(start=src).add_edge(src, ints, condition=lambda n: n > 3))
    (group,) = conditional_groups(graph, "src")
    assert deliver(graph, [Send("src", 1)], [{group.id: False}], {}).inbox == []
    assert len(deliver(graph, [Send("src", 9)], [{group.id: True}], {}).inbox) == 1


def test_switch_case_uses_the_chosen_case_and_default() -> None:
    src, a, b, c = Source("src"), IntSink("a"), IntSink("b"), IntSink("c")
    builder = WorkflowBuilder(start=src).add_switch_case_edge_group(
        src, [Case(lambda n: n < 0, a), Case(lambda n: n == 0, b), Default(c)]
    )
    graph = graph_of(builder)
    (group,) = conditional_groups(graph, "src")
    assert targets_for(graph, Send("src", 1), {group.id: 1}) == [(group, "b")]
    assert targets_for(graph, Send("src", 1), {group.id: 2}) == [(group, "c")]


def test_explicit_target_restricts_delivery() -> None:
    src, a, b = Source("src"), IntSink("a"), IntSink("b")
    graph = graph_of(WorkflowBuilder(start=src).add_fan_out_edges(src, [a, b]))
    d = deliver(graph, [Send("src", 1, target_id="b")], [{}], {})
    assert [e.target_id for e in d.inbox] == ["b"]


def test_fan_in_waits_for_every_source_then_delivers_one_list_in_source_order() -> None:
    start, a, b, sink = Source("start"), Source("a"), Source("b"), ListSink("sink")
    builder = (
        WorkflowBuilder(start=start).add_fan_out_edges(start, [a, b]).add_fan_in_edges([a, b], sink)
    )
    graph = graph_of(builder)
    first = deliver(graph, [Send("b", 2)], [{}], {})
    assert first.inbox == [] and list(first.fan_in.values()) == [{"b": [2]}]
    second = deliver(graph, [Send("a", 1)], [{}], first.fan_in)
    assert [(e.target_id, e.data) for e in second.inbox] == [("sink", [1, 2])]
    assert second.fan_in == {}
    assert first.fan_in != {}  # the input buffers were copied, not mutated


def test_messages_to_a_port_become_port_messages() -> None:
    src = Source("src")
    port = RequestPort("ask", request_type=int, response_type=str)
    graph = graph_of(WorkflowBuilder(start=src).add_edge(src, port).add_edge(port, StrSink("s")))
    d = deliver(graph, [Send("src", 4)], [{}], {})
    assert d.inbox == [] and [(e.target_id, e.data) for e in d.port_messages] == [("ask", 4)]
