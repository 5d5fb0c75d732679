"""Every example runs, so the README's code never rots."""

from __future__ import annotations

import pytest

from workflow_engine_cli.demos.review_loop import ReviewDecision, build_workflow, run_with_reviewer

pytestmark = pytest.mark.anyio


async def test_review_loop_publishes_after_feedback() -> None:
    verdicts = iter([False, False, True])

    def reviewer(draft):
        return ReviewDecision(approved=next(verdicts), feedback=f"tighten v{draft.version}")

    result = await run_with_reviewer("durability", reviewer)
    assert result.outputs == [
        "Published v3: A short note about durability. (revised: tighten v1) (revised: tighten v2)"
    ]


async def test_review_loop_resumes_from_json_in_a_fresh_workflow() -> None:
    from workflow_engine import Checkpoint

    paused = await build_workflow().run("restarts")
    (request,) = paused.pending_requests
    text = paused.checkpoint.to_json()
    resumed = await build_workflow().run(
        checkpoint=Checkpoint.from_json(text),
        responses={request.request_id: {"approved": True}},
    )
    assert resumed.outputs == ["Published v1: A short note about restarts."]
