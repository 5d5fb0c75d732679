"""The superstep runner: delivery, state, requests, responses, failures, limits, cancel."""

from __future__ import annotations

from typing import Any, Never

import anyio
import pytest
from pydantic import BaseModel

from workflow_engine import (
    Checkpoint,
    CheckpointStoreError,
    Executor,
    ExecutorFailedEvent,
    ExternalResponse,
    InMemoryCheckpointStore,
    MessageNotHandledError,
    RequestAlreadyAnsweredError,
    RequestCancelledError,
    RequestInfoEvent,
    RequestPort,
    ResponseTypeError,
    RunNotResumableError,
    SignatureMismatchError,
    UndeclaredOutputError,
    UnknownRequestError,
    UnknownTargetError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowFailedEvent,
    WorkflowOutputEvent,
    WorkflowRunState,
    executor,
    handler,
    response_handler,
)

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


class Approval(BaseModel):
    approved: bool
    note: str = ""


class Increment(Executor):
    @handler
    async def inc(self, n: int, ctx: WorkflowContext[int, int]) -> None:
        if n >= 5:
            await ctx.yield_output(n)
        else:
            await ctx.send_message(n + 1)


@executor(id="echo")
async def echo(n: int, ctx: WorkflowContext[Never, int]) -> None:
    await ctx.yield_output(n)


def loop_workflow():
    inc = Increment("inc")
    return WorkflowBuilder(name="loop", start=inc).add_edge(inc, inc).build()


async def test_self_loop_runs_one_superstep_per_message() -> None:
    result = await loop_workflow().run(0)
    assert result.status is WorkflowRunState.IDLE
    assert result.outputs == [5]
    assert result.checkpoint is not None and result.checkpoint.superstep == 6
    kinds = [e.type for e in result.events]
    assert kinds[:2] == ["workflow_started", "workflow_status"]
    assert kinds.count("superstep_started") == 6


async def test_max_supersteps_stops_with_a_status_and_continuing_finishes() -> None:
    wf = loop_workflow()
    first = await wf.run(0, max_supersteps=2)
    assert first.status is WorkflowRunState.MAX_SUPERSTEPS_REACHED
    assert first.events[-1].state is WorkflowRunState.MAX_SUPERSTEPS_REACHED
    # the limit counts per continuation
    second = await wf.run(checkpoint=first.checkpoint, max_supersteps=2)
    assert second.status is WorkflowRunState.MAX_SUPERSTEPS_REACHED
    third = await wf.run(checkpoint=second.checkpoint)
    assert third.outputs == [5]


class Counter(Executor):
    """Counts in its own state and in shared state; outputs the tally it saw."""

    @handler
    async def tick(self, n: int, ctx: WorkflowContext[int, list]) -> None:
        mine = await ctx.get_state("seen", [])
        mine.append(n)
        await ctx.set_state("seen", mine)
        shared_before = await ctx.get_shared("total", 0)
        await ctx.set_shared("total", shared_before + n)
        if n < 3:
            await ctx.send_message(n + 1)
        else:
            await ctx.yield_output([mine, await ctx.get_shared("total")])


async def test_executor_and_shared_state_persist_across_supersteps() -> None:
    c = Counter("c")
    wf = WorkflowBuilder(start=c).add_edge(c, c).build()
    result = await wf.run(0)
    assert result.outputs == [[[0, 1, 2, 3], 6]]
    assert result.checkpoint.executor_states == {"c": {"seen": [0, 1, 2, 3]}}
    assert result.checkpoint.shared_state == {"total": 6}


class SharedWriter(Executor):
    @handler
    async def write(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.set_shared("k", f"{self.id}:{n}")
        await ctx.send_message(n)


class SharedReader(Executor):
    @handler
    async def read(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(await ctx.get_shared("k", "unset"))


async def test_shared_writes_are_visible_after_the_barrier_last_in_graph_order_wins() -> None:
    start = Increment("start")
    a, b = SharedWriter("a"), SharedWriter("b")
    r1, r2 = SharedReader("r1"), SharedReader("r2")
    wf = (
        WorkflowBuilder(start=start)
        .add_fan_out_edges(start, [a, b])
        .add_edge(a, r1)
        .add_edge(b, r2)
        .build()
    )
    result = await wf.run(5)  # start yields 5 and sends nothing...
    assert result.outputs == [5]
    result = await wf.run(1)  # ...start sends 2 to a and b; readers see b's write
    assert result.outputs == ["b:2", "b:2"]


class Asker(Executor):
    """Uses ctx.request_info and gets the answer in a @response_handler."""

    @handler
    async def ask(self, question: str, ctx: WorkflowContext) -> None:
        await ctx.request_info(question, Approval)

    @response_handler
    async def answered(
        self, question: str, answer: Approval, ctx: WorkflowContext[Never, str]
    ) -> None:
        verdict = "yes" if answer.approved else "no"
        await ctx.yield_output(f"{question} -> {verdict} {answer.note}".strip())


def asker_workflow():
    return WorkflowBuilder(name="asker", start=Asker("asker")).build()


async def test_request_info_pauses_and_a_response_reaches_the_response_handler() -> None:
    wf = asker_workflow()
    paused = await wf.run("deploy?")
    assert paused.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    (request,) = paused.pending_requests
    (event,) = paused.get_request_info_events()
    assert event.request_id == request.request_id and event.data == "deploy?"
    # the checkpoint goes through JSON text; answers may be dicts (JSON clients)
    cp = Checkpoint.from_json(paused.checkpoint.to_json())
    done = await asker_workflow().run(
        checkpoint=cp, responses=[ExternalResponse(request.request_id, {"approved": True})]
    )
    assert done.status is WorkflowRunState.IDLE
    assert done.outputs == ["deploy? -> yes"]


async def test_response_errors_are_specific_and_change_nothing() -> None:
    wf = asker_workflow()
    paused = await wf.run("q")
    (request,) = paused.pending_requests
    rid = request.request_id
    with pytest.raises(UnknownRequestError, match=f"run '{paused.run_id}' has no request 'nope'"):
        await wf.run(checkpoint=paused.checkpoint, responses={"nope": True})
    with pytest.raises(ResponseTypeError, match="expected Approval: approved") as info:
        await wf.run(checkpoint=paused.checkpoint, responses={rid: {"approved": "maybe"}})
    assert __name__ not in str(info.value)  # a stable name, never a module path
    assert request.to_dict()["response_type"] == "Approval"
    # nothing changed: the original checkpoint still answers fine
    done = await wf.run(checkpoint=paused.checkpoint, responses={rid: Approval(approved=False)})
    assert done.outputs == ["q -> no"]
    # repeating the same answer is a no-op; a different one is a conflict
    again = await wf.run(checkpoint=done.checkpoint, responses={rid: {"approved": False}})
    assert again.outputs == [] and again.status is WorkflowRunState.IDLE
    with pytest.raises(RequestAlreadyAnsweredError, match=rid):
        await wf.run(checkpoint=done.checkpoint, responses={rid: {"approved": True}})


async def test_bool_response_is_strict() -> None:
    port = RequestPort("confirm", request_type=str, response_type=bool)
    start = _StrToPort("start")
    wf = WorkflowBuilder(start=start).add_edge(start, port).add_edge(port, _BoolSink("b")).build()
    paused = await wf.run("go?")
    rid = paused.pending_requests[0].request_id
    with pytest.raises(ResponseTypeError):
        await wf.run(checkpoint=paused.checkpoint, responses={rid: "yes"})
    done = await wf.run(checkpoint=paused.checkpoint, responses={rid: True})
    assert done.outputs == [True]


class _StrToPort(Executor):
    @handler
    async def go(self, s: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(s)


class _BoolSink(Executor):
    @handler
    async def take(self, b: bool, ctx: WorkflowContext[Never, bool]) -> None:
        await ctx.yield_output(b)


async def test_request_info_event_comes_after_the_checkpoint_is_saved() -> None:
    order: list[str] = []

    class RecordingStore(InMemoryCheckpointStore):
        async def save(self, checkpoint: Checkpoint) -> None:
            order.append(f"save:{len(checkpoint.pending_requests)}")
            await super().save(checkpoint)

    stream = asker_workflow().run_stream("q", checkpoint_store=RecordingStore())
    async for event in stream:
        if isinstance(event, RequestInfoEvent):
            order.append("request_info")
    assert order == ["save:0", "save:1", "request_info"]


class Boom(Executor):
    @handler
    async def explode(self, n: int, ctx: WorkflowContext[int]) -> None:
        if n == 2:
            raise RuntimeError("kaboom")
        await ctx.send_message(n + 1)


async def test_handler_exception_fails_the_run_and_keeps_the_last_checkpoint() -> None:
    b = Boom("boom")
    wf = WorkflowBuilder(start=b).add_edge(b, b).build()
    store = InMemoryCheckpointStore()
    result = await wf.run(0, checkpoint_store=store)
    assert result.status is WorkflowRunState.FAILED
    failed = [e for e in result.events if isinstance(e, ExecutorFailedEvent)]
    assert failed[0].executor_id == "boom" and "kaboom" in failed[0].error.message
    assert any(isinstance(e, WorkflowFailedEvent) for e in result.events)
    latest = await store.latest(result.run_id)
    assert latest.superstep == 2 and latest.status is WorkflowRunState.IN_PROGRESS
    assert [m.data for m in latest.messages] == [2]  # a retry starts from here


async def test_a_failed_run_says_where_its_error_was_raised() -> None:
    """The error said ``RuntimeError: kaboom`` and no more: a run that failed in a worker
    named no line to look at (outside tester 149). Its details carry the traceback, down to
    the handler's line; the record a store keeps has it too."""
    b = Boom("boom")
    result = await WorkflowBuilder(start=b).add_edge(b, b).build().run(0)
    assert result.error is not None and result.error.traceback is not None
    assert 'raise RuntimeError("kaboom")' in result.error.traceback
    assert "in explode" in result.error.traceback
    assert result.error.traceback.rstrip().endswith("RuntimeError: kaboom")
    assert result.error.as_record()["traceback"] == result.error.traceback.rstrip("\n")


class AsksFour(Executor):
    @handler
    async def ask(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        for i in range(4):
            await ctx.request_info(f"q{i}", int)

    @response_handler
    async def answered(self, question: str, answer: int, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(f"{question}={answer}")


async def test_answers_given_at_once_are_applied_in_the_order_the_requests_were_made() -> None:
    """In memory, answers went to their handlers in the order of the dict's keys -- the same
    answers, another outcome -- where a durable run applies them in request order (outside
    tester 149)."""
    wf = WorkflowBuilder(start=AsksFour("asks")).build()
    paused = await wf.run(0)
    ids = [r.request_id for r in paused.pending_requests]
    shuffled = {ids[i]: i for i in (3, 1, 0, 2)}
    done = await wf.run(checkpoint=paused.checkpoint, responses=shuffled)
    assert done.outputs == ["q0=0", "q1=1", "q2=2", "q3=3"]


class AsksSpeltOtherwise(Executor):
    @handler
    async def ask(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.request_info("which?", int | str)  # (the handler says ``str | int``)

    @response_handler
    async def answered(
        self, question: str, answer: str | int, ctx: WorkflowContext[Never, str]
    ) -> None:
        await ctx.yield_output(f"{question} {answer!r}")


class AsksWhatNoHandlerTakes(Executor):
    @handler
    async def ask(self, n: int, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.request_info("ok?", bool)

    @response_handler
    async def answered(self, question: str, answer: int, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output("never")


async def test_request_info_takes_an_answer_type_spelt_otherwise_and_refuses_one_never_taken() -> (
    None
):
    """``int | str`` asked where the handler declares ``str | int`` failed the run as declared
    nowhere; a question no @response_handler of the executor could take was asked, and its
    answer failed the run -- for good (outside tester 151). The first is asked and answered
    (in a new process too: its stored type reads back); the second fails before anyone is
    asked, naming what no handler takes."""
    from workflow_engine import Checkpoint

    workflow = WorkflowBuilder(start=AsksSpeltOtherwise("asks")).build()
    paused = await workflow.run(0)
    (request,) = paused.pending_requests
    again = WorkflowBuilder(start=AsksSpeltOtherwise("asks")).build()
    restored = Checkpoint.from_json(paused.checkpoint.to_json())
    done = await again.run(checkpoint=restored, responses={request.request_id: 3})
    assert done.outputs == ["which? 3"]
    failed = await WorkflowBuilder(start=AsksWhatNoHandlerTakes("asks")).build().run(0)
    assert failed.status is WorkflowRunState.FAILED and failed.error is not None
    assert not failed.pending_requests
    assert "no @response_handler of it takes a request of str answered with bool" in (
        failed.error.message
    )


async def test_undeclared_output_and_unknown_target_fail_the_run_with_clear_errors() -> None:
    class Liar(Executor):
        @handler
        async def lie(self, n: int, ctx: WorkflowContext[int]) -> None:
            await ctx.send_message("not an int")

    class Misdirect(Executor):
        @handler
        async def go(self, n: int, ctx: WorkflowContext[int]) -> None:
            await ctx.send_message(n, target_id="nowhere")

    for cls, error in ((Liar, UndeclaredOutputError), (Misdirect, UnknownTargetError)):
        node = cls("x")
        wf = WorkflowBuilder(start=node).add_edge(node, echo).build()
        result = await wf.run(1)
        assert result.status is WorkflowRunState.FAILED
        assert result.error is not None and result.error.error_type == error.__name__


class Passer(Executor):
    @handler
    async def go(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)


async def test_a_failing_edge_condition_names_the_edge_and_the_executor() -> None:
    """It failed the run with the condition's bare ``ZeroDivisionError`` and no executor
    (outside tester)."""
    node = Passer("p")
    wf = WorkflowBuilder(start=node).add_edge(node, echo, condition=lambda n: 1 / 0).build()
    result = await wf.run(1)
    assert result.status is WorkflowRunState.FAILED and result.error is not None
    assert result.error.error_type == "EdgeConditionError"
    assert result.error.code == "edge_condition_failed" and result.error.executor_id == "p"
    assert result.error.message == (
        "the condition of the edge 'p' → 'echo' raised ZeroDivisionError: division by zero"
    )
    choose = lambda n, targets: [][0]  # noqa: E731
    wf = WorkflowBuilder(start=node).add_fan_out_edges(node, [echo], choose).build()
    failed = await wf.run(1)
    assert failed.error is not None and failed.error.executor_id == "p"
    assert "the selection of the fan-out 'p' → 'echo' raised IndexError" in failed.error.message


@pytest.mark.parametrize(
    ("picked", "said"),
    [
        (["Echo"], "picked 'Echo', which is not one of its targets"),
        (["echo", "nope", 5], "picked 'nope', 5, which are not of its targets"),
        (None, "returned None: it returns a list of the ids of the targets"),
        ("echo", "returned 'echo': it returns a list"),
    ],
)
async def test_a_fan_out_selection_that_picks_no_target_of_it_fails_naming_it(
    picked: Any, said: str
) -> None:
    """A typo in a selection's target id dropped the message without a word (the run idle, no
    output, no error); ``None`` was a bare TypeError naming no edge; a string picked every
    target whose id is part of it (outside tester 149). A list of some targets -- or none --
    is the selection."""
    node = Passer("p")
    wf = WorkflowBuilder(start=node).add_fan_out_edges(node, [echo], lambda n, t: picked).build()
    failed = await wf.run(1)
    assert failed.status is WorkflowRunState.FAILED and failed.error is not None
    assert failed.error.error_type == "EdgeConditionError" and failed.error.executor_id == "p"
    assert "the selection of the fan-out 'p' → 'echo' " + said in failed.error.message
    for fine, outputs in (([], []), (("echo",), [1])):
        wf = WorkflowBuilder(start=node).add_fan_out_edges(node, [echo], lambda n, t, f=fine: f)
        assert (await wf.build().run(1)).outputs == outputs


async def test_of_concurrent_failures_the_first_in_graph_order_is_the_runs_error() -> None:
    """Siblings of a superstep that both fail: whichever finished failing first, the run's
    error is the one earlier in graph order (deterministic across runs and replays)."""

    class Failing(Executor):
        def __init__(self, id: str, delay: float) -> None:
            super().__init__(id)
            self.delay = delay

        @handler
        async def go(self, n: int, ctx: WorkflowContext[Never]) -> None:
            await anyio.sleep(self.delay)
            raise RuntimeError(f"{self.id} failed")

    for delays in ((0.0, 0.05), (0.05, 0.0)):
        start = Passer("p")
        first, second = Failing("first", delays[0]), Failing("second", delays[1])
        wf = WorkflowBuilder(start=start).add_fan_out_edges(start, [first, second]).build()
        result = await wf.run(1)
        assert result.status is WorkflowRunState.FAILED and result.error is not None
        assert result.error.executor_id == "first", (delays, result.error)


async def test_a_message_no_successor_takes_names_the_executor_that_sent_it() -> None:
    class Mixed(Executor):
        @handler
        async def go(self, n: int, ctx: WorkflowContext[int | str]) -> None:
            await ctx.send_message("text")

    node = Mixed("m")
    result = await WorkflowBuilder(start=node).add_edge(node, echo).build().run(1)
    assert result.error is not None and result.error.error_type == "MessageNotHandledError"
    assert result.error.executor_id == "m"


async def test_an_answer_no_successor_of_its_port_takes_is_refused_before_it_is_stored() -> None:
    """A port answering ``int | str`` into a handler of ``int`` only: "x" was accepted, then the
    run failed when it went on (and stayed in progress in a durable store)."""
    port = RequestPort("ask", request_type=int, response_type=int | str)
    wf = WorkflowBuilder(start=Passer("p")).add_edge("p", port).add_edge(port, echo).build()
    paused = await wf.run(1)
    (request,) = paused.pending_requests
    with pytest.raises(ResponseTypeError, match="port 'ask' sends its answers to 'echo'.*str"):
        await wf.run(checkpoint=paused.checkpoint, responses={request.request_id: "x"})
    done = await wf.run(checkpoint=paused.checkpoint, responses={request.request_id: 5})
    assert done.status is WorkflowRunState.IDLE and done.outputs == [5]


class Secret(BaseModel):
    code: int


@executor(id="echo_secret")
async def echo_secret(secret: Secret, ctx: WorkflowContext[Never, Secret]) -> None:
    await ctx.yield_output(secret)


class AsksForSecret(Executor):
    @handler
    async def ask(self, m: str, ctx: WorkflowContext[Never, Any]) -> None:
        await ctx.request_info(m, Secret)

    @response_handler
    async def got(self, q: str, answer: Any, ctx: WorkflowContext[Never, Any]) -> None:
        await ctx.yield_output(answer)


async def test_request_info_refuses_an_answer_type_the_workflow_cannot_read_back() -> None:
    """It asked a person, then refused every answer as if the checkpoint were corrupt or the
    graph had changed (outside tester). Registered, the type is fine."""
    failed = await WorkflowBuilder(start=AsksForSecret("a")).build().run("x")
    assert failed.status is WorkflowRunState.FAILED and failed.pending_requests == []
    assert failed.error is not None and failed.error.error_type == "UnregisteredTypeError"
    assert failed.error.executor_id == "a" and "register_types" in failed.error.message
    wf = WorkflowBuilder(start=AsksForSecret("a")).register_types(Secret).build()
    paused = await wf.run("x")
    (request,) = paused.pending_requests
    done = await wf.run(checkpoint=paused.checkpoint, responses={request.request_id: {"code": 1}})
    assert done.outputs == [Secret(code=1)]


async def test_a_model_that_does_not_validate_is_refused_as_the_senders_not_as_corrupt() -> None:
    """A model built with ``model_construct`` from a wrong value was reported as corrupt stored
    data (``CorruptValueError``); it is the value given that cannot be stored."""

    class Sends(Executor):
        @handler
        async def go(self, m: str, ctx: WorkflowContext[Secret]) -> None:
            await ctx.send_message(Secret.model_construct(code="not an int"))

    result = await WorkflowBuilder(start=Sends("s")).add_edge("s", echo_secret).build().run("x")
    assert result.error is not None and result.error.error_type == "SerializationError"
    assert result.error.message.startswith("cannot store value: it would not read back")
    assert "model_construct" in result.error.message and result.error.executor_id == "s"


class AsksForMaybeSecret(Executor):
    @handler
    async def ask(self, m: str, ctx: WorkflowContext[Never, Any]) -> None:
        await ctx.request_info(m, Secret | None)

    @response_handler
    async def got(self, q: str, answer: Any, ctx: WorkflowContext[Never, Any]) -> None: ...


async def test_an_unreadable_answer_type_that_is_not_a_class_gets_advice_that_works() -> None:
    """For ``Optional[Model]`` the error advised ``register_types``, which then refused the
    type with "issubclass() arg 1 must be a class" (outside tester)."""
    from workflow_engine import UsageError

    failed = await WorkflowBuilder(start=AsksForMaybeSecret("a")).build().run("x")
    assert failed.error is not None
    assert "annotate the answer parameter of a @response_handler with this type" in (
        failed.error.message
    )
    with pytest.raises(UsageError, match="register_types takes classes, not .*Secret | None"):
        WorkflowBuilder(start=AsksForMaybeSecret("a")).register_types(Secret | None)  # type: ignore[arg-type]


class Note(BaseModel):
    lines: list[str]


@executor(id="scribble")
async def scribble(note: Note, ctx: WorkflowContext[Never, Note]) -> None:
    note.lines.append("mine")  # (a handler that changes what it was given)
    await ctx.yield_output(note)


async def test_each_execution_of_an_admitted_run_gets_its_own_copy_of_the_start_message() -> None:
    # the admission decodes its message once (to prove it readable) and hands that copy to the
    # run's first execution: a second one from the same checkpoint (a retry after a crash)
    # must not get the copy the first changed, and the caller's object is never handed out
    workflow = WorkflowBuilder(name="scribble", start=scribble).build()
    given = Note(lines=["a"])
    checkpoint = workflow.admit(given)
    first = await workflow.run(checkpoint=checkpoint)
    again = await workflow.run(checkpoint=checkpoint)
    assert first.outputs == [Note(lines=["a", "mine"])] == again.outputs
    assert given == Note(lines=["a"])


async def test_start_message_of_the_wrong_type_is_refused_before_admission() -> None:
    store = InMemoryCheckpointStore()
    with pytest.raises(MessageNotHandledError, match="start executor 'inc' cannot take str"):
        await loop_workflow().run("text", checkpoint_store=store, run_id="r1")
    assert await store.latest("r1") is None


async def test_failing_store_fails_loudly() -> None:
    class BrokenStore(InMemoryCheckpointStore):
        async def save(self, checkpoint: Checkpoint) -> None:
            if checkpoint.superstep == 2:
                raise OSError("disk full")
            await super().save(checkpoint)

    with pytest.raises(CheckpointStoreError, match="superstep 2 failed: disk full"):
        await loop_workflow().run(0, checkpoint_store=BrokenStore())


async def test_restoring_on_a_different_graph_is_refused_naming_both_signatures() -> None:
    result = await loop_workflow().run(0, max_supersteps=1)
    inc = Increment("inc")
    other = WorkflowBuilder(name="loop", start=inc).add_edge(inc, inc).add_edge(inc, echo).build()
    with pytest.raises(SignatureMismatchError) as info:
        await other.run(checkpoint=result.checkpoint)
    assert result.checkpoint.workflow_signature in str(info.value)
    assert other.signature in str(info.value)


class Slow(Executor):
    @handler
    async def wait(self, n: int, ctx: WorkflowContext[int]) -> None:
        await anyio.sleep(10)


async def test_cancel_ends_the_stream_cancelled_and_cancels_pending_requests() -> None:
    slow = Slow("slow")
    wf = WorkflowBuilder(start=slow).add_edge(slow, slow).build()
    store = InMemoryCheckpointStore()
    stream = wf.run_stream(1, checkpoint_store=store)
    with anyio.fail_after(5):
        async for event in stream:
            if event.type == "executor_invoked":
                stream.cancel()
    assert stream.result.status is WorkflowRunState.CANCELLED
    latest = await store.latest(stream.result.run_id)
    assert latest.status is WorkflowRunState.CANCELLED and latest.messages == []
    with pytest.raises(RunNotResumableError):
        await wf.run(checkpoint=latest)

    paused = await asker_workflow().run("q")
    rid = paused.pending_requests[0].request_id
    cancelled = await asker_workflow().cancel(checkpoint=paused.checkpoint)
    assert cancelled.status is WorkflowRunState.CANCELLED
    assert cancelled.cancelled_requests == [rid] and cancelled.pending_requests == {}
    with pytest.raises((RequestCancelledError, RunNotResumableError)):
        await asker_workflow().run(checkpoint=cancelled, responses={rid: {"approved": True}})


async def test_one_workflow_serves_many_concurrent_runs() -> None:
    wf = loop_workflow()
    results: dict[int, list[int]] = {}

    async def one(start: int) -> None:
        results[start] = (await wf.run(start)).outputs

    async with anyio.create_task_group() as tg:
        for start in range(5):
            tg.start_soon(one, start)
    assert results == {i: [5] for i in range(5)}


async def test_stream_yields_outputs_live() -> None:
    seen = []
    async for event in loop_workflow().run_stream(3):
        if isinstance(event, WorkflowOutputEvent):
            seen.append((event.data, event.source_executor_id))
    assert seen == [(5, "inc")]


async def test_events_are_json_serializable() -> None:
    import json

    wf = asker_workflow()
    result = await wf.run("q")
    text = json.dumps([e.to_dict(wf.codec) for e in result.events])
    assert '"type": "request_info"' in text


# A checkpoint written by schema version 1 (every answer kept whole), after "q" was answered
# with Approval(approved=False) and the run finished.
_V1_DONE = (
    '{"schema_version": 1, "codec": "tagged-json/1", "checkpoint_id": '
    '"a316e3f16b25074584abc68a97663a76", "parent_id": "33160f8a88b30601b8a680ef719989d1", '
    '"run_id": "b324323fdc884daab3f13d37d6b4b0ce", "workflow_name": "asker", '
    '"workflow_signature": "e2d2cc33df01a6a1", "superstep": 2, "status": "idle", '
    '"created_at": 1796069778.5371428, "step_secret": "7f30062073cc9ee199f4b5727813759e", '
    '"messages": [], "executor_states": {}, "shared_state": {}, "fan_in_buffers": {}, '
    '"pending_requests": {}, "answered_requests": {"797b4a42a9956396608316903f37fbc4": '
    '{"data": {"$type": "Approval", "data": {"approved": false, "note": ""}}, '
    '"response_type": "Approval", "request": {"port_id": "asker", "data": "q", '
    '"source_executor_id": "asker", "superstep": 1}}}, "cancelled_requests": [], '
    '"outputs": ["q -> no"], "changes": {"executor_state_keys": {}, '
    '"executor_state_appends": {}, "shared_state_keys": [], "outputs_added": 1, '
    '"requests_added": [], "requests_answered": [], "requests_cancelled": []}}'
)


async def test_a_version_1_checkpoint_still_refuses_a_changed_answer() -> None:
    cp = Checkpoint.from_json(_V1_DONE)
    rid = "797b4a42a9956396608316903f37fbc4"
    assert cp.schema_version == 1 and cp.answered_ids() == [rid]
    wf = asker_workflow()
    again = await wf.run(checkpoint=cp, responses={rid: {"approved": False}})
    assert again.outputs == [] and again.status is WorkflowRunState.IDLE
    with pytest.raises(RequestAlreadyAnsweredError, match=rid):
        await wf.run(checkpoint=cp, responses={rid: {"approved": True}})


async def test_an_answer_applied_long_ago_is_a_digest_and_still_exact() -> None:
    """Only answers just applied (or in flight) stay whole in a checkpoint; older ones are
    digests -- yet a repeat is still a no-op and a different answer still refused."""
    wf = asker_workflow()
    store = InMemoryCheckpointStore()
    paused = await wf.run("q", checkpoint_store=store)
    rid = paused.pending_requests[0].request_id
    done = await wf.run(
        checkpoint=paused.checkpoint, responses={rid: {"approved": True}}, checkpoint_store=store
    )
    assert done.outputs == ["q -> yes"]
    applied = [c for c in await store.list(paused.run_id) if rid in c.answered_requests]
    assert len(applied) == 1  # whole only in the checkpoint that applied it
    final = done.checkpoint
    assert final.answered_requests == {} and list(final.answered_digests) == [rid]
    again = await wf.run(checkpoint=final, responses={rid: Approval(approved=True)})
    assert again.outputs == []
    with pytest.raises(RequestAlreadyAnsweredError, match=rid):
        await wf.run(checkpoint=final, responses={rid: {"approved": True, "note": "x"}})
    with pytest.raises(RequestAlreadyAnsweredError, match=rid):
        await wf.run(checkpoint=final, responses={rid: {"approved": "maybe"}})


class Asks(BaseModel):
    items: list[str]


class AskOnce(Executor):
    @handler
    async def go(self, message: str, ctx: WorkflowContext[Never, list[str]]) -> None:
        await ctx.request_info(Asks(items=["refund 10 EUR"]), Approval)

    @response_handler
    async def done(self, asked: Asks, answer: Approval, ctx: WorkflowContext[Never, Any]) -> None:
        await ctx.yield_output(asked.items)


@pytest.mark.parametrize("stored", [False, True])
async def test_a_stream_consumer_changing_a_request_changes_what_it_was_shown_only(
    stored: bool,
) -> None:
    """A page decorating the request it shows, in place: the run, stored or not, asked the
    question as it was when its superstep ended (outside tester 185: without a store, the
    change became the checkpoint's, and the response handler got it)."""
    wf = WorkflowBuilder("asks", start=AskOnce("a")).build()
    stream = wf.run_stream("x", checkpoint_store=InMemoryCheckpointStore() if stored else None)
    async for event in stream:
        if isinstance(event, RequestInfoEvent):
            event.request.data.items.append("(rendered)")
    paused = stream.result
    assert paused.checkpoint is not None
    answer = {paused.pending_requests[0].request_id: {"approved": True}}
    for checkpoint in (paused.checkpoint, Checkpoint.from_json(paused.checkpoint.to_json())):
        done = await wf.run(checkpoint=checkpoint, responses=answer)
        assert done.outputs == [["refund 10 EUR"]]


class Edits(BaseModel):
    items: list[str]


class EditsTwice(Executor):
    @handler
    async def go(self, message: str, ctx: WorkflowContext[Never, list[str]]) -> None:
        await ctx.request_info(Asks(items=["which?"]), Edits)

    @response_handler
    async def done(self, asked: Asks, answer: Edits, ctx: WorkflowContext[Never, Any]) -> None:
        await ctx.yield_output(list(answer.items))
        answer.items.append("added by the handler")


async def test_a_response_handler_gets_a_copy_of_the_answer_not_the_callers_object() -> None:
    """Without a store the handler got the caller's own object: a handler changing it changed
    the caller's, and a retry of the same checkpoint sent the changed answer (outside tester
    185). Every message is a copy; an answer is too."""
    wf = WorkflowBuilder("edits", start=EditsTwice("e")).build()
    paused = await wf.run("x")
    mine = Edits(items=["a"])
    answer = {paused.pending_requests[0].request_id: mine}
    first = await wf.run(checkpoint=paused.checkpoint, responses=answer)
    again = await wf.run(checkpoint=paused.checkpoint, responses=answer)
    assert mine.items == ["a"]
    assert first.outputs == again.outputs == [["a"]]
