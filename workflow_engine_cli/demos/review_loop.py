"""Draft → human review through a RequestPort → publish, looping until the reviewer approves.

The review cannot be skipped: the reviewer's answer (a :class:`ReviewDecision`) goes to the
editor, which is not the start executor, so no start message can stand in for it --
``workflow.run(ReviewDecision(approved=True))`` is refused before anything runs. (An answer to a
``RequestPort`` is an ordinary message to the port's successors: were the start executor among
them, a start message of the answer's type would reach the same handler.)

Run it: ``python -m workflow_engine_cli.demos.review_loop`` (answers on the terminal), or import
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
    """A version of the text, sent to the reviewer (and to the editor, who keeps it)."""

    topic: str
    version: int
    text: str


class ReviewDecision(BaseModel):
    """The reviewer's answer to a Draft."""

    approved: bool = Field(description="publish this version as it is?")
    feedback: str = Field("", description="what to change, when not approved")


class Revision(BaseModel):
    """The editor asks the writer for a new version of ``draft``."""

    draft: Draft
    feedback: str


class Writer(Executor):
    """The start executor: writes a first draft, and a new version for each revision."""

    @handler
    async def write(self, topic: str, ctx: WorkflowContext[Draft]) -> None:
        await ctx.send_message(Draft(topic=topic, version=1, text=f"A short note about {topic}."))

    @handler
    async def revise(self, revision: Revision, ctx: WorkflowContext[Draft]) -> None:
        draft = revision.draft
        text = f"{draft.text} (revised: {revision.feedback or 'tightened'})"
        await ctx.send_message(Draft(topic=draft.topic, version=draft.version + 1, text=text))


class Editor(Executor):
    """Keeps the draft under review and acts on the reviewer's decision: publish, or ask the
    writer for a revision. Only the review port sends it a ReviewDecision."""

    @handler
    async def keep(self, draft: Draft, ctx: WorkflowContext[Never]) -> None:
        await ctx.set_state("draft", draft)

    @handler
    async def decide(self, decision: ReviewDecision, ctx: WorkflowContext[Revision, str]) -> None:
        draft: Draft = await ctx.get_state("draft")
        if decision.approved:
            await ctx.yield_output(f"Published v{draft.version}: {draft.text}")
        else:
            await ctx.send_message(Revision(draft=draft, feedback=decision.feedback))


def build_workflow() -> Workflow:
    writer = Writer("writer")
    review = RequestPort("review", request_type=Draft, response_type=ReviewDecision)
    editor = Editor("editor")
    return (
        WorkflowBuilder(name="review_loop", start=writer)
        .add_edge(writer, review)  # each Draft goes to the human...
        .add_edge(writer, editor)  # ...and to the editor, who keeps it
        .add_edge(review, editor)  # the human's ReviewDecision goes to the editor only
        .add_edge(editor, writer)  # a Revision: the writer drafts the next version
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
