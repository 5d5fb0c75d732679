"""Dismissing a pause (``cancel(run_id, unless_answered=[...])``) survives SIGKILL at every point.

The dismissal is two writes: the requests cancelled (so that an answer racing it is refused),
then the run cancelled. A process that died between them left the run resting paused on a
request no answer could reach, with nothing recorded that it was being cancelled: ``resume``
left it so, and every listing showed it waiting (outside tester 131: 298 of 300 runs, killed
while dismissing them at once). The first write now records the run's cancel too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.integration.cli_harness import Cli
from tests.integration.dismissing_workflow import RUN_ID
from tests.integration.workflows import Answer, stepper_workflow
from workflow_engine import RequestCancelledError, Runtime, WorkflowRunState
from workflow_engine.storage import SqliteStore

ROOT = Path(__file__).resolve().parents[2]

# (the fault point the dismissing process dies at, whether the requests' cancel was committed)
POINTS = [
    ("cancel:before", False),
    ("cancel:inside", False),
    ("cancel:after", True),
    ("commit:before", True),
    ("commit:inside", True),
    ("commit:after", True),
]


@pytest.mark.slow  # a real process per point
@pytest.mark.parametrize(("point", "dismissed"), POINTS)
def test_a_dismissal_killed_anywhere_leaves_the_run_paused_or_being_cancelled(
    tmp_path: Path, point: str, dismissed: bool
) -> None:
    db = tmp_path / "runs.db"
    argv = [sys.executable, "-m", "tests.integration.dismissing_workflow", str(db), point]
    child = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert child.returncode == -9, child.stderr[-2000:]
    request_id = child.stdout.split()[0]
    interrupted = Cli(tmp_path).json("runs", "list", "--status", "interrupted")
    # the run's cancel recorded with the requests' cancel: listed with the runs to resume
    being_cancelled = dismissed and point != "commit:after"
    assert [r["run_id"] for r in interrupted] == ([RUN_ID] if being_cancelled else [])
    anyio.run(_check_after_the_kill, db, request_id, point, dismissed)


async def _check_after_the_kill(db: Path, request_id: str, point: str, dismissed: bool) -> None:
    runtime = Runtime(SqliteStore(db))
    runtime.register(stepper_workflow)
    try:
        run = await runtime.get_run(RUN_ID)
        request = await runtime.get_request(request_id)
        if not dismissed:  # nothing of the dismissal was committed: the pause stands
            assert (run.status, run.cancel_requested, request.status) == (
                WorkflowRunState.IDLE_WITH_PENDING_REQUESTS,
                False,
                "pending",
            )
            result = await runtime.respond_and_resume(request_id, Answer(approved=True))
            assert result.status is not WorkflowRunState.CANCELLED
            return
        assert request.status == "cancelled"
        with pytest.raises(RequestCancelledError):
            await runtime.respond(request_id, Answer(approved=True))
        if point == "commit:after":  # the run's cancel was committed too
            assert run.status is WorkflowRunState.CANCELLED
            return
        # the run's cancel was recorded with the requests': the run is interrupted, not
        # resting paused on a request no answer can reach, and resuming it cancels it
        assert (run.status, run.cancel_requested) == (WorkflowRunState.IN_PROGRESS, True)
        assert await runtime.pending_requests() == []
        result = await runtime.resume(RUN_ID)
        assert result.status is WorkflowRunState.CANCELLED
        assert (await runtime.get_run(RUN_ID)).status is WorkflowRunState.CANCELLED
    finally:
        await runtime.close()
