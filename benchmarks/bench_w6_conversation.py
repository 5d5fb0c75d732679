"""W6: an agent's long conversation -- 1,000 chat turns, durable, then resumed.

One agent hosted with ``ask_user=True``: after every reply the run pauses on a ``UserTurnRequest``
for the user's next message. Each turn the user's message arrives as the answer to that request
(``runtime.respond``), ``runtime.resume`` runs the turn (the agent gets the conversation, asks the
model, stores the reply) and the run pauses again. The model is an offline client that answers the
newest message (like a model, it is handed the whole conversation; unlike one, it reads only the
end of it -- the cost of reading all of it is reported separately). Everything goes through
``Runtime`` + ``SqliteStore`` (WAL, ``synchronous=NORMAL``) on a fresh temporary file. Reported:

* **bytes per turn** at turn 10, 100 and 1,000: the checkpoint rows written for that turn
  (their bodies, and the long lists a snapshot keeps apart), the request rows (question +
  answer), the journal rows, the process's write(2) volume and the database + WAL growth (the
  last two averaged over the ten turns ending there) -- flat when only the new messages are
  written, growing with the turn number when the conversation is copied;
* **µs per turn** (``respond`` + ``resume`` to the next pause) over the turns before 10, 100 and
  1,000 (median of the last ten);
* **reading the whole conversation** after a cold resume (what a client that reads every message
  adds: decoding 2,000 stored messages);
* **resume at turn 1,000**: in a new process (a subprocess per sample opens the store, then times
  ``respond`` + ``resume`` to the next pause -- imports, ``Runtime`` and store opening excluded;
  a second turn in that process is the warm figure; opening the store there is reported too) and
  in-process (the turns after 1,000); and where such a cold turn's time goes: ``respond``, taking
  the lease with the latest checkpoint's rows, folding them (parsing snapshot and deltas; the
  snapshot keeps the conversation apart, and the resume reads it only if the agent reads old
  messages, which this one does not), and the rest of the turn (one more subprocess per
  sample); and the same cold turn answered with
  ``respond_and_resume``, which stores the answer and takes the lease in one transaction (one
  more subprocess per sample).

    .venv/bin/python benchmarks/bench_w6_conversation.py            # -n 1000 -r 7
    .venv/bin/python benchmarks/bench_w6_conversation.py --profile  # cProfile of a cold resume
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
from _durable import db_bytes, kib, open_store, temp_dir, written_bytes

from workflow_engine import Runtime, Workflow, WorkflowBuilder, WorkflowRunState
from workflow_engine.executors import (
    Agent,
    AgentHostExecutor,
    ChatMessage,
    ChatResponse,
    ChatResponseUpdate,
    ToolSpec,
)
from workflow_engine.executors._host import read_message
from workflow_engine.storage import SqliteStore

NAME = "w6-chat"
ROOT = Path(__file__).resolve().parent.parent
WAITING = WorkflowRunState.IDLE_WITH_PENDING_REQUESTS


def user_message(turn: int) -> str:
    return f"Message {turn}: please note that my order number is {1000 + turn} and reply."


class EchoClient:
    """An offline model that acknowledges the newest message (reads nothing earlier)."""

    def _answer(self, messages: Sequence[ChatMessage]) -> ChatMessage:
        order = messages[-1].text.split("order number is ")[-1].split()[0]
        return ChatMessage.assistant(f"Noted order {order}. Anything else?")

    async def get_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> ChatResponse:
        return ChatResponse(messages=[self._answer(messages)])

    async def get_streaming_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[ToolSpec] = ()
    ) -> AsyncIterator[ChatResponseUpdate]:
        text = self._answer(messages).text
        yield ChatResponseUpdate(kind="text", message_id=f"msg_{len(messages)}", text=text)


def build_chat() -> Workflow:
    """The agent answers every user message, then asks the user for the next one."""
    agent = Agent("assistant", client=EchoClient())
    host = AgentHostExecutor(agent, stream_updates=False, ask_user=True)
    return WorkflowBuilder(NAME, start=host).build()


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs"


HANDOFF = "w6-handoff"


ROW_BYTES = "length(body) + coalesce(length(list_items), 0) + coalesce(length(chunks), 0)"
"""What a checkpoint row stores itself; a large row's long arrays are in ``list_chunks``."""
"""A checkpoint row's bytes: its body and the long lists a snapshot keeps apart from it."""


def build_handoff_chat() -> Workflow:
    """The same chat as a handoff between two agents (``HandoffBuilder``): each acknowledges
    the newest message, and a user message starting "to <other>" hands the conversation over."""
    from workflow_engine.executors import HandoffBuilder, Rule, ScriptedChatClient, ToolCall

    def agent(name: str, other: str) -> Agent:
        rules = [
            Rule(user=rf"^to {other}\b", calls=[ToolCall(f"handoff_to_{other}", {})]),
            Rule(reply=lambda messages: acknowledge(messages)),
        ]
        return Agent(name, client=ScriptedChatClient(rules))

    a, b = agent("a", "b"), agent("b", "a")
    builder = HandoffBuilder(name=HANDOFF, participants=[a, b], turn_limit=1_000_000)
    return builder.add_handoff(a, [b]).add_handoff(b, [a]).with_start_agent(a).build()


def acknowledge(messages: Sequence[ChatMessage]) -> str:
    """What the handoff chat's agents say: the order number of the newest user message (after
    a handoff, the newest message is the handoff's result)."""
    said = next(m.text for m in reversed(messages) if m.role == "user" and m.text)
    return f"Noted order {said.split('order number is ')[-1].split()[0]}. Anything else?"


def handoff_message(turn: int) -> str:
    """Every 100 turns (at 50, 150, ...) a message hands the chat to the other agent, which
    then catches up on the messages since it last spoke (the turns reported are not those)."""
    text = user_message(turn)
    return f"to {'a' if turn // 100 % 2 else 'b'} {text}" if turn % 100 == 50 else text


async def handoff_bytes(tmp: Path, turns: int) -> None:
    """Bytes of checkpoint rows per turn of a handoff chat, at turn 10, 100 and ``turns``: flat
    when a turn writes only its new messages (it used to grow with the turn number)."""
    db = tmp / "w6-handoff.db"
    runtime = Runtime(await open_store(db))
    runtime.register(build_handoff_chat())
    run_id = await runtime.start(HANDOFF, user_message(0))
    result = await runtime.resume(run_id)
    rows = Rows(db, run_id)
    seq, _, _ = rows.checkpoints_after(-1)
    marks = sorted({k for k in (10, 100, 1000) if k <= turns} | {turns})
    figures = []
    for n in range(1, turns + 1):
        (asked,) = result.pending_requests
        result = await runtime.respond_and_resume(asked.request_id, {"message": handoff_message(n)})
        seq, body, kinds = rows.checkpoints_after(seq)
        if n in marks:
            figures.append(f"turn {n}: {body:,} B ({'+'.join(kinds)})")
    await runtime.close()
    print(
        "W6 the same chat as a handoff between two agents (a handoff every 100 turns), "
        "checkpoint rows of a turn: " + ", ".join(figures)
    )


LOOP = "w6-loop"


def build_loop(supersteps: int) -> Workflow:
    """A writer and a critic answering each other (``AgentHostExecutor`` on both ends of the
    edges) for ``supersteps`` supersteps and one more: each sends on an ``AgentResponse``
    carrying the whole conversation, which the edge's condition reads."""
    from workflow_engine.executors import Rule, ScriptedChatClient

    writer = Agent("writer", client=ScriptedChatClient([Rule(reply="A draft: " + "w" * 150)]))
    critic = Agent("critic", client=ScriptedChatClient([Rule(reply="Tighten it: " + "c" * 150)]))
    return (
        WorkflowBuilder(LOOP, start=writer)
        .add_edge(writer, critic)
        .add_edge(critic, writer, condition=lambda r: len(r.conversation) <= supersteps + 1)
        .with_max_supersteps(supersteps + 10)
        .build()
    )


async def loop_bytes(tmp: Path, supersteps: int) -> None:
    """Bytes of checkpoint rows per superstep of a writer-critic loop at superstep 10, 100 and
    ``supersteps``: flat when the response in flight is stored as the messages it gained (it
    used to be stored whole at every superstep)."""
    db = tmp / "w6-loop.db"
    runtime = Runtime(await open_store(db))
    runtime.register(build_loop(supersteps))
    done = await runtime.run(LOOP, "Write a short essay on durable workflows.")
    assert done.status is WorkflowRunState.IDLE, (done.status, done.error)
    await runtime.close()
    with sqlite3.connect(db) as conn:
        rows = conn.execute(f"SELECT seq, kind, {ROW_BYTES} FROM checkpoints ORDER BY seq")
        by_seq = {seq: (kind, size) for seq, kind, size in rows}
        chunks = conn.execute("SELECT coalesce(sum(length(items)), 0) FROM list_chunks")
        chunk_bytes = int(chunks.fetchone()[0])
    marks = sorted({k for k in (10, 100) if k < supersteps} | {supersteps})
    figures = [f"superstep {k}: {by_seq[k][1]:,} B ({by_seq[k][0]})" for k in marks]
    total = sum(size for _, size in by_seq.values()) + chunk_bytes
    print(
        "W6 a writer and a critic answering each other (each response carries the whole "
        "conversation on), checkpoint rows of a superstep: " + ", ".join(figures) + f"; all "
        f"rows after {supersteps} supersteps, with the chunks they share, {total:,} B"
    )


# --- row sizes ------------------------------------------------------------------------------------


class Rows:
    """Reads what the store wrote, from a second (read-only) connection to the same file."""

    def __init__(self, db: Path, run_id: str) -> None:
        self.conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        self.run_id = run_id

    def checkpoints_after(self, seq: int) -> tuple[int, int, list[str]]:
        """(latest seq, bytes of the rows after ``seq``, kinds of those rows)."""
        rows = self.conn.execute(
            f"SELECT seq, {ROW_BYTES}, kind FROM checkpoints WHERE run_id = ? AND seq > ? "
            "ORDER BY seq",
            (self.run_id, seq),
        ).fetchall()
        last = rows[-1][0] if rows else seq
        return last, sum(r[1] for r in rows), [r[2] for r in rows]

    def request_bytes(self, request_id: str) -> int:
        row = self.conn.execute(
            "SELECT length(data) + coalesce(length(answer), 0) FROM requests WHERE request_id = ?",
            (request_id,),
        ).fetchone()
        return int(row[0]) if row else 0

    def bytes_in_use(self) -> int:
        """The database's pages that hold data, as of the last commit (the WAL's included):
        what the run takes on disk. The files' sizes say less: once the WAL is copied back it
        is written again from its start, so the files stop growing while the data grows."""
        pages = self.conn.execute("PRAGMA page_count").fetchone()[0]
        free = self.conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = self.conn.execute("PRAGMA page_size").fetchone()[0]
        return int((pages - free) * size)

    def journal_bytes(self) -> int:
        row = self.conn.execute(
            "SELECT coalesce(sum(length(value)), 0) FROM journal WHERE run_id = ?", (self.run_id,)
        ).fetchone()
        return int(row[0])

    def chunk_bytes(self) -> int:
        """What the chunks the rows share hold (``list_chunks``: this file holds one run)."""
        row = self.conn.execute("SELECT coalesce(sum(length(items)), 0) FROM list_chunks")
        return int(row.fetchone()[0])

    def totals(self) -> tuple[int, int, int, int]:
        """(bytes of every checkpoint row, of the snapshot rows among them, the most deltas a
        resume folds: between a snapshot or span and the next one)."""
        rows = self.conn.execute(
            f"SELECT kind, {ROW_BYTES} FROM checkpoints WHERE run_id = ? ORDER BY seq",
            (self.run_id,),
        ).fetchall()
        longest = run = 0
        for kind, _ in rows:
            run = 0 if kind in ("snapshot", "span") else run + 1
            longest = max(longest, run)
        return (
            sum(r[1] for r in rows),
            sum(r[1] for r in rows if r[0] == "snapshot"),
            longest,
            sum(1 for r in rows if r[0] == "span"),
        )

    def snapshots(self) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM checkpoints WHERE run_id = ? AND kind = 'snapshot'",
            (self.run_id,),
        ).fetchone()
        return int(row[0])


# --- one turn -------------------------------------------------------------------------------------


async def turn(runtime: Runtime, run_id: str, request_id: str, n: int) -> tuple[float, str]:
    """Answer the pending request with the user's message ``n`` and run to the next pause:
    seconds and the next request id."""
    t0 = time.perf_counter()
    await runtime.respond(request_id, user_message(n))
    result = await runtime.resume(run_id)
    t1 = time.perf_counter()
    assert result.status is WAITING, (result.status, result.error)
    return t1 - t0, result.pending_requests[0].request_id


# --- child process: resume ------------------------------------------------------------------------


class Phases:
    """Where a cold turn's time goes, by timing the store's steps of it (wrapped on the store
    instance): ``respond``; taking the lease with the latest checkpoint's rows (one
    transaction); folding those rows into the checkpoint (parsing the snapshot and the deltas,
    applying them); the rest of ``resume`` (restoring, the turn itself, its commits)."""

    def __init__(self, store: SqliteStore) -> None:
        self.seconds: dict[str, float] = {}
        self.fold = 0.0
        fold = store._fold_from

        def timed_fold(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fold(*args)
            finally:
                self.fold += time.perf_counter() - t0

        store._fold_from = timed_fold  # type: ignore[method-assign]
        acquire = store.acquire_latest

        async def timed_acquire(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await acquire(*args, **kwargs)
            finally:
                self.seconds["acquire"] = time.perf_counter() - t0

        store.acquire_latest = timed_acquire  # type: ignore[method-assign]

    async def turn(self, runtime: Runtime, run_id: str, request_id: str, n: int) -> str:
        t0 = time.perf_counter()
        await runtime.respond(request_id, user_message(n))
        t1 = time.perf_counter()
        result = await runtime.resume(run_id)
        t2 = time.perf_counter()
        assert result.status is WAITING, (result.status, result.error)
        acquire = self.seconds.pop("acquire")
        self.seconds.update(
            {
                "respond": t1 - t0,
                "lease + rows": acquire - self.fold,
                "fold": self.fold,
                "restore + turn + commits": (t2 - t1) - acquire,
                "total": t2 - t0,
            }
        )
        return result.pending_requests[0].request_id


async def child(
    db: str, run_id: str, request_id: str, first: int, profile: bool, phases: bool, joined: bool
) -> dict:
    """Two turns in a fresh process (cold, then warm), timed after imports and store opening
    (timed too); or one cold turn, phase by phase (``phases``), or answered with
    ``respond_and_resume`` (``joined``)."""
    store = SqliteStore(db)
    runtime = Runtime(store)
    runtime.register(build_chat)
    t0 = time.perf_counter()
    await store.open()
    out: dict[str, Any] = {"times": [], "open": time.perf_counter() - t0}
    if phases:
        timer = Phases(store)
        out["request_id"] = await timer.turn(runtime, run_id, request_id, first)
        out["phases"] = timer.seconds
        await runtime.close()
        return out
    if joined:
        t0 = time.perf_counter()
        result = await runtime.respond_and_resume(request_id, user_message(first))
        out["times"].append(time.perf_counter() - t0)
        assert result.status is WAITING, (result.status, result.error)
        out["request_id"] = result.pending_requests[0].request_id
        await runtime.close()
        return out
    profiler = cProfile.Profile() if profile else None
    for i in range(2):
        if profiler is not None and i == 0:
            profiler.enable()
        seconds, request_id = await turn(runtime, run_id, request_id, first + i)
        if profiler is not None and i == 0:
            profiler.disable()
        out["times"].append(seconds)
    out["request_id"] = request_id
    # what a client reading every message adds: decode the whole stored conversation
    checkpoint = await store.latest(run_id)
    assert checkpoint is not None
    stored = checkpoint.executor_states["assistant"]["conversation"]
    codec = runtime.workflow(NAME).codec
    t0 = time.perf_counter()
    everything = [read_message(codec.decode(m)) for m in stored]
    out["read_all"] = time.perf_counter() - t0
    out["messages"] = len(everything)
    if profiler is not None:
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(30)
        out["profile"] = text.getvalue()
    await runtime.close()
    return out


def run_child(
    db: Path,
    run_id: str,
    request_id: str,
    first: int,
    profile: bool = False,
    phases: bool = False,
    joined: bool = False,
) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), str(ROOT / "benchmarks"), env.get("PYTHONPATH")) if p
    )
    args = [sys.executable, __file__, "--child", str(db), run_id, request_id, str(first)]
    proc = subprocess.run(
        [
            *args,
            *(["--profile"] if profile else []),
            *(["--phases"] if phases else []),
            *(["--joined"] if joined else []),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
    )
    result: dict = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


# --- parent process -------------------------------------------------------------------------------


async def main(turns: int, repeats: int, profile: bool) -> None:
    marks = sorted({k for k in (10, 100, 1000) if k <= turns} | {turns})
    with temp_dir("w6-") as tmp:
        db = tmp / "w6.db"
        store = await open_store(db)
        runtime = Runtime(store)
        runtime.register(build_chat())
        result = await runtime.run(NAME, user_message(0))
        assert result.status is WAITING, (result.status, result.error)
        run_id, request_id = result.run_id, result.pending_requests[0].request_id
        rows = Rows(db, run_id)
        seq, _, _ = rows.checkpoints_after(-1)
        times: list[float] = []
        window: dict[int, tuple[int | None, int]] = {}  # turn -> (wchar, db bytes) before it
        for n in range(1, turns + 1):
            for k in marks:
                if n == max(1, k - 9):
                    window[k] = (written_bytes(), rows.bytes_in_use())
            asked = request_id
            seconds, request_id = await turn(runtime, run_id, request_id, n)
            times.append(seconds)
            if n in marks:
                seq, body, kinds = rows.checkpoints_after(seq)
                wchar, size = window[n]
                span = n - max(1, n - 9) + 1
                now_w = written_bytes()
                io_note = (
                    f"write(2) {kib((now_w - wchar) / span)}/turn"
                    if now_w is not None and wchar is not None
                    else "write(2) n/a"
                )
                print(
                    f"W6 turn {n:>5}: checkpoint rows {body:>7,} B ({'+'.join(kinds)}), "
                    f"request row {rows.request_bytes(asked):>6,} B, "
                    f"{us(statistics.median(times[-10:]))}/turn (median of last "
                    f"{min(10, len(times))}); {io_note}, database pages in use "
                    f"+{kib((rows.bytes_in_use() - size) / span)}/turn"
                )
            else:
                seq, _, _ = rows.checkpoints_after(seq)
        print(
            f"W6 after {turns} turns: {rows.snapshots()} snapshot rows, journal "
            f"{rows.journal_bytes():,} B, database + WAL {kib(db_bytes(db))}"
        )
        total, snapshot_bytes, longest, spans = rows.totals()
        chunks = rows.chunk_bytes()
        total += chunks
        print(
            f"W6 all checkpoint rows after {turns} turns, snapshots and the chunks they share "
            f"included: {total:,} B = {total / turns:,.0f} B/turn ({snapshot_bytes:,} B of them "
            f"in snapshot rows and {chunks:,} B in chunks, each snapshot written once the deltas "
            "since the last one held as many bytes: storage at most about twice the deltas); "
            f"{spans} spans; the most deltas a resume folds after the snapshot and spans: "
            f"{longest}"
        )
        warm = []
        for i in range(repeats):
            seconds, request_id = await turn(runtime, run_id, request_id, turns + 1 + i)
            warm.append(seconds)
        await runtime.close()
        store = None
        cold, second, read_all, opened, joined, messages = [], [], [], [], [], 0
        split: dict[str, list[float]] = {}
        first = turns + 1 + repeats
        for _ in range(repeats):
            out = run_child(db, run_id, request_id, first)
            cold.append(out["times"][0])
            second.append(out["times"][1])
            read_all.append(out["read_all"])
            opened.append(out["open"])
            messages = out["messages"]
            request_id = out["request_id"]
            first += 2
            # the same kind of cold turn, phase by phase, in a subprocess of its own
            out = run_child(db, run_id, request_id, first, phases=True)
            for phase, seconds in out["phases"].items():
                split.setdefault(phase, []).append(seconds)
            request_id = out["request_id"]
            first += 1
            # the same kind of cold turn answered with respond_and_resume
            out = run_child(db, run_id, request_id, first, joined=True)
            joined.append(out["times"][0])
            request_id = out["request_id"]
            first += 1
        med = statistics.median
        print(
            f"W6 resume at turn {turns} in a new process (respond + resume to the next pause, "
            f"after imports and store opening; median of {repeats} subprocesses): "
            f"{ms(med(cold))} [{ms(min(cold))}-{ms(max(cold))}]; a second turn there "
            f"{ms(med(second))}; opening the store there {ms(med(opened))}"
        )
        print(
            "W6 that cold turn by phase (medians of as many more subprocesses): "
            + ", ".join(f"{phase} {ms(med(times))}" for phase, times in split.items())
        )
        print(
            "W6 the same cold turn answered with respond_and_resume (the answer stored and the "
            f"lease taken in one transaction; median of {repeats} more subprocesses): "
            f"{ms(med(joined))} [{ms(min(joined))}-{ms(max(joined))}]"
        )
        print(
            f"W6 reading all {messages} stored messages there (what a client that reads "
            f"every message adds; median of {repeats}): {ms(med(read_all))}"
        )
        print(
            f"W6 resume at turn {turns} in-process (median of {repeats}): {ms(med(warm))} "
            f"[{ms(min(warm))}-{ms(max(warm))}]"
        )
        await handoff_bytes(tmp, turns)
        await loop_bytes(tmp, min(turns, 400))
        print("  targets: per-turn bytes flat in the turn number; resume at 1,000 turns ≤ 5 ms")
        if profile:
            out = run_child(db, run_id, request_id, first, profile=True)
            print(out["profile"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--turns", type=int, default=1000, help="chat turns before resuming")
    parser.add_argument("-r", "--repeats", type=int, default=7, help="samples per resume figure")
    parser.add_argument(
        "--profile", action="store_true", help="print a cProfile of one cold resume"
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--phases", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--joined", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        db, run_id, request_id, first = args.child
        out = anyio.run(
            child, db, run_id, request_id, int(first), args.profile, args.phases, args.joined
        )
        print(json.dumps(out))
    else:
        anyio.run(main, args.turns, args.repeats, args.profile)
