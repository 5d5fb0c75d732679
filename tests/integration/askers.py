"""A one-node workflow that asks for an answer of a given type and yields what it got: how the
answer tests try type after type. No ``from __future__ import annotations`` here: the
handler's annotation is the type itself, evaluated where the class is made."""

from collections.abc import Callable
from typing import Any, Never

from workflow_engine import (
    Executor,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    response_handler,
)


def asker_workflow(
    name: str, answer_type: Any, mend: Callable[[Any], Any] | None = None, questions: int = 1
) -> Workflow:
    """Workflow ``name``: its start node asks its message as a question answered with
    ``answer_type`` (``questions`` times at once) and yields each answer; ``mend``: the node's
    ``validate_response``, which may return the answer as it is to be kept."""

    class Asker(Executor):
        @handler
        async def ask(self, question: str, ctx: WorkflowContext[Never, Any]) -> None:
            for _ in range(questions):
                await ctx.request_info(question, answer_type)

        @response_handler
        async def answered(
            self,
            question: str,
            answer: answer_type,  # type: ignore[valid-type]
            ctx: WorkflowContext[Never, Any],
        ) -> None:
            await ctx.yield_output(answer)

        def validate_response(self, request: Any, response: Any) -> Any:
            return mend(response) if mend is not None else None

    return WorkflowBuilder(name, start=Asker("asker")).build()
