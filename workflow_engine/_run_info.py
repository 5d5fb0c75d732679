"""What ``Runtime.get_run`` returns -- a run as users see it -- and how it is worked out from the
stored run, its latest checkpoint and its requests.

Working it out reads nothing: the runtime reads what it needs through its store, and the
command line's read-only path (``runs show``) through a snapshot of the file, and both hand the
same records to :func:`run_info_of`, so they cannot differ in what they show.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._events import WorkflowRunState
from ._identity import derive_id
from ._journal import cut_off_steps
from ._requests import ExternalRequest, InDoubtEffect

if TYPE_CHECKING:
    from ._checkpoint import Checkpoint
    from ._store import RunRecord, StoredRequest
    from ._workflow import Workflow


@dataclass
class RunInfo:
    """A run as users see it: status, progress, outputs so far and what it waits for."""

    run_id: str
    workflow_name: str
    status: WorkflowRunState
    superstep: int
    created_at: float
    updated_at: float
    outputs: list[Any] = field(default_factory=list)
    pending_requests: list[ExternalRequest] = field(default_factory=list)
    """The requests waiting for an answer (one answered, not yet applied by the run, is not)."""
    answered_requests: list[str] = field(default_factory=list)
    """The ids of its requests answered and not applied yet: they wait for ``resume`` (a
    process that stored them may have stopped before it resumed the run)."""
    error: dict[str, Any] | None = None
    parent_run_id: str | None = None
    cancel_requested: bool = False
    """A cancel waits for the worker executing the run (see :meth:`Runtime.cancel`)."""
    effects_in_doubt: list[InDoubtEffect] = field(default_factory=list)
    """Of a run no worker executes: the steps that had started before it stopped (a crash, a
    kill) and recorded no result. A run stopped mid-step asks about them when resumed; a
    cancelled one ended before anyone was asked whether they happened: check with the outside
    service (each names its ``idempotency_key``)."""
    decoded: bool = True
    """False when this runtime cannot decode the run's values -- its workflow is not registered
    here, or its graph changed (a stranded run): ``outputs`` and each request's ``data`` are
    then the codec's stored JSON, and ``response_type`` the stored type name."""


def decoding_workflow(
    workflow: Workflow | None, run: RunRecord, checkpoint: Checkpoint | None
) -> Workflow | None:
    """``workflow`` (the one registered under the run's name) if it decodes the run's stored
    values: the same graph, declaring every type its pending requests answer with."""
    if workflow is None or workflow.signature != run.workflow_signature:
        return None
    if checkpoint is not None and not all(
        workflow.declares_type(r.response_type) for r in checkpoint.pending_requests.values()
    ):
        return None
    return workflow


def effects_cut_off(
    checkpoint: Checkpoint,
    entries: Sequence[tuple[str, Any]],
    requests: Iterable[StoredRequest],
) -> list[InDoubtEffect]:
    """The steps that journaled an intent and no result in the superstep that never committed
    (the run stopped mid-step, or was cancelled before that superstep ran again), of the
    journal ``entries`` after ``checkpoint`` and the run's stored ``requests``.

    A superstep's journal entries are deleted when it commits, so those left after the last
    checkpoint belong to the one that did not; a cancelled run commits nothing more."""
    if not entries:
        return []
    run_id, secret = checkpoint.run_id, checkpoint.step_secret
    # (a cancel marks a question cancelled even if it was answered: its answer stays)
    asked = {r.request_id: r.answer is not None or r.status == "answered" for r in requests}
    applied = checkpoint.answered_requests.keys() | checkpoint.answered_digests.keys()
    said = functools.partial(_said_what_happened, secret, run_id, asked=asked, applied=applied)
    return cut_off_steps(entries, secret, run_id, said if secret else None)


def _said_what_happened(
    secret: str, run_id: str, key: str, *, asked: Mapping[str, bool], applied: Collection[str]
) -> bool:
    """A person answered the question about step ``key`` and the run never applied the answer
    (it was cancelled first): they know what happened. The questions about one step are
    numbered (see ``RunLoop._ask_about_effects``); an answer applied belongs to an earlier
    intent, since the step only runs again once it is."""
    n = 0
    while (request_id := derive_id(secret, "in-doubt", run_id, key, str(n))) in asked:
        if asked[request_id] and request_id not in applied:
            return True
        n += 1
    return False


def may_have_effects_in_doubt(run: RunRecord, now: float) -> bool:
    """Whether the run can have steps in doubt to tell of: cancelled, failed, or stopped mid-step
    (in progress, and no live worker executes it)."""
    if run.status in (WorkflowRunState.CANCELLED, WorkflowRunState.FAILED):
        return True
    return run.status is WorkflowRunState.IN_PROGRESS and run.live_owner(now) is None


def run_info_of(
    run: RunRecord,
    checkpoint: Checkpoint | None,
    workflow: Workflow | None,
    *,
    answered: Iterable[str] = (),
    stored_pending: Sequence[StoredRequest] = (),
    effects_in_doubt: Sequence[InDoubtEffect] = (),
) -> RunInfo:
    """The run as users see it. ``workflow``: the one that decodes its values
    (:func:`decoding_workflow`), or None to show them as stored. ``answered``: the ids of its
    requests answered and not applied yet (they wait for the run, not for a person; read when
    decoding and the checkpoint has pending requests). ``stored_pending``: its pending request
    rows (read when not decoding: what is stored, as stored, not hidden, not guessed at)."""
    outputs: list[Any] = []
    pending: list[ExternalRequest] = []
    waiting: list[str] = []
    if checkpoint is not None and workflow is not None:
        outputs = [
            workflow.decode_stored(
                o, run.run_id, f"output {i} of checkpoint {checkpoint.checkpoint_id}"
            )
            for i, o in enumerate(checkpoint.outputs)
        ]
        pending = list(workflow.restore(checkpoint).pending.values())
        taken = set(answered)
        waiting = [r.request_id for r in pending if r.request_id in taken]
        pending = [r for r in pending if r.request_id not in taken]
    elif checkpoint is not None:
        outputs = list(checkpoint.outputs)
        pending = [
            ExternalRequest(
                request_id=r.request_id,
                port_id=r.port_id,
                data=r.data,
                response_type=r.response_type,
                source_executor_id=r.source_executor_id,
                superstep=r.superstep,
                run_id=r.run_id,
                from_port=r.kind == "port",
            )
            for r in stored_pending
        ]
        asked = checkpoint.pending_requests
        waiting = [request_id for request_id in answered if request_id in asked]
    return RunInfo(
        run_id=run.run_id,
        workflow_name=run.workflow_name,
        status=run.status,
        superstep=run.superstep,
        created_at=run.created_at,
        updated_at=run.updated_at,
        outputs=outputs,
        pending_requests=pending,
        answered_requests=waiting,
        error=run.error,
        parent_run_id=run.parent_run_id,
        cancel_requested=run.cancel_requested,
        effects_in_doubt=list(effects_in_doubt),
        decoded=workflow is not None,
    )
