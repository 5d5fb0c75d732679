"""A snapshot's long lists are kept apart from its body: a run resumed in a new process reads
them only when a handler needs them, and reads them right whenever it does -- after restarts,
prunes by another process, and from a database an older version wrote."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from stored_chunks import check_counts

from workflow_engine import (
    CheckpointNotFoundError,
    Executor,
    Runtime,
    StoreCorruptError,
    StoredItem,
    StoreUnavailableError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunResult,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine.storage import SqliteStore, _stored_lists
from workflow_engine.storage._rows import LONG_LIST
from workflow_engine.storage._schema import SCHEMA_VERSION

pytestmark = [pytest.mark.anyio]

WAITING = WorkflowRunState.IDLE_WITH_PENDING_REQUESTS


class Notebook(Executor):
    """Keeps the list state ``notes``; does what each command says, yields what it read, then
    asks for the next command (the run pauses)."""

    @handler
    async def first(self, command: list, ctx: WorkflowContext[None, list]) -> None:
        await self._do(command, ctx)

    @response_handler
    async def next(self, asked: str, command: list, ctx: WorkflowContext[None, list]) -> None:
        await self._do(command, ctx)

    async def _do(self, command: list, ctx: WorkflowContext[None, list]) -> None:
        what, arg = command
        read: Any = None
        if what == "append":
            await ctx.append_state("notes", arg)
        elif what == "set":  # the whole list again: its first ``arg`` items, then a new one
            notes = await ctx.get_state("notes", [])
            await ctx.set_state("notes", [*notes[:arg], f"set {len(notes)}"])
        elif what == "read":  # these items only (negative: from the end)
            items = await ctx.get_state_items("notes")
            read = [items[i] for i in arg if -len(items) <= i < len(items)]
        elif what == "whole":
            read = await ctx.get_state("notes", [])
        await ctx.yield_output([what, read])
        await ctx.request_info("next?", list)


def notebook() -> Any:
    return WorkflowBuilder("notebook", start=Notebook("notes")).build()


def notes(start: int, n: int) -> list[str]:
    """Notes long enough that a snapshot holding many outweighs the deltas after it (so the
    next snapshot, which reads them, is far off)."""
    return [f"note {i} " + "." * 100 for i in range(start, start + n)]


class Session:
    """A notebook run driven command by command, each in the store and runtime of the moment."""

    def __init__(
        self,
        db: Path,
        lists_apart_from: int = LONG_LIST,
        chunking: tuple[int, int, int, int, int] | None = None,
    ) -> None:
        self.db = db
        self.lists_apart_from = lists_apart_from
        self.chunking = chunking
        self.runtime = self._runtime()
        self.run_id = ""
        self.request_id = ""

    def _runtime(self) -> Runtime:
        store = SqliteStore(self.db, snapshot_every=2, span_every=2)
        store._lists_apart_from = self.lists_apart_from
        if self.chunking is not None:  # (rows chunked far more often than the store's own)
            store._chunking = self.chunking
        runtime = Runtime(store)
        runtime.register(notebook)
        return runtime

    async def restart(self) -> None:
        """What a new process does: a store that has read nothing yet."""
        await self.runtime.close()
        self.runtime = self._runtime()

    async def do(self, command: list) -> WorkflowRunResult:
        if not self.run_id:
            result = await self.runtime.run("notebook", command)
            self.run_id = result.run_id
        else:
            await self.runtime.respond(self.request_id, command)
            result = await self.runtime.resume(self.run_id)
        if result.status is WAITING:
            self.request_id = result.pending_requests[0].request_id
        return result

    async def read(self, command: list) -> Any:
        result = await self.do(command)
        assert result.status is WAITING, result.error
        return result.outputs[-1][1]


async def long_notebook(db: Path, n: int, then: int, run_id: str | None = None) -> Session:
    """A run of ``n`` notes, then ``then`` more one by one (a snapshot follows the first
    ones: it keeps them apart)."""
    session = Session(db)
    if run_id is not None:
        result = await session.runtime.run("notebook", ["append", notes(0, n)], run_id=run_id)
        session.run_id, session.request_id = run_id, result.pending_requests[0].request_id
    else:
        await session.do(["append", notes(0, n)])
    for i in range(then):
        await session.do(["append", notes(n + i, 1)])
    return session


def rows_apart(db: Path) -> list[tuple[int, str]]:
    """(seq, lists) of the snapshot rows that keep lists apart."""
    with sqlite3.connect(db) as raw:
        return raw.execute(
            "SELECT seq, lists FROM checkpoints WHERE list_items IS NOT NULL ORDER BY pos"
        ).fetchall()


async def test_a_resumed_run_reads_old_items_only_when_a_handler_needs_them(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    session = await long_notebook(db, 100, then=4)
    assert rows_apart(db), "no snapshot kept its notes apart"
    await session.restart()
    with sqlite3.connect(db) as raw:  # what a resume that needs no old note never reads
        raw.execute("UPDATE checkpoints SET list_items = '[damaged' WHERE list_items IS NOT NULL")

    # a new process appends and reads the newest note: the damaged ones are never read
    await session.do(["append", ["newest"]])
    assert await session.read(["read", [-1]]) == ["newest"]
    # reading an old note reads them, and says what is damaged: which run, which checkpoint
    *_, (seq, _) = rows_apart(db)  # (the newest: the one the resume folded)
    with pytest.raises(StoreCorruptError) as info:
        await session.do(["read", [0]])
    assert str(info.value).startswith(
        f"run {session.run_id!r}: list state 'notes' of executor 'notes' in checkpoint "
    ), info.value
    assert f"(#{seq}) is damaged: " in str(info.value), info.value
    await session.runtime.close()


async def test_items_read_after_another_process_pruned_their_snapshot(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    session = await long_notebook(db, 100, then=3)
    await session.restart()
    await session.do(["append", ["after the restart"]])  # (the notes now unread placeholders)
    first_apart = rows_apart(db)[0][0]

    other = SqliteStore(db)
    assert await other.prune(keep_last=1) > 0
    await other.close()
    assert all(seq > first_apart for seq, _ in rows_apart(db))  # the snapshot read is gone

    whole = await session.read(["whole", None])
    assert whole == [*notes(0, 103), "after the restart"]
    await session.do(["append", notes(200, 70)])  # and snapshots written from them read right
    for _ in range(3):
        await session.do(["append", ["more"]])
    await session.restart()
    assert await session.read(["whole", None]) == [
        *notes(0, 103),
        "after the restart",
        *notes(200, 70),
        "more",
        "more",
        "more",
    ]
    await session.runtime.close()


async def held_checkpoint(db: Path, run_id: str | None = None) -> tuple[Session, Any]:
    """A run of 100+ notes and the checkpoint a new process's resume gave back: its notes are
    placeholders, none read yet."""
    session = await long_notebook(db, 100, then=3, run_id=run_id)
    await session.restart()
    result = await session.do(["append", ["held"]])
    stored = result.checkpoint.executor_states["notes"]["notes"]
    assert type(stored[0]) is StoredItem and not stored[0].group.loaded
    return session, result.checkpoint


async def test_a_held_checkpoint_never_reads_a_list_that_replaced_its_items(
    tmp_path: Path,
) -> None:
    """Another process replaces the list and prunes: what the held checkpoint recorded is no
    longer stored anywhere, and reading it says so -- it does not read the new list's items
    (outside tester 116: they were read as if they were the run's)."""
    db = tmp_path / "runs.db"
    session, held = await held_checkpoint(db)
    await session.restart()
    await session.do(["set", 0])  # the list is now one item...
    await session.do(["append", notes(500, 120)])  # ...then 121: long enough to hold 104
    for _ in range(3):
        await session.do(["append", ["x"]])
    other = SqliteStore(db)
    assert await other.prune(keep_last=1) > 0
    await other.close()

    with pytest.raises(CheckpointNotFoundError) as info:
        held.to_json()  # (our error, not one pydantic wraps)
    message = str(info.value)
    assert message.startswith(f"run {session.run_id!r}: list state 'notes' of executor 'notes'")
    assert "no longer stored" in message and "the list was replaced" in message, message
    with pytest.raises(CheckpointNotFoundError):
        _ = held.executor_states["notes"]["notes"][0].value
    # the run itself reads what it holds now
    await session.restart()
    assert await session.read(["read", [0, 1]]) == ["set 104", notes(500, 1)[0]]
    await session.runtime.close()


async def test_a_held_checkpoint_never_reads_another_file_of_the_same_name(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    session, held = await held_checkpoint(db, run_id="the-run")
    await session.runtime.close()
    for path in tmp_path.glob("runs.db*"):
        path.unlink()
    other = Session(db)  # another file there, with a run of the same id, other notes
    result = await other.runtime.run("notebook", ["append", ["other"] * 120], run_id="the-run")
    other.run_id, other.request_id = "the-run", result.pending_requests[0].request_id
    for _ in range(3):
        await other.do(["append", ["other"]])
    await other.runtime.close()

    with pytest.raises(StoreCorruptError, match="or the database file was replaced"):
        held.to_json()


async def test_a_list_that_cannot_be_read_now_leaves_the_run_to_resume_later(
    tmp_path: Path,
) -> None:
    """The file cannot be opened for the list's read (moved away while the store has it open):
    the resume raises, the run is not marked failed, and it goes on once the file is back."""
    db = tmp_path / "runs.db"
    session, _ = await held_checkpoint(db)
    await session.restart()
    await session.do(["append", ["after"]])
    moved = tmp_path / "moved.db"
    db.rename(moved)
    try:
        with pytest.raises(StoreUnavailableError, match="could not be read from"):
            await session.do(["read", [0]])
    finally:
        moved.rename(db)
    info = await session.runtime.get_run(session.run_id)
    assert info.status is not WorkflowRunState.FAILED, info
    result = await session.runtime.resume(session.run_id)
    assert result.status is WAITING, result.error
    assert result.outputs[-1] == ["read", [notes(0, 1)[0]]]
    await session.runtime.close()


async def test_placeholders_read_the_file_their_store_opened_after_a_change_of_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    session, held = await held_checkpoint(Path("runs.db"))  # (a relative path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert held.executor_states["notes"]["notes"][0].value == notes(0, 1)[0]
    await session.runtime.close()


def as_version_5(db: Path) -> None:
    """Rewrite a database as schema version 5 wrote it: every snapshot whole in its body."""
    with sqlite3.connect(db) as raw:
        for pos, body, list_items in raw.execute(
            "SELECT pos, body, list_items FROM checkpoints WHERE list_items IS NOT NULL"
        ).fetchall():
            data = json.loads(body)
            for executor_id, lists in json.loads(list_items).items():
                data["executor_states"][executor_id].update(lists)
            data["schema_version"] = 4
            raw.execute("UPDATE checkpoints SET body = ? WHERE pos = ?", (json.dumps(data), pos))
        raw.execute("UPDATE checkpoints SET schema_version = 4")
        raw.execute("ALTER TABLE checkpoints DROP COLUMN list_items")
        raw.execute("ALTER TABLE checkpoints DROP COLUMN lists")
        raw.execute("UPDATE we_schema SET version = 5")


async def test_a_version_5_database_goes_on_with_its_lists_apart_from_then_on(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs.db"
    session = await long_notebook(db, 80, then=3)
    await session.runtime.close()
    assert rows_apart(db)
    as_version_5(db)

    session.runtime = session._runtime()
    assert await session.read(["read", [0, -1]]) == [notes(0, 1)[0], notes(82, 1)[0]]
    with sqlite3.connect(db) as raw:
        assert raw.execute("SELECT version FROM we_schema").fetchone()[0] == SCHEMA_VERSION
    for n in range(4):
        await session.do(["append", notes(83 + n, 1)])
    assert rows_apart(db), "a snapshot written after the upgrade keeps its notes apart"
    await session.restart()
    assert await session.read(["whole", None]) == notes(0, 87)
    await session.runtime.close()


# --- the property: whatever the commands, restarts and prunes, a run reads what it wrote ----------

commands = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 40)),
        st.tuples(st.just("set"), st.integers(0, 90)),
        st.tuples(st.just("read"), st.lists(st.integers(-100, 100), max_size=4)),
        st.tuples(st.just("whole"), st.none()),
        st.tuples(st.just("restart"), st.none()),
        st.tuples(st.just("prune"), st.integers(1, 3)),
    ),
    min_size=1,
    max_size=14,
)


@settings(
    max_examples=20 if os.environ.get("PROPERTY_EXAMPLES") == "half" else 40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    commands=commands,
    lists_apart_from=st.sampled_from([1, 5, LONG_LIST]),
    chunking=st.sampled_from([None, (1, 2, 2, 8, 2), (300, 3, 1, 200, 3), (2000, 8, 3, 64, 32)]),
)
def test_a_run_reads_its_list_as_written_whatever_restarts_and_prunes_come_between(
    tmp_path_factory: pytest.TempPathFactory,
    commands: list[tuple],
    lists_apart_from: int,
    chunking: tuple[int, int, int, int, int] | None,
) -> None:
    """...with its rows' long arrays chunked (``_chunks``) or not; each chunk stays counted
    by exactly the rows that use it."""
    db = tmp_path_factory.mktemp("notes") / "runs.db"

    async def go() -> None:
        session = Session(db, lists_apart_from, chunking)
        model: list[str] = []
        written = 0
        for what, arg in [("append", 1), *commands]:
            if what == "restart":
                await session.restart()
                continue
            if what == "prune":
                other = SqliteStore(db)
                await other.prune(keep_last=arg)
                await other.close()
                continue
            expected: Any = None
            if what == "append":
                arg, model = notes(written, arg), [*model, *notes(written, arg)]
                written += len(arg)
            elif what == "set":
                model = [*model[:arg], f"set {len(model)}"]
            elif what == "read":
                expected = [model[i] for i in arg if -len(model) <= i < len(model)]
            else:
                expected = list(model)
            assert await session.read([what, arg]) == expected, (what, arg)
        await session.restart()
        assert await session.read(["whole", None]) == model
        await session.runtime.close()
        event(f"chunks stored: {check_counts(db) > 0}")
        with sqlite3.connect(db) as raw:
            deep = "SELECT count(*) FROM list_chunks WHERE digest LIKE 'i%'"
            event(f"index chunks: {raw.execute(deep).fetchone()[0] > 0}")

    anyio.run(go)


def test_a_damaged_lists_column_is_named(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"

    async def go() -> None:
        session = Session(db, 1)
        await session.do(["append", notes(0, 3)])
        for _ in range(3):
            await session.do(["append", ["x"]])
        await session.runtime.close()
        with sqlite3.connect(db) as raw:
            raw.execute("UPDATE checkpoints SET lists = '{}' WHERE lists IS NOT NULL")
        store = SqliteStore(db)
        with pytest.raises(StoreCorruptError, match="its lists column is not what it should be"):
            await store.latest(session.run_id)
        await store.close()

    anyio.run(go)


async def test_a_lazy_read_sees_the_row_and_its_chunks_as_of_one_moment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process deleting chunks between the lazy read of a snapshot's row and of the
    chunks it names (a prune) cannot make the read miss them: both are one read transaction
    (outside tester 125 found a healthy run reported as damaged)."""
    db = tmp_path / "runs.db"
    session = Session(db, chunking=(1, 2, 2, 8, 2))  # (its lists kept apart, in chunks)
    await session.do(["append", notes(0, 100)])
    for i in range(4):
        await session.do(["append", notes(100 + i, 1)])
    await session.restart()
    read_row = _stored_lists.fetch_rows

    def then_chunks_go(conn: sqlite3.Connection, text: str, params: Any) -> list[tuple]:
        rows = read_row(conn, text, params)
        if "list_chunks" not in text:  # (the row: another process deletes its chunks now)
            with sqlite3.connect(db) as other:
                other.execute("DELETE FROM list_chunks")
        return rows

    monkeypatch.setattr(_stored_lists, "fetch_rows", then_chunks_go)
    assert await session.read(["read", [0, 99]]) == [notes(0, 1)[0], notes(99, 1)[0]]
    await session.runtime.close()
