"""W6 over AG-UI: one thread, a client that sends the thread's whole history with each message.

AG-UI clients (CopilotKit among them) send every message of a thread again with each new one,
and each message starts a run of the served agent: its input, its agent's conversation and its
output each hold the whole history. This drives one thread of ``-n`` (1,000) messages through
``add_agui_endpoint`` over an ``Agent`` with an offline client (in process, through httpx's ASGI
transport: the server's work, not the network's), on a fresh SQLite file, and prints at
milestones:

* the request's time (median, mean and slowest of the last 20 requests: a full garbage
  collection, which walks every object the process holds, lands on some requests only), and
  the first request after a restart (a new store and app on the same file);
* what each run stored: its checkpoint rows (body, lists kept apart, chunk places) and the new
  chunks it added to ``list_chunks`` (the database's growth over the last 20 runs, per run),
  next to the history's size in the request.

    .venv/bin/python benchmarks/bench_agui_thread.py            # -n 1000
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import time
import uuid
from pathlib import Path

import anyio
import httpx
from _durable import temp_dir
from fastapi import FastAPI

from workflow_engine.executors import Agent, Rule, ScriptedChatClient
from workflow_engine.storage import SqliteStore
from workflow_engine_agui import add_agui_endpoint

WINDOW = 20


def echo_client() -> ScriptedChatClient:
    """An offline model that acknowledges the newest message (reads nothing earlier)."""
    return ScriptedChatClient([Rule(reply=lambda seen: f"Noted: {seen[-1].text[:48]}. More?")])


def user_text(n: int) -> str:
    return f"Message {n:05d}: please note that my order number is {10000 + n} and reply."


def stored_bytes(db: Path) -> int:
    """Checkpoint rows (body, lists kept apart, chunk places) and the chunks they share."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (rows,) = conn.execute(
            "SELECT coalesce(sum(length(CAST(body AS BLOB)) + "
            "coalesce(length(CAST(list_items AS BLOB)), 0) + coalesce(length(chunks), 0)), 0) "
            "FROM checkpoints"
        ).fetchone()
        (chunks,) = conn.execute(
            "SELECT coalesce(sum(length(CAST(items AS BLOB))), 0) FROM list_chunks"
        ).fetchone()
    return int(rows) + int(chunks)


class Thread:
    """One thread's client, against an app it can restart on the same file."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.thread_id = uuid.uuid4().hex
        self.history: list[dict[str, str]] = []
        self._open()

    def _open(self) -> None:
        self.store = SqliteStore(self.db)
        app = FastAPI()
        add_agui_endpoint(app, Agent("assistant", client=echo_client()), "/chat", store=self.store)
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bench", timeout=60.0
        )

    async def restart(self) -> None:
        await self.client.aclose()
        await self.store.close()
        self._open()

    async def close(self) -> None:
        await self.client.aclose()
        await self.store.close()

    async def message(self, n: int) -> tuple[float, int]:
        """Send message ``n`` with the whole history: seconds, and the request's bytes."""
        said = {"id": f"u{n}", "role": "user", "content": user_text(n)}
        body = {
            "threadId": self.thread_id,
            "runId": uuid.uuid4().hex,
            "messages": [*self.history, said],
            "state": {},
            "tools": [],
            "context": [],
            "forwardedProps": {},
        }
        content = json.dumps(body).encode()
        headers = {"content-type": "application/json", "accept": "text/event-stream"}
        start = time.perf_counter()
        response = await self.client.post("/chat", content=content, headers=headers)
        seconds = time.perf_counter() - start
        events = [
            json.loads(line[5:]) for line in response.text.splitlines() if line[:5] == "data:"
        ]
        if response.status_code != 200 or not events or events[-1]["type"] != "RUN_FINISHED":
            raise SystemExit(f"message {n}: {response.status_code} {response.text[-300:]}")
        reply = "".join(e.get("delta", "") for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
        self.history += [said, {"id": f"a{n}", "role": "assistant", "content": reply}]
        return seconds, len(content)


async def main(messages: int) -> None:
    marks = sorted({m for m in (10, 100, 300, 1000, 2000, 5000) if m < messages} | {messages})
    with temp_dir("agui-thread-") as tmp:
        db = tmp / "agui-thread.db"
        thread = Thread(db)
        times: list[float] = []
        sizes: dict[int, int] = {}
        before = 0
        for n in range(1, messages + 1):
            seconds, request_bytes = await thread.message(n)
            times.append(seconds)
            sizes[n] = stored_bytes(db)
            if n not in marks:
                continue
            first = max(1, n - WINDOW)
            per_run = (sizes[n] - sizes.get(first, before)) / max(1, n - first)
            await thread.restart()
            cold, _ = await thread.message(n + 1)
            times.append(cold)
            sizes[n + 1] = stored_bytes(db)
            recent = times[-WINDOW - 1 : -1]
            print(
                f"AG-UI thread, full-history client, message {n:>5,}: request "
                f"{statistics.median(recent) * 1e3:.1f} ms (median of {len(recent)}; mean "
                f"{statistics.mean(recent) * 1e3:.1f}, slowest {max(recent) * 1e3:.1f}), first "
                f"after a restart {cold * 1e3:.1f} ms; stored per run {per_run / 1024:,.1f} KiB "
                f"(the request carries {request_bytes / 1024:,.1f} KiB of history); all rows "
                f"and chunks {sizes[n] / 1024 / 1024:,.2f} MiB",
                flush=True,
            )
        await thread.close()
    print(
        "  target (issue 12, W6): storage per message flat in the thread's length (only the "
        "new messages written)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", "--messages", type=int, default=1000, help="messages on the thread")
    args = parser.parse_args()
    anyio.run(main, args.messages)
