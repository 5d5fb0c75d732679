"""Draft → human review through a RequestPort → publish, looping until the reviewer approves.

Run it: ``python -m examples.review_loop`` (answers on the terminal), or import
:func:`build_workflow` and drive it with ``workflow.run(...)`` and ``ExternalResponse``s.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Never

import anyio
from pydantic import BaseModel, Field

from workflow_engine import (
    Executor,
    RequestPort,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunResult,
    handler,
)


class Draft(BaseModel):
    """A version of the text, sent to the reviewer."""

    topic: str
    version: int
    text: str


class ReviewDecision(BaseModel):
    """The reviewer's answer to a Draft."""

    approved: bool = Field(description="publish this version as it is?")
    feedback: str = Field("", description="what to change, when not approved")


class ApprovedDraft(BaseModel):
    """A draft the reviewer approved; only the publisher accepts this type."""

    draft: Draft


class Writer(Executor):
    """Writes a first draft, then revises it with each piece of feedback until approved."""

    @handler
    async def write(self, topic: str, ctx: WorkflowContext[Draft]) -> None:
        draft = Draft(topic=topic, version=1, text=f"A short note about {topic}.")
        await ctx.set_state("draft", draft)
        await ctx.send_message(draft)

    @handler
    async def revise(
        self, decision: ReviewDecision, ctx: WorkflowContext[Draft | ApprovedDraft]
    ) -> None:
        draft: Draft = await ctx.get_state("draft")
        if decision.approved:
            await ctx.send_message(ApprovedDraft(draft=draft))
            return
        revised = Draft(
            topic=draft.topic,
            version=draft.version + 1,
            text=f"{draft.text} (revised: {decision.feedback or 'tightened'})",
        )
        await ctx.set_state("draft", revised)
        await ctx.send_message(revised)


class Publisher(Executor):
    @handler
    async def publish(self, approved: ApprovedDraft, ctx: WorkflowContext[Never, str]) -> None:
        draft = approved.draft
        await ctx.yield_output(f"Published v{draft.version}: {draft.text}")


def build_workflow() -> Workflow:
    writer = Writer("writer")
    review = RequestPort("review", request_type=Draft, response_type=ReviewDecision)
    publisher = Publisher("publisher")
    return (
        WorkflowBuilder(name="review_loop", start=writer)
        .add_edge(writer, review)  # Draft goes to the human...
        .add_edge(review, writer)  # ...whose ReviewDecision comes back to the writer
        .add_edge(writer, publisher)  # ApprovedDraft: only the publisher accepts it
        .build()
    )


async def run_with_reviewer(
    topic: str, decide: Callable[[Draft], ReviewDecision], workflow: Workflow | None = None
) -> WorkflowRunResult:
    """Drive the loop, asking ``decide(draft) -> ReviewDecision`` at every pause."""
    workflow = workflow or build_workflow()
    result = await workflow.run(topic)
    while result.pending_requests:
        answers = {r.request_id: decide(r.data) for r in result.pending_requests}
        result = await workflow.run(checkpoint=result.checkpoint, responses=answers)
    return result


def _ask(draft: Draft) -> ReviewDecision:
    print(f"\nDraft v{draft.version}: {draft.text}")
    if not sys.stdin.isatty():  # scripted: ask for one revision, then approve
        answer = "y" if draft.version > 1 else "add an example"
        print(f"Approve? [y/N] or type feedback: {answer}")
    else:
        answer = input("Approve? [y/N] or type feedback: ").strip()
    if answer.lower() in ("y", "yes"):
        return ReviewDecision(approved=True)
    return ReviewDecision(approved=False, feedback=answer)


async def main() -> None:
    result = await run_with_reviewer("durable workflows", _ask)
    for output in result.outputs:
        print(output)


if __name__ == "__main__":
    anyio.run(main)
