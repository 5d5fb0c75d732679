"""Handoff orchestration: the support demo's paths, declared routes only, turn limits."""

from __future__ import annotations

import pytest

from workflow_engine import UsageError, Workflow, WorkflowRunResult, WorkflowRunState
from workflow_engine.executors import (
    Agent,
    ChatMessage,
    HandoffBuilder,
    HandoffOutcome,
    HandoffUserInputRequest,
    Rule,
    ScriptedChatClient,
    ToolApprovalRequestContent,
    ToolCall,
)
from workflow_engine_cli.demos.support_handoff import build_support_workflow

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


async def drive(
    wf: Workflow, message: str, *, approve: bool = True, replies: list[str] = ()
) -> tuple[WorkflowRunResult, list[str]]:
    """Run to the end, answering approvals with ``approve`` and user prompts with ``replies``."""
    replies = list(replies)
    asked: list[str] = []
    result = await wf.run(message)
    while result.pending_requests:
        (request,) = result.pending_requests
        if isinstance(request.data, ToolApprovalRequestContent):
            asked.append(request.data.function_call.name)
            answer = {"approved": approve}
        else:
            assert isinstance(request.data, HandoffUserInputRequest)
            asked.append(f"input:{request.data.agent}")
            answer = {"message": replies.pop(0)} if replies else {"end": True}
        result = await wf.run(checkpoint=result.checkpoint, responses={request.request_id: answer})
    return result, asked


def speakers(outcome: HandoffOutcome) -> list[str]:
    return [m.author_name for m in outcome.conversation if m.role == "assistant" and m.text]


async def test_refund_path() -> None:
    result, asked = await drive(build_support_workflow(), "I want a refund for order 12345")
    (outcome,) = result.outputs
    assert result.status is WorkflowRunState.IDLE and outcome.status == "completed"
    assert asked == ["submit_refund"]
    assert outcome.text == "Refund of 89.99 for order 12345 submitted. case complete."
    assert speakers(outcome)[0] == "triage_agent" and outcome.last_agent == "refund_agent"


async def test_replacement_path_asks_for_the_order_number() -> None:
    result, asked = await drive(
        build_support_workflow(), "My lamp arrived broken", replies=["It's order 24680"]
    )
    (outcome,) = result.outputs
    assert asked == ["input:order_agent", "submit_replacement"]
    assert outcome.text == "Replacement desk lamp for order 24680 is on its way. case complete."


async def test_both_goes_refund_then_order() -> None:
    result, asked = await drive(
        build_support_workflow(), "Order 67890: I want both a refund and a replacement"
    )
    assert asked == ["submit_refund", "submit_replacement"]
    assert result.outputs[0].last_agent == "order_agent"


async def test_rejection_keeps_the_conversation_open_and_user_can_end_it() -> None:
    result, asked = await drive(
        build_support_workflow(), "refund order 12345 please", approve=False, replies=[]
    )
    (outcome,) = result.outputs
    assert asked == ["submit_refund", "input:refund_agent"]
    assert outcome.status == "ended_by_user"
    assert outcome.text.startswith("Okay, I did not submit the refund.")


async def test_anything_else_gets_a_polite_answer_and_a_prompt() -> None:
    result, asked = await drive(
        build_support_workflow(), "What's the weather like?", replies=["thanks"]
    )
    (outcome,) = result.outputs
    assert asked == ["input:triage_agent"]
    assert outcome.status == "completed" and outcome.text == "Glad I could help. case complete."


def looping_agents() -> list[Agent]:
    ping = Agent(
        "ping",
        client=ScriptedChatClient([Rule(calls=[ToolCall("handoff_to_pong")])]),
    )
    pong = Agent(
        "pong",
        client=ScriptedChatClient(
            [Rule(calls=[ToolCall("handoff_to_ping"), ToolCall("handoff_to_nobody")])]
        ),
    )
    return [ping, pong]


async def test_turn_limit_ends_with_a_clear_status() -> None:
    ping, pong = looping_agents()
    wf = (
        HandoffBuilder("loop", [ping, pong], turn_limit=5)
        .add_handoff(ping, [pong])
        .add_handoff(pong, [ping])
        .build()
    )
    result = await wf.run("go")
    (outcome,) = result.outputs
    assert outcome.status == "turn_limit_reached" and outcome.turns == 5
    # an undeclared target is not a tool for that agent: the model sees an error result
    errors = [r.error for m in outcome.conversation for r in m.function_results if r.error]
    assert errors and "no tool named 'handoff_to_nobody'" in errors[0]


def test_builder_refuses_bad_routes() -> None:
    ping, pong = looping_agents()
    builder = HandoffBuilder("x", [ping, pong])
    with pytest.raises(ValueError, match="'ghost' is not a participant"):
        builder.add_handoff(ping, ["ghost"])
    with pytest.raises(ValueError, match="cannot hand off to itself"):
        builder.add_handoff(ping, [ping])
    with pytest.raises(ValueError, match="two participants"):
        builder.add_participant(ping)
    # what is not a list of agents is said so (a str was read letter by letter: tester 167)
    for participants in ("ab", ping, None, [ping, "pong"]):
        with pytest.raises(UsageError, match="participant"):
            HandoffBuilder("x", participants)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not a participant: name an Agent"):
        builder.add_handoff(ping, [3])  # type: ignore[list-item]
    # one target given alone is that target, by name or as the agent
    for one in ("pong", pong):
        routes = HandoffBuilder("x", [ping, pong]).add_handoff(ping, one)._routes  # type: ignore[arg-type]
        assert list(routes["ping"]) == ["pong"]


def test_support_workflow_is_a_normal_visualisable_workflow() -> None:
    wf = build_support_workflow()
    mermaid = wf.to_mermaid()
    for node in ("triage_agent", "refund_agent", "order_agent", "user_input"):
        assert node in mermaid
    assert "n_refund_agent --> n_order_agent" in mermaid
    assert "n_refund_agent --> n_triage_agent" not in mermaid


def test_turn_limits_and_tool_names_are_checked_when_declared() -> None:
    """The builder's own ``turn_limit=`` took 0 and failed on "5" with a raw TypeError; a
    tool named as another, or as a route's handoff tool, silently replaced it (outside tester
    109)."""
    from workflow_engine import DefinitionError, UsageError
    from workflow_engine.executors import tool

    ping, pong = looping_agents()
    for limit in (0, -3, "5", True, 2.5):
        with pytest.raises(UsageError, match=r"turn limit must be a whole number of at least 1"):
            HandoffBuilder("x", [ping, pong], turn_limit=limit)  # type: ignore[arg-type]
        with pytest.raises(UsageError, match=r"turn limit must be a whole number of at least 1"):
            HandoffBuilder("x", [ping, pong]).with_turn_limit(limit)  # type: ignore[arg-type]

    @tool(name="lookup")
    def first(order: str) -> str:
        """Look an order up."""
        return order

    @tool(name="lookup")
    def second(order: str) -> str:
        """Look an order up, otherwise."""
        return order

    client = ScriptedChatClient([])
    with pytest.raises(DefinitionError, match="two tools named 'lookup'"):
        Agent("desk", "You help.", client, [first, second])
    Agent("desk", "You help.", client, [first, first])  # (the same tool twice: one tool)

    @tool(name="handoff_to_pong")
    def own(order: str) -> str:
        """An application's tool that happens to bear a handoff's name."""
        return order

    clashing = Agent("ping", "You ping.", client, [own])
    builder = HandoffBuilder("x", [clashing, pong]).add_handoff(clashing, [pong])
    with pytest.raises(DefinitionError, match="tool of its own named 'handoff_to_pong'"):
        builder.build()


async def test_a_second_handoff_in_one_turn_is_not_run() -> None:
    """Both handoffs of one model turn were told "Handed off", and only one was followed."""
    a = Agent(
        "a",
        "You route.",
        ScriptedChatClient([Rule(calls=[ToolCall("handoff_to_b"), ToolCall("handoff_to_c")])]),
    )
    b = Agent("b", "You are b.", ScriptedChatClient([Rule(reply="b here. case complete.")]))
    c = Agent("c", "You are c.", ScriptedChatClient([Rule(reply="c here. case complete.")]))
    wf = HandoffBuilder("two", [a, b, c]).add_handoff(a, [b, c]).build()
    result = await wf.run("go")
    (outcome,) = result.outputs
    [handoffs] = [m.function_results for m in outcome.conversation if m.function_results]
    assert [(r.name, r.error) for r in handoffs] == [
        ("handoff_to_b", None),
        ("handoff_to_c", "not run: this turn already ends with handoff_to_b (one per turn)"),
    ]
    assert speakers(outcome)[-1] == "b"


async def test_an_agent_runs_on_a_user_s_text_as_well() -> None:
    agent = Agent("echo", "You echo.", ScriptedChatClient([Rule(reply="heard you")]))
    response = await agent.run("hello")
    assert response.messages[-1].text == "heard you"


async def test_an_empty_reply_to_a_new_message_asks_the_user() -> None:
    """A thread that went on after "... case complete.": the model's empty reply to the new
    message left that old reply the newest with words, and the run ended completed, the
    user's message unanswered (outside tester 159). Nothing was said since the user spoke:
    the user is asked, and the question repeats nothing from before."""
    agent = Agent("desk", client=ScriptedChatClient([Rule(reply="")]))
    wf = HandoffBuilder(name="desk", participants=[agent]).with_start_agent(agent).build()
    history = [
        ChatMessage.user("first"),
        ChatMessage.assistant("Done. case complete."),
        ChatMessage.user("second"),
    ]
    result = await wf.run(history)
    assert result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, result.outputs
    (request,) = result.pending_requests
    assert isinstance(request.data, HandoffUserInputRequest) and request.data.message == ""


@pytest.mark.parametrize("ended", ["completed", "ended_by_user"])
async def test_a_new_message_after_the_chat_ended_goes_on_with_the_whole_conversation(
    ended: str,
) -> None:
    """``run(message, checkpoint=...)`` after a handoff chat ended -- a chat's next turn, as
    the README says -- failed the run: the start agent held the conversation, and the
    coordinator started it over (outside tester 187). The chat goes on from the start agent
    with the new message after the whole conversation."""
    wf = build_support_workflow()
    if ended == "completed":
        first, _ = await drive(wf, "I want a refund for order 12345")
    else:
        first, _ = await drive(wf, "What's the weather like?", replies=[])
    (before,) = first.outputs
    assert before.status == ended
    after, asked = await drive_on(wf, first, "What's the weather like?", replies=["thanks"])
    assert after.status is WorkflowRunState.IDLE, after.error
    (outcome,) = after.outputs
    assert asked == ["input:triage_agent"]
    held = [(m.role, m.text) for m in before.conversation]
    assert [(m.role, m.text) for m in outcome.conversation][: len(held)] == held
    users = [m.text for m in outcome.conversation if m.role == "user" and m.text]
    assert users[-2:] == ["What's the weather like?", "thanks"]
    assert outcome.status == "completed"


async def drive_on(
    wf: Workflow, ended: WorkflowRunResult, message: str, *, replies: list[str]
) -> tuple[WorkflowRunResult, list[str]]:
    """``drive``, continuing the checkpoint of ``ended`` with ``message``."""
    replies = list(replies)
    asked: list[str] = []
    result = await wf.run(message, checkpoint=ended.checkpoint)
    while result.pending_requests:
        (request,) = result.pending_requests
        assert isinstance(request.data, HandoffUserInputRequest)
        asked.append(f"input:{request.data.agent}")
        answer = {"message": replies.pop(0)} if replies else {"end": True}
        result = await wf.run(checkpoint=result.checkpoint, responses={request.request_id: answer})
    return result, asked


@pytest.mark.parametrize("waiting_for", ["an approval", "a reply"])
async def test_a_new_message_while_the_chat_waits_is_refused_and_changes_nothing(
    waiting_for: str,
) -> None:
    """Sent while the chat waited for an approval, a new message failed the run for good
    (the approval used up, every resume failing); while it waited for the user's reply, it
    ended the chat and left the question open (outside tester 189). It is refused before
    anything runs; the chat goes on when the question is answered."""
    from workflow_engine import InMemoryCheckpointStore

    wf = build_support_workflow()
    store = InMemoryCheckpointStore()
    said = "I want a refund for order 12345" if waiting_for == "an approval" else "Hello"
    paused = await wf.run(said, checkpoint_store=store)
    (request,) = paused.pending_requests
    before = await store.latest(paused.run_id)
    with pytest.raises(UsageError, match="waits for answers to 1 request"):
        await wf.run("Where is my order?", checkpoint=paused.checkpoint, checkpoint_store=store)
    with pytest.raises(UsageError, match="takes a new message only once they are answered"):
        await wf.run("Where is my order?", checkpoint=paused.checkpoint)
    assert await store.latest(paused.run_id) == before
    answer = {"approved": True} if waiting_for == "an approval" else {"end": True}
    done = await wf.run(
        checkpoint=paused.checkpoint,
        responses={request.request_id: answer},
        checkpoint_store=store,
    )
    assert done.status is WorkflowRunState.IDLE, done.error
    (outcome,) = done.outputs
    assert outcome.status == ("completed" if waiting_for == "an approval" else "ended_by_user")
