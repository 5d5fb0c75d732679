"""Checked by mypy in ``make test`` (not collected by pytest): what a type checker tells a user.

Each ``type: ignore[arg-type]`` marks a line that must be an error; mypy runs with
``warn_unused_ignores``, so if ``WorkflowContext`` stopped catching one, the check fails.
"""

from __future__ import annotations

from typing import Never

from workflow_engine import WorkflowContext


async def handler_sending_ints(ctx: WorkflowContext[int]) -> None:
    await ctx.send_message(1)
    await ctx.send_message("not an int")  # type: ignore[arg-type]
    await ctx.yield_output("declares no output")  # type: ignore[arg-type]


async def handler_yielding_strs(ctx: WorkflowContext[Never, str]) -> None:
    await ctx.yield_output("ok")
    await ctx.yield_output(3)  # type: ignore[arg-type]
    await ctx.send_message(3)  # type: ignore[arg-type]
