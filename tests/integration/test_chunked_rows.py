"""Long arrays of large checkpoint rows are stored once, in chunks shared by every row that
holds them: an AG-UI thread whose client sends the whole history with each message grows by
what each message adds, not by the history again (it stored the history three times per run).
Chunks are counted by the rows that use them, given back by prune, checked when read, and
survive a SIGKILL mid-write."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from agui_harness import EVENT, in_process, parse_sse, sse_lines
from fastapi import FastAPI
from stored_chunks import check_counts, stored_bytes

from workflow_engine import Runtime, StoreCorruptError, WorkflowRunState
from workflow_engine.executors import Agent, ChatMessage, Rule, ScriptedChatClient
from workflow_engine.storage import SqliteStore
from workflow_engine.storage._schema import SCHEMA_VERSION
from workflow_engine_agui import add_agui_endpoint

pytestmark = pytest.mark.anyio

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def acknowledging() -> ScriptedChatClient:
    """An offline model that acknowledges the newest message (and says how many it saw)."""
    return ScriptedChatClient(
        [Rule(reply=lambda seen: f"Noted: {seen[-1].text[:40]} ({len(seen)} messages so far)")]
    )


def message(n: int) -> str:
    return f"Message {n:04d}: please keep in mind that my order number is {1000 + n} and reply."


def post(port: int, thread: str, messages: list[dict[str, str]]) -> str:
    """One AG-UI request on ``thread``; the assistant's text it streamed."""
    body = {"threadId": thread, "runId": f"r{len(messages)}", "messages": messages}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0) as http:
        response = http.post("/chat", json=body, headers={"accept": "text/event-stream"})
    assert response.status_code == 200, response.text
    events = [EVENT.validate_json(d) for d in parse_sse(iter(sse_lines(response.content)))]
    assert events[-1].type == "RUN_FINISHED", events[-1]
    return "".join(e.delta for e in events if e.type == "TEXT_MESSAGE_CONTENT")


@pytest.mark.slow
def test_an_agui_thread_with_a_full_history_client_grows_by_each_message(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agui.db"
    store = SqliteStore(db)
    app = FastAPI()
    add_agui_endpoint(app, Agent("assistant", client=acknowledging()), "/chat", store=store)
    history: list[dict[str, str]] = []
    added: dict[int, int] = {}
    with in_process(app) as port:
        before = 0
        for n in range(1, 141):
            history.append({"id": f"u{n}", "role": "user", "content": message(n)})
            reply = post(port, "thread-1", history)  # the whole history, as CopilotKit sends
            assert reply.startswith(f"Noted: {message(n)[:40]}") and f"({2 * n - 1} " in reply
            history.append({"id": f"a{n}", "role": "assistant", "content": reply})
            after = stored_bytes(db)  # (the first request created the tables)
            added[n] = after - before
            before = after
    early = sum(added[n] for n in range(61, 81)) / 20
    late = sum(added[n] for n in range(121, 141)) / 20
    # each run stored the history three times: 88 KB a run at messages 61-80, 161 KB at
    # 121-140; now the chunks at the ends of its arrays, about 15 KB at both
    print(f"added per run: {early:.0f} B at messages 61-80, {late:.0f} B at 121-140")
    assert late <= early * 1.25, (early, late)
    assert late < 25_000, late
    chunks = check_counts(db)
    assert chunks > 0
    # and the newest run reads back whole, in a new process
    code = (
        "import anyio, sys\n"
        "from workflow_engine.storage import SqliteStore\n"
        "async def main():\n"
        "    store = SqliteStore(sys.argv[1])\n"
        "    runs = await store.run_ids()\n"
        "    newest = max(runs, key=lambda r: int(r.rpartition('/')[2]))\n"
        "    checkpoint = await store.latest(newest)\n"
        "    print(newest, len(checkpoint.executor_states['assistant']['conversation']))\n"
        "    await store.close()\n"
        "anyio.run(main)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(db)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["chat:thread-1/139", str(2 * 140)], out


def conversation(n: int) -> list[ChatMessage]:
    """The history a full-history client sends with its ``n``-th message."""
    messages: list[ChatMessage] = []
    for i in range(1, n + 1):
        messages.append(ChatMessage.user(message(i)))
        if i < n:
            messages.append(ChatMessage.assistant(f"Noted {i}."))
    return messages


async def chats(
    db: Path, runs: int, length: int, chunking: tuple[int, int, int, int, int] | None = None
) -> list[str]:
    """``runs`` runs of an agent, each given a history one message longer."""
    store = SqliteStore(db)
    if chunking is not None:
        store._chunking = chunking
    runtime = Runtime(store)
    workflow = Agent("assistant", client=acknowledging()).as_workflow()
    runtime.register(workflow)
    ids = []
    for k in range(runs):
        result = await runtime.run(workflow.name, conversation(length + k))
        assert result.status is WorkflowRunState.IDLE, result.error
        ids.append(result.run_id)
    await runtime.close()
    return ids


async def test_prune_gives_back_the_chunks_of_what_it_deletes(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    ids = await chats(db, 6, 90)
    assert check_counts(db) > 0
    store = SqliteStore(db)
    kept = {run_id: await store.latest(run_id) for run_id in ids}
    deleted = await store.prune(keep_last=1)
    assert deleted > 0
    assert check_counts(db) > 0
    for run_id in ids:
        assert await store.latest(run_id) == kept[run_id]
    await store.prune(finished_before=time.time() + 60)
    assert await store.run_ids() == []
    await store.close()
    assert check_counts(db) == 0
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM list_chunks").fetchone()[0] == 0


async def test_runs_sharing_a_history_share_its_chunks(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    await chats(db, 1, 100)
    one = stored_bytes(db)
    await chats(db, 1, 101)
    two = stored_bytes(db)
    # the second run's history is the first's and two messages: it adds a fraction of it
    assert two - one < one / 4, (one, two)
    check_counts(db)


async def test_a_fork_shares_the_chunks_of_the_run_it_forks(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    (run_id,) = await chats(db, 1, 100)
    one = stored_bytes(db)
    runtime = Runtime(SqliteStore(db))
    runtime.register(Agent("assistant", client=acknowledging()).as_workflow())
    forked = await runtime.fork(run_id)
    await runtime.close()
    assert stored_bytes(db) - one < one / 10, (one, stored_bytes(db))
    check_counts(db)
    store = SqliteStore(db)
    original, copy = await store.latest(run_id), await store.latest(forked)
    assert copy.executor_states == original.executor_states
    await store.close()


@pytest.mark.parametrize("damage", ["changed", "missing"])
async def test_a_damaged_chunk_is_named_when_read(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "runs.db"
    (run_id,) = await chats(db, 1, 100)
    with sqlite3.connect(db) as conn:
        (digest,) = conn.execute("SELECT digest FROM list_chunks LIMIT 1").fetchone()
        if damage == "changed":
            conn.execute("UPDATE list_chunks SET items = '[1]' WHERE digest = ?", (digest,))
        else:
            conn.execute("DELETE FROM list_chunks WHERE digest = ?", (digest,))
    store = SqliteStore(db)
    with pytest.raises(StoreCorruptError) as caught:
        await store.latest(run_id)
    await store.close()
    said = str(caught.value)
    assert run_id in said and ("damaged" in said or "missing" in said), said
    assert (digest in said) if damage == "changed" else ("missing" in said)
    # the command line says so too, with its exit code for a damaged store, no traceback
    done = subprocess.run(
        [str(Path(sys.executable).parent / "workflow-engine"), "runs", "show", run_id, "--db", db],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 6, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and run_id in done.stdout + done.stderr


async def test_a_version_6_database_is_upgraded_and_chunks_from_then_on(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    (old,) = await chats(db, 1, 20)  # (small rows: nothing chunked)
    with sqlite3.connect(db) as conn:
        chunked = "SELECT count(*) FROM checkpoints WHERE chunks IS NOT NULL"
        assert conn.execute(chunked).fetchone()[0] == 0
        for (trigger,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"):
            if "chunk" in trigger:
                conn.execute(f"DROP TRIGGER {trigger}")
        conn.execute("ALTER TABLE checkpoints DROP COLUMN chunks")
        conn.execute("DROP TABLE list_chunks")
        conn.execute("UPDATE we_schema SET version = 6")
    (new,) = await chats(db, 1, 100)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT version FROM we_schema").fetchone()[0] == SCHEMA_VERSION
    assert check_counts(db) > 0
    store = SqliteStore(db)
    assert len((await store.latest(old)).executor_states["assistant"]["conversation"]) == 40
    assert len((await store.latest(new)).executor_states["assistant"]["conversation"]) == 200
    await store.close()


WRITER = """
import anyio, sys
sys.path.insert(0, sys.argv[2])
from test_chunked_rows import chats
anyio.run(chats, __import__("pathlib").Path(sys.argv[1]), 1000, 100)
"""


def chunked_rows(db: Path) -> int:
    """How many checkpoint rows of the file hold chunks (0 before it has tables)."""
    if not db.exists():
        return 0
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        try:
            query = "SELECT count(*) FROM checkpoints WHERE chunks IS NOT NULL"
            return int(conn.execute(query).fetchone()[0])
        except sqlite3.OperationalError:  # (no tables yet, or a column being added)
            return 0


@pytest.mark.slow
def test_chunks_stay_counted_when_a_writer_is_killed(tmp_path: Path) -> None:
    """SIGKILL a process writing runs with large rows, at three moments: what is stored reads
    back, and each chunk is counted by exactly the rows that use it."""
    db = tmp_path / "runs.db"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(HERE)])}
    for jitter in (0.0, 0.013, 0.029):
        before = chunked_rows(db)
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(HERE)], env=env)
        # killed once it has written rows with chunks (a fixed wait killed it before it had
        # created the tables, on a loaded machine), then a little later each round
        deadline = time.monotonic() + 120
        while chunked_rows(db) < before + 2 and time.monotonic() < deadline:
            assert proc.poll() is None, "the writer stopped by itself"
            time.sleep(0.02)
        time.sleep(jitter)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert chunked_rows(db) >= before + 2
        check_counts(db)

    async def read_all() -> int:
        store = SqliteStore(db)
        runs = await store.run_ids()
        for run_id in runs:
            assert (await store.latest(run_id)) is not None
        await store.close()
        return len(runs)

    import anyio

    assert anyio.run(read_all) > 0
    assert check_counts(db) > 0


WHOLE = (10**12, 64, 32, 2048, 32)
"""Chunking that never applies: rows written as an engine before schema 7 wrote them."""


async def test_a_chunked_row_says_a_version_an_older_engine_refuses(tmp_path: Path) -> None:
    """A prune's snapshot or a fork of rows an older engine wrote (checkpoint schema 5) is
    chunked, so it says schema 6: an older process that still has the file open refuses it
    instead of reading its arrays as empty (outside tester 125: it read 6,400 items as 0,
    and saved that)."""
    db = tmp_path / "runs.db"
    ids = await chats(db, 2, 100, chunking=WHOLE)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM list_chunks").fetchone()[0] == 0
        conn.execute("UPDATE checkpoints SET schema_version = 5")
    runtime = Runtime(SqliteStore(db))
    runtime.register(Agent("assistant", client=acknowledging()).as_workflow())
    await runtime.fork(ids[1])
    assert await runtime.store.prune(keep_last=1) > 0
    await runtime.close()
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT run_id, seq, schema_version, chunks IS NOT NULL, lists IS NOT NULL "
            "FROM checkpoints"
        ).fetchall()
    chunked = [row for row in rows if row[3]]
    assert {row[0] for row in chunked} == {*ids, forked_id(rows, ids)}, rows
    assert all(row[2] >= 6 for row in chunked), rows
    assert all(row[2] >= 5 for row in rows if row[4]), rows
    check_counts(db)


def forked_id(rows: list[tuple], ids: list[str]) -> str:
    (forked,) = {row[0] for row in rows} - set(ids)
    return forked


async def test_rows_an_older_engine_deletes_give_their_chunks_back(tmp_path: Path) -> None:
    """The database counts chunks down itself: a process of an older version that still has
    the file open deletes rows without knowing of chunks (its prune left every chunk behind,
    for good: outside tester 125). Arrays of 1,200 items: chunks named by index chunks."""
    db = tmp_path / "runs.db"
    await chats(db, 2, 600)
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM list_chunks WHERE digest LIKE 'i%'").fetchone()
        assert check_counts(db) > 0
        # the statements of the previous engine's prune(finished_before=)
        for (run_no,) in conn.execute("SELECT run_no FROM runs").fetchall():
            span = 2**32
            conn.execute(
                "DELETE FROM checkpoints WHERE pos BETWEEN ? AND ?",
                (run_no * span, run_no * span + span - 1),
            )
        conn.execute("DELETE FROM runs")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM list_chunks").fetchone()[0] == 0


async def test_a_chunks_column_that_names_nothing_is_damage(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    (run_id,) = await chats(db, 1, 100)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE checkpoints SET chunks = '{}' WHERE chunks IS NOT NULL")
    store = SqliteStore(db)
    with pytest.raises(StoreCorruptError, match="its chunks column is not what it should be"):
        await store.latest(run_id)
    await store.close()
