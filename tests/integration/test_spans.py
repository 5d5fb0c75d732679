"""Spans: now and then a checkpoint is stored relative to the last snapshot or span instead of
its parent, so a restore folds a snapshot, a few spans and a few deltas. Every checkpoint must
still read back exactly as without spans."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workflow_engine import (
    Executor,
    RequestPort,
    Runtime,
    StoreCorruptError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.storage import SqliteStore
from workflow_engine.storage._chain import latest_chain

pytestmark = pytest.mark.anyio

STEPS = 150


class Grower(Executor):
    """Each superstep: a growing list in its state and in shared state, a replaced value, an
    output now and then, a question every 37 steps."""

    @handler
    async def step(self, n: int, ctx: WorkflowContext[int | str, str]) -> None:
        await ctx.append_state("log", [f"step {n}"])
        seen = await ctx.get_shared("seen", [])
        await ctx.set_shared("seen", [*seen, n])
        await ctx.set_state("last", {"n": n, "half": n // 2})
        if n % 10 == 0:
            await ctx.yield_output(f"at {n}")
        if n >= STEPS:
            await ctx.yield_output("done")
        elif n % 37 == 0:
            await ctx.send_message(f"go on after {n}?")
        else:
            await ctx.send_message(n + 1)

    @handler
    async def answered(self, answer: bool, ctx: WorkflowContext[int, str]) -> None:
        await ctx.append_state("log", [f"answer {answer}"])
        seen = await ctx.get_shared("seen", [])
        await ctx.send_message(seen[-1] + 1)


def grower_workflow():
    grower = Grower("grower")
    ask = RequestPort("ask", request_type=str, response_type=bool)
    return (
        WorkflowBuilder(name="grower", start=grower)
        .add_edge(grower, grower)
        .add_edge(grower, ask)
        .add_edge(ask, grower)
        .with_max_supersteps(1000)
        .build()
    )


async def drive(store: SqliteStore) -> tuple[str, list[Any]]:
    """Run to the end, answering each question (True); the run id and the outputs."""
    rt = Runtime(store)
    rt.register(grower_workflow())
    result = await rt.run("grower", 1)
    while result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS:
        result = await rt.respond_and_resume(result.pending_requests[0].request_id, True)
    assert result.status is WorkflowRunState.IDLE, result.status
    return result.run_id, result.outputs


def state_of(cp: Any) -> tuple:
    """What a checkpoint holds, without the ids and times that differ between two runs."""
    return (
        cp.superstep,
        cp.status,
        cp.executor_states,
        cp.shared_state,
        cp.outputs,
        [m.data for m in cp.messages],
        sorted(r.data for r in cp.pending_requests.values()),
        len(cp.answered_digests) + len(cp.answered_requests),
    )


async def history_states(store: SqliteStore, run_id: str) -> list[tuple]:
    return [state_of(await store.load(i.checkpoint_id)) for i in await store.history(run_id)]


async def test_every_checkpoint_reads_back_as_without_spans(tmp_path: Path) -> None:
    spans = SqliteStore(tmp_path / "spans.db", snapshot_every=16, span_every=4)
    plain = SqliteStore(tmp_path / "plain.db", snapshot_every=16, span_every=0)
    run_a, outputs_a = await drive(spans)
    run_b, outputs_b = await drive(plain)
    assert outputs_a == outputs_b and outputs_a[-1] == "done"
    # a new store on the same file: nothing kept in memory, everything folded from rows
    again = SqliteStore(tmp_path / "spans.db")
    fresh = SqliteStore(tmp_path / "plain.db")
    a, b = await history_states(again, run_a), await history_states(fresh, run_b)
    assert len(a) == len(b) > STEPS
    assert a == b
    with sqlite3.connect(tmp_path / "spans.db") as raw:
        kinds = [k for (k,) in raw.execute("SELECT kind FROM checkpoints ORDER BY seq")]
    assert kinds.count("span") > 10, kinds
    for store in (spans, plain, again, fresh):
        await store.close()


async def test_a_restore_folds_at_most_span_every_deltas(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = SqliteStore(db, snapshot_every=10_000, span_every=8)
    run_id, _ = await drive(store)
    await store.close()
    store = SqliteStore(db)
    await store.open()
    folded = await store._run(store._transaction, "BEGIN", latest_chain, (run_id,))
    kinds = [row[2] for row in folded]
    assert kinds[0] == "snapshot" and kinds.count("delta") < 8, kinds
    assert kinds.count("span") >= STEPS // 8 - 2, kinds
    latest = await store.latest(run_id)
    assert latest is not None and latest.outputs[-1] == "done"
    await store.close()


async def test_a_run_resumes_across_processes_of_spans(tmp_path: Path) -> None:
    """Pause, reopen the file (no memory of the last span), go on: spans written after the
    restart are relative to the span or snapshot folded on the way."""
    db = tmp_path / "runs.db"
    outputs: list[Any] = []
    result = None
    for _ in range(8):
        store = SqliteStore(db, snapshot_every=10_000, span_every=3)
        rt = Runtime(store)
        rt.register(grower_workflow())
        if result is None:
            result = await rt.run("grower", 1)
        else:
            result = await rt.respond_and_resume(result.pending_requests[0].request_id, True)
        outputs = result.outputs
        await rt.close()
        if result.status is WorkflowRunState.IDLE:
            break
    assert result is not None and result.status is WorkflowRunState.IDLE
    assert outputs[-1] == "done"
    plain = SqliteStore(tmp_path / "plain.db", span_every=0)
    run_b, _ = await drive(plain)
    store = SqliteStore(db)
    assert await history_states(store, result.run_id) == await history_states(plain, run_b)
    await store.close()
    await plain.close()


async def stored_as_uninterrupted(db: Path, run_id: str, **policy: int) -> list[str]:
    """Check that run ``run_id`` of ``db`` (driven through restarts) was stored as the same run
    driven without a restart, by a store of the same ``policy``: rows of the same kinds in the
    same places, every checkpoint the same state. Its rows' kinds, in order."""
    plain_db = db.with_name("uninterrupted.db")
    plain = SqliteStore(plain_db, **policy)
    run_b, _ = await drive(plain)
    await plain.close()

    def kinds(path: Path) -> list[str]:
        with sqlite3.connect(path) as raw:
            return [k for (k,) in raw.execute("SELECT kind FROM checkpoints ORDER BY seq")]

    restarted = kinds(db)
    assert restarted == kinds(plain_db)
    store, plain = SqliteStore(db), SqliteStore(plain_db)
    assert await history_states(store, run_id) == await history_states(plain, run_b)
    await store.close()
    await plain.close()
    return restarted


async def test_a_run_looked_at_before_each_resume_is_stored_as_without_restarts(
    tmp_path: Path,
) -> None:
    """Each process looks at the run first (``get_run``, as the command line and a UI do),
    which keeps its latest checkpoint in memory; the resume then starts from that. Its commits
    must still know the last span and the snapshot's size: the rows come out of the same
    kinds, in the same places, as an uninterrupted run's (they used to hold no span at all
    after such a restart, and snapshots as if the last one had been empty)."""
    db = tmp_path / "runs.db"
    result = None
    for _ in range(8):
        store = SqliteStore(db, snapshot_every=16, span_every=3)
        rt = Runtime(store)
        rt.register(grower_workflow())
        if result is None:
            result = await rt.run("grower", 1)
        else:
            info = await rt.get_run(result.run_id)
            (request,) = info.pending_requests
            await rt.respond(request.request_id, True)
            result = await rt.resume(result.run_id)
        await rt.close()
        if result.status is WorkflowRunState.IDLE:
            break
    assert result is not None and result.status is WorkflowRunState.IDLE
    restarted = await stored_as_uninterrupted(db, result.run_id, snapshot_every=16, span_every=3)
    assert restarted.count("span") > 10, restarted


async def test_a_run_restarted_at_every_superstep_is_stored_as_without_restarts(
    tmp_path: Path,
) -> None:
    """A new process for every superstep (outside tester 46 drove a chat that way): what the
    snapshot policy counts -- the bytes written since the last snapshot -- must survive the
    restarts, or snapshots come late, and a restore folds more spans than it would have."""
    db = tmp_path / "runs.db"
    run_id = None
    for _ in range(400):
        store = SqliteStore(db, snapshot_every=4, span_every=3)
        rt = Runtime(store)
        rt.register(grower_workflow())
        if run_id is None:
            run_id = await rt.start("grower", 1)
        info = await rt.get_run(run_id)
        if info.status is WorkflowRunState.IDLE:
            await rt.close()
            break
        if info.pending_requests:
            await rt.respond(info.pending_requests[0].request_id, True)
        await rt.resume(run_id, max_supersteps=1)
        await rt.close()
    assert run_id is not None
    restarted = await stored_as_uninterrupted(db, run_id, snapshot_every=4, span_every=3)
    assert restarted.count("snapshot") > 3 and restarted.count("span") > 10, restarted


async def test_pruning_keeps_every_kept_checkpoint_readable(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = SqliteStore(db, snapshot_every=10_000, span_every=5)
    run_id, _ = await drive(store)
    before = await history_states(store, run_id)
    for keep in (97, 41, 12, 3):
        await store.prune(keep_last=keep)
        reopened = SqliteStore(db)
        assert await history_states(reopened, run_id) == before[-keep:]
        await reopened.close()
    await store.close()


def damage_the_last_span(db: Path, fields: dict[str, Any], kind: str = "span") -> str:
    """Set ``fields`` in the body of the run's last row of ``kind`` (a span's, or a delta's
    ``changes``), as written by hand; its checkpoint's id."""
    with sqlite3.connect(db) as raw:
        checkpoint_id, body = raw.execute(
            "SELECT checkpoint_id, body FROM checkpoints WHERE kind = ? ORDER BY seq DESC", (kind,)
        ).fetchone()
        data = json.loads(body)
        if kind == "delta":
            data["changes"].update(fields)
        else:
            data.update(fields)
        raw.execute(
            "UPDATE checkpoints SET body = ? WHERE checkpoint_id = ?",
            (json.dumps(data), checkpoint_id),
        )
    return str(checkpoint_id)


async def test_a_span_on_the_wrong_base_is_reported_by_name(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    store = SqliteStore(db, snapshot_every=10_000, span_every=4)
    run_id, _ = await drive(store)
    await store.close()
    checkpoint_id = damage_the_last_span(db, {"base_id": "0" * 32})
    store = SqliteStore(db)
    with pytest.raises(StoreCorruptError) as info:
        await store.latest(run_id)
    assert run_id in str(info.value) and checkpoint_id in str(info.value)
    await store.close()


@pytest.mark.parametrize(
    "damage",
    [
        {"executor_state_kept": {"ghost": {"log": 1}}},  # an executor the base does not have
        {"executor_state_kept": {"grower": {"ghost": 1}}},  # a key of none
        {"shared_state_kept": {"ghost": 1}},
        {"executor_state_same": {"ghost": ["log"]}},
        {"shared_state_same": ["ghost"]},
        {"executor_state_kept": {"grower": {"log": -5}}},  # a count below 0: a list cut short
        {"shared_state_kept": {"seen": -1}},
        {"outputs_kept": -1},
        {"digests_kept": -1},
        {"written_before": -1},
        {"outputs_kept": True},  # (read as 1: outside tester 210)
        {"executor_state_kept": {"grower": {"log": "3"}}},
        {"cancelled_kept": 1.0},
    ],
    ids=repr,
)
# (17 runs of 150 supersteps between them: in `make test`, not the fast tier's minute)
@pytest.mark.slow
async def test_a_span_that_does_not_fit_its_base_is_reported_by_name(
    tmp_path: Path, damage: dict[str, Any]
) -> None:
    """A span naming what its base does not hold read as a bare ``KeyError`` (the command
    line's exit 1, "internal error"), and one keeping a negative count of a list cut the list
    short and read on: a conversation five messages shorter (outside tester 209). Each is a
    damaged checkpoint, named."""
    db = tmp_path / "runs.db"
    store = SqliteStore(db, snapshot_every=10_000, span_every=4)
    run_id, _ = await drive(store)
    await store.close()
    checkpoint_id = damage_the_last_span(db, damage)
    store = SqliteStore(db)
    with pytest.raises(StoreCorruptError) as info:
        await store.latest(run_id)
    assert run_id in str(info.value) and checkpoint_id in str(info.value), info.value
    await store.close()


@pytest.mark.parametrize(
    "damage",
    [
        {"executor_state_appends": {"grower": {"log": -3}}},
        {"shared_state_appends": {"seen": -1}},
        {"outputs_added": -1},
        {"executor_state_appends": {"grower": {"log": True}}},  # (read as 1: tester 210)
    ],
    ids=repr,
)
@pytest.mark.slow
async def test_a_delta_keeping_a_negative_count_is_reported_by_name(
    tmp_path: Path, damage: dict[str, Any]
) -> None:
    """As a span's: a delta saying it keeps a negative count of its parent's list cut the
    list short and read on."""
    db = tmp_path / "runs.db"
    store = SqliteStore(db, snapshot_every=10_000, span_every=10_000)
    run_id, _ = await drive(store)
    await store.close()
    checkpoint_id = damage_the_last_span(db, damage, kind="delta")
    store = SqliteStore(db)
    with pytest.raises(StoreCorruptError) as info:
        await store.latest(run_id)
    assert run_id in str(info.value) and checkpoint_id in str(info.value), info.value
    await store.close()


@pytest.mark.parametrize("pruner", ["another store", "the writer's own store"])
async def test_a_writer_goes_on_correctly_after_its_history_was_pruned(
    tmp_path: Path, pruner: str
) -> None:
    """``prune(keep_last=)`` while a store keeps the run in memory (its last span's base): the
    writer's next span must not be relative to a checkpoint the prune deleted or re-based --
    every reader after it would get StoreCorruptError (outside tester). The other store stands
    for another process: its own connection, nothing shared in memory."""
    db = tmp_path / "runs.db"
    writer = SqliteStore(db, snapshot_every=10_000, span_every=4)
    other = SqliteStore(db)
    prunes = writer if pruner == "the writer's own store" else other
    rt = Runtime(writer)
    rt.register(grower_workflow())
    result = await rt.run("grower", 1)
    pauses = 0
    while result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS:
        pauses += 1
        await prunes.prune(keep_last=1)  # the newest row only: the last span goes (or is it)
        result = await rt.respond_and_resume(result.pending_requests[0].request_id, True)
    assert pauses == STEPS // 37 and result.outputs[-1] == "done"
    plain = SqliteStore(tmp_path / "plain.db", span_every=0)
    run_b, outputs_b = await drive(plain)
    fresh = SqliteStore(db)
    kept = await history_states(fresh, result.run_id)
    assert kept == (await history_states(plain, run_b))[-len(kept) :]
    assert (await Runtime(fresh).get_run(result.run_id)).status is WorkflowRunState.IDLE
    assert result.outputs == outputs_b
    for store in (writer, other, plain, fresh):
        await store.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[tuple], list[Any]]:
    """The grower's uninterrupted history (every checkpoint's state) and outputs."""

    async def run() -> tuple[list[tuple], list[Any]]:
        plain = SqliteStore(tmp_path_factory.mktemp("reference") / "plain.db", span_every=0)
        run_id, outputs = await drive(plain)
        states = await history_states(plain, run_id)
        await plain.close()
        return states, outputs

    return anyio.run(run)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    snapshot_every=st.sampled_from([2, 5, 10_000]),
    span_every=st.sampled_from([1, 2, 4, 32]),
    keeps=st.lists(st.one_of(st.none(), st.integers(1, 12)), min_size=4, max_size=4),
    same_store=st.booleans(),
)
async def test_pruning_at_any_pause_leaves_the_run_exact(
    tmp_path_factory: pytest.TempPathFactory,
    reference: tuple[list[tuple], list[Any]],
    snapshot_every: int,
    span_every: int,
    keeps: list[int | None],
    same_store: bool,
) -> None:
    """At each of the run's pauses, maybe ``prune(keep_last=k)`` (by the writer's store or by
    another); the writer goes on with what it keeps in memory. A fresh store then reads every
    kept checkpoint exactly as the uninterrupted run had it."""
    db = tmp_path_factory.mktemp("pruned") / "runs.db"
    writer = SqliteStore(db, snapshot_every=snapshot_every, span_every=span_every)
    other = SqliteStore(db)
    rt = Runtime(writer)
    rt.register(grower_workflow())
    result = await rt.run("grower", 1)
    pause = 0
    while result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS:
        keep = keeps[pause]
        pause += 1
        if keep is not None:
            await (writer if same_store else other).prune(keep_last=keep)
        result = await rt.respond_and_resume(result.pending_requests[0].request_id, True)
    states, outputs = reference
    assert result.outputs == outputs
    fresh = SqliteStore(db)
    kept = await history_states(fresh, result.run_id)
    assert kept == states[-len(kept) :]
    for store in (writer, other, fresh):
        await store.close()


class Keeper(Executor):
    """A big text and a big dict set once (executor state and shared state), then a small item
    appended each superstep."""

    @handler
    async def step(self, n: int, ctx: WorkflowContext[int, str]) -> None:
        if n == 0:
            await ctx.set_state("document", "x" * BIG)
            await ctx.set_state("index", {f"k{i}": i for i in range(2_000)})
            await ctx.set_shared("corpus", ["y" * 100] * 1_000)
        await ctx.append_state("log", [f"step {n}"])
        await ctx.set_state("last", n)
        if n < KEEPER_STEPS:
            await ctx.send_message(n + 1)
        else:
            await ctx.yield_output("done")


BIG = 200_000
KEEPER_STEPS = 300


def keeper_workflow():
    keeper = Keeper("keeper")
    return (
        WorkflowBuilder(name="keeper", start=keeper)
        .add_edge(keeper, keeper)
        .with_max_supersteps(1_000)
        .build()
    )


@pytest.mark.slow  # (2 s of the fast tier's minute; `make test` runs it)
async def test_a_value_set_once_is_not_stored_again_by_every_span(tmp_path: Path) -> None:
    """Spans leave out what their base holds unchanged: storage stays about the state once per
    snapshot plus the deltas (outside tester: every span stored a big value again, and their
    bytes made a snapshot due every 64 commits -- 13x the storage with spans off)."""
    spans = SqliteStore(tmp_path / "spans.db", span_every=4)
    plain = SqliteStore(tmp_path / "plain.db", span_every=0)
    stored = {}
    for name, store in (("spans", spans), ("plain", plain)):
        rt = Runtime(store)
        rt.register(keeper_workflow())
        result = await rt.run("keeper", 0)
        assert result.outputs == ["done"]
        stored[name] = result.run_id
    with sqlite3.connect(tmp_path / "spans.db") as raw:
        by_kind = dict(
            raw.execute(
                "SELECT kind, sum(length(body) + coalesce(length(list_items), 0)) "
                "FROM checkpoints GROUP BY kind"
            )
        )
    state = BIG + 2_000 * 12 + 1_000 * 103
    assert by_kind["span"] < state + 100_000, by_kind  # the first span after the big values only
    assert sum(by_kind.values()) < 4 * state + KEEPER_STEPS * 3_000, by_kind
    fresh = SqliteStore(tmp_path / "spans.db")
    assert await history_states(fresh, stored["spans"]) == await history_states(
        plain, stored["plain"]
    )
    for store in (spans, plain, fresh):
        await store.close()
