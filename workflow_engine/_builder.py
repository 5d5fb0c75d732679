"""WorkflowBuilder: compose executors, request ports and edges; ``build()`` validates the graph."""

from __future__ import annotations

import collections
import inspect
import itertools
from collections.abc import Callable, Sequence
from typing import Any, get_args, get_origin

from ._codec import is_text
from ._errors import (
    DefinitionError,
    DuplicateExecutorError,
    EdgeTypeMismatchError,
    FanInTypeMismatchError,
    GraphValidationError,
    MissingStartError,
    UnknownExecutorError,
    UnreachableExecutorError,
    UsageError,
    shown,
)
from ._executor import Executor
from ._graph import Case, Default, EdgeGroup, Graph, Node, Predicate
from ._requests import RequestPort
from ._types import is_assignable, type_name
from ._workflow import Workflow

NodeLike = Any
"""An Executor, a RequestPort, an object with ``as_executor()`` (e.g. an agent), or a node id."""


MAX_WORKFLOW_NAME = 200
"""Characters in a workflow's name (the stores' column is that wide)."""


class WorkflowBuilder:
    """Build a :class:`Workflow` from workflow_engine.executors and edges.

    Nodes join the graph when an edge (or ``add_executor``) first mentions them; later mentions may
    use the node itself or its id. Loops are allowed.
    """

    def __init__(self, name: str = "workflow", start: NodeLike | None = None) -> None:
        # runs are stored and found by it: bytes were stored as such, and every listing of the
        # database then refused the row as damage (outside tester 143)
        if not isinstance(name, str) or not name.strip():
            raise UsageError(
                f"a workflow needs a name that is non-empty text, not {shown(name, 60)}"
            )
        if len(name) > MAX_WORKFLOW_NAME:
            raise UsageError(
                f"a workflow's name is at most {MAX_WORKFLOW_NAME} characters, not "
                f"{len(name):,} ({shown(name, 60)})"
            )
        self.name = name
        self._nodes: dict[str, Node] = {}
        self._pending_ids: list[str] = []
        self._groups: list[EdgeGroup] = []
        self._problems: list[Exception] = []
        self._types: list[tuple[type, str | None]] = []
        self._start: str | None = None
        self.max_supersteps = 100
        if start is not None:
            self.set_start_executor(start)

    # --- nodes ----------------------------------------------------------------------------------

    def add_executor(self, node: NodeLike) -> WorkflowBuilder:
        self._node_id(node)
        return self

    def set_start_executor(self, node: NodeLike) -> WorkflowBuilder:
        self._start = self._node_id(node)
        return self

    def register_types(self, *types: type, name: str | None = None) -> WorkflowBuilder:
        """Allow values of these classes in state, messages or outputs beyond the annotations."""
        if name is not None and len(types) != 1:
            raise UsageError("name= can only be given when registering one type")
        if name is not None and (
            not isinstance(name, str) or not name.strip() or not is_text(name)
        ):
            # (an empty one fell back to the class's own name, silently: outside tester 170)
            raise UsageError(f"register_types: name= is a tag (non-blank text), not {name!r}")
        for t in types:
            if not isinstance(t, type):
                raise UsageError(
                    f"register_types takes classes, not {type_name(t)}: register the classes in "
                    "it; a request that expects answers of this type needs it in the annotation "
                    "of a @response_handler's answer parameter"
                )
        self._types.extend((t, name) for t in types)
        return self

    def with_max_supersteps(self, limit: int) -> WorkflowBuilder:
        from ._workflow import check_max_supersteps

        check_max_supersteps(limit)
        self.max_supersteps = limit
        return self

    def _node_id(self, node: NodeLike) -> str:
        if isinstance(node, str):
            if node not in self._nodes:
                self._pending_ids.append(node)
            return node
        if not isinstance(node, Executor | RequestPort) and hasattr(node, "as_executor"):
            node = node.as_executor()
        if not isinstance(node, Executor | RequestPort):
            raise DefinitionError(
                f"expected an Executor, RequestPort or node id, got {type(node).__name__}"
            )
        known = self._nodes.get(node.id)
        if known is None:
            self._nodes[node.id] = node
        elif known is not node and not _same_agent_host(known, node):
            self._problems.append(
                DuplicateExecutorError(
                    f"two different nodes use the id {node.id!r} ({known!r} and {node!r})"
                )
            )
        return node.id

    # --- edges ----------------------------------------------------------------------------------

    def _group(self, kind: str, sources: Sequence[str], targets: Sequence[str], **kw: Any) -> None:
        gid = f"{kind}:{','.join(sources)}->{','.join(targets)}#{len(self._groups)}"
        self._groups.append(EdgeGroup(gid, kind, tuple(sources), tuple(targets), **kw))

    def add_edge(
        self, source: NodeLike, target: NodeLike, condition: Predicate | None = None
    ) -> WorkflowBuilder:
        """Deliver ``source``'s messages to ``target`` (only those where ``condition`` holds)."""
        if condition is not None:
            _check_callable(condition, "add_edge: condition")
        self._group("single", [self._node_id(source)], [self._node_id(target)], condition=condition)
        return self

    def add_fan_out_edges(
        self,
        source: NodeLike,
        targets: Sequence[NodeLike],
        selection_func: Callable[[Any, list[str]], list[str]] | None = None,
    ) -> WorkflowBuilder:
        """Deliver each message to every target (or to the ids ``selection_func`` picks)."""
        if selection_func is not None:
            _check_callable(selection_func, "add_fan_out_edges: selection_func")
            if inspect.iscoroutinefunction(selection_func):  # (never awaited: tester 151)
                raise UsageError(
                    "add_fan_out_edges: selection_func must be a plain function (it picks the "
                    "targets as a message is routed), not an async one"
                )
        given = _listed(targets, "add_fan_out_edges", "targets")
        ids = _distinct([self._node_id(t) for t in given], "add_fan_out_edges", "target")
        self._group("fan_out", [self._node_id(source)], ids, selection=selection_func)
        return self

    def add_switch_case_edge_group(
        self, source: NodeLike, cases: Sequence[Case | Default]
    ) -> WorkflowBuilder:
        """Route each message to the first ``Case`` whose predicate holds, else the ``Default``."""
        preds: list[Predicate] = []
        targets: list[str] = []
        default: str | None = None
        for case in _listed(cases, "add_switch_case_edge_group", "cases"):
            if not isinstance(case, Case | Default):
                raise UsageError(
                    "add_switch_case_edge_group: each case is a Case or a Default, not "
                    f"{type(case).__name__} ({shown(case, 60)})"
                )
            if isinstance(case, Default):
                if default is not None:
                    raise UsageError("a switch-case group takes at most one Default")
                default = self._node_id(case.target)
            else:
                _check_callable(case.condition, "add_switch_case_edge_group: a Case's condition")
                preds.append(case.condition)
                targets.append(self._node_id(case.target))
        if not cases:
            raise UsageError("add_switch_case_edge_group needs at least one Case or Default")
        if default is not None:
            targets.append(default)
        self._group("switch", [self._node_id(source)], targets, cases=tuple(preds))
        return self

    def add_fan_in_edges(self, sources: Sequence[NodeLike], target: NodeLike) -> WorkflowBuilder:
        """``target`` receives one ``list`` of messages once every source has sent."""
        given = _listed(sources, "add_fan_in_edges", "sources")
        ids = _distinct([self._node_id(s) for s in given], "add_fan_in_edges", "source")
        self._group("fan_in", ids, [self._node_id(target)])
        return self

    def add_chain(self, nodes: Sequence[NodeLike]) -> WorkflowBuilder:
        """``a → b → c ...`` with plain edges."""
        ids = [self._node_id(n) for n in _listed(nodes, "add_chain", "nodes")]
        for a, b in itertools.pairwise(ids):
            self._group("single", [a], [b])
        return self

    # --- build ----------------------------------------------------------------------------------

    def build(self) -> Workflow:
        """Validate and freeze the graph; raises the first ``GraphValidationError`` found."""
        for problem in self._problems:
            raise problem
        for node_id in self._pending_ids:
            if node_id not in self._nodes:
                raise UnknownExecutorError(
                    f"workflow {self.name!r} refers to {node_id!r}, which is not an executor or "
                    f"port of this builder (known: {', '.join(sorted(self._nodes)) or 'none'})"
                )
        for name in (self.name, *self._nodes):
            if not is_text(name):
                raise DefinitionError(
                    f"the name {name!r} is not valid Unicode text (a lone surrogate): workflow "
                    "and executor names are stored"
                )
        if self._start is None:
            raise MissingStartError(
                f"workflow {self.name!r} has no start executor; pass start=... to WorkflowBuilder"
            )
        if isinstance(self._nodes.get(self._start), RequestPort):
            raise GraphValidationError(
                f"workflow {self.name!r} starts at request port {self._start!r}: the start node "
                "must be an executor (its handlers take the run's input); start at an executor "
                "that sends to the port"
            )
        nodes = list(self._nodes.values())
        for node in nodes:
            if isinstance(node, Executor):
                node._renew_handlers()
                if not node.handlers:  # (it failed only at run time, "it accepts " nothing)
                    raise DefinitionError(
                        f"workflow {self.name!r}: executor {node.id!r} "
                        f"({type(node).__name__}) has no @handler, so no message can reach it"
                    )
        _check_ports_lead_somewhere(self.name, self._nodes, self._groups)
        for group in self._groups:
            _check_group_types(self._nodes, group)
        _check_reachable(self.name, self._nodes, self._start, self._groups)
        graph = Graph.create(nodes, self._start, self._groups)
        return Workflow(
            name=self.name,
            graph=graph,
            extra_types=list(self._types),
            max_supersteps=self.max_supersteps,
        )


def _check_callable(value: Any, what: str) -> None:
    if not callable(value):
        raise UsageError(
            f"{what} must be callable, not {type(value).__name__} ({shown(value, 60)})"
        )


def _listed(given: Any, method: str, what: str) -> list[Any]:
    """``given`` as a list, if it is a list or a tuple (``None`` was a bare TypeError, and a
    string of ten million characters a list of as many one-letter ids: tester 143)."""
    if not isinstance(given, list | tuple):
        raise UsageError(
            f"{method}: {what} is a list of executors (or their ids), not "
            f"{type(given).__name__} ({shown(given, 60)})"
        )
    return list(given)


def _distinct(ids: list[str], method: str, role: str) -> list[str]:
    """``ids`` if no id is named twice (a fan-in listing a source twice delivered each of its
    messages once per listing, squared)."""
    counted = collections.Counter(ids)  # (``ids.count`` per id was quadratic: tester 143)
    twice = sorted(i for i, n in counted.items() if n > 1)
    if twice:
        raise UsageError(f"{method}: {role} {', '.join(map(repr, twice))} is named more than once")
    if not ids:
        raise UsageError(f"{method} needs at least one {role}")
    return ids


def _check_ports_lead_somewhere(
    name: str, nodes: dict[str, Node], groups: Sequence[EdgeGroup]
) -> None:
    """A request port sends each answer it gets to its successors: one without any would take
    a person's answer and then fail the run, which could not go on."""
    sources = {s for g in groups for s in g.sources}
    for node_id, node in nodes.items():
        if isinstance(node, RequestPort) and node_id not in sources:
            raise GraphValidationError(
                f"workflow {name!r}: request port {node_id!r} has no outgoing edge, so the "
                "answers it gets would have nowhere to go; add an edge from it to the executor "
                "that handles them"
            )


def _same_agent_host(a: Node, b: Node) -> bool:
    """Two wrappers of the same agent (``as_executor()`` called twice) are one node."""
    wrapped = getattr(a, "wrapped", None)
    return wrapped is not None and wrapped is getattr(b, "wrapped", None)


def _outputs(node: Node) -> tuple[Any, ...]:
    return node.output_types


def _inputs(node: Node) -> tuple[Any, ...]:
    return node.input_types


def _names(types: Sequence[Any]) -> str:
    return " | ".join(type_name(t) for t in types) or "nothing"


def _check_group_types(nodes: dict[str, Node], group: EdgeGroup) -> None:
    if group.kind == "fan_in":
        _check_fan_in(nodes, group)
        return
    (source_id,) = group.sources
    source = nodes[source_id]
    outs = _outputs(source)
    for target_id in group.targets:
        ins = _inputs(nodes[target_id])
        # (either way: an edge from a sender of ``Event`` to a handler of its subclass
        # ``Created`` carries the ``Created`` events -- it was refused: outside tester 170)
        if not any(is_assignable(o, i) or is_assignable(i, o) for o in outs for i in ins):
            raise EdgeTypeMismatchError(
                f"edge {source_id!r} → {target_id!r} can never carry a message: {source_id!r} "
                f"sends {_names(outs)} but {target_id!r} accepts {_names(ins)}"
            )


def _check_fan_in(nodes: dict[str, Node], group: EdgeGroup) -> None:
    (target_id,) = group.targets
    ins = _inputs(nodes[target_id])
    elements = [
        (get_args(t) or (Any,))[0] for t in ins if get_origin(t) is list or t is list or t is Any
    ]
    if not elements:
        raise FanInTypeMismatchError(
            f"fan-in into {target_id!r} delivers a list, but {target_id!r} accepts "
            f"{_names(ins)}; give it a handler for list[...]"
        )
    for source_id in group.sources:
        outs = _outputs(nodes[source_id])
        if not any(is_assignable(o, e) for o in outs for e in elements):
            raise FanInTypeMismatchError(
                f"fan-in sources disagree: {source_id!r} sends {_names(outs)}, but {target_id!r} "
                f"takes list[{_names(elements)}]"
            )


def _check_reachable(
    name: str, nodes: dict[str, Node], start: str, groups: Sequence[EdgeGroup]
) -> None:
    """Every node must be reachable from ``start`` along the edges (a plain graph search: no
    graph library on the build path, which a restarting process pays for)."""
    successors: dict[str, list[str]] = {}
    for group in groups:
        for source in group.sources:
            successors.setdefault(source, []).extend(group.targets)
    reachable = {start}
    todo = [start]
    while todo:
        for target in successors.get(todo.pop(), ()):
            if target not in reachable:
                reachable.add(target)
                todo.append(target)
    unreachable = [n for n in nodes if n not in reachable]
    if unreachable:
        raise UnreachableExecutorError(
            f"workflow {name!r}: {', '.join(repr(n) for n in unreachable)} cannot be reached from "
            f"the start executor {start!r}"
        )
