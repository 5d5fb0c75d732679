"""An agent's long conversation: each turn writes only its new messages, and a run resumed in
another process continues with the whole history (W6)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Never

import pytest
from chat_workflow import NAME, build_chat, user_message

from workflow_engine import ResponseTypeError, Runtime, Workflow, WorkflowRunState
from workflow_engine.executors import (
    Agent,
    ChatMessage,
    ChatResponseUpdate,
    HandoffBuilder,
    HandoffTurnResult,
    Rule,
    ScriptedChatClient,
    ToolCall,
)
from workflow_engine.executors._host import read_message
from workflow_engine.storage import SqliteStore

pytestmark = pytest.mark.anyio

HERE = Path(__file__).resolve().parent


def delta_bytes(db: Path, run_id: str, after: int) -> tuple[int, list[int]]:
    """The latest seq and the body sizes of the delta rows written after ``after``."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT seq, kind, length(body) FROM checkpoints WHERE run_id = ? AND seq > ? "
            "ORDER BY seq",
            (run_id, after),
        ).fetchall()
    last = rows[-1][0] if rows else after
    return last, [size for _, kind, size in rows if kind == "delta"]


async def chat(runtime: Runtime, turns: int) -> tuple[str, str]:
    result = await runtime.run(NAME, user_message(0))
    run_id = result.run_id
    request_id = result.pending_requests[0].request_id
    for n in range(1, turns + 1):
        await runtime.respond(request_id, user_message(n))
        result = await runtime.resume(run_id)
        assert result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, result.error
        request_id = result.pending_requests[0].request_id
    return run_id, request_id


async def test_a_turn_writes_the_same_bytes_at_turn_10_and_200(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(build_chat)
    result = await runtime.run(NAME, user_message(0))
    run_id = result.run_id
    request_id = result.pending_requests[0].request_id
    seq, _ = delta_bytes(db, run_id, -1)
    per_turn: dict[int, list[int]] = {}
    for n in range(1, 201):
        # the same length of user message every turn: "user 100" vs "user 10 " would differ
        await runtime.respond(request_id, user_message(n))
        result = await runtime.resume(run_id)
        request_id = result.pending_requests[0].request_id
        seq, sizes = delta_bytes(db, run_id, seq)
        per_turn[n] = sizes
    await runtime.close()
    at_10, at_200 = per_turn[10], per_turn[200]
    assert at_10 and at_200, per_turn  # deltas were written (no snapshot on these turns)
    # a few more digits in counters and ids only; the conversation is 20x longer at turn 200
    assert sum(at_200) <= sum(at_10) * 1.05 + 32, (at_10, at_200)


async def test_a_blank_reply_is_refused_and_only_the_empty_one_ends_the_chat(
    tmp_path: Path,
) -> None:
    """A reply of spaces or a zero-width space was taken as the empty one: a stray space
    ended the chat for good (outside testers 148, 149). It is refused, nothing stored, over
    the Python API as in memory; the empty string still ends the chat."""
    runtime = Runtime(SqliteStore(tmp_path / "chat.db"))
    runtime.register(build_chat)
    run_id, request_id = await chat(runtime, 2)
    for blank in (" ", "\u200b", "\t\n", "\xa0 "):
        with pytest.raises(ResponseTypeError, match="blank .*empty string to end the chat"):
            await runtime.respond(request_id, blank)
    assert (await runtime.get_request(request_id)).status == "pending"
    in_memory = build_chat()
    paused = await in_memory.run(user_message(0))
    with pytest.raises(ResponseTypeError, match="blank"):
        asked = paused.pending_requests[0].request_id
        await in_memory.run(checkpoint=paused.checkpoint, responses={asked: " "})
    await runtime.respond(request_id, "")
    ended = await runtime.resume(run_id)
    assert ended.status is WorkflowRunState.IDLE and len(ended.outputs) == 1
    await runtime.close()


@pytest.mark.slow  # a process per resumed turn
async def test_a_long_conversation_resumes_in_a_new_process_with_its_whole_history(
    tmp_path: Path,
) -> None:
    db = tmp_path / "chat.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(build_chat)
    turns = 120
    run_id, request_id = await chat(runtime, turns)
    await runtime.close()
    for n in (turns + 1, turns + 2):
        done = subprocess.run(
            [sys.executable, str(HERE / "chat_workflow.py"), str(db), run_id, request_id, str(n)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=HERE,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        request_id, reply = done.stdout.strip().split("\t")
        # every earlier user message and reply, in order, plus the new user message
        assert reply == f"seen {2 * n + 1} in order True replies {n}", reply


async def test_a_long_chat_keeps_old_answers_small_in_its_snapshots(tmp_path: Path) -> None:
    """What a resume parses stays bounded per answer: a snapshot holds a fixed-size digest per
    answered request (the answers themselves stay in the requests table), not the answers."""
    db = tmp_path / "chat.db"
    every = 8
    runtime = Runtime(SqliteStore(db, snapshot_every=every))
    runtime.register(build_chat)
    turns = 300
    run_id, _ = await chat(runtime, turns)
    await runtime.close()
    with sqlite3.connect(db) as conn:
        (body,) = conn.execute(
            "SELECT body FROM checkpoints WHERE run_id = ? AND kind = 'snapshot' "
            "ORDER BY seq DESC LIMIT 1",
            (run_id,),
        ).fetchone()
    snapshot = json.loads(body)
    assert snapshot["schema_version"] >= 2 and snapshot["superstep"] > turns // 2
    assert len(snapshot["answered_requests"]) <= 1  # at most the answer just applied
    digests = snapshot["answered_digests"]
    assert len(digests) >= turns // 2
    assert all(len(rid) + len(text) <= 80 for rid, text in digests.items()), digests


# --- a handoff chat ------------------------------------------------------------------------------


def digest(messages: Sequence[ChatMessage]) -> str:
    """What a model of the handoff chat says: how many messages it was handed, and whether the
    users' messages are all there, in order (they end with their turn number)."""
    users = [m.text for m in messages if m.role == "user" and m.text]
    in_order = [int(u.split()[-1]) for u in users] == list(range(len(users)))
    return f"seen {len(messages)} users {len(users)} in order {in_order}"


def build_handoff_chat() -> Workflow:
    def agent(name: str, other: str) -> Agent:
        rules = [
            Rule(
                user=rf"^to {other}\b",
                reply=f"over to {other}",
                calls=[ToolCall(f"handoff_to_{other}", {"reason": "asked"})],
            ),
            Rule(reply=digest),
        ]
        return Agent(name, "Chat.", ScriptedChatClient(rules))

    a, b = agent("a", "b"), agent("b", "a")
    return (
        HandoffBuilder(name="handoff-chat", participants=[a, b], turn_limit=100_000)
        .with_start_agent(a)
        .add_handoff(a, [b])
        .add_handoff(b, [a])
        .build()
    )


def said_to(n: int) -> str:
    return {50: f"to b {n:04d}", 120: f"to a {n:04d}"}.get(n, f"user {n:04d}")


async def test_a_handoff_chat_writes_the_same_bytes_at_turn_20_and_200(tmp_path: Path) -> None:
    """Every turn of a handoff chat carried the whole conversation in its messages and
    rewrote it in the agents' and the coordinator's state: about 1 KB more per turn with
    every turn, 4 GB after 600 turns of realistic messages (outside tester)."""
    db = tmp_path / "handoff.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(build_handoff_chat)
    run_id = await runtime.start("handoff-chat", "user 0000")
    result = await runtime.resume(run_id)
    seq, _ = delta_bytes(db, run_id, -1)
    per_turn: dict[int, list[int]] = {}
    for n in range(1, 201):
        (asked,) = result.pending_requests
        assert asked.data.message.endswith(f"users {n} in order True"), (n, asked.data)
        result = await runtime.respond_and_resume(asked.request_id, {"message": said_to(n)})
        seq, per_turn[n] = delta_bytes(db, run_id, seq)
    await runtime.close()
    at_20, at_200 = per_turn[20], per_turn[200]
    assert at_20 and at_200 and len(at_20) == len(at_200), per_turn  # no snapshot on these
    assert sum(at_200) <= sum(at_20) * 1.05 + 64, (at_20, at_200)

    again = Runtime(SqliteStore(db))  # a restart: the whole history, exact
    again.register(build_handoff_chat)
    (asked,) = await again.pending_requests(run_id)
    assert asked.data.agent == "a" and asked.data.message.endswith("users 201 in order True")
    done = await again.respond_and_resume(asked.request_id, {"end": True})
    (outcome,) = done.outputs
    users = [m.text for m in outcome.conversation if m.role == "user" and m.text]
    assert users == ["user 0000", *(said_to(n) for n in range(1, 201))]
    assert [m.text for m in outcome.conversation if m.role == "assistant"][-1] == asked.data.message
    await again.close()


async def test_a_handoff_message_of_an_older_version_still_carries_the_conversation(
    tmp_path: Path,
) -> None:
    """A run paused by a version whose turn results carried the whole conversation goes on:
    the coordinator takes the conversation from it, and the agent, which has seen nothing yet,
    is sent all of it."""
    runtime = Runtime(SqliteStore(tmp_path / "old.db"))
    runtime.register(build_handoff_chat)
    earlier = [ChatMessage.user("user 0000"), ChatMessage.assistant("hello", "a")]
    old = HandoffTurnResult(agent="a", conversation=earlier, turn=1)
    paused = await runtime.run("handoff-chat", old)
    (asked,) = paused.pending_requests
    assert asked.data.message == "hello"
    answered = await runtime.respond_and_resume(asked.request_id, {"message": "user 0001"})
    (asked,) = answered.pending_requests
    # the agent's instructions, the two earlier messages and the new one
    assert asked.data.message == "seen 4 users 2 in order True"
    await runtime.close()


# --- agents passing the conversation along edges ------------------------------------------------


def build_writer_critic_loop() -> Workflow:
    """A writer and a critic answering each other until the conversation has 40 messages."""
    from workflow_engine import WorkflowBuilder

    writer = Agent("writer", "Write.", ScriptedChatClient([Rule(reply="a draft")]))
    critic = Agent("critic", "Criticise.", ScriptedChatClient([Rule(reply="try again")]))
    return (
        WorkflowBuilder(name="writer-critic", start=writer)
        .add_edge(writer, critic)
        .add_edge(critic, writer, condition=lambda response: len(response.conversation) < 40)
        .with_max_supersteps(100)
        .build()
    )


async def test_an_agent_answered_again_in_a_loop_stores_only_the_new_messages(
    tmp_path: Path,
) -> None:
    """An agent that gets the conversation back from another agent it answered before wrote
    the whole conversation into its state again at every hop (storage growing with the square
    of the loop's length)."""
    db = tmp_path / "loop.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(build_writer_critic_loop)
    done = await runtime.run("writer-critic", "write me a poem")
    assert done.status is WorkflowRunState.IDLE, done.error
    with sqlite3.connect(db) as conn:
        bodies = [
            json.loads(body)
            for (body,) in conn.execute(
                "SELECT body FROM checkpoints WHERE kind = 'delta' ORDER BY seq"
            )
        ]
    written = [
        len(b["executor_states"][agent]["conversation"])
        for b in bodies
        for agent in ("writer", "critic")
        if "conversation" in b["executor_states"].get(agent, {})
    ]
    assert len(written) >= 30, written  # one write per hop
    # each agent's first turn writes what it was handed; every later one, its new messages
    assert max(written[2:]) <= 2, written

    again = Runtime(SqliteStore(db))  # and what is stored reads back whole, in order
    again.register(build_writer_critic_loop)
    latest = await again.store.latest(done.run_id)
    assert latest is not None
    writer = [read_message(m) for m in latest.executor_states["writer"]["conversation"]]
    assert [m.text for m in writer][:4] == ["write me a poem", "a draft", "try again", "a draft"]
    assert len(writer) == 40  # the critic's 41st message went nowhere: the loop ended
    await again.close()
    await runtime.close()


def build_long_loop(turns: int) -> Workflow:
    """The writer and the critic answering each other for ``turns`` messages."""
    from workflow_engine import WorkflowBuilder

    writer = Agent("writer", "Write.", ScriptedChatClient([Rule(reply="a draft " + "w" * 120)]))
    critic = Agent("critic", "Criticise.", ScriptedChatClient([Rule(reply="again " + "c" * 120)]))
    return (
        WorkflowBuilder(name="long-loop", start=writer)
        .add_edge(writer, critic)
        .add_edge(critic, writer, condition=lambda response: len(response.conversation) < turns)
        .with_max_supersteps(turns + 10)
        .build()
    )


async def test_a_message_passing_the_conversation_on_stores_only_its_new_messages(
    tmp_path: Path,
) -> None:
    """The response an agent sends on carries the whole conversation (an edge's condition may
    read it), and each superstep's delta stored all of it again: 5.8 KB at superstep 10, 40 KB
    at 100 (storage growing with the square of the loop's length). Now a superstep writes the
    same bytes at superstep 20 and 120, and the message reads back whole."""
    db = tmp_path / "loop.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(lambda: build_long_loop(130))
    done = await runtime.run("long-loop", "write me an essay")
    assert done.status is WorkflowRunState.IDLE, done.error
    await runtime.close()
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT seq, kind, length(body), body FROM checkpoints ORDER BY seq"
        ).fetchall()
    sizes = {seq: size for seq, kind, size, _ in rows if kind == "delta"}
    assert 20 in sizes and 120 in sizes, sorted(sizes)
    assert sizes[120] <= sizes[20] + 64, (sizes[20], sizes[120])
    delta = json.loads(next(body for seq, kind, _, body in rows if seq == 120))
    [message] = delta["messages"]
    assert len(message["data"]["data"]["conversation"]) <= 2  # the new turn, not the 120 before
    assert delta["changes"]["message_appends"], delta["changes"]


async def test_a_run_stopped_mid_loop_resumes_with_the_whole_conversation_in_flight(
    tmp_path: Path,
) -> None:
    """Stopped with a response in flight (its conversation stored as the messages it gained),
    the run resumed by another runtime reads it back whole: the same conversation, message for
    message, as a run that was never stopped."""
    db = tmp_path / "loop.db"
    first = Runtime(SqliteStore(db))
    first.register(lambda: build_long_loop(120))
    stopped = await first.run("long-loop", "write me an essay", max_supersteps=77)
    assert stopped.status is WorkflowRunState.MAX_SUPERSTEPS_REACHED, stopped.error
    await first.close()

    again = Runtime(SqliteStore(db, snapshot_every=1000))
    again.register(lambda: build_long_loop(120))
    latest = await again.store.latest(stopped.run_id)
    assert latest is not None
    [in_flight] = latest.messages
    assert len(in_flight.data["data"]["conversation"]) == 78  # whole, after the fold
    done = await again.resume(stopped.run_id)
    assert done.status is WorkflowRunState.IDLE, done.error
    resumed = await again.store.latest(stopped.run_id)
    await again.close()

    straight = Runtime(SqliteStore(tmp_path / "straight.db"))
    straight.register(lambda: build_long_loop(120))
    whole = await straight.run("long-loop", "write me an essay")
    uninterrupted = await straight.store.latest(whole.run_id)
    await straight.close()
    assert resumed is not None and uninterrupted is not None
    for agent in ("writer", "critic"):
        got = [read_message(m) for m in resumed.executor_states[agent]["conversation"]]
        want = [read_message(m) for m in uninterrupted.executor_states[agent]["conversation"]]
        assert [(m.role, m.text) for m in got] == [(m.role, m.text) for m in want]
    assert len(got) >= 119


async def test_a_delta_keeping_items_of_a_message_that_is_not_there_is_store_corrupt(
    tmp_path: Path,
) -> None:
    """A damaged row naming an earlier message it does not have is refused by name, not read
    as a shorter conversation."""
    from workflow_engine import StoreCorruptError

    db = tmp_path / "loop.db"
    runtime = Runtime(SqliteStore(db, snapshot_every=1000))
    runtime.register(lambda: build_long_loop(30))
    stopped = await runtime.run("long-loop", "write me an essay", max_supersteps=12)
    await runtime.close()
    with sqlite3.connect(db) as conn:
        seq, body = conn.execute(
            "SELECT seq, body FROM checkpoints WHERE kind = 'delta' ORDER BY seq DESC LIMIT 1"
        ).fetchone()
        damaged = json.loads(body)
        [(i, field, _, kept)] = damaged["changes"]["message_appends"]
        damaged["changes"]["message_appends"] = [[i, field, 9, kept]]
        conn.execute("UPDATE checkpoints SET body = ? WHERE seq = ?", (json.dumps(damaged), seq))
    again = Runtime(SqliteStore(db))
    again.register(lambda: build_long_loop(30))
    with pytest.raises(StoreCorruptError, match="keeps items of message 9") as refused:
        await again.store.latest(stopped.run_id)
    assert stopped.run_id in str(refused.value)
    await again.close()


class NewestOnly:
    """A model that reads only the newest message (as W6's does): "to X" hands off to X."""

    def __init__(self, name: str, other: str) -> None:
        self.name, self.other = name, other

    async def get_response(self, messages: Sequence[ChatMessage], *, tools: object = ()) -> Never:
        raise AssertionError("the host streams")

    async def get_streaming_response(
        self, messages: Sequence[ChatMessage], *, tools: object = ()
    ) -> AsyncIterator[ChatResponseUpdate]:
        n = len(messages)
        if messages[-1].role == "user" and messages[-1].text.startswith(f"to {self.other}"):
            yield ChatResponseUpdate(
                kind="function_call",
                message_id=f"m{n}",
                call_id=f"call_{n}",
                name=f"handoff_to_{self.other}",
            )
        else:
            yield ChatResponseUpdate(kind="text", message_id=f"m{n}", text=f"{self.name}: noted.")


def newest_reading_handoff() -> Workflow:
    """Two agents whose models read only the newest message; "to b"/"to a" hands off."""

    def agent(name: str, other: str) -> Agent:
        return Agent(name, client=NewestOnly(name, other))

    a, b = agent("a", "b"), agent("b", "a")
    return (
        HandoffBuilder(name="newest", participants=[a, b], turn_limit=1_000)
        .add_handoff(a, [b])
        .add_handoff(b, [a])
        .with_start_agent(a)
        .build()
    )


async def test_a_handoff_turn_in_a_new_process_decodes_only_what_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A participant's finished turn built the whole conversation to hand it on, decoding every
    stored message at the first turn in a new process: 18 ms at 1,000 turns, 86 ms for a
    handoff (outside tester 184). It needs the length and what the next node has not seen."""
    import workflow_engine.executors._host as host

    db = tmp_path / "newest.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(newest_reading_handoff)
    run_id = await runtime.start("newest", "hello")
    await runtime.resume(run_id)
    for n in range(40):
        said = {37: "to b now", 38: "to a now"}.get(n, f"message {n}")  # (b takes part)
        (asked,) = await runtime.pending_requests(run_id)
        await runtime.respond_and_resume(asked.request_id, {"message": said})
    await runtime.close()

    decoded: list[object] = []
    original = host.read_message

    def counted(stored: object) -> ChatMessage:
        decoded.append(stored)
        return original(stored)

    monkeypatch.setattr(host, "read_message", counted)
    for said in ("next message", "to b please"):
        again = Runtime(SqliteStore(db))  # a new process's: nothing decoded yet
        again.register(newest_reading_handoff)
        (asked,) = await again.pending_requests(run_id)
        decoded.clear()
        result = await again.respond_and_resume(asked.request_id, {"message": said})
        assert result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, result.error
        # (of some 90 stored: the newest, and for b what it has not seen -- 4 messages)
        assert len(decoded) <= 8, (said, len(decoded))
        await again.close()
    (asked,) = result.pending_requests
    assert asked.data.agent == "b", asked.data
