"""What a process resuming a run from an existing database pays for, beyond the resume (W6).

No timing asserts (the figures live in ``benchmarks/bench_w6_conversation.py``): these check the
mechanisms -- the WAL is started when the store opens, not by its first commit; a checkpoint
chain is read by SQLite's own decoder, and the tolerant one still reports damaged text.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from chat_workflow import NAME, build_chat, user_message

from workflow_engine import Runtime, WorkflowRunState
from workflow_engine._errors import StoreCorruptError
from workflow_engine.storage import SqliteStore
from workflow_engine.storage._records import decode_text

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

WAITING = WorkflowRunState.IDLE_WITH_PENDING_REQUESTS


def wal_header(db: Path) -> bytes:
    """The WAL's 32-byte header: a WAL that starts over gets new salts (bytes 16-24)."""
    with open(f"{db}-wal", "rb") as wal:
        return wal.read(32)


async def chat(db: Path, turns: int) -> tuple[str, str]:
    runtime = Runtime(SqliteStore(db))
    runtime.register(build_chat)
    result = await runtime.run(NAME, user_message(0))
    run_id, request_id = result.run_id, result.pending_requests[0].request_id
    for n in range(1, turns + 1):
        await runtime.respond(request_id, user_message(n))
        result = await runtime.resume(run_id)
        request_id = result.pending_requests[0].request_id
    await runtime.close()
    return run_id, request_id


async def test_a_reopened_database_starts_its_wal_at_open_not_at_its_first_commit(
    tmp_path: Path,
) -> None:
    db = tmp_path / "chat.db"
    run_id, request_id = await chat(db, 3)
    assert not Path(f"{db}-wal").exists()  # the last connection's close checkpoints it away
    with sqlite3.connect(db) as conn:
        user_version = conn.execute("PRAGMA user_version").fetchone()[0]

    store = SqliteStore(db)
    runtime = Runtime(store)
    runtime.register(build_chat)
    await store.open()
    header = wal_header(db)
    assert len(header) == 32 and header[:4] in (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
    await runtime.respond(request_id, user_message(4))
    result = await runtime.resume(run_id)
    assert result.status is WAITING, result.error
    assert wal_header(db) == header  # the commits appended to it: no new WAL, no header sync
    await runtime.close()

    with sqlite3.connect(db) as conn:  # opening rewrote the header value it had, nothing else
        assert conn.execute("PRAGMA user_version").fetchone()[0] == user_version
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    store = SqliteStore(db)
    checkpoint = await store.latest(run_id)
    assert checkpoint is not None
    assert len(checkpoint.executor_states["assistant"]["conversation"]) == 2 * 5
    await store.close()


async def test_opening_a_database_in_use_leaves_its_wal_alone(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    await chat(db, 1)
    first = SqliteStore(db)
    await first.open()
    header = wal_header(db)
    with sqlite3.connect(db) as conn:
        frames = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    second = SqliteStore(db)
    await second.open()  # the WAL is not empty: no write
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1] == frames
    assert wal_header(db) == header
    await second.close()
    await first.close()


async def test_a_chain_is_read_strictly_and_damaged_text_still_names_its_checkpoint(
    tmp_path: Path,
) -> None:
    db = tmp_path / "chat.db"
    run_id, _ = await chat(db, 2)
    with sqlite3.connect(db) as conn:
        seq, checkpoint_id = conn.execute(
            "SELECT seq, checkpoint_id FROM checkpoints WHERE run_id = ? AND kind = 'delta' "
            "ORDER BY seq DESC LIMIT 1",
            (run_id,),
        ).fetchone()
        conn.execute(
            "UPDATE checkpoints SET body = CAST(X'7B22FF7D' AS TEXT) WHERE run_id = ? AND seq = ?",
            (run_id, seq),
        )
    store = SqliteStore(db)
    with pytest.raises(StoreCorruptError, match=rf"{checkpoint_id}.*not UTF-8"):
        await store.latest(run_id)
    # the fallback read left the connection decoding tolerantly, as every other read expects
    assert store._conn is not None and store._conn.text_factory is decode_text
    await store.close()
