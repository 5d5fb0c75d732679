"""MessageCountingChatReducer: what of a long conversation an agent sends its model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workflow_engine import DefinitionError
from workflow_engine.executors import (
    Agent,
    ChatMessage,
    FunctionCallContent,
    FunctionResultContent,
    HandoffBuilder,
    MessageCountingChatReducer,
    ScriptedChatClient,
    TextContent,
    ToolApprovalRequestContent,
)


def _exchange(n: int, approved: bool | None) -> list[ChatMessage]:
    """An assistant's call, its approval (if asked), and its result."""
    call = FunctionCallContent(call_id=f"c{n}", name="t", arguments={})
    said = [ChatMessage(role="assistant", contents=[call])]
    if approved is not None:
        asked = ToolApprovalRequestContent(id=f"approval_c{n}", function_call=call)
        said.append(ChatMessage(role="assistant", contents=[asked]))
        said.append(ChatMessage(role="user", contents=[asked.create_response(approved)]))
    said.append(ChatMessage(role="tool", contents=[FunctionResultContent(call_id=f"c{n}")]))
    return said


PARTS = st.one_of(st.just("user"), st.just("assistant"), st.sampled_from([None, True, False]))


@st.composite
def conversations(draw: st.DrawFn) -> list[ChatMessage]:
    messages = [ChatMessage(role="system", contents=[TextContent(text="be brief")])]
    if not draw(st.booleans()):
        messages = []
    for n, part in enumerate(draw(st.lists(PARTS, max_size=30))):
        if part == "user":
            messages.append(ChatMessage.user(f"u{n}"))
        elif part == "assistant":
            messages.append(ChatMessage.assistant(f"a{n}"))
        else:
            messages += _exchange(n, part)
    return messages


def _bookkeeping(m: ChatMessage) -> bool:
    return bool(m.approval_requests or m.approval_responses)


@settings(max_examples=300, deadline=None)
@given(conversations(), st.integers(min_value=1, max_value=12))
def test_the_window_is_the_newest_messages_and_never_starts_inside_a_call(
    messages: list[ChatMessage], target: int
) -> None:
    sent = list(MessageCountingChatReducer(target).reduce(messages))
    if not messages:
        assert sent == []
        return
    assert sent[-1] is messages[-1]  # the newest is always sent
    tail = sent[1:] if sent[0].role == "system" and len(sent) < len(messages) else sent
    assert tail == messages[len(messages) - len(tail) :]  # the newest, in order
    if len(sent) < len(messages) and messages[0].role == "system":
        assert sent[0] is messages[0]
    # every result sent has its call sent (a model's API refuses an orphan result)
    calls = {c.call_id for m in sent for c in m.function_calls}
    assert {r.call_id for m in sent for r in m.function_results} <= calls
    first = tail[0]
    assert (not first.function_results and not _bookkeeping(first)) or tail == messages
    counted = [m for m in tail if not _bookkeeping(m)]
    available = [m for m in messages if not _bookkeeping(m)]
    assert len(counted) >= min(target, len(available) - (messages[0].role == "system"))
    if len(counted) > target:  # more only to keep a call with its results
        assert first.function_calls or tail == messages


def test_a_short_conversation_is_sent_as_it_is() -> None:
    messages = [ChatMessage.user("hi"), ChatMessage.assistant("hello")]
    assert MessageCountingChatReducer(5).reduce(messages) is messages


@pytest.mark.parametrize("bad", [0, -1, 2.5, "10", True, None])
def test_a_target_that_is_not_a_count_is_refused(bad: object) -> None:
    with pytest.raises(DefinitionError, match="target_count must be a whole number"):
        MessageCountingChatReducer(bad)  # type: ignore[arg-type]


def test_an_agent_refuses_a_reducer_without_reduce_and_a_handoff_keeps_it() -> None:
    client = ScriptedChatClient([])
    with pytest.raises(DefinitionError, match="has no reduce"):
        Agent("a", "", client, chat_reducer=len)  # type: ignore[arg-type]
    reducer = MessageCountingChatReducer(4)
    triage = Agent("triage", "", client, chat_reducer=reducer)
    other = Agent("other", "", client)
    workflow = HandoffBuilder(name="h", participants=[triage, other]).build()
    hosted = {e.id: e for e in workflow.executors if hasattr(e, "agent")}
    assert hosted["triage"].agent.chat_reducer is reducer
