"""A workflow whose code changed under its runs without its graph changing: a message or
answer class with a field added or renamed, under the same name. The stored values no longer
fit the classes; that is a code change, like a changed graph, not damage to the database.

It was reported as damage (``StoreCorruptError``: "does not decode"; the command line's exit 6,
AG-UI's ``store_corrupt``), and ``get_run`` -- a read -- raised it too (outside tester 96). Now
``resume`` raises ``StoredTypeChangedError`` (a ``SignatureMismatchError``: the run is stranded,
exit 5 on the command line), naming the run, the record and the field; ``get_run`` shows the
run as stored (``decoded=False``); nothing is written; and the code the run started with
continues it.
"""

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, model_validator

from workflow_engine import (
    Executor,
    Runtime,
    SignatureMismatchError,
    StoredTypeChangedError,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
    response_handler,
)
from workflow_engine.storage import SqliteStore

pytestmark = pytest.mark.anyio


def step_class(*, field_added: bool) -> type[BaseModel]:
    class Step(BaseModel):  # (one name, one place: the same class to the workflow's graph)
        __workflow_type__ = "Step"
        n: int
        if field_added:
            m: int

    return Step


def answer_class(*, field_renamed: bool) -> type[BaseModel]:
    if field_renamed:

        class Answer(BaseModel):
            __workflow_type__ = "Answer"
            okay: bool

    else:

        class Answer(BaseModel):  # type: ignore[no-redef]
            __workflow_type__ = "Answer"
            ok: bool

    return Answer


StepV1, StepV2 = step_class(field_added=False), step_class(field_added=True)
AnswerV1, AnswerV2 = answer_class(field_renamed=False), answer_class(field_renamed=True)


def build(step: type[BaseModel], answer: type[BaseModel]) -> WorkflowBuilder:
    class Looper(Executor):
        @handler
        async def go(self, msg: step, ctx: WorkflowContext[step, str]) -> None:  # type: ignore[valid-type]
            n = msg.n  # type: ignore[attr-defined]
            if n == 2:
                await ctx.request_info(f"go on after {n}?", answer)
            elif n < 4:
                await ctx.send_message(step.model_construct(n=n + 1, m=0))
            else:
                await ctx.yield_output(f"done at {n}")

        @response_handler
        async def answered(
            self,
            question: str,
            reply: answer,  # type: ignore[valid-type]
            ctx: WorkflowContext[step, str],  # type: ignore[valid-type]
        ) -> None:
            await ctx.send_message(step.model_construct(n=3, m=0))

    looper = Looper("looper")
    return WorkflowBuilder("looper", start=looper).add_edge(looper, looper)


def runtime(db: Path, step: type[BaseModel], answer: type[BaseModel]) -> Runtime:
    rt = Runtime(SqliteStore(db))
    rt.register(lambda: build(step, answer).build())
    return rt


async def test_a_class_changed_under_a_run_strands_it_and_damages_nothing(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    old = runtime(db, StepV1, AnswerV1)
    try:
        # one paused with its answer stored, not applied; one with a message in flight
        answered = await old.run("looper", StepV1(n=1))
        assert answered.pending_requests, (answered.status, answered.error)
        (request,) = answered.pending_requests
        await old.respond(request.request_id, AnswerV1(ok=True))
        in_flight = await old.start("looper", StepV1(n=3))
        signature = old.workflow("looper").signature
    finally:
        await old.close()

    for step, answer, run_id, what in (
        (StepV1, AnswerV2, answered.run_id, "'ok'"),  # the answer's field renamed
        (StepV2, AnswerV1, in_flight, "m"),  # the message's field added
    ):
        new = runtime(db, step, answer)
        try:
            assert new.workflow("looper").signature == signature  # (the graph is the same)
            before = await new.store.get_run(run_id)
            with pytest.raises(StoredTypeChangedError) as raised:
                await new.resume(run_id)
            said = str(raised.value)
            assert isinstance(raised.value, SignatureMismatchError)
            assert run_id in said and what in said and "code changed" in said, said
            if what == "m":  # (which record: the message, not only its checkpoint)
                assert "message 0 in flight (the run's input to 'looper')" in said, said
            after = await new.store.get_run(run_id)
            assert (after.status, after.superstep, after.owner) == (
                before.status,
                before.superstep,
                None,
            )
            # a read raised too; now it shows what it can: the paused run (its question reads
            # as before), the other as stored (its message in flight does not)
            info = await new.get_run(run_id)
            assert info.status is before.status and info.decoded is (what == "'ok'")
        finally:
            await new.close()

    old = runtime(db, StepV1, AnswerV1)
    try:
        for run_id in (answered.run_id, in_flight):
            done = await old.resume(run_id)
            assert done.status is WorkflowRunState.IDLE and done.outputs == ["done at 4"]
    finally:
        await old.close()


def note_class(*, field_removed: bool, renamed_reading_old: bool = False) -> type[BaseModel]:
    if renamed_reading_old:

        class Note(BaseModel):  # type: ignore[no-redef]
            __workflow_type__ = "Note"
            text: str = ""
            times: int

            @model_validator(mode="before")
            @classmethod
            def _from_older(cls, data: Any) -> Any:  # (records from before the rename)
                if isinstance(data, dict) and "seen" in data:
                    data = {**data, "times": data["seen"]}
                    del data["seen"]
                return data

    elif field_removed:

        class Note(BaseModel):  # type: ignore[no-redef]
            __workflow_type__ = "Note"
            text: str = ""

    else:

        class Note(BaseModel):  # type: ignore[no-redef]
            __workflow_type__ = "Note"
            text: str = ""
            seen: int

    return Note


def keeper(note: type[BaseModel]) -> WorkflowBuilder:
    """Keeps a note in its state at the first message, asks, and reads it back when answered."""

    class Keeper(Executor):
        @handler
        async def keep(self, text: str, ctx: WorkflowContext[str, str]) -> None:
            if text == "start":
                await ctx.set_state("note", note.model_construct(text="kept", seen=1))
                await ctx.request_info("go on?", bool)
            else:
                await ctx.yield_output(f"{text}: {await ctx.get_state('note')!r}")

        @response_handler
        async def answered(self, question: str, ok: bool, ctx: WorkflowContext[str, str]) -> None:
            await ctx.yield_output(f"read back {await ctx.get_state('note')!r}")

    return WorkflowBuilder("keeper", start=Keeper("keeper")).register_types(note)


async def test_a_field_removed_from_a_class_in_state_is_found_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    """A field removed from a class a run keeps in its state: validating the stored value
    dropped the field's value without a word, and the run went on (outside tester 97). Met
    mid-superstep (reading the state), the run was left ``in_progress``, looking interrupted:
    it is now left as it was. The inbox lists the other runs' requests all the same."""
    db = tmp_path / "runs.db"
    old = Runtime(SqliteStore(db))
    old.register(lambda: keeper(note_class(field_removed=False)).build())
    try:
        paused = await old.run("keeper", "start")
        assert paused.pending_requests, (paused.status, paused.error)
        (request,) = paused.pending_requests
        await old.respond(request.request_id, True)
    finally:
        await old.close()

    new = Runtime(SqliteStore(db))
    new.register(lambda: keeper(note_class(field_removed=True)).build())
    try:
        before = await new.store.get_run(paused.run_id)
        with pytest.raises(StoredTypeChangedError) as raised:
            await new.resume(paused.run_id)
        assert "'seen'" in str(raised.value) and paused.run_id in str(raised.value)
        after = await new.store.get_run(paused.run_id)
        assert (after.status, after.superstep, after.owner, after.error) == (
            before.status,
            before.superstep,
            None,
            None,
        )
        other = await new.run("keeper", "start")  # (its note is written by the new class)
        assert [r.run_id for r in await new.pending_requests()] == [other.run_id]
    finally:
        await new.close()

    old = Runtime(SqliteStore(db))
    old.register(lambda: keeper(note_class(field_removed=False)).build())
    try:
        done = await old.resume(paused.run_id)
        assert done.outputs == ["read back Note(text='kept', seen=1)"]
    finally:
        await old.close()


async def test_a_class_that_reads_its_old_field_names_continues_the_run(tmp_path: Path) -> None:
    """A rename the class itself reads old records under (a ``before`` model validator) is a
    migration, not a change that strands the run: the stored key the class has no field for is
    left to it (outside tester 98)."""
    db = tmp_path / "runs.db"
    old = Runtime(SqliteStore(db))
    old.register(lambda: keeper(note_class(field_removed=False)).build())
    try:
        paused = await old.run("keeper", "start")
        (request,) = paused.pending_requests
        await old.respond(request.request_id, True)
    finally:
        await old.close()
    new = Runtime(SqliteStore(db))
    new.register(lambda: keeper(note_class(field_removed=False, renamed_reading_old=True)).build())
    try:
        done = await new.resume(paused.run_id)
        assert done.outputs == ["read back Note(text='kept', times=1)"]
    finally:
        await new.close()


_SUBCLASS_APP = {
    "base.py": """
from pydantic import BaseModel


class Base(BaseModel):
    x: int
""",
    "hidden.py": """
from base import Base


class Hidden(Base):  # named by no annotation: registered when first stored
    secret: str = "s"
""",
    "twin.py": """
from base import Base


class Hidden(Base):  # another module's class of the same name
    other: int = 0
""",
    "app.py": """
import json
import sys
from typing import Never

import anyio

from base import Base
from workflow_engine import Executor, Runtime, WorkflowBuilder, WorkflowContext, handler
from workflow_engine.storage import SqliteStore


class Src(Executor):
    @handler
    async def go(self, m: str, ctx: WorkflowContext[Base]) -> None:
        import hidden  # (imported only here: a new process has not, until this runs)

        await ctx.send_message(hidden.Hidden(x=1, secret="kept"))


class Dst(Executor):
    @handler
    async def got(self, m: Base, ctx: WorkflowContext[Never, str]) -> None:
        await ctx.yield_output(repr(m))


def build():
    src = Src("src")
    return WorkflowBuilder(name="hid", start=src).add_edge(src, Dst("dst")).build()


async def main(db: str, how: str) -> None:
    if how == "imported":
        import hidden  # noqa: F401
    elif how == "both":
        import hidden  # noqa: F401
        import twin  # noqa: F401
    runtime = Runtime(SqliteStore(db))
    runtime.register(build)
    try:
        if how == "start":
            result = await runtime.run("hid", "go", run_id="r1", max_supersteps=1)
        else:
            result = await runtime.resume("r1")
        print(json.dumps({"outputs": result.outputs}))
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
    finally:
        await runtime.close()


anyio.run(main, sys.argv[1], sys.argv[2])
""",
}


@pytest.mark.slow
def test_a_subclass_whose_module_a_new_process_has_not_imported_is_named_so(
    tmp_path: Path,
) -> None:
    """A subclass no annotation names is registered when first stored, and found again in a
    new process among the imported subclasses of the class it extends. The resume said "the
    code changed since it was stored" -- it had not (outside tester 178): it says to import
    the class's module, and with it imported the run goes on."""
    import json
    import subprocess
    import sys

    for name, text in _SUBCLASS_APP.items():
        (tmp_path / name).write_text(text)
    db = str(tmp_path / "runs.db")

    def app(how: str) -> dict[str, Any]:
        done = subprocess.run(
            [sys.executable, "app.py", db, how],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return json.loads(done.stdout.strip().splitlines()[-1])

    assert app("start") == {"outputs": []}
    stranded = app("resume")
    assert stranded["error"] == "StoredTypeChangedError", stranded
    assert "names type 'Hidden'" in stranded["message"]
    assert "found again only once its module is imported" in stranded["message"]
    # another module's class of that name imported too: not damage (it said the store was
    # corrupt -- outside tester 185); the run waits for a process that can tell them apart
    both = app("both")
    assert both["error"] == "StoredTypeChangedError", both
    assert "fits several subclasses" in both["message"], both
    assert "the stored value is intact" in both["message"], both
    assert app("imported") == {"outputs": ["Hidden(x=1, secret='kept')"]}


def question_class(*, field_added: bool) -> type[BaseModel]:
    class Question(BaseModel):  # (one name, one place: the same class to the workflow's graph)
        __workflow_type__ = "Question"
        text: str
        if field_added:
            urgent: bool

    return Question


def asker(question: type[BaseModel]) -> WorkflowBuilder:
    class Asker(Executor):
        @handler
        async def ask(self, text: str, ctx: WorkflowContext[str, str]) -> None:
            await ctx.request_info(question.model_construct(text=text), bool)

        @response_handler
        async def answered(
            self,
            asked: question,  # type: ignore[valid-type]
            ok: bool,
            ctx: WorkflowContext[str, str],
        ) -> None:
            await ctx.yield_output(f"{asked.text}: {ok}")  # type: ignore[attr-defined]

    return WorkflowBuilder("asker", start=Asker("asker")).register_types(question)


async def test_a_resume_refused_for_a_changed_question_writes_nothing(tmp_path: Path) -> None:
    """A paused run whose question's class gained a field: ``respond`` and ``resume`` are
    refused, and the run's row was written all the same (its status again, with a new update
    time: it moved to the end of ``runs list`` as the run updated last -- outside tester 206).
    It is left as it was; the code the run started with answers and continues it."""
    db = tmp_path / "runs.db"
    old = Runtime(SqliteStore(db))
    old.register(lambda: asker(question_class(field_added=False)).build())
    try:
        paused = await old.run("asker", "refund order 7?")
        (request,) = paused.pending_requests
    finally:
        await old.close()

    new = Runtime(SqliteStore(db))
    new.register(lambda: asker(question_class(field_added=True)).build())
    try:
        before = await new.store.get_run(paused.run_id)
        with pytest.raises(StoredTypeChangedError):
            await new.respond(request.request_id, True)
        for _ in range(2):
            with pytest.raises(StoredTypeChangedError) as raised:
                await new.resume(paused.run_id)
            assert "urgent" in str(raised.value), raised.value
        after = await new.store.get_run(paused.run_id)
        # (but for its count of leases taken, which fences writers: each took one)
        assert dataclasses.replace(after, version=before.version) == before
    finally:
        await new.close()

    old = Runtime(SqliteStore(db))
    old.register(lambda: asker(question_class(field_added=False)).build())
    try:
        done = await old.respond_and_resume(request.request_id, True)
        assert done.outputs == ["refund order 7?: True"], (done.status, done.error)
    finally:
        await old.close()
