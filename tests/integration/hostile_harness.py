"""Helpers for the hostile-input tests: what a browser sends, what the store holds, corruption.

``store_state(db)`` reads every run and request through the Runtime API on the same SQLite file
the server or the CLI uses, so a test can say "this refusal changed nothing" exactly.
``corrupt_pending_data`` and ``corrupt_checkpoint_body`` damage a stored record in place with
sqlite3, the way a bad disk, a buggy tool or a hand edit would.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio

from tests.integration.agui_harness import Server
from workflow_engine import Runtime
from workflow_engine.storage import SqliteStore

EVIL = "https://evil.example"


def browser_headers(origin: str = EVIL, content_type: str = "text/plain;charset=UTF-8") -> dict:
    """What a page on ``origin`` sends with ``fetch(url, {method: "POST", mode: "no-cors",
    body: "..."})`` or a ``<form enctype="text/plain">``: a "simple" request, sent cross-site
    without a CORS preflight."""
    return {
        "content-type": content_type,
        "origin": origin,
        "referer": f"{origin}/",
        "accept": "*/*",
        "sec-fetch-site": "cross-site",
        "sec-fetch-mode": "no-cors",
        "sec-fetch-dest": "empty",
        "user-agent": "Mozilla/5.0 (X11; Linux x86_64) Chrome/126.0 Safari/537.36",
    }


StoreState = tuple[tuple[tuple[Any, ...], ...], tuple[tuple[Any, ...], ...]]


def store_state(db: Path) -> StoreState:
    """Every run (status, superstep, lease version, latest checkpoint) and every request
    (status, answer) in ``db``, read through the Runtime API."""

    async def read() -> StoreState:
        runtime = Runtime(SqliteStore(db))
        try:
            runs = await runtime.list_runs()
            requests = await runtime.store.list_requests(status=None)
        finally:
            await runtime.close()
        return (
            tuple(
                sorted(
                    (r.run_id, r.status.value, r.superstep, r.version, r.latest_checkpoint_id)
                    for r in runs
                )
            ),
            tuple(
                sorted(
                    (q.request_id, q.run_id, q.status, json.dumps(q.answer, sort_keys=True))
                    for q in requests
                )
            ),
        )

    return anyio.run(read)


def server_log_clean(server: Server) -> str:
    """The server's log, asserted free of tracebacks."""
    text = server.log.read_text(errors="replace") if server.log.exists() else ""
    assert "Traceback" not in text, text[-4000:]
    return text


# --- corrupting stored records ------------------------------------------------------------------

BAD_VALUES: dict[str, Any] = {
    "float": {"$float": "x"},
    "bytes": {"$bytes": "abc"},
    "items": {"$items": 5},
    "items-pair": {"$items": [[1]]},
    "tuple": {"$tuple": 5},
    "dict": {"$dict": 5},
    "type": {"$type": "no.such.Type", "data": {}},
}
"""Values that are valid JSON but not valid tagged-json/1, one per marker."""


@contextmanager
def default_server(base: Path) -> Iterator[Server]:
    """The default ``serve`` (loopback, no token, no CORS origins), its files and the demo's
    ledger in ``base``; when it stops, its log must hold no traceback."""
    with Server(
        db=base / "runs.db",
        log=base / "server.log",
        env={"WORKFLOW_ENGINE_DEMO_LEDGER": str(base / "ledger.jsonl")},
    ) as running:
        yield running
    server_log_clean(running)


def corrupt_pending_data(db: Path, run_id: str, value: Any) -> str:
    """Replace the data of the run's pending request in the checkpoint row that added it (a
    delta's ``requests_added`` or a snapshot's ``pending_requests``); returns the request id."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT checkpoint_id, body FROM checkpoints WHERE run_id = ? ORDER BY seq DESC",
            (run_id,),
        ).fetchall()
        for checkpoint_id, body in rows:
            parsed = json.loads(body)
            records = parsed.get("requests_added") or parsed.get("pending_requests") or {}
            if records:
                request_id = next(iter(records))
                records[request_id]["data"] = value
                conn.execute(
                    "UPDATE checkpoints SET body = ? WHERE checkpoint_id = ?",
                    (json.dumps(parsed), checkpoint_id),
                )
                return request_id
    raise AssertionError(f"run {run_id} has no checkpoint with a pending request")


def corrupt_checkpoint_body(db: Path, run_id: str, body: str = "{not json") -> str:
    """Overwrite the run's latest checkpoint row; returns its checkpoint id."""
    with sqlite3.connect(db) as conn:
        (checkpoint_id,) = conn.execute(
            "SELECT checkpoint_id FROM checkpoints WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
            (run_id,),
        ).fetchone()
        conn.execute(
            "UPDATE checkpoints SET body = ? WHERE checkpoint_id = ?", (body, checkpoint_id)
        )
    return checkpoint_id


def corrupt_request_data(db: Path, request_id: str, text: str) -> None:
    """Overwrite a request row's ``data`` column with ``text`` (raw, need not be JSON)."""
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE requests SET data = ? WHERE request_id = ?", (text, request_id))
