"""Keep-alive comments flow while a run is busy, through a real uvicorn server in-process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import httpx
from fastapi import FastAPI

from tests.integration.agui_harness import in_process
from workflow_engine import Executor, WorkflowBuilder, WorkflowContext, handler
from workflow_engine.storage import SqliteStore
from workflow_engine_agui import add_agui_endpoint


class Slow(Executor):
    @handler
    async def work(self, text: str, ctx: WorkflowContext[str, str]) -> None:
        await anyio.sleep(0.6)
        await ctx.yield_output(text.upper())


def test_keepalive_comments_during_a_long_step(tmp_path: Path) -> None:
    app = FastAPI()
    workflow = WorkflowBuilder(name="slow", start=Slow("slow")).build()
    store = SqliteStore(tmp_path / "runs.db")
    add_agui_endpoint(app, workflow, "/slow", store=store, keepalive_seconds=0.1)
    with in_process(app) as port, _closing(store):
        body = {
            "threadId": "t",
            "runId": "r",
            "messages": [{"id": "m", "role": "user", "content": "hello"}],
        }
        lines = []
        with httpx.stream("POST", f"http://127.0.0.1:{port}/slow", json=body, timeout=10) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line]
        comments = [line for line in lines if line.startswith(":")]
        data = [line for line in lines if line.startswith("data:")]
        assert len(comments) >= 3  # ~0.6 s of work at one comment per 0.1 s of silence
        assert '"RUN_STARTED"' in data[0] and '"RUN_FINISHED"' in data[-1]
        assert any("HELLO" in line for line in data)


@contextmanager
def _closing(store: SqliteStore) -> Iterator[None]:
    try:
        yield
    finally:
        anyio.run(store.close)
