"""Durable runs on real SQLite files: pause, answer from anywhere, resume in a new Runtime."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Never
from uuid import UUID

import pytest
from pydantic import BaseModel, ConfigDict, field_validator

from tests.integration.askers import asker_workflow
from tests.integration.workflows import (
    Answer,
    Ticket,
    changed_stepper_workflow,
    exploding_workflow,
    stepper_workflow,
)
from workflow_engine import (
    AnswerOutcome,
    DefinitionError,
    Executor,
    RequestAlreadyAnsweredError,
    RequestCancelledError,
    ResponseTypeError,
    RunNotFoundError,
    RunNotResumableError,
    Runtime,
    SignatureMismatchError,
    UnknownRequestError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowNotRegisteredError,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]

EXPECTED = "done: seen=[1, 2, 3, 4, 5, 6] total=21"


def open_runtime(path: Path, *factories) -> Runtime:
    rt = Runtime(SqliteStore(path))
    for factory in factories or (stepper_workflow, exploding_workflow):
        rt.register(factory)
    return rt


async def test_pause_answer_and_resume_across_runtimes(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    first = open_runtime(db)
    run_id = await first.start("stepper", 1)
    assert (await first.get_run(run_id)).status is WorkflowRunState.IN_PROGRESS
    paused = await first.resume(run_id)
    assert paused.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    await first.close()

    second = open_runtime(db)  # e.g. an approval UI in another process
    (pending,) = await second.pending_requests()
    assert pending.run_id == run_id and pending.data.question == "continue after 3?"
    assert await second.respond(pending.request_id, {"approved": True}) is AnswerOutcome.STORED
    await second.close()

    third = open_runtime(db)
    done = await third.resume(run_id)
    assert done.status is WorkflowRunState.IDLE and done.outputs == [EXPECTED]
    info = await third.get_run(run_id)
    assert info.status is WorkflowRunState.IDLE and info.outputs == [EXPECTED]
    assert info.pending_requests == [] and info.superstep == 7
    with pytest.raises(RunNotResumableError, match="idle"):
        await third.resume(run_id)
    await third.close()


async def test_answers_are_validated_and_single_valued(tmp_path: Path) -> None:
    rt = open_runtime(tmp_path / "runs.db")
    paused = await rt.run("stepper", 1)
    rid = paused.pending_requests[0].request_id
    with pytest.raises(UnknownRequestError, match="'nope'"):
        await rt.respond("nope", {"approved": True})
    with pytest.raises(ResponseTypeError, match=f"run '{paused.run_id}', request '{rid}'"):
        await rt.respond(rid, {"approved": "perhaps"})
    assert await rt.respond(rid, Answer(approved=False, note="stop")) is AnswerOutcome.STORED
    assert await rt.respond(rid, {"approved": False, "note": "stop"}) is AnswerOutcome.DUPLICATE
    with pytest.raises(RequestAlreadyAnsweredError, match=rid):
        await rt.respond(rid, {"approved": True})
    done = await rt.resume(paused.run_id)
    assert done.outputs == ["stopped at 3: stop"]
    # answering an applied request again is still a no-op, not a second execution
    assert await rt.respond(rid, {"approved": False, "note": "stop"}) is AnswerOutcome.DUPLICATE
    await rt.close()


class Open(BaseModel):
    """An answer type that takes extra fields."""

    model_config = ConfigDict(extra="allow")
    approved: bool


class Asker(Executor):
    @handler
    async def ask(self, question: str, ctx: WorkflowContext[Never, Open]) -> None:
        await ctx.request_info(question, Open)

    @response_handler
    async def answered(
        self, question: str, answer: Open, ctx: WorkflowContext[Never, Open]
    ) -> None:
        await ctx.yield_output(answer)


async def test_an_answer_naming_a_field_its_type_lacks_is_refused(tmp_path: Path) -> None:
    """A reviewer's typo ("nots" for "note") is refused, naming the key -- not dropped while
    the run goes on without it -- and nothing is stored. A type that declares
    ``extra="allow"`` takes extra keys, as it says."""
    rt = open_runtime(tmp_path / "runs.db")
    paused = await rt.run("stepper", 1)
    rid = paused.pending_requests[0].request_id
    with pytest.raises(ResponseTypeError, match=r"expected Answer: nots: Answer has no such"):
        await rt.respond(rid, {"approved": False, "nots": "too long"})
    (pending,) = await rt.pending_requests()
    assert pending.request_id == rid and pending.status == "pending"
    # an instance of another class is named as such (it used to be its str(): "Input should
    # be an object")
    with pytest.raises(ResponseTypeError, match=r"expected Answer, not Open: answer with the"):
        await rt.respond(rid, Open(approved=False))
    assert await rt.respond(rid, {"approved": False, "note": "too long"}) is AnswerOutcome.STORED
    assert (await rt.resume(paused.run_id)).outputs == ["stopped at 3: too long"]
    await rt.close()

    workflow = WorkflowBuilder("open", start=Asker("asker")).build()
    result = await workflow.run("may I?")
    (request,) = result.pending_requests
    done = await workflow.run(
        checkpoint=result.checkpoint,
        responses={request.request_id: {"approved": True, "why": "fine"}},
    )
    (answer,) = done.outputs
    assert answer == Open(approved=True, why="fine")


class Loose(BaseModel):
    """An answer with a free-form part: what a Python caller puts there keeps its own types."""

    approved: bool
    extra: dict[str, Any] = {}


class Approved(BaseModel):
    note: str


class Rejected(BaseModel):
    note: str


class LooseAsker(Executor):
    @handler
    async def ask(self, question: str, ctx: WorkflowContext[Never, Loose]) -> None:
        await ctx.request_info(question, Loose)

    @response_handler
    async def answered(
        self, question: str, answer: Loose, ctx: WorkflowContext[Never, Loose]
    ) -> None:
        await ctx.yield_output(answer)


_SEEN_ALIKE = {  # what a Python caller answered, and what a JSON client sends back for it
    "tuple, list": ((1, "a"), [1, "a"]),
    "list, tuple": ([1, "a"], (1, "a")),
    "set, list": ({3, 1, 2}, [1, 2, 3]),
    "Decimal, text": (Decimal("1.10"), "1.10"),
    "bytes, base64": (b"\x00hi", base64.b64encode(b"\x00hi").decode()),
    "datetime, ISO text": (datetime(2024, 5, 1, 12, 30), "2024-05-01T12:30:00"),
    "UUID, text": (UUID(int=7), str(UUID(int=7))),
    "nested": ({"k": (1, {2})}, {"k": [1, [2]]}),
}
_SEEN_APART = {
    "1, True": (1, True),
    "tuple, reordered list": ((1, 2), [2, 1]),
    "text, number": ("1.10", 1.1),
    "empty tuple, null": ((), None),
    # what the wire shows alike but are different answers (outside tester 97)
    "inf, -inf": (float("inf"), float("-inf")),
    "inf, null": (float("inf"), None),
    "nan, null": (float("nan"), None),
    "a marker-like dict, a tuple": ({"$tuple": [1, 2]}, (1, 2)),
    "two classes, the same fields": (Approved(note="x"), Rejected(note="x")),
    # keys the wire writes as the same text (outside tester 98)
    "keys inf, None": ({float("inf"): 1}, {None: 1}),
    "keys inf, 'inf'": ({float("inf"): 1}, {"inf": 1}),
}


@pytest.mark.parametrize("case", [*_SEEN_ALIKE, *_SEEN_APART])
async def test_the_same_answer_as_json_sees_it_is_the_same_answer(
    tmp_path: Path, case: str
) -> None:
    """A tuple answered by a Python caller and the list a JSON client sends back for it (the
    wire shows tuples and sets as lists, Decimals and bytes as text) are one answer: the second
    was refused as a different one (outside tester 96). Before the run applies the answer
    (kept whole) and after (kept as a digest), in the store and in the runtime alike."""
    first, second = _SEEN_ALIKE.get(case) or _SEEN_APART[case]
    same = case in _SEEN_ALIKE
    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(
        lambda: (
            WorkflowBuilder("loose", start=LooseAsker("asker"))
            .register_types(Approved, Rejected)
            .build()
        )
    )
    try:
        paused = await rt.run("loose", "may I?")
        rid = paused.pending_requests[0].request_id
        stored = await rt.respond(rid, Loose(approved=True, extra={"v": first}))
        assert stored is AnswerOutcome.STORED
        for when in ("stored", "applied"):
            again = {"approved": True, "extra": {"v": second}}
            if same:
                assert await rt.respond(rid, again) is AnswerOutcome.DUPLICATE, when
            else:
                with pytest.raises(RequestAlreadyAnsweredError):
                    await rt.respond(rid, again)
            if when == "stored":
                done = await rt.resume(paused.run_id)
                kept = done.outputs[0].extra["v"]
                assert kept == first or (kept != kept and first != first)  # (nan)
    finally:
        await rt.close()


async def test_bytes_answered_as_json_text_are_the_base64_the_wire_shows(tmp_path: Path) -> None:
    """A JSON client answers a bytes-typed request with the base64 text the wire shows bytes
    as; that text was read as UTF-8 (pydantic's default), so the wire's own form of an answer
    was a different answer, and raw text passed for the same one (outside tester 97)."""
    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(lambda: asker_workflow("bytes", list[bytes]))
    try:
        paused = await rt.run("bytes", "a file?")
        rid = paused.pending_requests[0].request_id
        with pytest.raises(ResponseTypeError, match=rf"request '{rid}': expected .*base64"):
            await rt.respond(rid, ["not base64!"])
        assert await rt.respond(rid, [b"\x00hi", b"\xff"]) is AnswerOutcome.STORED
        shown = [base64.b64encode(b).decode() for b in (b"\x00hi", b"\xff")]
        assert await rt.respond(rid, shown) is AnswerOutcome.DUPLICATE
        with pytest.raises(RequestAlreadyAnsweredError):
            await rt.respond(rid, ["AGhp", "/w=="[:2] + "8="])
        assert (await rt.resume(paused.run_id)).outputs == [[b"\x00hi", b"\xff"]]
        again = await rt.run("bytes", "another?")
        rid = again.pending_requests[0].request_id
        assert await rt.respond(rid, shown) is AnswerOutcome.STORED  # a JSON client first
        assert (await rt.resume(again.run_id)).outputs == [[b"\x00hi", b"\xff"]]
    finally:
        await rt.close()


@dataclass
class Upload:
    name: str
    body: bytes


async def test_a_plain_dataclass_s_bytes_are_base64_as_they_are_nested(tmp_path: Path) -> None:
    """A plain dataclass as the whole answer type read its bytes as UTF-8 text, though nested
    (``Upload | None``) it read them as base64, the wire's form (outside tester 99)."""
    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(lambda: asker_workflow("upload", Upload))
    try:
        paused = await rt.run("upload", "a file?")
        rid = paused.pending_requests[0].request_id
        with pytest.raises(ResponseTypeError, match=r"expected Upload: body: Data should be valid"):
            await rt.respond(rid, {"name": "a", "body": "!!"})
        assert await rt.respond(rid, Upload("a", b"\x00hi")) is AnswerOutcome.STORED
        shown = {"name": "a", "body": base64.b64encode(b"\x00hi").decode()}
        assert await rt.respond(rid, shown) is AnswerOutcome.DUPLICATE
        assert (await rt.resume(paused.run_id)).outputs == [Upload("a", b"\x00hi")]
    finally:
        await rt.close()


@dataclass
class Tagged:
    tags: set[str]
    n: int = 0


async def test_a_plain_dataclass_answer_s_fields_are_checked_before_it_is_stored(
    tmp_path: Path,
) -> None:
    """A plain dataclass checks nothing when it is made: ``Tagged(tags={1, 2})`` was stored,
    every resume then failed to read it back (``StoredTypeChangedError``), and the right answer
    was refused as a different one -- the run stuck for good (outside tester 100)."""
    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(lambda: asker_workflow("tagged", Tagged))
    try:
        paused = await rt.run("tagged", "tags?")
        rid = paused.pending_requests[0].request_id
        said = rf"request '{rid}': .*would not read back \(data: Tagged does not validate: tags\.0"
        with pytest.raises(ResponseTypeError, match=said):
            await rt.respond(rid, Tagged(tags={1, 2}))  # type: ignore[arg-type]
        with pytest.raises(ResponseTypeError, match=r"expected Tagged: n: Input should be a valid"):
            await rt.respond(rid, {"tags": {"a"}, "n": "x"})  # (Python values: the field named)
        assert await rt.respond(rid, Tagged(tags={"a"})) is AnswerOutcome.STORED
        assert (await rt.resume(paused.run_id)).outputs == [Tagged(tags={"a"})]
    finally:
        await rt.close()


def as_text_tags(answer: Tagged) -> Tagged:
    """A node's own rule that mends what its type would refuse: its tags as text."""
    return Tagged(tags={str(tag) for tag in answer.tags}, n=answer.n)


class SplitTags(BaseModel):
    """A model whose validator fails on its own stored form (a list has no ``split``)."""

    tags: list[str]

    @field_validator("tags", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        return value.split(",")


async def test_what_would_not_read_back_is_refused_after_the_node_s_own_rules(
    tmp_path: Path,
) -> None:
    """The read-back check runs on the answer as it is kept: a node's ``validate_response``
    may still mend it (the check ran before the hook, and refused what the hook mended:
    outside tester 101); a model whose validator fails on its own stored form is refused too
    (it was stored, and every resume said the store was damaged)."""
    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(lambda: asker_workflow("mended", Tagged, mend=as_text_tags))
    rt.register(lambda: asker_workflow("split", SplitTags))
    try:
        paused = await rt.run("mended", "tags?")
        rid = paused.pending_requests[0].request_id
        done = await rt.respond_and_resume(rid, Tagged(tags={1, 2}))  # type: ignore[arg-type]
        assert done.outputs == [Tagged(tags={"1", "2"})]
        paused = await rt.run("split", "tags?")
        rid = paused.pending_requests[0].request_id
        with pytest.raises(ResponseTypeError, match=r"not read back \(data: SplitTags cannot"):
            await rt.respond(rid, SplitTags(tags="a,b"))  # type: ignore[arg-type]
        assert (await rt.get_request(rid)).status == "pending"
    finally:
        await rt.close()


async def test_a_set_answer_s_items_are_checked(tmp_path: Path) -> None:
    """A ``frozenset[bytes]`` answer of strings passed the fast type check (the set alone was
    checked, not its items) and reached the handler as strings (outside tester 99)."""
    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    rt.register(lambda: asker_workflow("set", frozenset[bytes]))
    try:
        paused = await rt.run("set", "files?")
        rid = paused.pending_requests[0].request_id
        # (Python values are validated as in Python: a str is its UTF-8, as model_validate has it)
        assert await rt.respond(rid, frozenset({"AGhp"})) is AnswerOutcome.STORED
        assert (await rt.resume(paused.run_id)).outputs == [frozenset({b"AGhp"})]
    finally:
        await rt.close()


async def test_resume_with_nothing_answered_stays_paused(tmp_path: Path) -> None:
    rt = open_runtime(tmp_path / "runs.db")
    paused = await rt.run("stepper", 1)
    again = await rt.resume(paused.run_id)
    assert again.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
    assert [r.request_id for r in again.pending_requests] == [
        r.request_id for r in paused.pending_requests
    ]
    await rt.close()


async def test_stranded_runs_are_the_unfinished_ones_in_the_order_they_were_started(
    tmp_path: Path,
) -> None:
    """Read status by status (every run was read, finished ones too: 0.7 s at 100,000, outside
    tester 119): paused, failed and stopped runs of a workflow not registered are stranded, a
    finished or cancelled one is not."""
    db = tmp_path / "runs.db"
    rt = open_runtime(db)
    paused = await rt.run("stepper", 1)
    finished = await rt.run("stepper", 1)
    await rt.respond(finished.pending_requests[0].request_id, Answer(approved=True))
    assert (await rt.resume(finished.run_id)).status is WorkflowRunState.IDLE
    failed = await rt.run("exploding", 1)
    assert failed.status is WorkflowRunState.FAILED
    cancelled = await rt.run("stepper", 1)
    await rt.cancel(cancelled.run_id)
    stopped = await rt.run("stepper", 1, max_supersteps=1)
    assert stopped.status is WorkflowRunState.MAX_SUPERSTEPS_REACHED
    await rt.close()
    bare = Runtime(SqliteStore(db))
    try:
        stranded = [r.run_id for r in await bare.stranded_runs()]
        assert stranded == [paused.run_id, failed.run_id, stopped.run_id]
    finally:
        await bare.close()


async def test_stranded_runs_started_at_one_instant_are_in_the_store_s_order(
    tmp_path: Path,
) -> None:
    """Runs stamped with the same creation time are listed as ``list_runs`` lists them (by run
    id), not grouped by status (outside tester 120)."""
    db = tmp_path / "runs.db"
    rt = Runtime(SqliteStore(db, clock=lambda: 1_800_000_000.0))
    rt.register(stepper_workflow)
    rt.register(exploding_workflow)
    for _ in range(4):
        await rt.run("exploding", 1)
        await rt.run("stepper", 1)
        await rt.run("stepper", 1, max_supersteps=1)
    listed = [r.run_id for r in await rt.store.list_runs()]
    await rt.close()
    bare = Runtime(SqliteStore(db))
    try:
        assert [r.run_id for r in await bare.stranded_runs()] == listed
    finally:
        await bare.close()


async def test_changed_graph_strands_the_run_with_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    rt = open_runtime(db)
    paused = await rt.run("stepper", 1)
    old_signature = rt.workflow("stepper").signature
    await rt.close()
    changed = open_runtime(db, changed_stepper_workflow)
    with pytest.raises(SignatureMismatchError) as info:
        await changed.resume(paused.run_id)
    message = str(info.value)
    assert paused.run_id in message and old_signature in message
    assert changed.workflow("stepper").signature in message
    assert [r.run_id for r in await changed.stranded_runs()] == [paused.run_id]
    unregistered = open_runtime(db, exploding_workflow)
    with pytest.raises(WorkflowNotRegisteredError, match="'stepper'"):
        await unregistered.resume(paused.run_id)
    await changed.close()
    await unregistered.close()


async def test_a_workflow_is_registered_under_its_own_name_only(tmp_path: Path) -> None:
    """Runs are stored with their workflow's name: an alias would admit runs that no process
    could resume, and a second graph under one name would resume the first one's runs."""
    rt = Runtime(SqliteStore(tmp_path / "runs.db"))
    with pytest.raises(DefinitionError, match="'stepper' as 'stepper_v2'"):
        rt.register(stepper_workflow, name="stepper_v2")
    assert rt.workflow_names == []
    assert rt.register(stepper_workflow, name="stepper") == "stepper"
    assert rt.register(stepper_workflow) == "stepper"  # the same graph again: fine
    with pytest.raises(DefinitionError, match="different workflow named 'stepper'"):
        rt.register(changed_stepper_workflow)
    paused = await rt.run("stepper", 1)  # the first graph is still the one registered
    await rt.respond(paused.pending_requests[0].request_id, {"approved": True})
    assert (await rt.resume(paused.run_id)).outputs == [EXPECTED]
    await rt.close()


async def test_fork_travels_back_and_leaves_the_original_alone(tmp_path: Path) -> None:
    rt = open_runtime(tmp_path / "runs.db")
    paused = await rt.run("stepper", 1)
    await rt.respond(paused.pending_requests[0].request_id, {"approved": True})
    done = await rt.resume(paused.run_id)
    assert done.outputs == [EXPECTED]
    history = await rt.history(paused.run_id)
    paused_at = next(i.superstep for i in history if i.status.value.startswith("idle_with"))
    fork_id = await rt.fork(paused.run_id, paused_at)
    fork = await rt.get_run(fork_id)
    assert fork.parent_run_id == paused.run_id
    (fork_request,) = fork.pending_requests
    assert fork_request.request_id != paused.pending_requests[0].request_id
    await rt.respond(fork_request.request_id, {"approved": False, "note": "alt"})
    alt = await rt.resume(fork_id)
    assert alt.outputs == ["stopped at 3: alt"]
    assert (await rt.get_run(paused.run_id)).outputs == [EXPECTED]
    await rt.close()


async def test_cancel_clears_pending_requests(tmp_path: Path) -> None:
    rt = open_runtime(tmp_path / "runs.db")
    paused = await rt.run("stepper", 1)
    rid = paused.pending_requests[0].request_id
    info = await rt.cancel(paused.run_id)
    assert info.status is WorkflowRunState.CANCELLED and info.pending_requests == []
    with pytest.raises(RequestCancelledError):
        await rt.respond(rid, {"approved": True})
    with pytest.raises(RunNotResumableError):
        await rt.resume(paused.run_id)
    assert await rt.pending_requests() == []
    await rt.close()


async def test_failed_run_records_the_error_and_can_retry_from_the_last_checkpoint(
    tmp_path: Path,
) -> None:
    rt = open_runtime(tmp_path / "runs.db")
    failed = await rt.run("exploding", 0)
    assert failed.status is WorkflowRunState.FAILED
    info = await rt.get_run(failed.run_id)
    assert info.status is WorkflowRunState.FAILED
    assert info.error["executor_id"] == "exploder" and "exploded at 2" in info.error["message"]
    assert info.superstep == 2
    again = await rt.resume(failed.run_id)  # the same bug fails the same way, nothing lost
    assert again.status is WorkflowRunState.FAILED
    assert [i.superstep for i in await rt.history(failed.run_id)] == [0, 1, 2]
    await rt.close()


async def test_max_supersteps_is_recorded_and_resumable(tmp_path: Path) -> None:
    rt = open_runtime(tmp_path / "runs.db")
    stopped = await rt.run("stepper", 4, max_supersteps=1)
    assert stopped.status is WorkflowRunState.MAX_SUPERSTEPS_REACHED
    assert (await rt.get_run(stopped.run_id)).status is WorkflowRunState.MAX_SUPERSTEPS_REACHED
    done = await rt.resume(stopped.run_id)
    assert done.outputs == ["done: seen=[4, 5, 6] total=15"]
    await rt.close()


async def test_unknown_run_is_a_clear_error(tmp_path: Path) -> None:
    rt = open_runtime(tmp_path / "runs.db")
    for call in (rt.get_run, rt.resume, rt.cancel, rt.history):
        with pytest.raises(RunNotFoundError, match="'ghost'"):
            await call("ghost")
    await rt.close()


async def test_get_run_shows_what_it_cannot_decode_as_stored(tmp_path: Path) -> None:
    """A runtime without the run's workflow, or with a changed graph, does not hide the run's
    outputs and pending requests: it shows them as stored and says so (``decoded``)."""
    db = tmp_path / "runs.db"
    rt = open_runtime(db)
    paused = await rt.run("stepper", 1)
    finished = await rt.run("stepper", 1)
    await rt.respond(finished.pending_requests[0].request_id, {"approved": True})
    assert (await rt.resume(finished.run_id)).outputs == [EXPECTED]
    mine = await rt.get_run(paused.run_id)
    assert mine.decoded and [type(r.data) for r in mine.pending_requests] == [Ticket]
    await rt.close()
    for outsider in (Runtime(SqliteStore(db)), open_runtime(db, changed_stepper_workflow)):
        waiting = await outsider.get_run(paused.run_id)
        assert not waiting.decoded
        (request,) = waiting.pending_requests
        assert request.request_id == paused.pending_requests[0].request_id
        assert request.data["data"] == {"step": 3, "question": "continue after 3?"}
        assert request.response_type.endswith("Answer")
        done = await outsider.get_run(finished.run_id)
        assert done.outputs == [EXPECTED] and done.pending_requests == [] and not done.decoded
        await outsider.close()
