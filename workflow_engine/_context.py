"""The context a handler receives: the only way an executor affects the run.

Everything a handler does through the context is collected in an :class:`ExecutorStep` and applied
at the superstep barrier (Pregel/BSP): messages are delivered in the next superstep, state writes
become visible to other executors after the barrier, requests become pending. So a superstep is
all-or-nothing, and what a checkpoint records is exactly what the next superstep sees.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, Never

from typing_extensions import TypeVar

from ._errors import UndeclaredOutputError, UnknownTargetError
from ._events import WorkflowEvent, WorkflowOutputEvent
from ._requests import ExternalRequest
from ._types import Matcher, type_name

if TYPE_CHECKING:
    from ._codec import JsonCodec
    from ._journal import JournalStore

TOut = TypeVar("TOut", default=Never)
TWorkflowOut = TypeVar("TWorkflowOut", default=Never)

_MISSING: Any = object()
REQUEST_NAMESPACE = uuid.UUID("6f1c7a52-8a53-4c0e-9a59-0d6f4ad3b1e1")


def request_id_for(run_id: str, superstep: int, node_id: str, index: int) -> str:
    """Deterministic request ids: a restored run emits the same events as an uninterrupted one."""
    return str(uuid.uuid5(REQUEST_NAMESPACE, f"{run_id}/{superstep}/{node_id}/{index}"))


class ExecutorStep:
    """What one executor did in one superstep; applied at the barrier in executor order."""

    __slots__ = (
        "emit",
        "executor_id",
        "outputs",
        "requests",
        "sent",
        "shared_writes",
        "state",
        "state_writes",
    )

    def __init__(
        self, executor_id: str, state: dict[str, Any], emit: Callable[[WorkflowEvent], None]
    ) -> None:
        self.executor_id = executor_id
        self.state = state  # committed, encoded: this executor's keys
        self.emit = emit
        self.sent: list[tuple[Any, str | None]] = []
        self.outputs: list[Any] = []
        self.state_writes: dict[str, Any] = {}
        self.shared_writes: dict[str, Any] = {}
        self.requests: list[ExternalRequest] = []


class StepScope:
    """Per-superstep facts every context shares (read-only for handlers)."""

    __slots__ = (
        "codec",
        "journal",
        "journal_scope",
        "run_id",
        "shared",
        "successors",
        "superstep",
    )

    def __init__(
        self,
        run_id: str,
        superstep: int,
        codec: JsonCodec,
        shared: dict[str, Any],
        successors: dict[str, frozenset[str]],
        journal: JournalStore,
        journal_scope: str = "",
    ) -> None:
        self.run_id = run_id
        self.superstep = superstep
        self.codec = codec
        self.shared = shared  # committed, encoded
        self.successors = successors
        self.journal = journal
        self.journal_scope = journal_scope  # the checkpoint this superstep started from


class WorkflowContext(Generic[TOut, TWorkflowOut]):
    """Handed to every handler. ``TOut``: what it may send; ``TWorkflowOut``: what it may yield.

    ``WorkflowContext[int]`` sends ints; ``WorkflowContext[Never, str]`` only yields strs; a bare
    ``WorkflowContext`` does neither. Sending an undeclared type raises ``UndeclaredOutputError``.
    """

    __slots__ = ("_handler_name", "_scope", "_sends", "_step", "_yields")

    def __init__(
        self,
        scope: StepScope,
        step: ExecutorStep,
        sends: Matcher,
        yields: Matcher,
        handler_name: str = "",
    ) -> None:
        self._scope = scope
        self._step = step
        self._sends = sends
        self._yields = yields
        self._handler_name = handler_name

    @property
    def run_id(self) -> str:
        return self._scope.run_id

    @property
    def superstep(self) -> int:
        return self._scope.superstep

    @property
    def executor_id(self) -> str:
        return self._step.executor_id

    @property
    def successor_ids(self) -> frozenset[str]:
        """The nodes this executor has edges to (empty: its messages would go nowhere)."""
        return self._scope.successors.get(self._step.executor_id, frozenset())

    async def run_once(self, key: str, func: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``func`` at most once per ``key`` in this run, surviving crashes and re-runs.

        The result is journaled durably (when the store supports it) before it is returned; a
        later call with the same key from the same starting point -- the same superstep
        re-executed after a crash -- returns the journaled result without calling ``func``.
        Keys are scoped to this executor and to the checkpoint the superstep started from, so
        two branches continued from one checkpoint with different answers do not share results.
        The result must be JSON-serializable by the workflow's codec.
        """
        scope = self._scope
        full_key = f"{scope.journal_scope}/{self._step.executor_id}/{key}"
        stored = await scope.journal.journal_get(scope.run_id, full_key)
        if stored is None:
            value = await func()
            stored = await scope.journal.journal_put(
                scope.run_id, full_key, {"value": scope.codec.encode(value)}
            )
        return scope.codec.decode(stored["value"])

    async def send_message(self, message: Any, target_id: str | None = None) -> None:
        """Send ``message`` along this executor's outgoing edges (or to one successor)."""
        if not self._sends(message):
            raise UndeclaredOutputError(
                f"executor {self.executor_id!r} sent {type_name(type(message))}, which its handler "
                f"{self._handler_name} does not declare in WorkflowContext[...]"
            )
        if target_id is not None and target_id not in self._scope.successors.get(
            self.executor_id, ()
        ):
            raise UnknownTargetError(
                f"executor {self.executor_id!r} sent to {target_id!r}, which is not one of its "
                "successors in the graph"
            )
        self._step.sent.append((message, target_id))

    async def yield_output(self, output: Any) -> None:
        """Publish a workflow output (``WorkflowOutputEvent``; kept in the run's outputs)."""
        if not self._yields(output):
            raise UndeclaredOutputError(
                f"executor {self.executor_id!r} yielded {type_name(type(output))}, which its "
                f"handler {self._handler_name} does not declare as workflow output"
            )
        self._step.outputs.append(output)
        self._step.emit(WorkflowOutputEvent(output, self.executor_id))

    async def add_event(self, event: WorkflowEvent) -> None:
        """Emit a custom event into the run's event stream."""
        if not isinstance(event, WorkflowEvent):
            raise TypeError(f"add_event expects a WorkflowEvent, got {type_name(type(event))}")
        self._step.emit(event)

    # --- durable state --------------------------------------------------------------------------

    async def get_state(self, key: str, default: Any = None) -> Any:
        """This executor's durable state for ``key`` (a fresh copy; write back with set_state)."""
        step = self._step
        if key in step.state_writes:
            return self._scope.codec.decode(step.state_writes[key])
        if key in step.state:
            return self._scope.codec.decode(step.state[key])
        return default

    async def set_state(self, key: str, value: Any) -> None:
        """Write this executor's durable state; committed with the superstep."""
        self._step.state_writes[key] = self._scope.codec.encode(value)

    async def get_shared(self, key: str, default: Any = None) -> Any:
        """Shared state as committed at the last barrier, plus this handler's own writes."""
        step = self._step
        if key in step.shared_writes:
            return self._scope.codec.decode(step.shared_writes[key])
        if key in self._scope.shared:
            return self._scope.codec.decode(self._scope.shared[key])
        return default

    async def set_shared(self, key: str, value: Any) -> None:
        """Write shared state; visible to every executor after the barrier. If two executors write
        the same key in one superstep, the later one in graph order wins."""
        self._step.shared_writes[key] = self._scope.codec.encode(value)

    # --- requests -------------------------------------------------------------------------------

    async def request_info(self, request_data: Any, response_type: Any) -> str:
        """Ask the outside world; the answer arrives in this executor's ``@response_handler``.

        Returns the request id. The request is published when the superstep commits.
        """
        step = self._step
        scope = self._scope
        request = ExternalRequest(
            request_id=request_id_for(
                scope.run_id, scope.superstep, step.executor_id, len(step.requests)
            ),
            port_id=step.executor_id,
            data=request_data,
            response_type=response_type,
            source_executor_id=step.executor_id,
            superstep=scope.superstep,
            run_id=scope.run_id,
            from_port=False,
        )
        step.requests.append(request)
        return request.request_id
