"""The pure superstep planner: which executors run, and where each sent message goes.

Plain functions over plain data: no ``await``, no clock, no I/O. Edge conditions may be async user
code, so the loop evaluates them first (:func:`conditional_groups` says which) and hands the
verdicts in; everything else is decided here, deterministically:

* messages are delivered in the next superstep ordered by (source position in the graph, send
  order), so timing never changes what an executor sees;
* a message that no candidate target can handle is an error, never a silent drop (a condition that
  routes it nowhere is not a drop: that is the graph's decision).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._errors import EdgeConditionError, MessageNotHandledError, shown
from ._graph import EdgeGroup, Graph
from ._requests import ExternalRequest, RequestPort
from ._types import type_name

NOT_ENCODED: Any = object()


@dataclass(slots=True)
class Envelope:
    """A message in flight to ``target_id``. ``request`` is set when it answers request_info.

    ``message_id`` is the delivery's deterministic id (see ``_identity``); ``encoded`` is the
    codec's form of ``data`` once the runner has encoded it (each receiver decodes its own copy).
    """

    source_id: str
    target_id: str
    data: Any
    request: ExternalRequest | None = None
    message_id: str = ""
    encoded: Any = NOT_ENCODED


@dataclass(slots=True)
class Send:
    """A message an executor (or a port, for an answer) sent during a superstep.

    ``send_id`` names it deterministically (``_identity.send_id``); each delivery of it gets the
    id ``<send_id>>target``."""

    source_id: str
    data: Any
    target_id: str | None = None
    send_id: str = ""
    encoded: Any = NOT_ENCODED


Verdicts = Mapping[str, Any]
"""Per edge-group id: ``bool`` for a conditional single edge, the chosen case index for a switch."""


@dataclass(slots=True)
class Delivery:
    """Where a superstep's sends went."""

    inbox: list[Envelope] = field(default_factory=list)
    port_messages: list[Envelope] = field(default_factory=list)
    fan_in: dict[str, dict[str, list[Any]]] = field(default_factory=dict)


def plan_superstep(graph: Graph, inbox: Sequence[Envelope]) -> list[tuple[str, list[Envelope]]]:
    """Group the inbox by target, in graph order; each target's messages keep delivery order."""
    if len(inbox) == 1:
        return [(inbox[0].target_id, [inbox[0]])]
    by_target: dict[str, list[Envelope]] = {}
    for env in inbox:
        by_target.setdefault(env.target_id, []).append(env)
    order = graph.order
    return sorted(by_target.items(), key=lambda item: order[item[0]])


def conditional_groups(graph: Graph, source_id: str) -> list[EdgeGroup]:
    """The groups whose routing needs a predicate evaluated for a message from ``source_id``."""
    return list(graph.conditional.get(source_id, ()))


def targets_for(graph: Graph, send: Send, verdicts: Verdicts) -> list[tuple[EdgeGroup, str]]:
    """The (group, target) pairs a message is offered to, before type checks."""
    out: list[tuple[EdgeGroup, str]] = []
    for g in graph.outgoing.get(send.source_id, ()):
        kind = g.kind
        if kind == "single":
            if g.condition is None or verdicts.get(g.id, False):
                out.append((g, g.targets[0]))
        elif kind == "fan_out":
            chosen = list(g.targets)
            if g.selection is not None:
                try:
                    picked = g.selection(send.data, chosen)
                except Exception as exc:
                    raise edge_failed(
                        "the selection of the fan-out", g, send.source_id, exc
                    ) from exc
                chosen = [t for t in g.targets if t in _selected(g, send.source_id, picked)]
            out.extend((g, t) for t in chosen)
        elif kind == "switch":
            index = verdicts.get(g.id)
            if index is not None:
                out.append((g, g.targets[index]))
        else:  # fan_in
            out.append((g, g.targets[0]))
    if send.target_id is not None:
        out = [(g, t) for g, t in out if t == send.target_id]
    return out


def _selected(group: EdgeGroup, source_id: str, picked: Any) -> list[str]:
    """What a fan-out's selection returned, if it is a list of some of its targets: a typo
    dropped the message without a word, a string picked every target whose id is part of it,
    ``None`` was a bare TypeError (outside tester 149)."""
    targets = ", ".join(repr(t) for t in group.targets)
    where = f"the selection of the fan-out {source_id!r} → {targets}"
    if inspect.isawaitable(picked):  # (an async callable object: never awaited)
        if inspect.iscoroutine(picked):
            picked.close()
        raise EdgeConditionError(
            f"{where} returned an awaitable: a selection is a plain function", executor_id=source_id
        )
    if isinstance(picked, str) or not isinstance(picked, list | tuple | set | frozenset):
        raise EdgeConditionError(
            f"{where} returned {shown(picked, 80)}: it returns a list of the ids of the targets "
            "to send to (an empty list: none)",
            executor_id=source_id,
        )
    unknown = [p for p in picked if p not in group.targets]
    if unknown:
        raise EdgeConditionError(
            f"{where} picked {', '.join(shown(p, 60) for p in unknown)}, which "
            f"{'is not one' if len(unknown) == 1 else 'are not'} of its targets",
            executor_id=source_id,
        )
    return list(picked)


def accepts(graph: Graph, target_id: str, message: Any) -> bool:
    node = graph.nodes[target_id]
    if isinstance(node, RequestPort):
        return node.can_handle(message)
    return node.find_handler(message) is not None


def edge_failed(what: str, group: EdgeGroup, source_id: str, exc: Exception) -> EdgeConditionError:
    """The error for an edge's user code (a condition, a selection) that raised: it names the
    edge and its source."""
    targets = ", ".join(repr(t) for t in group.targets)
    return EdgeConditionError(
        f"{what} {source_id!r} → {targets} raised {type(exc).__name__}: {exc}",
        executor_id=source_id,
    )


def deliver(
    graph: Graph,
    sends: Sequence[Send],
    verdicts: Sequence[Verdicts],
    fan_in: Mapping[str, Mapping[str, list[Any]]],
) -> Delivery:
    """Route ``sends`` (already in source/send order) to the next superstep's inbox.

    ``verdicts[i]`` belongs to ``sends[i]``. Fan-in buffers are copied, never mutated.
    """
    result = Delivery(
        fan_in={gid: {s: list(m) for s, m in b.items()} for gid, b in fan_in.items()}
        if fan_in
        else {}
    )
    touched_fan_in: dict[str, tuple[EdgeGroup, str]] = {}  # id -> (group, last send to it)
    for send, verdict in zip(sends, verdicts, strict=True):
        candidates = targets_for(graph, send, verdict)
        if not candidates:
            if not graph.outgoing.get(send.source_id):
                raise MessageNotHandledError(
                    f"{send.source_id!r} sent {type_name(type(send.data))} but has no outgoing "
                    "edges",
                    executor_id=send.source_id,
                )
            continue  # conditions routed it nowhere: the graph's decision, not a drop
        delivered = False
        for group, target in candidates:
            if group.kind == "fan_in":
                delivered = True
                buf = result.fan_in.setdefault(group.id, {})
                buf.setdefault(send.source_id, []).append(send.data)
                touched_fan_in[group.id] = (group, send.send_id)
                continue
            if not accepts(graph, target, send.data):
                continue  # type-based routing: another candidate may take it
            delivered = True
            env = Envelope(
                send.source_id, target, send.data, None, f"{send.send_id}>{target}", send.encoded
            )
            if isinstance(graph.nodes[target], RequestPort):
                result.port_messages.append(env)
            else:
                result.inbox.append(env)
        if not delivered:
            names = ", ".join(repr(t) for _, t in candidates)
            raise MessageNotHandledError(
                f"{send.source_id!r} sent {type_name(type(send.data))}, which none of its targets "
                f"({names}) can handle",
                executor_id=send.source_id,
            )
    for group, last_send in touched_fan_in.values():
        buf = result.fan_in[group.id]
        if all(buf.get(s) for s in group.sources):
            batch = [m for s in group.sources for m in buf[s]]
            (target,) = group.targets
            if not accepts(graph, target, batch):
                raise MessageNotHandledError(
                    f"fan-in into {target!r} produced a list it cannot handle"
                )
            # named after the send that completed it: unique, and the same on re-execution
            result.inbox.append(Envelope(group.id, target, batch, None, f"{last_send}>{target}"))
            del result.fan_in[group.id]
    return result
