"""Events a run emits, in a deterministic order, all JSON-serializable via :meth:`to_dict`."""

from __future__ import annotations

import dataclasses
import re
import traceback
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._codec import JsonCodec
    from ._requests import ExternalRequest


class WorkflowRunState(StrEnum):
    """Where a run stands. Only ``IN_PROGRESS`` means "executing now"."""

    IN_PROGRESS = "in_progress"
    IDLE = "idle"
    """Finished: no message in flight and no request pending."""
    IDLE_WITH_PENDING_REQUESTS = "idle_with_pending_requests"
    """Paused: waiting for ExternalResponses."""
    MAX_SUPERSTEPS_REACHED = "max_supersteps_reached"
    """Stopped by ``max_supersteps`` with messages still in flight; continuing resumes it."""
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL  # a module tuple: no enum member lookups per call


_TERMINAL = (WorkflowRunState.IDLE, WorkflowRunState.FAILED, WorkflowRunState.CANCELLED)


_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


class WorkflowEvent:
    """Base of every event; subclass it (as a dataclass) for your own events via ``add_event``."""

    @property
    def type(self) -> str:
        """``ExecutorInvokedEvent`` → ``executor_invoked``."""
        name = type(self).__name__.removesuffix("Event")
        return _CAMEL.sub("_", name).lower()

    def to_dict(self, codec: JsonCodec | None = None) -> dict[str, Any]:
        """A JSON-compatible dict: ``{"type": ..., <fields>}``; payloads go through ``codec``."""
        out: dict[str, Any] = {"type": self.type}
        if dataclasses.is_dataclass(self):
            for f in dataclasses.fields(self):
                out[f.name] = _jsonable(getattr(self, f.name), codec)
        return out


def _jsonable(value: Any, codec: JsonCodec | None) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, WorkflowEvent | ErrorDetails):
        return dataclasses.asdict(value)  # type: ignore[arg-type]
    if hasattr(value, "to_dict"):
        return value.to_dict(codec)
    if codec is not None:
        return codec.encode(value)
    return value


@dataclass(slots=True)
class ErrorDetails:
    """What went wrong, in a form that survives JSON: exception type, message, where, code."""

    error_type: str
    message: str
    code: str = "executor_failed"
    executor_id: str | None = None
    traceback: str | None = None
    """Where it was raised, as Python prints it (a failing handler's line; it was lost: a run
    that failed in another process said ``KeyError: 'id'`` and no more -- outside tester 149).
    Kept with the run's record; never sent to an AG-UI client."""

    @classmethod
    def from_exception(cls, exc: BaseException, executor_id: str | None = None) -> ErrorDetails:
        code = getattr(exc, "code", None) or "executor_failed"
        said = exception_text(exc)
        try:
            where = "".join(traceback.format_exception(exc))
        except Exception:  # (an exception whose parts fail to print: the message still says)
            where = None
        return cls(
            valid_text(type(exc).__name__),
            valid_text(said),
            valid_text(str(code)),
            executor_id,
            valid_text(where) if where is not None else None,
        )

    def as_record(self) -> dict[str, Any]:
        """The error as a run record stores it (``RunRecord.error``): a message longer than
        ``RECORDED_MESSAGE`` characters is cut there, saying so -- one too big for the store
        would leave the run looking cut off by a crash, its error unrecorded."""
        message = self.message
        if len(message) > RECORDED_MESSAGE:
            cut = _recorded_up_to(message)
            rest = len(message) - cut
            message = f"{message[:cut]} ... ({rest:,} more characters not recorded)"
        record = {
            "error_type": self.error_type[:RECORDED_MESSAGE],
            "message": message,
            "code": self.code[:RECORDED_MESSAGE],
            "executor_id": self.executor_id,
        }
        if self.traceback is not None:
            record["traceback"] = _recorded_traceback(self.traceback)
        return record


RECORDED_MESSAGE = 100_000
RECORDED_TRACEBACK = 50_000
"""The most of a traceback a run's record keeps: its last characters, each line cut at
``TRACEBACK_LINE`` (its last line repeats the message, recorded already)."""
TRACEBACK_LINE = 1_000


def _recorded_traceback(text: str) -> str:
    lines = [
        line
        if len(line) <= TRACEBACK_LINE
        else f"{line[:TRACEBACK_LINE]} ... ({len(line) - TRACEBACK_LINE:,} more characters)"
        for line in text.splitlines()
    ]
    return "\n".join(lines)[-RECORDED_TRACEBACK:]


"""The most of an error's message a run record keeps (characters)."""


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or what can be said of it when its ``__str__`` fails: recording such an
    error failed in turn, leaving the run in progress with nothing recorded (outside tester
    109)."""
    try:
        return str(exc)
    except Exception as failed:
        return (
            f"(its message cannot be shown: {type(exc).__name__}.__str__ raised "
            f"{type(failed).__name__})"
        )


def valid_text(value: str) -> str:
    """``value`` as valid Unicode: a lone surrogate (a file name decoded with
    ``surrogateescape`` in a message) is written as its escape, so the error can be stored."""
    if value.isascii():
        return value
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(slots=True)
class WorkflowStartedEvent(WorkflowEvent):
    """A run began executing (a new run, or a resumed one)."""

    run_id: str


@dataclass(slots=True)
class WorkflowStatusEvent(WorkflowEvent):
    """The run's state changed (``IN_PROGRESS``, ``IDLE_WITH_PENDING_REQUESTS``, ...)."""

    state: WorkflowRunState


@dataclass(slots=True)
class SuperstepStartedEvent(WorkflowEvent):
    """A superstep began: every executor with messages waiting runs in it."""

    superstep: int


@dataclass(slots=True)
class SuperstepCompletedEvent(WorkflowEvent):
    """A superstep's executors all finished; its checkpoint is committed next."""

    superstep: int


@dataclass(slots=True)
class ExecutorInvokedEvent(WorkflowEvent):
    """An executor's handler was called with the messages of this superstep."""

    executor_id: str


@dataclass(slots=True)
class ExecutorCompletedEvent(WorkflowEvent):
    """An executor's handlers returned for this superstep."""

    executor_id: str


@dataclass(slots=True)
class ExecutorFailedEvent(WorkflowEvent):
    """An executor's handler raised; the superstep is not applied."""

    executor_id: str
    error: ErrorDetails


@dataclass(slots=True)
class EffectInDoubtEvent(ExecutorFailedEvent):
    """A step of the executor started an effect (a tool call, a payment) whose outcome is
    unknown: its process stopped in between. Not a failure: the run asks a person next (a
    :class:`RequestInfoEvent` for the step), and never repeats the effect blindly. A subclass
    of ``ExecutorFailedEvent``, so code that handles failures still sees it; its ``type`` is
    ``effect_in_doubt``."""

    step_key: str = ""


@dataclass(slots=True)
class WorkflowFailedEvent(WorkflowEvent):
    """The run failed; ``error`` says where and why."""

    error: ErrorDetails


@dataclass(slots=True)
class WorkflowOutputEvent(WorkflowEvent):
    """An executor yielded an output of the workflow."""

    data: Any
    source_executor_id: str


@dataclass(slots=True)
class RequestInfoEvent(WorkflowEvent):
    """A request is pending: answer it with ``ExternalResponse(request_id, data)``.

    Emitted only after the checkpoint that records the request was saved, so a request id a client
    sees always exists in the store.
    """

    request: ExternalRequest = field()

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def data(self) -> Any:
        return self.request.data

    @property
    def source_executor_id(self) -> str:
        return self.request.source_executor_id

    def to_dict(self, codec: JsonCodec | None = None) -> dict[str, Any]:
        return {"type": self.type, **self.request.to_dict(codec)}


def _recorded_up_to(message: str) -> int:
    """Where a recorded message longer than ``RECORDED_MESSAGE`` is cut: after the last whole
    piece (a word, or the lines a wrapped URL goes on across) that fits. Cut inside a word,
    a URL's password was left before its ``@``, which said no more that it was one: a failed
    run's start sent again showed it (outside tester 219)."""
    from ._redaction import pieces

    cut = 0
    for piece, end in pieces(message):
        if end > RECORDED_MESSAGE:
            break
        if not piece.isspace():
            cut = end
    return cut or RECORDED_MESSAGE
