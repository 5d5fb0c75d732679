"""Tools, the scripted model and the function-invocation loop, without a workflow."""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable
from typing import Annotated, Any, Literal

import pytest
from pydantic import BeforeValidator, Field

from workflow_engine import UsageError
from workflow_engine.executors import (
    Agent,
    ChatMessage,
    IdempotencyKey,
    Rule,
    ScriptedChatClient,
    ToolApprovalResponseContent,
    ToolArgumentsError,
    ToolCall,
    message_from_updates,
    tool,
)

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


@tool
async def lookup(order_id: Annotated[str, Field(description="the order number")]) -> dict:
    """Find an order.

    Longer text that is not part of the description."""
    return {"order_id": order_id, "status": "shipped"}


@tool(approval_mode=lambda args: args["amount"] > 100)
def refund(order_id: str, amount: float, key: IdempotencyKey) -> str:
    """Refund part of an order."""
    return f"{order_id}:{amount}:{key}"


def test_schema_comes_from_annotations_and_docstring() -> None:
    spec = lookup.spec
    assert spec.description == "Find an order."
    assert spec.parameters["properties"]["order_id"]["description"] == "the order number"
    assert spec.parameters["required"] == ["order_id"]
    # the idempotency key is injected, never shown to the model
    assert set(refund.spec.parameters["properties"]) == {"order_id", "amount"}


def test_arguments_are_validated_before_any_call() -> None:
    with pytest.raises(ToolArgumentsError, match="amount: Input should be a valid number"):
        refund.validate({"order_id": "1", "amount": "lots"})
    with pytest.raises(ToolArgumentsError, match="surprise: Extra inputs"):
        lookup.validate({"order_id": "1", "surprise": True})
    assert refund.validate({"order_id": "1", "amount": "5"}) == {"order_id": "1", "amount": 5.0}
    # a boolean is no number, however pydantic's lax reading takes it (an approval edited to
    # "amount": true moved 1.00 EUR: outside tester 176) -- at any depth; text still is
    for wrong, where in (
        ({"order_id": "1", "amount": True}, "amount: Input should be a valid number"),
        ({"order_id": "1", "amount": False}, "amount: Input should be a valid number"),
        ({"counts": [1, True]}, r"counts\.1: Input should be a valid number, not a boolean"),
        # a Literal of numbers and an IntEnum take True as 1 too (outside tester 179)
        ({"counts": [1], "level": True}, "level: Input should be a valid number, not a"),
        ({"counts": [1], "size": True}, "size: Input should be a valid number, not a"),
    ):
        with pytest.raises(ToolArgumentsError, match=where):
            (refund if "order_id" in wrong else _counting).validate(wrong)
    assert _counting.validate({"counts": [1, "2"], "exact": True}) == {
        "counts": [1, 2],
        "exact": True,
        "level": 1,
        "size": _Size.SMALL,
    }
    # a value JSON cannot hold beside it (bytes, from Python) hid the boolean (tester 179)
    with pytest.raises(ToolArgumentsError, match="amount: Input should be a valid number"):
        _paying.validate({"amount": True, "note": b"abc"})
    # an aliased field, a dict's number keys, a set (outside tester 180)
    for wrong, where in (
        ({"amt": True}, "amt: Input should be a valid number"),
        ({"amt": 1, "weights": {"7": False}}, "weights.7: Input should be a valid number"),
        ({"amt": 1, "ids": [2, True]}, "ids.1: Input should be a valid integer"),
    ):
        with pytest.raises(ToolArgumentsError, match=where):
            _shaped.validate(wrong)
    assert _shaped.validate({"amt": "2", "weights": {"7": 1}, "ids": [2]}) == {
        "amount": 2.0,
        "weights": {7: 1.0},
        "ids": {2},
    }
    # from Python: a set, a tuple, a dict's keys (outside tester 181)
    for wrong, where in (
        ({"amt": 1, "ids": {True, 2}}, "ids: Input should be a valid number"),
        ({"amt": 1, "weights": {True: 0.5}}, "weights.True: Input should be a valid number"),
        ({"amt": 1, "ids": (2, True)}, r"ids\.1: Input should be a valid integer"),
    ):
        with pytest.raises(ToolArgumentsError, match=where):
            _shaped.validate(wrong)
    # a boolean a type reads as its own (an enum of booleans, a validator's shorthand) is
    # still taken: the check refused every such value (outside tester 181)
    assert _deploying.validate({"mode": True, "confirm": False}) == {
        "mode": _Mode.LIVE,
        "confirm": "no",
    }
    # JSON has no infinity nor NaN: the text pydantic would read as one is refused (an
    # approval edited to "Infinity" moved inf EUR)
    for endless in ("Infinity", "-inf", "NaN", float("inf"), float("nan")):
        with pytest.raises(ToolArgumentsError, match="amount: Input should be a finite number"):
            refund.validate({"order_id": "1", "amount": endless})


class _Size(enum.IntEnum):
    SMALL = 1
    LARGE = 2


@tool
def _counting(
    counts: list[int], exact: bool = False, level: Literal[1, 2] = 1, size: _Size = _Size.SMALL
) -> int:
    """Count."""
    return sum(counts)


@tool
def _paying(amount: float, note: bytes = b"") -> str:
    """Pay."""
    return "paid"


class _Mode(enum.Enum):
    LIVE = True
    DRY_RUN = False


def _yes_or_no(value: Any) -> Any:
    return ("yes" if value else "no") if type(value) is bool else value


@tool
def _deploying(mode: _Mode, confirm: Annotated[str, BeforeValidator(_yes_or_no)]) -> str:
    """Deploy."""
    return "deployed"


@tool
def _shaped(
    amount: Annotated[float, Field(alias="amt")],
    weights: dict[int, float] | None = None,
    ids: set[int] | None = None,
) -> str:
    """Weigh."""
    return "weighed"


def test_conditional_approval_mode() -> None:
    assert not refund.needs_approval({"order_id": "1", "amount": 50})
    assert refund.needs_approval({"order_id": "1", "amount": 500})
    # a predicate that raises asks a person: it failed the run, and each resume replayed the
    # model's call into the same failure (outside tester 176)
    fragile = tool(approval_mode=lambda args: 1 / 0)(_plain)
    assert fragile.needs_approval({})
    with pytest.raises(ValueError, match="approval_mode"):
        tool(approval_mode="sometimes")(lambda: None)  # type: ignore[arg-type]


async def test_sync_and_async_tools_receive_the_idempotency_key() -> None:
    assert await refund.invoke({"order_id": "7", "amount": 1}, idempotency_key="run:call") == (
        "7:1.0:run:call"
    )
    assert (await lookup.invoke({"order_id": "7"}, idempotency_key="x"))["status"] == "shipped"


async def test_streaming_deltas_reassemble_the_message() -> None:
    client = ScriptedChatClient(
        [
            Rule(
                user="refund",
                reply="One moment please, checking.",
                calls=[ToolCall("lookup", {"order_id": "9"})],
            )
        ],
        chunk_size=2,
    )
    updates = [u async for u in client.get_streaming_response([ChatMessage.user("refund 9")])]
    assert [u.text for u in updates if u.kind == "text"] == ["One moment ", "please, checking."]
    message = message_from_updates(updates)
    assert message.text == "One moment please, checking."
    assert message.function_calls[0].arguments == {"order_id": "9"}


async def test_a_callable_reply_is_the_text_not_a_template() -> None:
    """Braces in what a callable returns (the user's own words, echoed) are text: they were
    formatted, and ``"set {}"`` failed the run (outside tester)."""
    client = ScriptedChatClient([Rule(reply=lambda messages: "you said: " + messages[-1].text)])
    for said in ("hello", 'a dict {"k": 1}', "set {}", "{user}"):
        (answer,) = (await client.get_response([ChatMessage.user(said)])).messages
        assert answer.text == f"you said: {said}"


def agent_with(rules, tools=(lookup, refund), **kwargs) -> Agent:
    return Agent("a", "be helpful", ScriptedChatClient(rules), list(tools), **kwargs)


async def test_free_calls_run_and_the_model_continues() -> None:
    agent = agent_with(
        [
            Rule(user=r"order (?P<id>\d+)", calls=[ToolCall("lookup", {"order_id": "{id}"})]),
            Rule(after_tool="lookup", reply="Status: {result}"),
        ]
    )
    response = await agent.run([ChatMessage.user("where is order 12?")])
    assert [m.role for m in response.messages] == ["assistant", "tool", "assistant"]
    assert response.text == 'Status: {"order_id": "12", "status": "shipped"}'
    assert response.pending_approvals == []


async def test_a_message_built_with_text_reaches_the_model() -> None:
    """``ChatMessage("user", text=...)`` as MAF writes it: the text was silently dropped, so
    the model was sent an empty message (outside testers 158, 176)."""
    agent = agent_with(
        [
            Rule(user=r"order (?P<id>\d+)", calls=[ToolCall("lookup", {"order_id": "{id}"})]),
            Rule(after_tool="lookup", reply="Status: {result}"),
        ]
    )
    response = await agent.run([ChatMessage("user", text="where is order 12?")])
    assert response.text == 'Status: {"order_id": "12", "status": "shipped"}'
    both = ChatMessage(role="assistant", contents=ChatMessage.user("a").contents, text="b")
    assert [c.text for c in both.contents] == ["a", "b"]
    with pytest.raises(ValueError, match="takes text, not int"):
        ChatMessage("user", text=5)  # type: ignore[arg-type]
    # validated from data too (outside tester 176: it became an empty message)
    assert ChatMessage.model_validate({"role": "user", "text": "hi"}).text == "hi"
    assert ChatMessage.model_validate_json('{"role": "user", "text": "hi"}').text == "hi"
    # reading messages back (a checkpoint, a model's JSON) does not go through that __init__
    assert ChatMessage.__pydantic_custom_init__ is False


async def test_a_guarded_call_holds_the_whole_batch_until_answered() -> None:
    agent = agent_with(
        [
            Rule(
                user="refund",
                calls=[
                    ToolCall("lookup", {"order_id": "1"}),
                    ToolCall("refund", {"order_id": "1", "amount": "500"}),
                ],
            ),
            Rule(after_tool="refund", reply="done: {result}", rejected="not refunded"),
        ]
    )
    first = await agent.run([ChatMessage.user("refund order 1")])
    (held,) = first.pending_approvals
    assert held.function_call.name == "refund" and not first.messages[-1].function_results
    conversation = [ChatMessage.user("refund order 1"), *first.messages]
    # rejected: the free sibling still runs, the guarded call does not
    rejected = await agent.run(
        [*conversation, ChatMessage(role="user", contents=[held.create_response(False)])]
    )
    results = {r.name: r for r in rejected.messages[0].function_results}
    assert results["lookup"].error is None and "rejected" in results["refund"].error
    assert rejected.text == "not refunded"
    # approved with an edited amount (validated, merged with the original arguments)
    approved = await agent.run(
        [
            *conversation,
            ChatMessage(role="user", contents=[held.create_response(True, {"amount": 120})]),
        ]
    )
    # the idempotency key comes from the engine (outside a workflow: a fresh one per call)
    assert re.fullmatch(r"done: 1:120\.0:[0-9a-f]{32}", approved.text)


async def test_an_approval_made_by_create_response_is_the_bare_approval() -> None:
    """``create_response(True)`` names the call it answers; ``{"approved": true}`` (the
    command line, AG-UI) does not: stored, they were two answers -- the second a conflict
    (outside tester 181). The call it answers is the request's to say."""
    from workflow_engine import AnswerOutcome, ResponseTypeError, Runtime, WorkflowBuilder
    from workflow_engine.storage import InMemoryRunStore

    agent = agent_with(
        [Rule(user="refund", calls=[ToolCall("refund", {"order_id": "1", "amount": "500"})])]
    )
    runtime = Runtime(InMemoryRunStore())
    name = runtime.register(WorkflowBuilder(name="refunds", start=agent).build())
    try:
        for first, then in (
            (lambda held: held.create_response(True), {"approved": True}),
            (lambda held: {"approved": True}, None),  # (then create_response, below)
        ):
            paused = await runtime.run(name, "refund order 1")
            (request,) = paused.pending_requests
            held = request.data
            assert await runtime.respond(request.request_id, first(held)) == AnswerOutcome.STORED
            again = then if then is not None else held.create_response(True)
            assert await runtime.respond(request.request_id, again) == AnswerOutcome.DUPLICATE
        paused = await runtime.run(name, "refund order 1")
        (request,) = paused.pending_requests
        other = request.data.function_call.model_copy(update={"call_id": "another"})
        with pytest.raises(ResponseTypeError, match="names call 'another'"):
            await runtime.respond(
                request.request_id,
                ToolApprovalResponseContent(approved=True, function_call=other),
            )
    finally:
        await runtime.close()


async def test_tool_errors_and_unknown_tools_become_results_the_model_sees() -> None:
    @tool
    def broken() -> str:
        """Always fails."""
        raise RuntimeError("backend down")

    agent = agent_with(
        [
            Rule(user="go", calls=[ToolCall("broken"), ToolCall("ghost")]),
            Rule(after_tool="broken", reply="saw: {result}"),
        ],
        tools=[broken],
    )
    response = await agent.run([ChatMessage.user("go")])
    errors = [r.error for r in response.messages[1].function_results]
    assert errors[0] == "RuntimeError: backend down"
    assert "no tool named 'ghost'" in errors[1]
    strict = agent_with([Rule(user="go", calls=[ToolCall("broken")])], tools=[broken])
    strict.raise_tool_errors = True
    with pytest.raises(RuntimeError, match="backend down"):
        await strict.run([ChatMessage.user("go")])


async def test_round_trip_cap_stops_a_looping_model() -> None:
    agent = agent_with([Rule(calls=[ToolCall("lookup", {"order_id": "1"})])], max_round_trips=3)
    response = await agent.run([ChatMessage.user("loop forever")])
    assert response.round_trip_limit_hit
    assert sum(1 for m in response.messages if m.function_calls) == 3
    assert "3 model round trips" in response.messages[-1].text


async def test_journal_replays_model_and_tool_results() -> None:
    calls = []

    @tool
    def count() -> int:
        """Counts its calls."""
        calls.append(1)
        return len(calls)

    journal: dict[str, object] = {}
    keys: list[str] = []

    async def once(kind, fn, *, idempotent=False, description=None):
        # like ctx.run_once under ctx.next_step_name(kind): steps numbered per invocation
        key = f"{kind}#{sum(1 for k in keys if k.startswith(kind + '#'))}"
        keys.append(key)
        if key not in journal:
            journal[key] = await fn(f"idem-{key}")
        return journal[key]

    client = ScriptedChatClient(
        [Rule(user="go", calls=[ToolCall("count")]), Rule(after_tool="count", reply="n={result}")]
    )
    agent = Agent("a", "", client, [count])
    first = await agent.run([ChatMessage.user("go")], journal=once)
    keys.clear()  # a new invocation of the same delivery numbers its steps from 0 again
    again = await agent.run([ChatMessage.user("go")], journal=once)
    assert first.text == again.text == "n=1"
    assert calls == [1] and client.calls == 2  # replayed: no second model call, no second tool run


def test_an_argument_is_compared_as_a_value_not_as_stored_json() -> None:
    """A client's dict holding ``{"$tuple": [1, 2]}`` matched the list ``[1, 2]`` through the
    codec's canonical JSON, so that edit was dropped as changing nothing and the call ran with
    the list (outside tester 104)."""
    from decimal import Decimal

    from workflow_engine.executors._content import same_argument

    assert same_argument(10, 10.0) and same_argument({"a": [1, 2.0]}, {"a": [1.0, 2]})
    assert not same_argument({"k": {"$tuple": [1, 2]}}, {"k": [1, 2]})
    assert not same_argument({"$set": [1]}, [1])
    assert not same_argument(True, 1) and not same_argument(0, False)
    assert not same_argument("10", 10) and not same_argument([1, 2], [2, 1])
    assert not same_argument({"a": 1}, {"a": 1, "b": None})
    assert same_argument(Decimal("1.5"), Decimal("1.5")) and same_argument(None, None)


def _varargs(a: int, *args: int, b: str = "x") -> str:
    return "never"


def _two_keys(a: IdempotencyKey, b: IdempotencyKey) -> str:
    return "never"


def _int_key(idempotency_key: int) -> str:
    return "never"


async def _asks(arguments: dict) -> bool:
    return True


class _AsyncPredicate:
    async def __call__(self, arguments: dict) -> bool:
        return True


def _plain() -> str:
    """A tool."""
    return "ran"


def _private(_order_id: str) -> str:
    return "never"


def _unknown_annotation(order: NoSuchType) -> str:  # type: ignore[name-defined]  # noqa: F821
    return "never"


def _callable_parameter(how: Callable[[int], int]) -> str:
    return "never"


def _configured(order_id: str, model_config: str) -> str:
    return "never"


def _protected(model_validate: int) -> str:
    return "never"


def test_underscored_parameters_the_engine_fills_are_still_taken() -> None:
    """``**_kw`` (forwarded props) and ``_key: IdempotencyKey`` are never the model's: the
    check of names starting with '_' refused them (outside tester 179)."""

    def forwarded(a: int, **_kw: Any) -> str:
        return "ran"

    def keyed(a: int, _key: IdempotencyKey) -> str:
        return "ran"

    assert tool(forwarded).accepts_invocation_kwargs
    assert tool(keyed).idempotency_param == "_key"
    for made in (tool(forwarded), tool(keyed)):
        assert list(made.spec.parameters["properties"]) == ["a"]


@pytest.mark.parametrize(
    ("make", "refused"),
    [
        # each accepted, then failing at the first call (outside tester 167)
        (lambda: tool(_varargs), r"\*args cannot be filled by a model"),
        (lambda: tool(_two_keys), "two parameters take the idempotency key"),
        (lambda: tool(_int_key), "annotate it str or IdempotencyKey"),
        (lambda: tool(approval_mode=5)(_plain), "approval_mode must be"),
        (lambda: tool(approval_mode=None)(_plain), "approval_mode must be"),
        (lambda: tool(approval_mode="sometimes")(_plain), "approval_mode must be"),
        (lambda: tool(approval_mode=_asks)(_plain), "must be a plain function"),
        (lambda: tool(approval_mode=_AsyncPredicate())(_plain), "must be a plain function"),
        (lambda: tool(name=5)(_plain), "name must be non-blank text"),
        (lambda: tool(name="   ")(_plain), "name must be non-blank text"),
        (lambda: tool(name="\u200b")(_plain), "name must be non-blank text"),
        (lambda: tool(name="\ud800")(_plain), "name must be non-blank text"),
        (lambda: tool(description=3)(_plain), "description must be text"),
        (lambda: tool(idempotent="yes")(_plain), "idempotent must be True or False"),
        (lambda: tool("not a function"), "decorates a function"),
        # left out of the schema, so no call could ever pass it (outside testers 176, 179)
        (lambda: tool(_private), "parameter '_order_id' cannot be one of a model's arguments"),
        (lambda: tool(_configured), "parameter 'model_config' cannot be one of a model's"),
        (lambda: tool(_protected), "its parameters cannot be a schema: Field 'model_validate'"),
        (lambda: tool(_unknown_annotation), "its annotations cannot be read"),
        # no JSON schema to show the model: the run failed at its first turn (tester 181)
        (lambda: tool(_callable_parameter), "its parameters have no JSON schema"),
    ],
)
def test_a_tool_that_cannot_be_called_as_defined_is_refused_when_defined(
    make: Any, refused: str
) -> None:
    with pytest.raises(UsageError, match=refused):
        make()


async def test_an_idempotency_key_parameter_may_be_optional_text() -> None:
    @tool
    def book(what: str, idempotency_key: str | None = None) -> str:
        """Book."""
        return f"{what}:{idempotency_key}"

    assert list(book.spec.parameters["properties"]) == ["what"]
    assert await book.invoke({"what": "x"}, idempotency_key="k") == "x:k"


async def test_positional_only_parameters_are_passed_by_position() -> None:
    """``def f(a, /)`` failed at every call: the model's arguments were passed by name (the
    idempotency key's too: outside tester 173)."""

    @tool
    def charge(amount: float, idempotency_key: str, /) -> str:
        """Charge."""
        return f"{amount}:{idempotency_key}"

    assert await charge.invoke({"amount": 2}, idempotency_key="k") == "2.0:k"

    @tool
    def add(a: int, b: int, /, c: int = 0) -> int:
        """Add."""
        return a + b + c

    assert add.spec.parameters["required"] == ["a", "b"]
    assert await add.invoke({"a": 1, "b": 2, "c": 3}, idempotency_key="k") == 6


class _Lookup:
    """Look an order up."""

    async def __call__(self, order_id: str) -> str:
        return f"found {order_id}"


async def _find(order_id: str, where: str) -> str:
    return f"found {order_id} in {where}"


def _finding_later(order_id: str) -> Any:
    return _find(order_id, "a coroutine handed back")


async def test_a_callable_object_a_partial_or_a_coroutine_handed_back_is_a_tool() -> None:
    """An object with ``async def __call__`` and a ``functools.partial`` were refused with a
    bare ``TypeError``; a plain function handing back a coroutine had it for its result,
    never awaited -- the effect never happened, and the model was told it had (outside
    tester 176)."""
    for made, said in (
        (tool(_Lookup()), "found 7"),
        (tool(functools.partial(_find, where="the archive")), "found 7 in the archive"),
        (tool(_finding_later), "found 7 in a coroutine handed back"),
    ):
        assert list(made.spec.parameters["properties"]) == ["order_id"], made
        assert await made.invoke({"order_id": "7"}, idempotency_key="k") == said
    assert tool(_Lookup()).name == "_Lookup" and tool(functools.partial(_find)).name == "_find"


def test_a_reducer_class_for_an_instance_is_refused_when_the_agent_is_defined() -> None:
    """The class itself was taken, and failed the first turn (outside tester 173)."""
    from workflow_engine import DefinitionError
    from workflow_engine.executors import MessageCountingChatReducer

    with pytest.raises(DefinitionError, match="MessageCountingChatReducer\\(40\\)"):
        Agent("a", "", ScriptedChatClient([]), chat_reducer=MessageCountingChatReducer)  # type: ignore[arg-type]
