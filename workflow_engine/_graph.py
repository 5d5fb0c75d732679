"""The immutable graph a builder produces: nodes in declaration order and edge groups."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._executor import Executor, FunctionExecutor
from ._requests import RequestPort
from ._types import type_name

Predicate = Callable[[Any], "bool | Awaitable[bool]"]
Node = Executor | RequestPort


@dataclass(frozen=True, slots=True)
class Case:
    """A switch-case branch: messages for which ``condition`` holds go to ``target``."""

    condition: Predicate
    target: Any


@dataclass(frozen=True, slots=True)
class Default:
    """The switch-case branch taken when no ``Case`` matched."""

    target: Any


@dataclass(frozen=True, slots=True)
class EdgeGroup:
    """How messages from ``sources`` reach ``targets``.

    kind ``single``: one edge, optional condition. ``fan_out``: every target (or those chosen by
    ``selection``). ``switch``: the first case whose predicate holds, else the default (the last
    target). ``fan_in``: the target receives one ``list`` once every source has sent.
    """

    id: str
    kind: str
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    condition: Predicate | None = None
    cases: tuple[Predicate, ...] = ()
    selection: Callable[[Any, list[str]], list[str]] | None = None


@dataclass(frozen=True)
class Graph:
    """The validated graph ``WorkflowBuilder.build`` makes: nodes in a fixed order, edges."""

    nodes: dict[str, Node]
    order: dict[str, int]
    start_id: str
    edge_groups: tuple[EdgeGroup, ...]
    outgoing: dict[str, tuple[EdgeGroup, ...]] = field(default_factory=dict)
    successors: dict[str, frozenset[str]] = field(default_factory=dict)
    conditional: dict[str, tuple[EdgeGroup, ...]] = field(default_factory=dict)
    """Per source: the groups whose routing needs a predicate evaluated."""

    @classmethod
    def create(cls, nodes: Sequence[Node], start_id: str, groups: Sequence[EdgeGroup]) -> Graph:
        by_id = {n.id: n for n in nodes}
        outgoing: dict[str, list[EdgeGroup]] = {n.id: [] for n in nodes}
        successors: dict[str, set[str]] = {n.id: set() for n in nodes}
        for g in groups:
            for s in g.sources:
                outgoing[s].append(g)
                successors[s].update(g.targets)
        return cls(
            nodes=by_id,
            order={n.id: i for i, n in enumerate(nodes)},
            start_id=start_id,
            edge_groups=tuple(groups),
            outgoing={k: tuple(v) for k, v in outgoing.items()},
            successors={k: frozenset(v) for k, v in successors.items()},
            conditional={
                k: tuple(
                    g
                    for g in v
                    if (g.kind == "single" and g.condition is not None) or g.kind == "switch"
                )
                for k, v in outgoing.items()
            },
        )

    def structure(self) -> dict[str, Any]:
        """A canonical, JSON-able description of the structure (the signature's input)."""
        nodes: list[dict[str, Any]] = []
        for node in self.nodes.values():
            if isinstance(node, RequestPort):
                nodes.append(
                    {
                        "id": node.id,
                        "kind": "port",
                        "request": type_name(node.request_type),
                        "response": type_name(node.response_type),
                    }
                )
            else:
                nodes.append(
                    {
                        "id": node.id,
                        "kind": "executor",
                        "class": executor_class_name(node),
                        "inputs": sorted(type_name(t) for t in node.input_types),
                    }
                )
        edges = [
            {
                "kind": g.kind,
                "sources": list(g.sources),
                "targets": list(g.targets),
                "conditional": g.condition is not None,
                "cases": len(g.cases),
            }
            for g in self.edge_groups
        ]
        return {"start": self.start_id, "nodes": nodes, "edges": edges}

    def signature(self) -> str:
        text = json.dumps(self.structure(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    # --- pictures -------------------------------------------------------------------------------

    def to_mermaid(self) -> str:
        lines = ["flowchart TD"]
        for node in self.nodes.values():
            label = node.id + (" ⏸" if isinstance(node, RequestPort) else "")
            shape = ("{{", "}}") if isinstance(node, RequestPort) else ("[", "]")
            start = ":::start" if node.id == self.start_id else ""
            lines.append(f'    {_mid(node.id)}{shape[0]}"{label}"{shape[1]}{start}')
        for g in self.edge_groups:
            for s in g.sources:
                for i, t in enumerate(g.targets):
                    lines.append(f"    {_mid(s)} {_mermaid_arrow(g, i)} {_mid(t)}")
        lines.append("    classDef start stroke-width:3px")
        return "\n".join(lines) + "\n"

    def to_dot(self) -> str:
        lines = [f'digraph "{self.start_id}" {{', "    rankdir=TB;"]
        for node in self.nodes.values():
            attrs = ["shape=hexagon" if isinstance(node, RequestPort) else "shape=box"]
            if node.id == self.start_id:
                attrs.append("penwidth=2")
            lines.append(f'    "{node.id}" [{", ".join(attrs)}];')
        for g in self.edge_groups:
            for s in g.sources:
                for i, t in enumerate(g.targets):
                    label = _edge_label(g, i)
                    style = f' [label="{label}", style=dashed]' if label else ""
                    lines.append(f'    "{s}" -> "{t}"{style};')
        lines.append("}")
        return "\n".join(lines) + "\n"


def executor_class_name(node: Executor) -> str:
    if isinstance(node, FunctionExecutor):
        return node.class_name
    cls = type(node)
    return f"{cls.__module__}.{cls.__qualname__}"


def _mid(node_id: str) -> str:
    return "n_" + "".join(c if c.isalnum() else "_" for c in node_id)


def _edge_label(g: EdgeGroup, index: int) -> str:
    if g.kind == "single" and g.condition is not None:
        return "if"
    if g.kind == "switch":
        return f"case {index}" if index < len(g.cases) else "default"
    if g.kind == "fan_in":
        return "fan-in"
    return ""


def _mermaid_arrow(g: EdgeGroup, index: int) -> str:
    label = _edge_label(g, index)
    return f"-. {label} .->" if label else "-->"
