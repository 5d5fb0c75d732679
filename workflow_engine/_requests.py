"""Request ports: graph nodes where a run waits for the outside world.

A message sent to a :class:`RequestPort` becomes an :class:`ExternalRequest`, published as a
``RequestInfoEvent``; the run pauses once nothing else is in flight. The answer, an
:class:`ExternalResponse`, leaves the port as a message along its outgoing edges in the next
superstep. ``ctx.request_info(...)`` uses the same machinery with the calling executor as the port,
and its answer arrives in that executor's ``@response_handler``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, model_validator

from ._errors import DefinitionError, UsageError
from ._types import build_matcher, type_name

if TYPE_CHECKING:
    from ._codec import JsonCodec


class RequestPort:
    """A node that turns messages of ``request_type`` into external requests answered with
    ``response_type``."""

    def __init__(self, id: str, request_type: Any, response_type: Any) -> None:
        if not id or not isinstance(id, str):  # (as an executor's: tester 143)
            raise UsageError("a request port needs a non-empty string id")
        self.id = id
        self.request_type = request_type
        self.response_type = response_type
        try:
            self._accepts = build_matcher(request_type)
        except DefinitionError as exc:
            raise DefinitionError(f"request port {id!r}: its request type: {exc}") from None
        try:  # (an answer type nothing can check: refused here, not as an edge's mismatch)
            build_matcher(response_type)
        except DefinitionError as exc:
            raise DefinitionError(f"request port {id!r}: its answer type: {exc}") from None

    def can_handle(self, message: Any) -> bool:
        return self._accepts(message)

    @property
    def input_types(self) -> tuple[Any, ...]:
        return (self.request_type,)

    @property
    def output_types(self) -> tuple[Any, ...]:
        return (self.response_type,)

    def __repr__(self) -> str:
        return (
            f"RequestPort({self.id!r}, {type_name(self.request_type)}, "
            f"{type_name(self.response_type)})"
        )


@dataclass(slots=True)
class ExternalRequest:
    """A question a paused run is waiting on.

    ``port_id`` is the node that will receive the answer: a ``RequestPort`` id, or the id of the
    executor that called ``ctx.request_info``.
    """

    request_id: str
    port_id: str
    data: Any
    response_type: Any
    source_executor_id: str = ""
    superstep: int = 0
    run_id: str = ""
    from_port: bool = field(default=True)
    effect_key: str | None = None
    """Set for a request asking whether an in-doubt effect happened (the step's key)."""

    @property
    def kind(self) -> str:
        """``port`` (a RequestPort), ``executor`` (ctx.request_info) or ``effect``."""
        if self.effect_key is not None:
            return "effect"
        return "port" if self.from_port else "executor"

    @property
    def response_type_name(self) -> str:
        """The response type's stable name (see ``display_name``), never a module path."""
        from ._registry import display_name

        return display_name(self.response_type)

    def to_dict(self, codec: JsonCodec | None = None) -> dict[str, Any]:
        from ._registry import display_name

        registry = getattr(codec, "registry", None)
        return {
            "request_id": self.request_id,
            "port_id": self.port_id,
            "source_executor_id": self.source_executor_id,
            "run_id": self.run_id,
            "superstep": self.superstep,
            "data": codec.encode(self.data) if codec else self.data,
            "request_type": display_name(type(self.data), registry),
            "response_type": display_name(self.response_type, registry),
        }


_DATA = ExternalRequest.__dict__["data"]
"""Where an ``ExternalRequest`` keeps its data (its slot)."""


class RestoredRequest(ExternalRequest):
    """A pending request read back from a checkpoint, whose data is decoded when first read.

    A resume decodes what its superstep needs: a run waiting on 1,000 requests decoded all of
    them at every answer, most of each answer's time (outside tester 215). Damage is found,
    and named, where the data is read -- by the step it answers, or by whoever reads the
    run's pending requests. Otherwise an ``ExternalRequest`` like any other: it compares
    equal to one with the same fields, and says it is one."""

    __slots__ = ("_decode", "_encoded")
    _decode: Callable[[Any, str], Any] | None
    _encoded: Any

    @classmethod
    def stored(
        cls,
        encoded: Any,
        decode: Callable[[Any, str], Any],
        request_id: str,
        port_id: str,
        response_type: Any,
        source_executor_id: str,
        superstep: int,
        run_id: str,
        from_port: bool,
    ) -> RestoredRequest:
        """One whose data is ``decode(encoded, request_id)`` once read. (Made without the
        generated ``__init__``: a resume makes one per pending request.)"""
        made = cls.__new__(cls)
        made.request_id, made.port_id, made.response_type = request_id, port_id, response_type
        made.source_executor_id, made.superstep, made.run_id = source_executor_id, superstep, run_id
        made.from_port, made.effect_key = from_port, None
        made._encoded, made._decode = encoded, decode
        return made

    @property
    def data(self) -> Any:
        decode = self._decode
        if decode is not None:
            _DATA.__set__(self, decode(self._encoded, self.request_id))
            self._decode = self._encoded = None
        return _DATA.__get__(self, type(self))

    @data.setter
    def data(self, value: Any) -> None:
        _DATA.__set__(self, value)
        self._decode = self._encoded = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ExternalRequest):
            return NotImplemented
        return all(getattr(self, f) == getattr(other, f) for f in _FIELDS)

    def __repr__(self) -> str:
        shown = ", ".join(f"{f}={getattr(self, f)!r}" for f in _FIELDS)
        return f"ExternalRequest({shown})"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled (and copied) as the ``ExternalRequest`` it is, its data decoded: the
        decoding it kept is no value to carry (outside tester 216)."""
        return ExternalRequest, tuple(getattr(self, f) for f in _FIELDS)


_FIELDS = tuple(f.name for f in fields(ExternalRequest))


@dataclass(slots=True, frozen=True)
class ExternalResponse:
    """The answer to one :class:`ExternalRequest`. ``data`` is validated against the request's
    response type (a dict is accepted for a pydantic model or dataclass)."""

    request_id: str
    data: Any


class InDoubtEffect(BaseModel):
    """The question a run asks when a journaled step started before a crash and recorded no
    result: did the effect happen? (A step declared idempotent is simply retried instead.)"""

    # (its schema is built when a run first meets a step in doubt: most never do, and every
    # process importing the engine paid for it -- issue 12's import figure)
    model_config = ConfigDict(defer_build=True)

    executor_id: str
    step: str
    """The step's key within its handler invocation (e.g. ``tool#0`` or a ``run_once`` key)."""
    description: Any = None
    """What the step was doing, as its code described it (tool name and arguments, ...)."""
    step_key: str = ""
    idempotency_key: str = ""
    """The key the step handed the outside service (``ctx.idempotency_key``, a tool's
    ``idempotency_key`` parameter): look the effect up by it there ("" in older questions)."""
    question: str = "Did this effect happen before the process stopped?"


class EffectResolution(BaseModel):
    """The answer to an :class:`InDoubtEffect`. ``happened=True`` records ``result`` as the
    step's result (the step is not run again); ``happened=False`` lets the step run again, and
    takes no result. Any other key is refused: a misspelt ``result`` would otherwise record
    None as the result."""

    model_config = ConfigDict(
        extra="forbid",
        defer_build=True,  # (as ``InDoubtEffect``'s)
        # what a client is shown as the answer's schema (not this docstring's markup)
        json_schema_extra={
            "description": 'Did the effect happen? {"happened": true, "result": ...} records '
            'its result (it is not run again); {"happened": false} lets it run again.'
        },
    )

    happened: bool
    result: Any = None

    @model_validator(mode="after")
    def _result_only_if_it_happened(self) -> EffectResolution:
        if not self.happened and self.result is not None:
            raise ValueError(
                "a result goes with happened: true; an effect that did not happen runs again "
                "and gets its own"
            )
        return self
