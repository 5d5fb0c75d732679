"""The RunStore contract, run against every store (in memory, SQLite, SQLite compacting often)."""

from __future__ import annotations

import time

import anyio
import pytest

from tests.integration.workflows import (
    Answer,
    changed_stepper_workflow,
    failing_with_a_question_workflow,
    following,
    stepper_workflow,
)
from workflow_engine import (
    AnswerOutcome,
    CheckpointNotFoundError,
    CheckpointNotLatestError,
    Executor,
    LeaseLostError,
    RequestAlreadyAnsweredError,
    RequestCancelledError,
    ResponseTypeError,
    RunBusyError,
    RunExistsError,
    RunNotFoundError,
    RunNotResumableError,
    RunStore,
    Runtime,
    SignatureMismatchError,
    StorageError,
    UnknownRequestError,
    UsageError,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowNotRegisteredError,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine._store import default_owner

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


def runtime(store: RunStore) -> Runtime:
    rt = Runtime(store)
    rt.register(stepper_workflow)
    return rt


async def test_admission_is_visible_and_unique(store: RunStore) -> None:
    wf = stepper_workflow()
    checkpoint = wf.admit(1, run_id="run-1")
    await store.admit(checkpoint)
    run = await store.get_run("run-1")
    assert (run.workflow_name, run.status, run.superstep) == ("stepper", "in_progress", 0)
    assert (await store.latest("run-1")) == checkpoint
    assert [i.checkpoint_id for i in await store.history("run-1")] == [checkpoint.checkpoint_id]
    with pytest.raises(StorageError, match="already exists"):
        await store.admit(wf.admit(1, run_id="run-1"))
    with pytest.raises(RunNotFoundError, match="'nope'"):
        await store.get_run("nope")


async def test_lease_is_exclusive_and_commits_are_fenced(store: RunStore) -> None:
    await store.admit(stepper_workflow().admit(1, run_id="r"))
    lease = await store.acquire("r", "host-a:1:x", 30)
    with pytest.raises(RunBusyError, match="being executed by another worker"):
        await store.acquire("r", "host-b:2:y", 30)
    await store.release(lease)
    # held by this very process (two requests on one server): not "another worker"
    lease = await store.acquire("r", default_owner(), 30)
    with pytest.raises(RunBusyError, match="by another execution in this process") as busy:
        await store.acquire("r", default_owner(), 30)
    assert "another worker" not in str(busy.value)
    checkpoint = await store.latest("r")
    lease = await store.commit(lease, checkpoint.model_copy(update={"checkpoint_id": "c1"}))
    await store.release(lease)
    other = await store.acquire("r", "host-b:2:y", 30)
    with pytest.raises(RunBusyError):  # the old holder's lease is gone: its commit is refused
        await store.commit(lease, checkpoint.model_copy(update={"checkpoint_id": "c2"}))
    await store.release(other)
    assert [i.checkpoint_id for i in await store.history("r")][-1] == "c1"


async def test_expired_or_dead_owner_lease_can_be_taken_over(store: RunStore) -> None:
    await store.admit(stepper_workflow().admit(1, run_id="r"))
    stale = await store.acquire("r", "host-a:1:x", 0.01)
    time.sleep(0.02)
    taken = await store.acquire("r", "host-b:2:y", 30)
    assert taken.version > stale.version
    await store.release(taken)
    import subprocess
    import sys

    from workflow_engine import default_owner

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    host = default_owner().split(":")[0]
    await store.acquire("r", f"{host}:{dead}:gone", 300)
    lease = await store.acquire("r", "host-c:3:z", 30)  # the owner process no longer exists
    await store.release(lease)


async def test_requests_flow_through_the_inbox_once(store: RunStore) -> None:
    rt = runtime(store)
    paused = await rt.run("stepper", 1)
    assert paused.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    (pending,) = await store.list_requests()
    assert pending.status == "pending" and pending.run_id == paused.run_id
    answer = {"$type": "tests.integration.workflows.Answer", "data": {"approved": True}}
    assert await store.answer(pending.request_id, answer) is AnswerOutcome.STORED
    assert await store.answer(pending.request_id, answer) is AnswerOutcome.DUPLICATE
    other = {"$type": "tests.integration.workflows.Answer", "data": {"approved": False}}
    with pytest.raises(RequestAlreadyAnsweredError, match=pending.request_id):
        await store.answer(pending.request_id, other)
    with pytest.raises(UnknownRequestError):
        await store.answer("missing", answer)
    assert [r.request_id for r in await store.list_requests(status="answered")] == [
        pending.request_id
    ]
    done = await rt.resume(paused.run_id)
    assert done.status is WorkflowRunState.IDLE
    assert (await store.get_request(pending.request_id)).status == "applied"
    assert await store.list_requests() == []


async def test_a_release_says_what_arrived_while_the_lease_was_held(store: RunStore) -> None:
    """An answer or a cancel stored while a worker holds the run, which no commit took up (a
    resume with nothing to run): the release reports it, in its own transaction -- the
    worker was named as the one that applies it (outside tester 86)."""
    rt = runtime(store)
    paused = await rt.run("stepper", 1)
    (pending,) = await store.list_requests()
    lease = await store.acquire(paused.run_id, "host-a:1:x", 30)
    quiet = await store.release(lease)
    assert quiet is not None and not quiet.answers_waiting and not quiet.cancel_requested
    assert await store.release(lease) is None  # released already: nothing to release
    lease = await store.acquire(paused.run_id, "host-a:1:y", 30)
    answer = {"$type": "tests.integration.workflows.Answer", "data": {"approved": True}}
    await store.answer(pending.request_id, answer)
    waiting = await store.release(lease)
    assert waiting is not None and waiting.answers_waiting and not waiting.cancel_requested
    lease = await store.acquire(paused.run_id, "host-a:1:z", 30)
    assert await store.request_cancel(paused.run_id) is True  # held: stored for its worker
    cancelled = await store.release(lease)
    assert cancelled is not None and cancelled.cancel_requested
    assert (await store.get_run(paused.run_id)).owner is None


async def test_request_ids_list_every_request_by_prefix(store: RunStore) -> None:
    rt = runtime(store)
    first, second = await rt.run("stepper", 1), await rt.run("stepper", 1)
    await rt.cancel(second.run_id)
    every = sorted(r.request_id for r in await store.list_requests(status=None))
    assert len(every) == 2 and await store.request_ids() == every  # any status, sorted
    for request_id in every:
        assert await store.request_ids(request_id[:5]) == [
            i for i in every if i.startswith(request_id[:5])
        ]
        assert await store.request_ids(request_id) == [request_id]
    assert first.pending_requests[0].request_id in every
    for prefix in ("%", "_", "zz", every[0][:3] + "%"):  # no pattern matching
        assert await store.request_ids(prefix) == []


async def test_run_ids_list_every_run_by_prefix(store: RunStore) -> None:
    rt = runtime(store)
    first, second = await rt.run("stepper", 1), await rt.run("stepper", 1)
    await rt.cancel(second.run_id)
    every = sorted([first.run_id, second.run_id])
    assert await store.run_ids() == every  # any status, sorted
    for run_id in every:
        assert await store.run_ids(run_id[:5]) == [i for i in every if i.startswith(run_id[:5])]
        assert await store.run_ids(run_id) == [run_id]
    for prefix in ("%", "_", "zz", every[0][:3] + "%"):  # no pattern matching
        assert await store.run_ids(prefix) == []


class Split(Executor):
    @handler
    async def split(self, n: int, ctx: WorkflowContext[int]) -> None:
        await ctx.send_message(n)


class Ask(Executor):
    @handler
    async def ask(self, n: int, ctx: WorkflowContext[None]) -> None:
        await ctx.request_info(n, int)

    @response_handler
    async def answered(self, n: int, answer: int, ctx: WorkflowContext[None]) -> None:
        pass


class Busy(Executor):
    """Goes on for a second superstep, which waits for ``go_on``."""

    def __init__(self, go_on: anyio.Event) -> None:
        super().__init__("busy")
        self.go_on = go_on

    @handler
    async def busy(self, n: int, ctx: WorkflowContext[int]) -> None:
        if n == 2:  # its second superstep: the request is committed by now
            await self.go_on.wait()
        elif n < 2:
            await ctx.send_message(n + 1)


async def test_the_inbox_lists_requests_of_runs_in_any_state(store: RunStore) -> None:
    """A run still executing can hold a pending request (another branch goes on): the inbox
    across runs reads the waiting runs at once, and such a run on its own."""
    go_on = anyio.Event()

    def branching() -> Workflow:
        split, ask, busy = Split("split"), Ask("ask"), Busy(go_on)
        return (
            WorkflowBuilder(name="branching", start=split)
            .add_fan_out_edges(split, [ask, busy])
            .add_edge(busy, busy)
            .build()
        )

    rt = runtime(store)
    rt.register(branching)
    waiting = await rt.run("stepper", 1)
    executing = await rt.start("branching", 1)
    async with anyio.create_task_group() as tg:
        tg.start_soon(rt.resume, executing)
        for _ in range(500):
            pending = await rt.pending_requests()
            if len(pending) == 2:
                break
            await anyio.sleep(0.01)
        assert (await store.get_run(executing)).status is WorkflowRunState.IN_PROGRESS
        assert sorted((r.run_id, r.workflow_name) for r in pending) == sorted(
            [(waiting.run_id, "stepper"), (executing, "branching")]
        )
        go_on.set()


async def test_cancelled_requests_refuse_answers(store: RunStore) -> None:
    rt = runtime(store)
    paused = await rt.run("stepper", 1)
    (pending,) = await store.list_requests()
    await rt.cancel(paused.run_id)
    assert (await store.get_request(pending.request_id)).status == "cancelled"
    with pytest.raises(RequestCancelledError):
        await store.answer(pending.request_id, {"approved": True})
    assert (await store.get_run(paused.run_id)).status is WorkflowRunState.CANCELLED


async def test_answers_given_together_are_stored_together_or_not_at_all(store: RunStore) -> None:
    """``answer_all``: one refused (unknown, answered otherwise, cancelled, or given twice in
    the batch, differently), none is stored; what is stored already is a duplicate. What a
    client answering several questions at once relies on (outside tester 103)."""
    rt = runtime(store)
    one, two, three = [await rt.run("stepper", 1) for _ in range(3)]
    a, b, c = (r.pending_requests[0].request_id for r in (one, two, three))
    yes, no = {"approved": True}, {"approved": False}
    await rt.cancel(three.run_id)
    for batch, error in (
        ([(a, yes), ("nope", yes)], UnknownRequestError),
        ([(a, yes), (b, yes), (a, no)], RequestAlreadyAnsweredError),
        ([(a, yes), (c, yes)], RequestCancelledError),
    ):
        with pytest.raises(error):
            await store.answer_all(batch)
        assert [(await store.get_request(i)).status for i in (a, b)] == ["pending"] * 2
    stored, duplicate = AnswerOutcome.STORED, AnswerOutcome.DUPLICATE
    assert await store.answer_all([(a, yes), (b, no), (a, yes)]) == [stored, stored, duplicate]
    with pytest.raises(RequestAlreadyAnsweredError):
        await store.answer_all([(a, yes), (b, yes)])
    assert await store.answer_all([(b, no), (a, yes)]) == [duplicate, duplicate]
    assert [(await store.get_request(i)).answer for i in (a, b)] == [yes, no]


async def test_requests_cancelled_together_unless_one_was_answered(store: RunStore) -> None:
    """``cancel_requests``: pending ones cancelled at once (no answer is taken for them after);
    one answered refuses them all, nothing changed; cancelled already is no refusal."""
    rt = runtime(store)
    one, two, three = [await rt.run("stepper", 1) for _ in range(3)]
    a, b, c = (r.pending_requests[0].request_id for r in (one, two, three))
    yes = {"approved": True}
    await store.answer(b, yes)
    with pytest.raises(RequestAlreadyAnsweredError, match=b):
        await store.cancel_requests([a, b])
    with pytest.raises(UnknownRequestError, match="nope"):
        await store.cancel_requests([a, "nope"])
    assert [(await store.get_request(i)).status for i in (a, b)] == ["pending", "answered"]
    await store.cancel_requests([a, c])
    await store.cancel_requests([a])  # again: as it was
    assert [(await store.get_request(i)).status for i in (a, c)] == ["cancelled"] * 2
    with pytest.raises(RequestCancelledError):
        await store.answer(a, yes)
    with pytest.raises(RequestCancelledError):
        await store.answer_all([(c, yes)])


async def test_requests_cancelled_for_their_run_record_its_cancel(store: RunStore) -> None:
    """``cancel_requests(ids, run_id=)`` records the run's cancel in the same write (a cancel
    requested, a run resting paused marked in progress): a process that dies before it cancels
    the run leaves it interrupted, and the next resume cancels it (outside tester 131). An
    unknown run refuses the whole, nothing cancelled; a run that ended is left as it is."""
    rt = runtime(store)
    paused, other = [await rt.run("stepper", 1) for _ in range(2)]
    a = paused.pending_requests[0].request_id
    b = other.pending_requests[0].request_id
    with pytest.raises(RunNotFoundError, match="nope"):
        await store.cancel_requests([b], run_id="nope")
    assert (await store.get_request(b)).status == "pending"
    await store.cancel_requests([a], run_id=paused.run_id)
    run = await store.get_run(paused.run_id)
    assert (run.status, run.cancel_requested) == (WorkflowRunState.IN_PROGRESS, True)
    assert (await store.get_request(a)).status == "cancelled"
    assert (await rt.resume(paused.run_id)).status is WorkflowRunState.CANCELLED
    run = await store.get_run(paused.run_id)
    assert (run.status, run.cancel_requested) == (WorkflowRunState.CANCELLED, False)
    # dismissed again (a second process dismissing the same pause): refused, and a run that
    # ended keeps no cancel (it showed "cancelling" for good: outside tester 133)
    with pytest.raises(RunNotResumableError, match="already cancelled"):
        await rt.cancel(paused.run_id, unless_answered=[a])
    run = await store.get_run(paused.run_id)
    assert (run.status, run.cancel_requested) == (WorkflowRunState.CANCELLED, False)


async def test_a_failed_run_s_dismissal_is_recorded_as_interrupted(store: RunStore) -> None:
    """The same for a run that failed with a request pending: kept failed with a cancel flag,
    no listing of runs to resume showed it (outside tester 134: 298 of 300 dismissals killed
    so); it is interrupted now, and a resume cancels it."""
    rt = runtime(store)
    rt.register(failing_with_a_question_workflow)
    failed = await rt.run("failing_asker", 1)
    assert failed.status is WorkflowRunState.FAILED
    [request] = await store.list_requests(run_id=failed.run_id, status="pending")
    await store.cancel_requests([request.request_id], run_id=failed.run_id)
    run = await store.get_run(failed.run_id)
    assert (run.status, run.cancel_requested) == (WorkflowRunState.IN_PROGRESS, True)
    assert (await rt.resume(failed.run_id)).status is WorkflowRunState.CANCELLED


async def test_a_cancel_unless_answered_loses_to_an_answer_given_first(store: RunStore) -> None:
    """``Runtime.cancel(unless_answered=)``: an answer stored first wins (the run is left to
    apply it); a cancel first refuses the answer after it (outside tester 107)."""
    rt = runtime(store)
    answered, dismissed = [await rt.run("stepper", 1) for _ in range(2)]
    a = answered.pending_requests[0].request_id
    d = dismissed.pending_requests[0].request_id
    await rt.respond(a, Answer(approved=True))
    with pytest.raises(RequestAlreadyAnsweredError, match=a):
        await rt.cancel(answered.run_id, unless_answered=[a])
    assert (await rt.resume(answered.run_id)).status is not WorkflowRunState.CANCELLED
    with pytest.raises(UsageError, match="belongs to run"):
        await rt.cancel(dismissed.run_id, unless_answered=[a])
    info = await rt.cancel(dismissed.run_id, unless_answered=[d])
    assert info.status is WorkflowRunState.CANCELLED
    with pytest.raises(RequestCancelledError):
        await rt.respond(d, Answer(approved=True))


async def test_a_cancel_unless_answered_this_process_cannot_make_writes_nothing(
    store: RunStore,
) -> None:
    """A paused run no worker executes, dismissed by a process whose workflow of that name
    changed, or that has none: ``cancel(unless_answered=)`` cancelled the request and stored
    the run's cancel, then said it was refused -- and the next resume by the run's own
    workflow cancelled it (outside tester 147). Refused before anything is written now."""
    paused = await runtime(store).run("stepper", 1)
    asked = paused.pending_requests[0].request_id
    changed = Runtime(store)
    changed.register(changed_stepper_workflow)
    with pytest.raises(SignatureMismatchError, match="no worker is executing"):
        await changed.cancel(paused.run_id, unless_answered=[asked])
    with pytest.raises(WorkflowNotRegisteredError, match="no worker is executing"):
        await Runtime(store).cancel(paused.run_id, unless_answered=[asked])
    run = await store.get_run(paused.run_id)
    assert (run.status, run.cancel_requested) == (
        WorkflowRunState.IDLE_WITH_PENDING_REQUESTS,
        False,
    )
    assert (await store.get_request(asked)).status == "pending"
    done = await runtime(store).respond_and_resume(asked, Answer(approved=True))
    assert done.status is not WorkflowRunState.CANCELLED


async def test_respond_all_validates_every_answer_before_storing_any(store: RunStore) -> None:
    rt = runtime(store)
    one, two = [await rt.run("stepper", 1) for _ in range(2)]
    a, b = (r.pending_requests[0].request_id for r in (one, two))
    with pytest.raises(ResponseTypeError, match=b):
        await rt.respond_all({a: Answer(approved=True), b: "not an answer"})
    assert [(await store.get_request(i)).status for i in (a, b)] == ["pending"] * 2
    outcomes = await rt.respond_all({a: Answer(approved=True), b: Answer(approved=False)})
    assert outcomes == {a: AnswerOutcome.STORED, b: AnswerOutcome.STORED}
    assert (await rt.resume(one.run_id)).status is WorkflowRunState.IDLE


async def test_latest_reassembles_exactly_what_the_runner_checkpointed(store: RunStore) -> None:
    rt = runtime(store)
    paused = await rt.run("stepper", 1)
    await rt.respond(paused.pending_requests[0].request_id, Answer(approved=True))
    done = await rt.resume(paused.run_id)
    assert (await store.latest(paused.run_id)) == done.checkpoint
    history = await store.history(paused.run_id)
    assert [i.seq for i in history] == list(range(len(history)))
    loaded = [await store.load(i.checkpoint_id) for i in history]
    assert [c.superstep for c in loaded] == [i.superstep for i in history]
    assert loaded[-1] == done.checkpoint


async def test_list_runs_filters(store: RunStore) -> None:
    rt = runtime(store)
    a = await rt.run("stepper", 1)
    b = await rt.run("stepper", 5)
    assert b.status is WorkflowRunState.IDLE
    paused = await store.list_runs(status=WorkflowRunState.IDLE_WITH_PENDING_REQUESTS)
    assert [r.run_id for r in paused] == [a.run_id]
    assert {r.run_id for r in await store.list_runs(workflow="stepper")} == {a.run_id, b.run_id}
    assert await store.list_runs(workflow="other") == []
    assert len(await store.list_runs(limit=1)) == 1


@pytest.mark.parametrize(
    ("finished_before", "keep_last"),
    [(1e18, 0), (1e18, -1), (1e18, 1.5), (1e18, True), (float("nan"), 2), ("soon", None)],
)
async def test_prune_refused_changes_nothing(
    store: RunStore, finished_before: object, keep_last: object
) -> None:
    """A refused prune deletes nothing: it used to delete every finished run, then refuse
    ``keep_last=0`` (outside tester)."""
    rt = runtime(store)
    finished = await rt.run("stepper", 5)
    history = await store.history(finished.run_id)
    with pytest.raises(UsageError):
        await store.prune(finished_before=finished_before, keep_last=keep_last)  # type: ignore[arg-type]
    assert await store.history(finished.run_id) == history
    assert [r.run_id for r in await store.list_runs()] == [finished.run_id]


async def test_prune_keeps_what_it_must(store: RunStore) -> None:
    rt = runtime(store)
    finished = await rt.run("stepper", 5)
    paused = await rt.run("stepper", 1)
    before = await store.latest(paused.run_id)
    assert await store.prune(keep_last=1) > 0
    assert len(await store.history(paused.run_id)) == 1
    assert (await store.latest(paused.run_id)) == before
    await store.prune(finished_before=time.time() + 1)
    with pytest.raises(RunNotFoundError):
        await store.get_run(finished.run_id)
    assert (await store.get_run(paused.run_id)).status is (
        WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    )
    # the pruned paused run still resumes
    await rt.respond(paused.pending_requests[0].request_id, {"approved": True})
    assert (await rt.resume(paused.run_id)).status is WorkflowRunState.IDLE


async def test_combined_operations_are_atomic_shortcuts(store: RunStore) -> None:
    wf = stepper_workflow()
    first = wf.admit(1, run_id="r")
    lease = await store.admit_and_acquire(first, "host-a:1:x", 30)
    with pytest.raises(RunBusyError):
        await store.acquire("r", "host-b:2:y", 30)
    run, checkpoint = await store.get_run_and_latest("r")
    assert run.owner == "host-a:1:x" and checkpoint == first
    lease = await store.commit_and_release(
        lease, first.model_copy(update={"checkpoint_id": "c1", "parent_id": None})
    )
    assert (await store.get_run("r")).owner is None  # released with the commit

    def refuse(run) -> None:
        raise RunNotResumableError(f"not {run.run_id}")

    version = (await store.get_run("r")).version
    with pytest.raises(RunNotResumableError, match="not r"):
        await store.acquire_latest("r", "host-b:2:y", 30, refuse)
    assert (await store.get_run("r")).version == version  # the check ran before any write
    run, lease, latest, answered = await store.acquire_latest("r", "host-b:2:y", 30)
    assert run.run_id == "r" and latest.checkpoint_id == "c1" and list(answered) == []
    await store.release(lease)


async def test_answer_and_acquire_is_one_atomic_step(store: RunStore) -> None:
    paused = await runtime(store).run("stepper", 1)
    (pending,) = await store.list_requests()
    answer = {"$type": "tests.integration.workflows.Answer", "data": {"approved": True}}

    def refuse(run) -> None:
        raise RunNotResumableError(f"not {run.run_id}")

    version = (await store.get_run(paused.run_id)).version
    with pytest.raises(RunNotResumableError):  # refused: the answer is not stored either
        await store.answer_and_acquire(pending.request_id, answer, "host-a:1:x", 30, refuse)
    assert (await store.get_request(pending.request_id)).status == "pending"
    assert (await store.get_run(paused.run_id)).version == version
    with pytest.raises(UnknownRequestError):
        await store.answer_and_acquire("missing", answer, "host-a:1:x", 30)

    holder = await store.acquire(paused.run_id, "host-b:2:y", 30)
    outcome, taken = await store.answer_and_acquire(pending.request_id, answer, "host-a:1:x", 30)
    assert (outcome, taken) == (AnswerOutcome.STORED, None)  # busy run: the answer stays
    assert (await store.get_request(pending.request_id)).status == "answered"
    await store.release(holder)

    outcome, taken = await store.answer_and_acquire(pending.request_id, answer, "host-a:1:x", 30)
    assert outcome is AnswerOutcome.DUPLICATE and taken is not None
    run, lease, latest, answered = taken
    assert run.run_id == paused.run_id and lease.owner == "host-a:1:x"
    assert latest == await store.latest(paused.run_id)
    assert [r.request_id for r in answered] == [pending.request_id]
    with pytest.raises(RunBusyError):
        await store.acquire(paused.run_id, "host-b:2:y", 30)
    other = {"$type": "tests.integration.workflows.Answer", "data": {"approved": False}}
    with pytest.raises(RequestAlreadyAnsweredError):
        await store.answer_and_acquire(pending.request_id, other, "host-b:2:y", 30)
    await store.release(lease)


async def test_respond_and_resume_finishes_the_run(store: RunStore) -> None:
    rt = runtime(store)
    paused = await rt.run("stepper", 1)
    request_id = paused.pending_requests[0].request_id
    done = await rt.respond_and_resume(request_id, Answer(approved=True))
    assert done.status is WorkflowRunState.IDLE and done.run_id == paused.run_id
    assert (await store.get_run(paused.run_id)).owner is None  # the lease ended with the run
    # the identical answer again (a retry after a lost reply): nothing runs, the run as it ended
    # (it raised RunNotResumableError, tester 74)
    repeat = await rt.respond_and_resume(request_id, Answer(approved=True))
    assert repeat.status is WorkflowRunState.IDLE and repeat.outputs == []
    assert repeat.checkpoint == done.checkpoint
    with pytest.raises(RequestAlreadyAnsweredError, match=request_id):  # a different one
        await rt.respond_and_resume(request_id, Answer(approved=False))

    again = await rt.run("stepper", 1)
    holder = await store.acquire(again.run_id, "host-b:2:y", 30)
    with pytest.raises(RunBusyError, match="answer .* is stored"):
        await rt.respond_and_resume(again.pending_requests[0].request_id, Answer(approved=True))
    await store.release(holder)
    assert (await rt.resume(again.run_id)).status is WorkflowRunState.IDLE


async def test_request_and_its_run_in_one_read(store: RunStore) -> None:
    paused = await runtime(store).run("stepper", 1)
    (pending,) = await store.list_requests()
    request, run = await store.get_request_and_run(pending.request_id)
    assert request == pending and run.run_id == paused.run_id
    with pytest.raises(UnknownRequestError):
        await store.get_request_and_run("missing")


# --- step identity: renewal, fenced journal, compaction, linear history, durable cancel -------


async def test_renewal_keeps_the_version_and_fails_once_taken_over(store: RunStore) -> None:
    await store.admit(stepper_workflow().admit(1, run_id="r"))
    lease = await store.acquire("r", "host-a:1:x", 0.05)
    renewed = await store.renew(lease)
    assert renewed.version == lease.version and renewed.expires_at >= lease.expires_at
    time.sleep(0.1)  # expired: another worker may take the run
    taker = await store.acquire("r", "host-b:2:y", 30)
    with pytest.raises(LeaseLostError):
        await store.renew(renewed)
    await store.release(renewed)  # a lost lease releases nothing
    assert (await store.get_run("r")).owner == taker.owner


async def test_journal_intents_results_fencing_and_compaction(store: RunStore) -> None:
    wf = stepper_workflow()
    await store.admit(wf.admit(1, run_id="r"))
    lease = await store.acquire("r", "host-a:1:x", 30)
    await store.journal_intent("r", "1/a/d/x", {"intent": {"tool": "t"}}, 1, lease=lease)
    assert await store.journal_get("r", "1/a/d/x") == {"intent": {"tool": "t"}}
    stored = await store.journal_put("r", "1/a/d/x", {"value": 1}, 1, lease=lease)
    assert stored == {"value": 1}  # a result replaces the intent
    assert await store.journal_put("r", "1/a/d/x", {"value": 2}, 1, lease=lease) == {"value": 1}
    await store.journal_put("r", "2/a/d/y", {"value": 3}, 2, lease=lease)
    await store.journal_intent("r", "2/a/d/z", {"intent": None}, 2, lease=lease)
    await store.journal_clear("r", "2/a/d/z", lease=lease)
    assert await store.journal_get("r", "2/a/d/z") is None
    # a commit of superstep 1 compacts that superstep's entries and keeps later ones
    latest = await store.latest("r")
    assert latest is not None
    step1 = latest.model_copy(
        update={"checkpoint_id": "c1", "parent_id": latest.checkpoint_id, "superstep": 1}
    )
    lease = await store.commit(lease, step1)
    assert await store.journal_get("r", "1/a/d/x") is None
    assert await store.journal_get("r", "2/a/d/y") == {"value": 3}
    await store.release(lease)
    other = await store.acquire("r", "host-b:2:y", 30)
    with pytest.raises(LeaseLostError):  # the old holder can no longer journal anything
        await store.journal_put("r", "2/a/d/w", {"value": 4}, 2, lease=lease)
    with pytest.raises(LeaseLostError):
        await store.journal_intent("r", "2/a/d/w", {"intent": None}, 2, lease=lease)
    assert await store.journal_get("r", "2/a/d/w") is None
    await store.release(other)


async def test_a_commit_must_follow_the_latest_checkpoint(store: RunStore) -> None:
    await store.admit(stepper_workflow().admit(1, run_id="r"))
    first = await store.latest("r")
    assert first is not None
    lease = await store.acquire("r", "host-a:1:x", 30)
    second = first.model_copy(update={"checkpoint_id": "c1", "parent_id": first.checkpoint_id})
    lease = await store.commit(lease, second)
    stale = first.model_copy(update={"checkpoint_id": "c2", "parent_id": first.checkpoint_id})
    with pytest.raises(CheckpointNotLatestError, match="latest checkpoint is c1"):
        await store.commit(lease, stale)
    await store.release(lease)
    assert [i.checkpoint_id for i in await store.history("r")][-1] == "c1"
    assert (await store.latest("r")).checkpoint_id == "c1"  # type: ignore[union-attr]
    assert await store.prune(keep_last=1) == 1


async def test_a_cancel_request_reaches_the_lease_holder(store: RunStore) -> None:
    await store.admit(stepper_workflow().admit(1, run_id="r"))
    lease = await store.acquire("r", "host-a:1:x", 30)
    assert not lease.cancel_requested
    await store.request_cancel("r")
    assert (await store.renew(lease)).cancel_requested
    with pytest.raises(RunNotFoundError):
        await store.request_cancel("nope")
    await store.release(lease)


async def test_prune_removes_a_runs_journal_with_it(store: RunStore) -> None:
    rt = runtime(store)
    result = await rt.run("stepper", 1)
    run_id = result.run_id
    lease = await store.acquire(run_id, "host-a:1:x", 30)
    await store.journal_put(run_id, "99/a/d/x", {"value": 1}, 99, lease=lease)
    await store.release(lease)
    await rt.cancel(run_id)
    await store.prune(finished_before=time.time() + 60)
    assert await store.journal_get(run_id, "99/a/d/x") is None


async def test_each_runs_requests_and_checkpoints_stay_its_own_through_prune(
    store: RunStore,
) -> None:
    """Reads by run and by id among many runs, and what a prune takes with a run: its requests,
    its journal and its checkpoints, no other run's (the in-memory store keeps them indexed by
    run and id, where it scanned every run's)."""
    from workflow_engine import CheckpointNotFoundError

    rt = runtime(store)
    paused = [await rt.run("stepper", 1) for _ in range(4)]
    for result in paused:
        (mine,) = await store.list_requests(result.run_id)
        assert mine.request_id == result.pending_requests[0].request_id
        assert mine.run_id == result.run_id
        for info in await store.history(result.run_id):
            assert (await store.load(info.checkpoint_id)).run_id == result.run_id
    gone, kept = paused[0], paused[1:]
    gone_checkpoints = [i.checkpoint_id for i in await store.history(gone.run_id)]
    lease = await store.acquire(gone.run_id, "host-a:1:x", 30)
    await store.journal_put(gone.run_id, "99/a/d/x", {"value": 1}, 99, lease=lease)
    await store.release(lease)
    await rt.cancel(gone.run_id)
    await store.prune(finished_before=time.time() + 60)
    with pytest.raises(UnknownRequestError):
        await store.get_request(gone.pending_requests[0].request_id)
    assert list(await store.list_requests(gone.run_id, status=None)) == []
    for checkpoint_id in gone_checkpoints:
        with pytest.raises(CheckpointNotFoundError):
            await store.load(checkpoint_id)
    assert {r.run_id for r in await store.list_requests()} == {r.run_id for r in kept}
    # keep_last drops a run's older checkpoints from loads by id, not its latest
    older = [i.checkpoint_id for i in await store.history(kept[0].run_id)][:-1]
    assert older
    await store.prune(keep_last=1)
    for checkpoint_id in older:
        with pytest.raises(CheckpointNotFoundError):
            await store.load(checkpoint_id)
    latest = await store.latest(kept[0].run_id)
    assert (await store.load(latest.checkpoint_id)) == latest
    await rt.respond(kept[0].pending_requests[0].request_id, {"approved": True})
    assert (await rt.resume(kept[0].run_id)).status is WorkflowRunState.IDLE


async def test_a_cancel_request_is_stored_only_for_a_run_a_worker_holds(store: RunStore) -> None:
    """For a run at rest it is refused (False): no worker would honour it, and it outlived the
    run (``idle, cancelling`` for good; outside tester 79). A run set FAILED is done with one."""
    await store.admit(stepper_workflow().admit(1, run_id="r"))
    assert await store.request_cancel("r") is False  # admitted, not leased: nobody executes it
    assert not (await store.get_run("r")).cancel_requested
    lease = await store.acquire("r", "host-a:1:x", 30)
    assert await store.request_cancel("r") is True
    assert (await store.get_run("r")).cancel_requested
    lease = await store.set_status(lease, WorkflowRunState.FAILED, {"message": "broken"})
    assert not (await store.get_run("r")).cancel_requested
    await store.release(lease)
    assert await store.request_cancel("r") is False
    with pytest.raises(RunNotFoundError):
        await store.request_cancel("nope")


async def test_a_run_admitted_again_under_a_pruned_runs_id_starts_afresh(store: RunStore) -> None:
    """The in-memory store kept a pruned run's cancel request and checkpoint numbering: a run
    started again under its id began ``cancelling``, its history numbered on (tester 79)."""
    rt = runtime(store)
    first = await rt.run("stepper", 5, run_id="x")
    await store.prune(keep_last=1)
    lease = await store.acquire("x", "host-a:1:x", 30)
    assert await store.request_cancel("x") is True
    await store.release(lease)
    await store.prune(finished_before=time.time() + 60)
    with pytest.raises(RunNotFoundError):
        await store.get_run("x")
    again = await rt.run("stepper", 5, run_id="x")
    assert again.status is first.status
    assert not (await store.get_run("x")).cancel_requested
    assert [h.seq for h in await store.history("x")] == list(range(len(await store.history("x"))))


async def test_a_checkpoint_id_names_one_checkpoint(store: RunStore) -> None:
    """A commit or an admission reusing a stored checkpoint's id is refused: the in-memory
    store took it, and ``load`` then returned the later one (tester 79)."""
    wf = stepper_workflow()
    first = wf.admit(1, run_id="a")
    await store.admit(first)
    with pytest.raises(StorageError):
        await store.admit(
            wf.admit(1, run_id="b").model_copy(update={"checkpoint_id": first.checkpoint_id})
        )
    lease = await store.acquire("a", "host-a:1:x", 30)
    with pytest.raises(StorageError):
        await store.commit(lease, first.model_copy(update={"parent_id": first.checkpoint_id}))
    assert (await store.load(first.checkpoint_id)) == first
    with pytest.raises(RunNotFoundError):
        await store.get_run("b")


async def test_admit_and_commit_writes_a_run_with_its_first_superstep(store: RunStore) -> None:
    wf = stepper_workflow()
    first = wf.admit(1, run_id="r")
    lease = await store.admit_and_commit(first, following(first, "c1"), "host-a:1:x", 30)
    assert [i.checkpoint_id for i in await store.history("r")] == [first.checkpoint_id, "c1"]
    run = await store.get_run("r")
    assert (run.owner, run.latest_checkpoint_id, run.superstep) == ("host-a:1:x", "c1", 1)
    with pytest.raises(RunBusyError):  # born leased
        await store.acquire("r", "host-b:2:y", 30)
    # the lease it returns is the one the next commit is fenced by
    await store.commit_and_release(lease, following(following(first, "c1"), "c2"))
    assert (await store.get_run("r")).owner is None
    assert (await store.latest("r")).checkpoint_id == "c2"

    second = wf.admit(1, run_id="s")
    lease = await store.admit_and_commit(
        second, following(second, "d1"), "host-a:1:y", 30, release=True
    )
    run = await store.get_run("s")
    assert run.owner is None and run.latest_checkpoint_id == "d1"
    assert lease.version == run.version
    taken = await store.acquire("s", "host-b:2:y", 30)  # released: anyone may take it
    await store.release(taken)


async def test_admit_and_commit_refused_writes_nothing(store: RunStore) -> None:
    wf = stepper_workflow()
    taken = wf.admit(1, run_id="r")
    await store.admit(taken)
    again = wf.admit(2, run_id="r")
    with pytest.raises(RunExistsError, match="'r' already exists"):
        await store.admit_and_commit(again, following(again, "c1"), "host-a:1:x", 30)
    assert await store.latest("r") == taken
    assert len(await store.history("r")) == 1
    with pytest.raises(CheckpointNotFoundError):
        await store.load("c1")

    fresh = wf.admit(1, run_id="s")
    elsewhere = following(fresh, "d1").model_copy(update={"parent_id": "elsewhere"})
    with pytest.raises(CheckpointNotLatestError):
        await store.admit_and_commit(fresh, elsewhere, "host-a:1:x", 30)
    with pytest.raises(RunNotFoundError):
        await store.get_run("s")
    stored_twice = following(fresh, taken.checkpoint_id)  # an id already stored
    with pytest.raises(StorageError):
        await store.admit_and_commit(fresh, stored_twice, "host-a:1:x", 30)
    with pytest.raises(RunNotFoundError):
        await store.get_run("s")
    assert await store.load(taken.checkpoint_id) == taken
    # nothing of the refusals stays behind: the same run is admitted afterwards
    lease = await store.admit_and_commit(fresh, following(fresh, "d1"), "host-a:1:x", 30)
    assert (await store.get_run("s")).latest_checkpoint_id == "d1"
    await store.release(lease)


async def test_a_checkpoint_of_another_run_is_refused(store: RunStore) -> None:
    """A run's lease commits only that run's checkpoints: one naming another run (a caller of
    the store's own API mixing up runs) is refused, whichever run it names, and writes nothing
    -- stored, it would sit in the other run's history as the first run's latest."""
    wf = stepper_workflow()
    first, other = wf.admit(1, run_id="r"), wf.admit(1, run_id="s")
    await store.admit(other)
    lease = await store.admit_and_acquire(first, "host-a:1:x", 30)
    for named in ("s", "nobody"):
        foreign = following(first, f"x-{named}").model_copy(update={"run_id": named})
        for commit in (store.commit, store.commit_and_release):
            with pytest.raises(UsageError, match=f"checkpoint 'x-{named}' is of run '{named}'"):
                await commit(lease, foreign)
    assert [i.checkpoint_id for i in await store.history("r")] == [first.checkpoint_id]
    assert [i.checkpoint_id for i in await store.history("s")] == [other.checkpoint_id]
    lease = await store.commit(lease, following(first, "c1"))  # the lease still holds
    await store.release(lease)

    fresh = wf.admit(1, run_id="t")
    foreign = following(fresh, "x-t").model_copy(update={"run_id": "s"})
    with pytest.raises(UsageError, match="checkpoint 'x-t' is of run 's'"):
        await store.admit_and_commit(fresh, foreign, "host-a:1:x", 30)
    with pytest.raises(RunNotFoundError):
        await store.get_run("t")
    assert [i.checkpoint_id for i in await store.history("s")] == [other.checkpoint_id]
