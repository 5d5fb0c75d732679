"""Misuse of the Python API gets an error of the engine's tree saying what was wrong -- not a
raw pydantic or attribute error, not a silently different run (outside tester 108)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.integration.workflows import stepper_workflow
from workflow_engine import (
    Checkpoint,
    CheckpointError,
    Executor,
    RequestAlreadyAnsweredError,
    RunNotFoundError,
    Runtime,
    UsageError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.storage import InMemoryRunStore, SqliteStore

pytestmark = pytest.mark.anyio


class Noop(Executor):
    @handler
    async def on(self, message: str, ctx: WorkflowContext[None]) -> None:
        return None


def runtime() -> Runtime:
    rt = Runtime(InMemoryRunStore())
    rt.register(stepper_workflow)
    return rt


@pytest.mark.parametrize("text", ["{}", '{"schema_version": 4', "not json", "[]"])
def test_text_that_is_not_a_checkpoint_is_a_checkpoint_error(text: str) -> None:
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        Checkpoint.from_json(text)


async def test_a_run_id_must_be_text_and_not_empty() -> None:
    rt = runtime()
    with pytest.raises(UsageError, match="cannot be empty"):
        await rt.start("stepper", 1, run_id="")
    with pytest.raises(UsageError, match=r"text \(str\), not int"):
        await rt.start("stepper", 1, run_id=5)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="cannot be empty or blank"):
        await rt.start("stepper", 1, run_id="  ")
    with pytest.raises(UsageError, match="cannot be empty"):
        await stepper_workflow().run(1, run_id="")
    assert await rt.list_runs() == []  # nothing was admitted


async def test_a_checkpoint_continues_its_own_run_only() -> None:
    paused = await stepper_workflow().run(1)
    assert paused.checkpoint is not None
    with pytest.raises(UsageError, match="continues its own run"):
        await stepper_workflow().run(checkpoint=paused.checkpoint, run_id="another")


async def test_an_unknown_status_or_run_is_said_so() -> None:
    rt = runtime()
    with pytest.raises(UsageError, match="no run status 'bogus'; a status is one of: "):
        await rt.list_runs(status="bogus")  # type: ignore[arg-type]
    assert await rt.list_runs(status="idle") == []  # type: ignore[arg-type]
    with pytest.raises(RunNotFoundError, match="nope"):
        await rt.pending_requests("nope")
    paused = await rt.run("stepper", 1)
    assert len(await rt.pending_requests(paused.run_id)) == 1
    await rt.close()


@pytest.mark.parametrize("sqlite", [False, True])
async def test_a_run_or_request_id_that_is_not_text_is_a_usage_error(
    tmp_path: Path, sqlite: bool
) -> None:
    """``get_run(5)`` said "no run 5", and a list reached SQLite as a binding error."""
    rt = Runtime(SqliteStore(tmp_path / "runs.db") if sqlite else InMemoryRunStore())
    rt.register(stepper_workflow)
    # a run named "5": SQLite compares the number 5 with it as text, so get_run(5) read it and
    # fork(5) made a new run of it (outside tester 114)
    await rt.run("stepper", 1, run_id="5")
    before = [(r.run_id, r.version) for r in await rt.list_runs()]
    calls = [
        ("get_run: run_id", lambda: rt.get_run(5)),  # type: ignore[arg-type]
        ("resume: run_id", lambda: rt.resume(b"r")),  # type: ignore[arg-type]
        ("cancel: run_id", lambda: rt.cancel(None)),  # type: ignore[arg-type]
        ("history: run_id", lambda: rt.history(["r"])),  # type: ignore[arg-type]
        ("respond: request_id", lambda: rt.respond(7, "yes")),  # type: ignore[arg-type]
        ("get_request: request_id", lambda: rt.get_request(7.5)),  # type: ignore[arg-type]
        ("fork: run_id", lambda: rt.fork(5)),  # type: ignore[arg-type]
        ("resume: run_id", lambda: rt.resume(5)),  # type: ignore[arg-type]
        ("cancel: run_id", lambda: rt.cancel(run_id=5)),  # type: ignore[arg-type]
        ("pending_requests: run_id", lambda: rt.pending_requests(5)),  # type: ignore[arg-type]
        ("cancel: each of unless_answered", lambda: rt.cancel("5", unless_answered=[5])),  # type: ignore[list-item]
        ("respond_all: each request id", lambda: rt.respond_all({5: "yes"})),  # type: ignore[dict-item]
    ]
    for said, call in calls:
        with pytest.raises(UsageError, match=rf"^{said} must be text \(str\), not "):
            await call()
    with pytest.raises(UsageError, match=r"^resume_stream: run_id must be text"):
        rt.resume_stream(5)  # type: ignore[arg-type]
    assert [(r.run_id, r.version) for r in await rt.list_runs()] == before  # nothing written
    with pytest.raises(RunNotFoundError):  # text that names no run: as before
        await rt.get_run("nope")
    assert [r.run_id for r in await rt.pending_requests()] == ["5"]  # (None: every run's)
    await rt.close()


@pytest.mark.parametrize("limit", [0, -1, "5", 1.5, True])
async def test_a_bad_superstep_limit_is_refused_before_anything_is_written(
    tmp_path: Path, limit: object
) -> None:
    """``max_supersteps=0`` was refused after the run was admitted (a retry with the same run
    id was then ``RunExistsError``, the refused run resumable) and after the answer was
    stored (a corrected answer refused as a conflict); ``"5"`` was a raw TypeError."""
    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(stepper_workflow)
    bad: Any = limit
    with pytest.raises(UsageError, match="max_supersteps must be"):
        await rt.run("stepper", 1, run_id="order-42", max_supersteps=bad)
    assert await rt.list_runs() == []
    paused = await rt.run("stepper", 1, run_id="order-42")
    (asked,) = paused.pending_requests
    with pytest.raises(UsageError, match="max_supersteps must be"):
        await rt.respond_and_resume(asked.request_id, {"approved": True}, max_supersteps=bad)
    assert (await rt.get_request(asked.request_id)).status == "pending"
    await rt.respond(asked.request_id, {"approved": True})
    with pytest.raises(UsageError, match="max_supersteps must be"):
        await rt.resume(paused.run_id, max_supersteps=bad)
    with pytest.raises(UsageError, match="max_supersteps must be"):
        rt.resume_stream(paused.run_id, max_supersteps=bad)
    run = await rt.get_run(paused.run_id)
    assert run.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS  # (not interrupted)
    with pytest.raises(UsageError, match="max_supersteps must be"):
        await stepper_workflow().run(1, max_supersteps=bad)
    with pytest.raises(UsageError, match="max_supersteps must be"):
        WorkflowBuilder(name="w", start=Noop("n")).with_max_supersteps(bad)
    assert (await rt.resume(paused.run_id)).status is WorkflowRunState.IDLE  # (the answer: applied)
    await rt.close()


@pytest.mark.parametrize(
    "seconds",
    [
        *(0, -1, "30", True, float("nan"), float("inf"), 1e12, 2**63),
        pytest.param(10**5000, id="5,000 digits"),
    ],
)
def test_a_lease_that_is_not_a_positive_time_is_refused(seconds: object) -> None:
    """``lease_seconds=0`` made every lease lapse at once: a live worker's run was taken over
    mid-step, its renewals spinning. ``1e12``: a lease ending past the year 9999, which the
    store then read as damage -- every listing of the database with it (outside tester 144)."""
    with pytest.raises(UsageError, match="lease_seconds must be a positive number"):
        Runtime(InMemoryRunStore(), lease_seconds=seconds)  # type: ignore[arg-type]


async def test_misused_arguments_name_what_was_expected(tmp_path: Path) -> None:
    rt = runtime()
    paused = await rt.run("stepper", 1)
    (asked,) = paused.pending_requests
    with pytest.raises(UsageError, match="respond_all takes a mapping"):
        await rt.respond_all([(asked.request_id, {"approved": True})])  # type: ignore[arg-type]

    class Twice(Mapping[str, Any]):  # a mapping of its own that yields one id twice
        def __getitem__(self, key: str) -> Any:
            return {"approved": True}

        def __iter__(self) -> Iterator[str]:
            return iter([asked.request_id, asked.request_id])

        def __len__(self) -> int:
            return 2

        def items(self) -> Any:  # (the two answers differ: the last one was kept, silently)
            return [(asked.request_id, {"approved": True}), (asked.request_id, {"approved": 0})]

    with pytest.raises(UsageError, match=f"request '{asked.request_id}' is answered twice"):
        await rt.respond_all(Twice())
    with pytest.raises(UsageError, match=r"fork: superstep is a whole number \(int\), not str"):
        await rt.fork(paused.run_id, "1")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="fork: give a superstep or a checkpoint_id, not both"):
        await rt.fork(paused.run_id, 1, checkpoint_id=paused.checkpoint.checkpoint_id)
    with pytest.raises(UsageError, match="unless_answered is a list of request ids"):
        await rt.cancel(paused.run_id, unless_answered=asked.request_id)
    with pytest.raises(UsageError, match="unless_answered is a list of request ids, not 5"):
        await rt.cancel(paused.run_id, unless_answered=5)  # type: ignore[arg-type]
    # a generator is read once: its ids still guard the cancel (it was used up by the checks,
    # and the run was cancelled though its request had been answered: outside tester 115)
    await rt.respond(asked.request_id, {"approved": True})
    with pytest.raises(RequestAlreadyAnsweredError):
        await rt.cancel(paused.run_id, unless_answered=(i for i in [asked.request_id]))
    with pytest.raises(UsageError, match="at most 1024 characters"):
        await rt.run("stepper", 1, run_id="r" * 1025)
    with pytest.raises(UsageError, match="list_runs: limit is a whole number"):
        await rt.list_runs(limit="x")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="list_runs: workflow must be text"):
        await rt.list_runs(workflow=5)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="cannot hold a NUL"):
        SqliteStore(tmp_path / "a\x00b.db")
    run = await rt.get_run(paused.run_id)
    assert run.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    assert len(await rt.list_runs()) == 1


# --- outside tester 143 --------------------------------------------------------------------------


@pytest.mark.parametrize("name", [b"x", None, 5, "", "  ", "w" * 201])
def test_a_workflow_needs_a_name_that_is_text(name: Any) -> None:
    """``name=b"x"`` was built, registered and run, and the run's row then held bytes: every
    listing of that database refused it as damage, every other run's inbox unreadable."""
    with pytest.raises(UsageError, match="workflow"):
        WorkflowBuilder(name=name, start=Noop("n"))


@pytest.mark.parametrize("port_id", ["", None, 5])
def test_a_request_port_needs_an_id_as_an_executor_does(port_id: Any) -> None:
    from workflow_engine import RequestPort

    with pytest.raises(UsageError, match="non-empty string id"):
        RequestPort(port_id, str, bool)


async def test_values_whose_repr_fails_or_too_big_for_sqlite_are_usage_errors(
    tmp_path: Path,
) -> None:
    """The error saying what was wrong failed itself (``repr`` of an int past Python's digit
    limit: a bare ValueError, 21 calls), or the value reached SQLite (a bare OverflowError)."""
    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(stepper_workflow)
    huge = 10**5000
    with pytest.raises(UsageError, match="bits"):
        await rt.get_run(huge)  # type: ignore[arg-type]
    for call in (
        lambda: rt.list_runs(limit=2**63),
        lambda: rt.list_runs(limit=-1),  # (SQLite's "no limit")
        lambda: rt.prune(keep_last=2**63),
        lambda: rt.prune(finished_before=huge),
    ):
        with pytest.raises(UsageError):
            await call()
    await rt.close()


async def test_what_is_registered_and_run_is_named_by_text() -> None:
    """A list for a name was a bare ``TypeError: unhashable type``; ``register(None)`` a bare
    ``TypeError: 'NoneType' object is not callable``."""
    rt = runtime()
    for call in (
        lambda: rt.run(["a"], 1),  # type: ignore[arg-type]
        lambda: rt.start({"a": 1}, 1),  # type: ignore[arg-type]
    ):
        with pytest.raises(UsageError, match=r"name must be text \(str\)"):
            await call()
    with pytest.raises(UsageError, match=r"name must be text \(str\)"):
        rt.workflow(["a"])  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"name must be text \(str\)"):
        rt.register(stepper_workflow, name=5)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="a Workflow, or a function that builds one"):
        rt.register(None)  # type: ignore[arg-type]


def test_the_builder_takes_lists_of_executors_and_cases() -> None:
    """``None`` was a bare TypeError, a string of ten million characters ten million ids
    (checked for doubles in quadratic time: it never returned)."""
    a, b = Noop("a"), Noop("b")
    builder = WorkflowBuilder("w", start=a)
    for call in (
        lambda: builder.add_chain(None),  # type: ignore[arg-type]
        lambda: builder.add_fan_out_edges(a, "b" * 10_000_000),  # type: ignore[arg-type]
        lambda: builder.add_fan_in_edges(5, b),  # type: ignore[arg-type]
        lambda: builder.add_switch_case_edge_group(a, "ab"),  # type: ignore[arg-type]
        lambda: builder.add_switch_case_edge_group(a, [b]),  # type: ignore[list-item]
    ):
        with pytest.raises(UsageError):
            call()


@pytest.mark.parametrize("owner", [b"x", "", "  ", 5])
def test_an_owner_is_text(owner: Any) -> None:
    """Accepted, and ``run`` failed later with a bare error (outside tester 144)."""
    with pytest.raises(UsageError, match="owner must be non-empty text"):
        Runtime(InMemoryRunStore(), owner=owner)


class _Unshowable:
    def __repr__(self) -> str:
        raise RuntimeError("repr boom")


class _UnshowableText(str):
    def __repr__(self) -> str:
        raise RuntimeError("repr boom")


async def test_an_error_naming_a_value_whose_repr_fails_still_says_what_was_wrong() -> None:
    """The caller's value in the message failed the message: a bare RuntimeError from a dozen
    calls (outside tester 144)."""
    from workflow_engine import RunNotFoundError, WorkflowNotRegisteredError

    rt = runtime()
    odd = _Unshowable()
    with pytest.raises(RunNotFoundError):
        await rt.get_run(_UnshowableText("nope"))
    with pytest.raises(WorkflowNotRegisteredError):
        rt.workflow(_UnshowableText("nope"))
    for call in (
        lambda: rt.list_runs(status=odd),  # type: ignore[arg-type]
        lambda: rt.start("stepper", 1, run_id=odd),  # type: ignore[arg-type]
        lambda: rt.run("stepper", 1, max_supersteps=odd),  # type: ignore[arg-type]
    ):
        with pytest.raises(UsageError, match="repr fails"):
            await call()
    builder = WorkflowBuilder("w", start=Noop("a"))
    for build in (
        lambda: builder.with_max_supersteps(odd),  # type: ignore[arg-type]
        lambda: builder.register_types(odd),  # type: ignore[arg-type]
        lambda: builder.add_edge("a", "b", condition=odd),  # type: ignore[arg-type]
    ):
        with pytest.raises(UsageError):
            build()


# --- outside tester 155 --------------------------------------------------------------------------


@pytest.mark.parametrize("store", ["runs.db", None, 5], ids=["a path", "None", "5"])
def test_a_runtime_needs_a_store(store: Any) -> None:
    """A path given for a store was taken, and every later call -- ``close()`` too -- was a
    bare ``AttributeError``."""
    with pytest.raises(UsageError, match="Runtime takes a run store -- SqliteStore"):
        Runtime(store)


async def test_prune_refuses_a_time_past_what_the_store_holds_as_a_float_too() -> None:
    """``1e300`` and ``inf`` were taken (and deleted every finished run) where ``2**63`` was
    refused."""
    rt = runtime()
    for when in (1e19, 1e300, float("inf"), float("-inf")):
        with pytest.raises(UsageError, match="finished_before must be a time in seconds"):
            await rt.prune(finished_before=when)


def test_registering_an_executor_class_says_what_to_register() -> None:
    """It was called as a factory: a bare ``TypeError`` (``__init__`` missing its id)."""
    from workflow_engine import Executor

    class Writer(Executor):
        pass

    with pytest.raises(UsageError, match="not the executor class Writer: build a workflow"):
        runtime().register(Writer)  # type: ignore[arg-type]


async def test_a_checkpoint_or_responses_of_the_wrong_kind_are_usage_errors() -> None:
    """A checkpoint's JSON text for the checkpoint, or a list of ints for the responses, was
    an ``AttributeError`` (outside tester 170)."""
    wf = stepper_workflow()
    paused = await wf.run(0)
    assert paused.pending_requests
    text = paused.checkpoint.to_json()
    with pytest.raises(UsageError, match=r"takes a Checkpoint, not str -- read one .*from_json"):
        await wf.run(checkpoint=text)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="takes a Checkpoint, not dict"):
        await wf.cancel(checkpoint={"a": 1})  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="not both"):
        await wf.run(checkpoint=paused.checkpoint, checkpoint_id="x")
    with pytest.raises(UsageError, match="checkpoint_id= is a checkpoint's id"):
        await wf.run(checkpoint_id=5)  # type: ignore[arg-type]
    for responses in ([42], "abc", 42, {5: True}):
        with pytest.raises(UsageError, match="responses are a mapping of request id"):
            await wf.run(checkpoint=paused.checkpoint, responses=responses)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", [5, None, b"k"])
async def test_reading_state_with_a_key_that_is_not_text_is_a_usage_error(key: Any) -> None:
    """``set_state(5, ...)`` was refused, ``get_state(5)`` said "no value" (tester 170)."""
    said: list[str] = []

    class Reads(Executor):
        @handler
        async def on(self, message: str, ctx: WorkflowContext[None]) -> None:
            for read in (ctx.get_state, ctx.get_shared):
                try:
                    await read(key)
                except UsageError as exc:
                    said.append(str(exc))

    await WorkflowBuilder(start=Reads("r")).build().run("go")
    assert len(said) == 2 and all("state keys are text" in s for s in said), said


@pytest.mark.parametrize("name", ["", "  ", 5, "\ud800"])
def test_a_type_tag_given_is_non_blank_text(name: Any) -> None:
    with pytest.raises(UsageError, match="name= is a tag"):
        WorkflowBuilder(start=Noop("n")).register_types(Noop, name=name)


@pytest.mark.parametrize("given", [5, b"x", "", "checkpoint info"])
async def test_fork_takes_a_checkpoint_id_as_text(given: Any) -> None:
    """``history()``'s ``CheckpointInfo`` given as the id was a raw SQLite binding error, and
    ``""`` said the run had no latest checkpoint (outside tester 173)."""
    rt = runtime()
    run = await rt.run("stepper", 0)
    [info, *_] = await rt.history(run.run_id)
    with pytest.raises(UsageError, match="checkpoint_id is a checkpoint's id"):
        await rt.fork(run.run_id, checkpoint_id=info if given == "checkpoint info" else given)
