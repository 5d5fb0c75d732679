"""An int of more than 4,300 digits is written as JSON by pydantic, but read back by no JSON
reader here (pydantic: "number out of range"; Python's json: its digit limit). Stored, it made
the run's checkpoint unreadable: every later read of the run was a StoreCorruptError (outside
tester 129). It is refused before anything is stored, by the codec where it meets the value
and by the store where the codec copies a list or dict of plain values as it is."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Never

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from workflow_engine import (
    CheckpointError,
    RequestPort,
    ResponseTypeError,
    Runtime,
    SerializationError,
    StorageError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    executor,
)
from workflow_engine._codec import _long_digit_run
from workflow_engine.executors import ChatResponseUpdate
from workflow_engine.executors._clients import message_from_updates
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

HUGE = 10**4300

VALUES: dict[str, Any] = {
    "int": HUGE,
    "list": [1, HUGE],  # (a list of plain values: the codec copies it as it is)
    "flat-dict": {"n": -HUGE},
}


def keeping(value: Any) -> Any:
    @executor(id="keep")
    async def keep(n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.set_state("kept", value)
        await ctx.send_message(n)

    @executor(id="done")
    async def done(n: int, ctx: WorkflowContext[Never, int]) -> None:
        await ctx.yield_output(n)

    port = RequestPort(id="ask", request_type=int, response_type=int)
    return WorkflowBuilder("keep", start=keep).add_edge(keep, port).add_edge(port, done).build()


@pytest.mark.parametrize("kind", list(VALUES))
async def test_a_number_no_reader_reads_back_is_refused_and_the_store_stays_readable(
    tmp_path: Path, kind: str
) -> None:
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(keeping(VALUES[kind]), name="keep")
    try:
        result = await runtime.run("keep", 1, run_id="r1")
    except StorageError as exc:  # (refused by the store: its commit)
        assert "more than 4,300 digits" in str(exc) and "nothing was stored" in str(exc)
    else:  # (refused by the codec: the handler's write fails the run)
        assert result.status is WorkflowRunState.FAILED
        assert result.error is not None and "more than 4,300 digits" in result.error.message
    await runtime.close()

    # a new process reads every run it stores: nothing unreadable was written
    store = SqliteStore(db)
    await store.open()
    try:
        for info in await store.history("r1"):
            await store.load(info.checkpoint_id)
        await store.latest("r1")
    finally:
        await store.close()


async def test_digits_in_text_are_text(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    runtime = Runtime(SqliteStore(db))
    runtime.register(keeping(["7" * 6_000, {"id": "9" * 5_000}]), name="keep")
    result = await runtime.run("keep", 1)
    assert result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    await runtime.close()
    runtime = Runtime(SqliteStore(db))
    runtime.register(keeping(None), name="keep")
    done = await runtime.respond_and_resume(result.pending_requests[0].request_id, 5)
    assert done.status is WorkflowRunState.IDLE and done.outputs == [5]
    await runtime.close()


def test_the_codec_names_the_number() -> None:
    workflow = keeping(None)
    with pytest.raises(SerializationError, match="integer of more than 4,300 digits"):
        workflow.codec.encode({"n": [HUGE, (1, 2)]})


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 9_000), st.sampled_from(["7", "x", ",", "é"])), max_size=6)
)
def test_a_long_run_of_digits_is_found_wherever_it_lies(pieces: list[tuple[int, str]]) -> None:
    # the store looks for such a run only around sample points: it must find every one (a
    # separator that is a digit joins two runs)
    text = "".join("1" * digits + separator for digits, separator in pieces)
    assert _long_digit_run(text) == (re.search("[0-9]{4301}", text) is not None)


@executor(id="effect")
async def effect(n: int, ctx: WorkflowContext[Never, int]) -> None:
    async def call_out() -> list[int]:
        return [1, HUGE]  # (a list of plain values: copied by the codec as it is)

    await ctx.run_once("call", call_out)
    await ctx.yield_output(n)


async def test_a_step_result_no_reader_reads_back_fails_the_run_saying_the_step_ran(
    tmp_path: Path,
) -> None:
    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(WorkflowBuilder("effect", start=effect).build(), name="effect")
    result = await runtime.run("effect", 1)
    await runtime.close()
    assert result.status is WorkflowRunState.FAILED and result.error is not None
    said = result.error.message
    assert "which ran (its effect happened" in said and "more than 4,300 digits" in said, said


@executor(id="counter")
async def counter(numbers: list[int], ctx: WorkflowContext[Never, int]) -> None:
    await ctx.yield_output(len(numbers))


async def test_an_answer_no_reader_reads_back_is_refused_naming_the_request(
    tmp_path: Path,
) -> None:
    @executor(id="ask")
    async def ask(n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)

    port = RequestPort(id="numbers", request_type=int, response_type=list[int])
    workflow = WorkflowBuilder("numbers", start=ask).add_edge(ask, port).add_edge(port, counter)
    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(workflow.build(), name="numbers")
    paused = await runtime.run("numbers", 1)
    request_id = paused.pending_requests[0].request_id
    for answer in (runtime.respond, runtime.respond_and_resume):
        with pytest.raises(SerializationError, match=f"request '{request_id}'.*4,300 digits"):
            await answer(request_id, [1, HUGE])
    done = await runtime.respond_and_resume(request_id, [1, 2])  # (nothing was stored)
    assert done.outputs == [2]
    await runtime.close()


class Edit(BaseModel):
    values: dict[str, Any]


async def test_an_answer_of_a_model_holding_one_is_refused_saying_so(tmp_path: Path) -> None:
    # (it said "expected Edit, got dict: Exceeds the limit ... set_int_max_str_digits()":
    # outside tester 130)
    @executor(id="ask")
    async def ask(n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)

    @executor(id="take")
    async def take(edit: Edit, ctx: WorkflowContext[Never, int]) -> None:
        await ctx.yield_output(len(edit.values))

    port = RequestPort(id="edit", request_type=int, response_type=Edit)
    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(
        WorkflowBuilder("edit", start=ask).add_edge(ask, port).add_edge(port, take).build(),
        name="edit",
    )
    paused = await runtime.run("edit", 1)
    request_id = paused.pending_requests[0].request_id
    with pytest.raises(ResponseTypeError, match=f"request '{request_id}'.*4,300 digits"):
        await runtime.respond(request_id, {"values": {"n": HUGE}})
    done = await runtime.respond_and_resume(request_id, {"values": {"n": 1}})
    assert done.outputs == [1]
    await runtime.close()


async def test_a_step_description_holding_one_is_shown_as_text_and_the_step_runs(
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    @executor(id="charge")
    async def charge(n: int, ctx: WorkflowContext[Never, str]) -> None:
        async def pay() -> str:
            ran.append("paid")
            return "paid"

        await ctx.yield_output(await ctx.run_once("pay", pay, description={"amount": HUGE}))

    runtime = Runtime(SqliteStore(tmp_path / "runs.db"))
    runtime.register(WorkflowBuilder("charge", start=charge).build(), name="charge")
    result = await runtime.run("charge", 1)
    await runtime.close()
    assert result.outputs == ["paid"] and ran == ["paid"]


async def test_a_checkpoint_holding_one_is_not_written_as_json_no_reader_reads() -> None:
    result = await keeping([1, HUGE]).run(1)
    assert result.checkpoint is not None
    with pytest.raises(CheckpointError, match="more than 4,300 digits"):
        result.checkpoint.to_json()


def test_tool_call_arguments_no_reader_reads_are_kept_unparsed() -> None:
    raw = '{"n": ' + "9" * 4_400 + "}"
    updates = [
        ChatResponseUpdate(kind="function_call", message_id="m", call_id="c", name="t"),
        ChatResponseUpdate(kind="function_call", message_id="m", call_id="c", arguments_delta=raw),
    ]
    [call] = message_from_updates(updates).function_calls
    assert call.arguments == {"__unparsed__": raw}
