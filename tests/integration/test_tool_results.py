"""What a tool (or a ``run_once`` step) hands back after its effect ran must never fail the
turn: a resume would run the effect again (outside tester 109). Results JSON cannot hold, an
exception that cannot say what it is, a result a person gives for a call in doubt, and a
plain (not async) function as a step -- each recorded once, the run going on."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any, Never

import pytest

from tests.integration.workflows import asked_after_a_crash
from workflow_engine import (
    EffectResolution,
    Executor,
    InDoubtEffect,
    Runtime,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.executors import Agent, Rule, ScriptedChatClient, ToolCall, tool
from workflow_engine.storage import SqliteStore

pytestmark = pytest.mark.anyio


class Crash(BaseException):
    """The process dies inside the tool (not an error the agent turns into a result)."""


class CannotSay(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of the tool's exception fails")


def self_holding() -> dict[str, Any]:
    loop: dict[str, Any] = {"id": 1}
    loop["me"] = loop
    return loop


def payer(returns: Any, *, raise_tool_errors: bool = False) -> tuple[Any, list[str]]:
    """A workflow whose agent calls ``pay`` once and says its result; the calls it made."""
    calls: list[str] = []

    @tool
    def pay(amount: float) -> Any:
        """Pay an amount."""
        calls.append("pay")
        if isinstance(returns, BaseException):
            raise returns
        return returns() if callable(returns) else returns

    def build() -> Any:
        model = ScriptedChatClient(
            [
                Rule(user="pay", calls=[ToolCall("pay", {"amount": 5})]),
                Rule(after_tool="pay", reply="Result: {result}"),
            ]
        )
        agent = Agent("payer", "You pay.", model, [pay], raise_tool_errors=raise_tool_errors)
        return WorkflowBuilder(name="payer", start=agent).build()

    return build, calls


def nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def said(result: Any) -> str:
    [reply] = result.outputs
    return str(getattr(reply, "text", reply))


class _SaysSurrogate:
    def __repr__(self) -> str:
        return "caf\udce9"


@pytest.mark.parametrize(
    ("returns", "shown"),
    [
        (b"\xff\x00receipt", "b'\\xff\\x00receipt'"),  # bytes that are not UTF-8: their repr
        (self_holding, "{'id': 1, 'me': {...}}"),  # a dict that holds itself
        ({3, 1, 2}, "[1, 2, 3]"),  # JSON forms, as before
        (Decimal("1.50"), "1.50"),
        # text with a lone surrogate (a file name decoded with surrogateescape: tester 167)
        ({"name": b"caf\xe9.txt".decode("utf-8", "surrogateescape")}, "'caf\\udce9.txt'"),
        (lambda: 10**5000, "<an int that cannot be shown>"),  # (past the digit limit: no repr)
        # an error quoting a file name decoded as the OS gives it, a class's own __repr__
        # holding such text: each failed the turn after the tool ran (outside tester 173)
        (ValueError("no " + b"caf\xe9".decode("utf-8", "surrogateescape")), "caf\\udce9"),
        (_SaysSurrogate, "caf\\udce9"),
        # nesting deeper than a checkpoint holds (a parse tree): it failed the turn, and a
        # person who said the call had not happened saw it run again (outside tester 184)
        (lambda: {"tree": nested(200)}, "{'tree': [[[["),
        ({"tree": nested(60)}, '{"tree": [[[['),  # (as JSON, within the limit)
    ],
)
async def test_a_result_json_cannot_hold_is_its_repr_and_the_tool_ran_once(
    tmp_path: Path, returns: Any, shown: str
) -> None:
    build, calls = payer(returns)
    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(build)
    done = await rt.run("payer", "pay please")
    assert done.status is WorkflowRunState.IDLE, done.error
    assert shown in said(done)
    assert calls == ["pay"]
    await rt.close()


@pytest.mark.parametrize("raise_tool_errors", [False, True])
async def test_an_exception_that_cannot_say_what_it_is_is_recorded_all_the_same(
    tmp_path: Path, raise_tool_errors: bool
) -> None:
    """Its ``__str__`` raised: the model's error result, or the run's recorded error, failed
    in turn -- the run left in progress with no error, the tool run again by every resume."""
    build, calls = payer(CannotSay(), raise_tool_errors=raise_tool_errors)
    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(build)
    result = await rt.run("payer", "pay please")
    cannot = "(its message cannot be shown: CannotSay.__str__ raised RuntimeError)"
    if raise_tool_errors:
        assert result.status is WorkflowRunState.FAILED and result.error is not None
        assert result.error.error_type == "CannotSay" and result.error.message == cannot
        assert (await rt.get_run(result.run_id)).error["message"] == cannot  # type: ignore[index]
    else:
        assert result.status is WorkflowRunState.IDLE, result.error
        assert f"Error: CannotSay: {cannot}" in said(result)
    assert calls == ["pay"]
    await rt.close()


@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ({3, 1, 2}, "[1, 2, 3]"),
        (Decimal("2.50"), "2.50"),
        (b"ok", "ok"),
        (dt.datetime(2026, 12, 4, 15, 0, tzinfo=dt.UTC), "2026-12-04T15:00:00Z"),
    ],
)
async def test_a_result_given_for_a_call_in_doubt_is_kept_as_a_tool_s_would_be(
    tmp_path: Path, given: Any, shown: str
) -> None:
    """Answered from Python with a set, a ``Decimal``, bytes or a datetime, the answer was
    stored, then every resume failed (``not JSON serializable``) and the answer could not be
    changed: the run was lost."""
    build, calls = payer(Crash())
    again, asked = await asked_after_a_crash(build, tmp_path / "runs.db", Crash)
    assert isinstance(asked.data, InDoubtEffect)
    done = await again.respond_and_resume(
        asked.request_id, EffectResolution(happened=True, result=given)
    )
    assert done.status is WorkflowRunState.IDLE, done.error
    assert f"Result: {shown}" in said(done)
    assert calls == ["pay"]  # never run again
    await again.close()


async def test_a_plain_function_is_a_step_too(tmp_path: Path) -> None:
    """``run_once`` with a plain function ran its effect, then failed awaiting its result
    (``TypeError``); a resume ran it again. Its result is recorded as an async one's."""
    charged: list[int] = []

    class Charger(Executor):
        @handler
        async def charge(self, amount: int, ctx: WorkflowContext[Never, str]) -> None:
            def effect() -> str:
                charged.append(amount)
                return f"charged {amount}"

            receipt = await ctx.run_once("charge", effect)
            again = await ctx.run_once("charge", effect)  # the same step: its result
            await ctx.yield_output(f"{receipt} / {again}")

    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(lambda: WorkflowBuilder(name="charger", start=Charger("charger")).build())
    done = await rt.run("charger", 7)
    assert done.status is WorkflowRunState.IDLE, done.error
    assert done.outputs == ["charged 7 / charged 7"] and charged == [7]
    await rt.close()


@pytest.mark.parametrize("depth", [200, 900])
async def test_a_call_whose_arguments_nest_too_deep_is_refused_to_the_model(
    tmp_path: Path, depth: int
) -> None:
    """A model's call whose arguments nest deeper than a checkpoint holds failed the model's
    step, at every resume (outside tester 184): they are kept as their text, which the tool
    refuses to the model, and the run goes on."""
    from workflow_engine.executors import ChatResponseUpdate

    ran: list[Any] = []

    @tool
    def save(doc: Any) -> str:
        """Save a document."""
        ran.append(doc)
        return "saved"

    class Deep:
        async def get_response(self, messages: Any, *, tools: Any = ()) -> Never:
            raise NotImplementedError

        async def get_streaming_response(self, messages: Any, *, tools: Any = ()) -> Any:
            if messages[-1].role == "user":
                raw = '{"doc": ' + "[" * depth + '"x"' + "]" * depth + "}"
                yield ChatResponseUpdate(
                    kind="function_call",
                    message_id="m1",
                    call_id="c1",
                    name="save",
                    arguments_delta=raw,
                )
            else:
                yield ChatResponseUpdate(
                    kind="text",
                    message_id="m2",
                    text=" ".join(r.text for r in messages[-1].function_results)[:200],
                )

    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(lambda: WorkflowBuilder("deep", start=Agent("a", "", Deep(), [save])).build())
    done = await rt.run("deep", "save it")
    assert done.status is WorkflowRunState.IDLE, done.error
    assert ran == []
    assert "invalid arguments" in said(done), said(done)
    await rt.close()


async def test_an_edit_nesting_too_deep_is_refused_when_answering(tmp_path: Path) -> None:
    """A reviewer's edit nesting past 64 levels was taken: the approved tool ran, and its call
    could not be stored -- the run failed at every resume (outside tester 187). It is refused
    when answering, as a model's call that deep is refused to the model; nothing ran."""
    from workflow_engine import ResponseTypeError

    ran: list[Any] = []

    @tool(approval_mode="always_require")
    def save(doc: Any) -> str:
        """Save a document."""
        ran.append(doc)
        return "saved"

    def build() -> Any:
        model = ScriptedChatClient(
            [
                Rule(user="save", calls=[ToolCall("save", {"doc": "x"})]),
                Rule(after_tool="save", reply="Result: {result}"),
            ]
        )
        return WorkflowBuilder(name="saver", start=Agent("saver", "", model, [save])).build()

    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(build)
    paused = await rt.run("saver", "save it")
    (asked,) = paused.pending_requests
    deep = {"approved": True, "arguments": {"doc": nested(70)}}
    with pytest.raises(ResponseTypeError, match="nest deeper than 64 levels"):
        await rt.respond_and_resume(asked.request_id, deep)
    assert ran == []
    shallow = {"approved": True, "arguments": {"doc": nested(60)}}
    done = await rt.respond_and_resume(asked.request_id, shallow)
    assert done.status is WorkflowRunState.IDLE, done.error
    assert ran == [nested(60)]
    await rt.close()
