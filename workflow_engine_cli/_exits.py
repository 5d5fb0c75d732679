"""The command line's exit codes: a contract with scripts, so each keeps its meaning.

  0  done (the run finished, or the command succeeded)
  1  the run failed or was cancelled (or the output could not be written: a full disk --
     unless the command had acted: then its own code, and the error says what was done)
  2  bad usage or invalid input (malformed JSON, an answer of the wrong type, an ambiguous id)
  3  paused: the run waits for input (answer with ``respond``, continue with ``resume``)
  4  not found: unknown run, request or workflow
  5  conflict: already answered differently, cancelled, finished, or run by another worker
  6  storage problem: the database is unusable, damaged or locked, or a record is corrupt
  7  the server cannot listen: the address is in use or not allowed
130  quit at once: Ctrl-C before any run started (while loading, at the demo's first prompt),
     or a third Ctrl-C on ``serve``
141  the reader of the output went away (``| head``): stopped quietly, as SIGPIPE would
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workflow_engine import WorkflowError

EXIT_DONE, EXIT_FAILED, EXIT_USAGE, EXIT_PAUSED = 0, 1, 2, 3
EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_STORAGE, EXIT_CANNOT_LISTEN = 4, 5, 6, 7
EXIT_QUIT = 130
"""Ctrl-C before anything started: the status a shell gives a command SIGINT ended."""
EXIT_BROKEN_PIPE = 141
"""Whoever read the output stopped reading (``| head``): the command stops quietly, with the
status a shell gives a tool that SIGPIPE ended (128 + 13)."""


class Exit(Exception):
    """End the command with this exit code (what was to say is said already)."""

    def __init__(self, code: int) -> None:
        self.code = code


def exit_code_for(exc: WorkflowError) -> int:
    from workflow_engine import (
        CheckpointNotFoundError,
        CheckpointNotLatestError,
        CheckpointVersionError,
        GraphValidationError,
        RequestAlreadyAnsweredError,
        RequestCancelledError,
        ResponseTypeError,
        RunBusyError,
        RunExistsError,
        RunNotFoundError,
        RunNotResumableError,
        SerializationError,
        SignatureMismatchError,
        StorageError,
        UnknownRequestError,
        WorkflowNotRegisteredError,
    )

    if isinstance(exc, RunNotFoundError | UnknownRequestError | WorkflowNotRegisteredError):
        return EXIT_NOT_FOUND
    if isinstance(exc, CheckpointNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(
        exc,
        RequestAlreadyAnsweredError
        | RequestCancelledError
        | RunBusyError
        | RunExistsError
        | RunNotResumableError
        | CheckpointNotLatestError
        | SignatureMismatchError,
    ):
        return EXIT_CONFLICT
    if isinstance(exc, StorageError | SerializationError | CheckpointVersionError):
        # a value the CLI reads back that does not decode is a damaged (or foreign) record
        return EXIT_STORAGE
    if isinstance(exc, ResponseTypeError | GraphValidationError):
        return EXIT_USAGE
    return EXIT_FAILED
