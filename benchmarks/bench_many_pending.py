"""Many questions at once: one run asks ``-n`` (1,000) questions in one superstep, and a person
answers them one at a time (``respond_and_resume`` each), as a batch of approvals is worked
through.

Reported (SQLite WAL, ``synchronous=NORMAL``, a fresh file): the time of an answer (median, and
the median of the first and of the last ten: the first resumes still have every question
pending), the whole batch, and the checkpoint rows stored by kind. A resume reads the run back
with every question still pending; each answer should cost about the same, and storage should
grow with the number of questions, not with its square (outside tester 215).

    .venv/bin/python benchmarks/bench_many_pending.py
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import time

import anyio
from _durable import open_store, temp_dir
from pydantic import BaseModel

from workflow_engine import (
    Executor,
    Runtime,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
    response_handler,
)


class Question(BaseModel):
    item: int
    text: str


class Batch(Executor):
    """Asks ``n`` questions at once; each answer yields the number of the item it approves."""

    @handler
    async def ask(self, n: int, ctx: WorkflowContext[None, int]) -> None:
        for i in range(n):
            await ctx.request_info(Question(item=i, text=f"please approve item {i}"), bool)

    @response_handler
    async def answered(
        self, question: Question, approved: bool, ctx: WorkflowContext[None, int]
    ) -> None:
        await ctx.yield_output(question.item)


def build_batch() -> Workflow:
    return WorkflowBuilder(name="batch", start=Batch("batch")).build()


async def main(n: int) -> None:
    with temp_dir("many-pending-") as tmp:
        db = tmp / "runs.db"
        runtime = Runtime(await open_store(db))
        runtime.register(build_batch)
        try:
            paused = await runtime.run("batch", n)
            assert paused.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
            times = []
            for request in paused.pending_requests:
                began = time.perf_counter()
                await runtime.respond_and_resume(request.request_id, True)
                times.append(time.perf_counter() - began)
            info = await runtime.get_run(paused.run_id)
            assert info.status is WorkflowRunState.IDLE and len(info.outputs) == n
        finally:
            await runtime.close()
        with sqlite3.connect(db) as raw:
            kinds = raw.execute(
                "SELECT kind, count(*), sum(length(body)) FROM checkpoints GROUP BY kind"
            ).fetchall()
    few = min(10, len(times))
    stored = ", ".join(f"{kind} {count} rows {size / 1e6:.2f} MB" for kind, count, size in kinds)
    print(
        f"{n:,} questions answered one at a time: {statistics.median(times) * 1e3:.2f} ms an "
        f"answer (median; first {few} {statistics.median(times[:few]) * 1e3:.2f} ms, last "
        f"{few} {statistics.median(times[-few:]) * 1e3:.2f} ms), {sum(times):.2f} s in all; "
        f"checkpoints stored: {sum(size for _, _, size in kinds) / 1e6:.2f} MB ({stored})"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000, help="questions (default 1,000)")
    args = parser.parse_args()
    anyio.run(main, args.n)
