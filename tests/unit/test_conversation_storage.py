"""How an agent host stores its conversation: every message reads back exactly as it was, in
order, through a real checkpoint (JSON text and lazy views included)."""

from __future__ import annotations

import datetime as dt
import enum
import functools
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from workflow_engine import (
    Checkpoint,
    Executor,
    SerializationError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.executors import (
    Agent,
    AgentHostExecutor,
    ChatMessage,
    ChatResponse,
    ChatResponseUpdate,
    FunctionCallContent,
    FunctionResultContent,
    TextContent,
    ToolApprovalRequestContent,
    ToolApprovalResponseContent,
)
from workflow_engine.executors._agent import Joined, pending_batch
from workflow_engine.executors._host import read_message, stored_message


class Size(enum.StrEnum):
    """Equal to its text (``Size.S == "s"``): JSON keeps the text, not the enum."""

    S = "s"
    L = "l"


class Level(enum.IntEnum):
    LOW = 1


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=8), st.floats(allow_nan=False)
)
values: st.SearchStrategy[Any] = st.recursive(
    json_scalars
    | st.datetimes()  # not JSON: stored tagged, never as text that reads back different
    | st.tuples(st.integers())
    | st.sampled_from([Size.S, Size.L, Level.LOW]),  # == their JSON, yet not what it reads as
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
calls = st.builds(
    FunctionCallContent,
    call_id=st.text(max_size=6),
    name=st.text(max_size=6),
    arguments=st.dictionaries(st.text(max_size=5), values, max_size=3),
)
contents = st.one_of(
    st.builds(TextContent, text=st.text(max_size=20)),
    calls,
    st.builds(
        FunctionResultContent,
        call_id=st.text(max_size=6),
        name=st.text(max_size=6),
        result=values,
        error=st.none() | st.text(max_size=8),
    ),
    st.builds(ToolApprovalRequestContent, id=st.text(max_size=6), function_call=calls),
    st.builds(
        ToolApprovalResponseContent,
        approved=st.booleans(),
        arguments=st.none() | st.dictionaries(st.text(max_size=5), values, max_size=2),
        id=st.none() | st.text(max_size=6),
        reason=st.none() | st.text(max_size=8),
    ),
)
messages = st.builds(
    ChatMessage,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    contents=st.lists(contents, max_size=3),
    author_name=st.none() | st.text(max_size=6),
    message_id=st.none() | st.text(max_size=6),
)


class Keeper(Executor):
    """Appends the messages it receives the way an agent host does, and yields what it reads."""

    @handler
    async def on_batch(self, batch: list[ChatMessage], ctx: WorkflowContext[None, Any]) -> None:
        await ctx.append_state("conversation", [stored_message(m) for m in batch])
        view = await ctx.get_state_items("conversation", convert=read_message)
        await ctx.yield_output(list(view))


def same(a: Any, b: Any) -> bool:
    """Equal, with the same types at every depth (a tuple stays a tuple, a datetime a datetime)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, BaseModel):
        return all(same(getattr(a, f), getattr(b, f)) for f in type(a).model_fields)
    return bool(a == b)


# half of them in the fast tier (``make test-fast``), as tests/unit/test_properties.py does
@settings(max_examples=75 if os.environ.get("PROPERTY_EXAMPLES") == "half" else 150, deadline=None)
@given(st.lists(messages, max_size=4), st.lists(messages, max_size=4))
def test_a_stored_conversation_reads_back_exactly_after_a_checkpoint(
    first: list[ChatMessage], second: list[ChatMessage]
) -> None:
    keeper = Keeper("keeper")
    wf = (
        WorkflowBuilder("keep", start=keeper)
        .register_types(*AgentHostExecutor.serializable_types, dt.datetime, Size, Level)
        .build()
    )

    async def go() -> list[ChatMessage]:
        result = await wf.run(first)
        assert result.checkpoint is not None
        # through JSON, as a store keeps it, then another superstep appends to it
        restored = Checkpoint.from_json(result.checkpoint.to_json())
        result = await wf.run(second, checkpoint=restored)
        assert result.checkpoint is not None
        restored = Checkpoint.from_json(result.checkpoint.to_json())
        stored = restored.executor_states["keeper"]["conversation"]
        assert len(stored) == len(first) + len(second)
        out: list[ChatMessage] = result.outputs[-1]
        return out

    read = anyio.run(go)
    assert len(read) == len(first) + len(second)
    for original, back in zip([*first, *second], read, strict=True):
        assert same(original, back), (original, back)


class Listener:
    """A chat client that answers "ok" and keeps every conversation it was given."""

    def __init__(self) -> None:
        self.seen: list[list[ChatMessage]] = []

    async def get_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[Any] = ()
    ) -> ChatResponse:
        self.seen.append(list(messages))
        return ChatResponse(messages=[ChatMessage.assistant("ok")])

    async def get_streaming_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[Any] = ()
    ) -> AsyncIterator[ChatResponseUpdate]:
        self.seen.append(list(messages))
        yield ChatResponseUpdate(kind="text", message_id="m", text="ok")


# messages an agent reads without acting on them (no call of a tool, no approval it asks for),
# each of their values of any type (results and arguments hold JSON, enums, tuples, datetimes)
read_only_messages = st.builds(
    ChatMessage,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    contents=st.lists(
        st.one_of(
            st.builds(TextContent, text=st.text(max_size=20)),
            st.builds(
                FunctionResultContent,
                call_id=st.text(max_size=6),
                name=st.text(max_size=6),
                result=values,
            ),
        ),
        max_size=3,
    ),
    author_name=st.none() | st.text(max_size=6),
)


@settings(max_examples=40 if os.environ.get("PROPERTY_EXAMPLES") == "half" else 80, deadline=None)
@given(st.lists(read_only_messages, max_size=4), st.lists(read_only_messages, max_size=4))
def test_an_agent_host_hands_its_model_the_conversation_exactly(
    first: list[ChatMessage], second: list[ChatMessage]
) -> None:
    # a turn reads the messages its handler just appended without parsing them again: what
    # the model is given is what a fresh read of the stored conversation gives, type for type,
    # in the run that appended them and in one restored from the checkpoint
    listener = Listener()
    host = AgentHostExecutor(Agent("a", client=listener), run_on_message=True)
    wf = WorkflowBuilder("listen", start=host).register_types(dt.datetime, Size, Level).build()

    # (each batch ends with a question for the model: the agent answers it, whatever tool
    # calls and approvals the batch holds before it)
    first = [*first, ChatMessage.user("first?")]
    second = [*second, ChatMessage.user("second?")]

    async def go() -> None:
        result = await wf.run(first)
        assert result.checkpoint is not None
        restored = Checkpoint.from_json(result.checkpoint.to_json())
        await wf.run(second, checkpoint=restored)

    anyio.run(go)
    assert len(listener.seen) == 2
    at_first, at_second = listener.seen
    assert len(at_second) == len(first) + 1 + len(second)  # (the reply to the first between)
    for expected, read in (
        (first, at_first),
        (first, at_second[: len(first)]),
        (second, at_second[len(first) + 1 :]),
    ):
        assert len(read) == len(expected)
        for given_message, back in zip(expected, read, strict=True):
            assert same(given_message, back), (given_message, back)


class Preloader(Executor):
    """Appends two notes, then reads them through views told what they read as."""

    @handler
    async def on_go(self, go: str, ctx: WorkflowContext[None, Any]) -> None:
        appended = [f"{go}-1", f"{go}-2"]
        await ctx.append_state("notes", appended)
        told = await ctx.get_state_items("notes")
        told.preload(appended, ["ONE", None])  # (None: not known, read it)
        others = await ctx.get_state_items("notes")
        others.preload([f"{go}-1", f"{go}-2"], ["X", "Y"])  # equal text, other objects
        short = await ctx.get_state_items("notes")
        short.preload(appended[:1], ["Z"])  # not what the view ends with
        await ctx.yield_output([list(told), list(others), list(short)])


def test_a_view_takes_preloaded_items_only_for_the_very_objects_it_ends_with() -> None:
    wf = WorkflowBuilder("preload", start=Preloader("p")).build()
    result = anyio.run(wf.run, "a")
    result = anyio.run(functools.partial(wf.run, "b", checkpoint=result.checkpoint))
    told, others, short = result.outputs[-1]
    assert told == ["a-1", "a-2", "ONE", "b-2"]
    assert others == short == ["a-1", "a-2", "b-1", "b-2"]


class Retyper(Executor):
    """Reads a list through a view, rewrites it with equal items of other types, then reads
    it again through a view that reuses the first (outside tester 185)."""

    view: Any = None

    @handler
    async def on_step(self, step: int, ctx: WorkflowContext[int, Any]) -> None:
        if step == 0:
            await ctx.set_state("flags", [1, 2.0, 0.0, 3])
        elif step == 1:
            self.view = await ctx.get_state_items("flags")
            list(self.view)  # every item decoded
            await ctx.set_state("flags", [True, 2, -0.0, 3, False])
        else:
            again = await ctx.get_state_items("flags", reuse=self.view)
            await ctx.yield_output(list(again))
            return
        await ctx.send_message(step + 1)


def test_a_reused_view_keeps_only_items_stored_exactly_as_they_were() -> None:
    retyper = Retyper("r")
    wf = WorkflowBuilder("retype", start=retyper).add_edge(retyper, retyper).build()
    result = anyio.run(wf.run, 0)
    (items,) = result.outputs
    assert items == [True, 2, -0.0, 3, False]
    assert [type(i) for i in items] == [bool, int, float, int, bool]
    assert str(items[2]) == "-0.0"


class Meddler:
    """A chat client that changes the messages it is given in place, then fails once."""

    def __init__(self) -> None:
        self.seen: list[list[ChatMessage]] = []

    async def get_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[Any] = ()
    ) -> ChatResponse:
        raise AssertionError("the host streams")

    async def get_streaming_response(
        self, messages: Sequence[ChatMessage], *, tools: Sequence[Any] = ()
    ) -> AsyncIterator[ChatResponseUpdate]:
        self.seen.append([m.model_copy(deep=True) for m in messages])
        messages[-1].contents.append(TextContent(text="INJECTED"))
        for message in messages:
            for content in message.contents:
                if isinstance(content, FunctionCallContent):
                    content.arguments["injected"] = True
        if len(self.seen) == 1:
            raise RuntimeError("the model is down")
        yield ChatResponseUpdate(kind="text", message_id="m", text="ok")


def test_the_retry_of_a_failed_turn_gives_the_model_the_stored_conversation() -> None:
    # outside tester 129: the host kept the failed attempt's messages, changed in place by its
    # client, and the retry in the same process handed them to the model again
    meddler = Meddler()
    host = AgentHostExecutor(Agent("a", client=meddler), run_on_message=True)
    wf = WorkflowBuilder("meddle", start=host).build()
    call = FunctionCallContent(call_id="c0", name="t", arguments={"x": 1})
    given = [
        ChatMessage(role="assistant", contents=[call]),
        ChatMessage(role="tool", contents=[FunctionResultContent(call_id="c0", result=1)]),
        ChatMessage.user("hello"),
    ]

    async def go() -> None:
        admitted = wf.admit(given)
        failed = await wf.run(checkpoint=admitted)
        assert failed.status is WorkflowRunState.FAILED
        await wf.run(checkpoint=admitted)  # the retry, same process, same host

    anyio.run(go)
    first, retry = meddler.seen
    assert first == given and retry == given, retry


def test_a_message_whose_json_would_not_read_back_is_refused_by_name() -> None:
    huge = ChatMessage(
        role="assistant",
        contents=[FunctionCallContent(call_id="c", name="t", arguments={"n": 10**5000})],
    )
    with pytest.raises(SerializationError, match="more than 4,300 digits"):
        stored_message(huge)  # (JSON readers refuse it: no checkpoint holding it could be read)
    lone = ChatMessage.user("a\ud800b")  # no text for it: the codec refuses it by name
    assert stored_message(lone) is lone


def test_a_message_that_json_would_change_is_stored_as_itself() -> None:
    exact = ChatMessage.user("hello")
    assert isinstance(stored_message(exact), str)
    when = dt.datetime(2024, 5, 1, 12, 0)
    odd = ChatMessage(
        role="tool",
        contents=[FunctionResultContent(call_id="c", result={"at": when, "pair": (1, 2)})],
    )
    assert stored_message(odd) is odd
    assert same(read_message(stored_message(odd)), odd)


def test_a_stored_message_leaves_out_its_unset_fields_and_keeps_nulls_it_carries() -> None:
    """Every resume parses the whole stored conversation: ``"author_name":null`` and the like
    are a fifth of a short message's bytes. A null the message carries (in a tool result) is
    data, and stays."""
    stored = stored_message(ChatMessage.user("hello"))
    assert stored == '{"role":"user","contents":[{"type":"text","text":"hello"}]}'
    carried = ChatMessage(
        role="tool",
        contents=[FunctionResultContent(call_id="c", result={"found": None, "rows": [None]})],
    )
    text = stored_message(carried)
    assert isinstance(text, str)
    assert '"found":null' in text and '"rows":[null]' in text and '"error"' not in text
    assert read_message(text) == carried


def test_pending_batch_stops_at_the_newest_message_that_is_not_the_users() -> None:
    call = FunctionCallContent(call_id="c1", name="pay")
    held = ToolApprovalRequestContent(id="approval_c1", function_call=call)
    answer = ToolApprovalResponseContent(approved=True, id="approval_c1")
    head = [ChatMessage.user(f"u{i}") for i in range(50)]
    calls = ChatMessage(role="assistant", contents=[call])
    approvals = ChatMessage(role="assistant", contents=[held])
    waiting = Joined(head, [calls, approvals, ChatMessage(role="user", contents=[answer])])
    found = pending_batch(waiting)
    assert found is not None
    assert found[0] == [call] and found[1] == [held] and found[2] == {"approval_c1": answer}
    assert (
        pending_batch(Joined(head, [ChatMessage.assistant("done"), ChatMessage.user("hi")])) is None
    )
