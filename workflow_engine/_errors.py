"""The one error tree of the engine.

Every error the engine raises derives from :class:`WorkflowError`; each branch names a condition,
and each class carries a stable ``code`` that crosses wires (CLI messages, AG-UI ``RUN_ERROR``).
A paused run is not an error: it is a status.

    WorkflowError
    ├── GraphValidationError            build() refused the graph
    │   ├── DuplicateExecutorError
    │   ├── UnknownExecutorError
    │   ├── MissingStartError
    │   ├── UnreachableExecutorError
    │   ├── EdgeTypeMismatchError
    │   └── FanInTypeMismatchError
    ├── ExecutionError                  something went wrong while a run executed
    │   ├── MessageNotHandledError
    │   ├── EdgeConditionError          an edge's condition raised
    │   ├── UndeclaredOutputError
    │   ├── UnknownTargetError
    │   ├── RunNotResumableError
    │   └── EffectInDoubtError          a side effect may have happened before a crash
    ├── ResponseError                   an ExternalResponse was refused; nothing changed
    │   ├── UnknownRequestError
    │   ├── RequestAlreadyAnsweredError
    │   ├── RequestCancelledError
    │   └── ResponseTypeError
    ├── CheckpointError
    │   ├── SignatureMismatchError
    │   ├── CheckpointNotFoundError
    │   ├── CheckpointNotLatestError    continuing from a checkpoint history moved past
    │   ├── CheckpointVersionError      written by a newer workflow-engine
    │   └── CheckpointStoreError
    ├── SerializationError
    │   ├── UnregisteredTypeError
    │   └── CorruptValueError
    ├── StorageError
    │   ├── RunNotFoundError
    │   ├── RunExistsError              a run with that id was admitted before
    │   ├── RunBusyError
    │   │   └── LeaseLostError          our lease was taken over: stop before the next effect
    │   ├── StoreUnavailableError
    │   ├── StoreLockedError
    │   ├── StoreCorruptError
    │   └── SchemaVersionError
    ├── WorkflowNotRegisteredError
    ├── UsageError (also a ValueError)   an API was called with values it cannot take
    └── DefinitionError (also a TypeError)  an executor, handler or tool is declared wrongly
"""

from __future__ import annotations

from typing import Any


def shown(value: Any, limit: int = 80) -> str:
    """A stored value as an error message may quote it: ``repr`` (so control characters and
    undecodable bytes appear escaped), and never more than ``limit`` characters of it. A value
    whose ``repr`` fails -- an int past Python's digit limit, a caller's object -- is named by
    its type: the error saying what was wrong must not fail itself (outside tester 143)."""
    try:
        text = repr(value)
    except Exception:
        kind = type(value).__name__
        if isinstance(value, int):
            return f"<an {kind} of {value.bit_length():,} bits>"
        return f"<a {kind} whose repr fails>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


class WorkflowError(Exception):
    """Root of every error raised by workflow-engine."""

    code: str = "workflow_error"


# --- graph validation -------------------------------------------------------------------------


class GraphValidationError(WorkflowError):
    """The builder refused the graph; the message names the executors and types involved."""

    code = "graph_invalid"


class DuplicateExecutorError(GraphValidationError):
    code = "duplicate_executor"


class UnknownExecutorError(GraphValidationError):
    code = "unknown_executor"


class MissingStartError(GraphValidationError):
    code = "missing_start"


class UnreachableExecutorError(GraphValidationError):
    code = "unreachable_executor"


class EdgeTypeMismatchError(GraphValidationError):
    code = "edge_type_mismatch"


class FanInTypeMismatchError(GraphValidationError):
    code = "fan_in_type_mismatch"


# --- execution --------------------------------------------------------------------------------


class ExecutionError(WorkflowError):
    """A run could not proceed as the graph describes."""

    code = "execution_error"

    def __init__(self, message: str = "", *, executor_id: str | None = None) -> None:
        super().__init__(message)
        self.executor_id = executor_id
        """The executor whose message (or handler) it was, where one is to blame."""


class MessageNotHandledError(ExecutionError):
    """A message reached (or would reach) an executor with no handler for its type."""

    code = "message_not_handled"


class EdgeConditionError(ExecutionError):
    """An edge's condition (or a switch case's, or a fan-out's selection) raised: the error
    names the edge; the condition's own exception is its ``__cause__``."""

    code = "edge_condition_failed"


class UndeclaredOutputError(ExecutionError):
    """A handler sent or yielded a value of a type its ``WorkflowContext`` does not declare."""

    code = "undeclared_output"


class UnknownTargetError(ExecutionError):
    """``send_message(target_id=...)`` named an executor that is not a successor."""

    code = "unknown_target"


class EffectInDoubtError(ExecutionError):
    """A journaled step started (its intent is recorded) but its result is not: the process
    died in between, so whether the effect happened is unknown. The runner turns this into a
    request asking a person, never a blind repeat."""

    code = "effect_in_doubt"

    def __init__(
        self, message: str, *, step_key: str = "", description: object = None, step: str = ""
    ) -> None:
        super().__init__(message)  # (the executor is the one whose step it was: the runner's)
        self.step_key = step_key
        self.description = description
        self.step = step or step_key.rsplit("/", 1)[-1]
        """The step's own key (``run_once``'s), which may hold a "/" as ``step_key`` does."""
        self.raised: BaseException | None = None
        """The error the step's caller was given instead, if any (its effect ran and its
        result could not be recorded): the run fails with that one if it is not caught."""


class RunNotResumableError(ExecutionError):
    """The run is finished, cancelled or otherwise cannot continue."""

    code = "run_not_resumable"


class RunInterruptedError(ExecutionError):
    """The runtime was closed while it executed the run: the run stopped at its last committed
    superstep (a step under way that is not idempotent ran to its end first), its lease was
    given back, and resuming it -- in any process -- continues from there."""

    code = "run_interrupted"

    def __init__(self, message: str, *, run_id: str) -> None:
        super().__init__(message)
        self.run_id = run_id


# --- responses --------------------------------------------------------------------------------


class ResponseError(WorkflowError):
    """An :class:`ExternalResponse` was refused. A refused response changes nothing."""

    code = "response_error"


class UnknownRequestError(ResponseError):
    code = "unknown_request"


class RequestAlreadyAnsweredError(ResponseError):
    """A request that already has an answer received a *different* answer."""

    code = "request_conflict"


class RequestCancelledError(ResponseError):
    code = "request_cancelled"


class ResponseTypeError(ResponseError):
    """The answer does not validate against the request's response type."""

    code = "response_type_mismatch"


# --- checkpoints ------------------------------------------------------------------------------


class CheckpointError(WorkflowError):
    code = "checkpoint_error"


class CheckpointVersionError(CheckpointError):
    """A checkpoint's ``schema_version`` is newer than this engine reads: it was written by a
    newer workflow-engine, and reading it as an older layout could silently lose state."""

    code = "checkpoint_too_new"


class SignatureMismatchError(CheckpointError):
    """A checkpoint was written by a workflow with a different graph structure."""

    code = "signature_mismatch"


class StoredTypeChangedError(SignatureMismatchError):
    """A stored value (a message, a state, an answer) no longer fits the type the workflow's
    code now gives it: a field added, removed or renamed, a class no longer registered. The
    code changed under the run, as a changed graph does, and the run is stranded in the same
    way (continue it with the code it started with); or the record is damaged. The message says
    which run, which record and what does not fit."""

    code = "stored_type_changed"


class CheckpointNotFoundError(CheckpointError):
    code = "checkpoint_not_found"


class CheckpointNotLatestError(CheckpointError):
    """A run was continued from a checkpoint that is not its latest: writing after it would
    fork the history. ``Runtime.fork`` makes a proper branch (a new run) instead."""

    code = "checkpoint_not_latest"


class CheckpointStoreError(CheckpointError):
    """The configured store failed; the run stops rather than continue without a checkpoint."""

    code = "checkpoint_store_failed"


# --- serialization ----------------------------------------------------------------------------


class SerializationError(WorkflowError):
    code = "serialization_error"


class UnregisteredTypeError(SerializationError):
    """A value's type is not known to the workflow's type registry, so it could not be restored."""

    code = "unregistered_type"


class CorruptValueError(SerializationError):
    """Stored data is not a valid encoding (bad marker, wrong shape, a value that fails its
    declared type, nesting too deep); the message says what was wrong and where."""

    code = "corrupt_value"


class NoLongerFitsError(CorruptValueError):
    """A stored value of a registered class that the class does not take (it fails validation,
    or holds a field the class no longer has): most often the class changed since the value was
    stored. Read back from a store it is a ``StoredTypeChangedError``."""


# --- durable runs -----------------------------------------------------------------------------


class StorageError(WorkflowError):
    """The durable store failed or refused an operation; nothing was half-written."""

    code = "storage_error"


class RunNotFoundError(StorageError):
    code = "run_not_found"


class RunExistsError(StorageError):
    """A run with this id exists already: run ids are chosen once."""

    code = "run_exists"


class RunBusyError(StorageError):
    """Another worker holds the run's lease (or committed past us): this one must not proceed."""

    code = "run_busy"


class LeaseLostError(RunBusyError):
    """This worker's lease on the run expired and another worker took it: nothing more is
    written and no further side effect starts; the other worker continues the run."""

    code = "lease_lost"


class StoreUnavailableError(StorageError):
    """The database cannot be opened or written (missing/unwritable directory, not a database)."""

    code = "store_unavailable"


class StoreLockedError(StorageError):
    """Another writer held the database lock past the busy timeout."""

    code = "store_locked"


class StoreCorruptError(StorageError):
    """A stored record does not decode; the message names the run and the record."""

    code = "store_corrupt"


class SchemaVersionError(StorageError):
    """The database was written by a newer version of workflow-engine."""

    code = "schema_too_new"


class WorkflowNotRegisteredError(WorkflowError):
    """A stored run names a workflow this process has not registered."""

    code = "workflow_not_registered"
    workflow_name: str | None = None
    """The name looked for (set by ``Runtime``)."""


class UsageError(WorkflowError, ValueError):
    """An API was called with values it cannot take (a ``ValueError`` too)."""

    code = "usage_error"


class DefinitionError(WorkflowError, TypeError):
    """An executor, handler, tool or workflow is declared in a way the engine cannot use
    (a ``TypeError`` too)."""

    code = "definition_error"
