"""A process that restarts to resume runs pays only for what it uses (issue 12).

Fresh interpreters check which modules importing the engine and building workflows load (no
timing asserts: the figures live in ``benchmarks/bench_w4_pause_resume.py``); the caches that
make a build cheap are checked for giving each graph and each class its own answer.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest

from workflow_engine import (
    EdgeTypeMismatchError,
    Executor,
    FunctionExecutor,
    RequestPort,
    UnreachableExecutorError,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    handler,
)
from workflow_engine._registry import adapter_for

ROOT = Path(__file__).resolve().parents[2]
NOT_AT_RESTART = ("networkx", "sqlalchemy", "workflow_engine.storage._memory")
"""Modules a process resuming runs from SQLite must not load to import and build: graph and
schema libraries, and the in-memory store."""


def loaded_after(code: str) -> dict[str, bool]:
    """Which of ``NOT_AT_RESTART`` are in ``sys.modules`` after ``code`` runs in a fresh
    interpreter (from the repository root, like the CLI and the benchmarks)."""
    report = f"print(json.dumps({{m: m in sys.modules for m in {NOT_AT_RESTART!r}}}))"
    probe = f"{code}\nimport json, sys\n{report}"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded: dict[str, bool] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


W4 = textwrap.dedent(
    """
    import workflow_engine, workflow_engine.storage
    from workflow_engine import Executor, RequestPort, WorkflowBuilder, WorkflowContext, handler

    class Start(Executor):
        @handler
        async def on_topic(self, topic: str, ctx: WorkflowContext[str]) -> None: ...

    class End(Executor):
        @handler
        async def on_verdict(self, ok: bool, ctx: WorkflowContext[None, str]) -> None: ...

    start, end = Start("start"), End("end")
    review = RequestPort("review", request_type=str, response_type=bool)
    WorkflowBuilder("w4", start=start).add_edge(start, review).add_edge(review, end).build()
    """
)


def test_importing_the_engine_and_the_sqlite_store_loads_no_heavy_library() -> None:
    assert loaded_after("import workflow_engine, workflow_engine.storage") == dict.fromkeys(
        NOT_AT_RESTART, False
    )


def test_building_the_w4_workflow_loads_no_heavy_library() -> None:
    assert loaded_after(W4) == dict.fromkeys(NOT_AT_RESTART, False)


def test_building_the_support_handoff_demo_loads_no_heavy_library() -> None:
    code = (
        "import workflow_engine.storage\n"
        "from workflow_engine_cli.demos.support_handoff import build_support_workflow\n"
        "build_support_workflow(offline=True)"
    )
    assert loaded_after(code) == dict.fromkeys(NOT_AT_RESTART, False)


def test_the_in_memory_store_is_still_importable_by_name() -> None:
    assert loaded_after("from workflow_engine.storage import InMemoryRunStore")[
        "workflow_engine.storage._memory"
    ]
    import workflow_engine.storage as storage

    assert storage.InMemoryRunStore.__module__ == "workflow_engine.storage._memory"


def modules_after(code: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules starting with one of ``prefixes`` in ``sys.modules`` after ``code`` runs in a
    fresh interpreter."""
    report = f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))"
    probe = f"{code}\nimport json, sys\n{report}"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


LAZY_PREFIXES = ("workflow_engine", "pydantic", "anyio", "asyncio", "sqlite3", "sqlalchemy")


def test_importing_the_packages_loads_none_of_their_submodules() -> None:
    """Public names are imported on first use (PEP 562): the bare imports load no kernel module,
    no store, no executor, and none of the libraries those need."""
    code = "import workflow_engine, workflow_engine.storage, workflow_engine.executors"
    assert modules_after(code, LAZY_PREFIXES) == [
        "workflow_engine",
        "workflow_engine._lazy",  # the hook the three install (importlib alone)
        "workflow_engine.executors",
        "workflow_engine.storage",
    ]


def test_a_name_loads_only_what_its_module_needs() -> None:
    errors = modules_after("from workflow_engine import RunNotFoundError", LAZY_PREFIXES)
    assert errors == ["workflow_engine", "workflow_engine._errors", "workflow_engine._lazy"]
    scripted = modules_after(
        "from workflow_engine.executors import ScriptedChatClient", ("workflow_engine.executors",)
    )
    assert "workflow_engine.executors._openai" not in scripted


# --- reachability without a graph library -------------------------------------------------------


class Count(Executor):
    @handler
    async def on_int(self, n: int, ctx: WorkflowContext[int]) -> None: ...


def test_nodes_reached_only_through_a_loop_or_a_port_are_reachable() -> None:
    a, b, c = Count("a"), Count("b"), Count("c")
    port = RequestPort("ask", request_type=int, response_type=int)
    workflow = (
        WorkflowBuilder(start=a).add_edge(a, b).add_edge(b, a).add_edge(b, port).add_edge(port, c)
    ).build()
    assert [e.id for e in workflow.executors] == ["a", "b", "c"]


def test_an_unreachable_cycle_names_each_of_its_nodes_in_declaration_order() -> None:
    a, b, c, d = Count("a"), Count("b"), Count("c"), Count("d")
    builder = WorkflowBuilder(start=a).add_edge(a, b).add_edge(d, c).add_edge(c, d).add_edge(c, b)
    with pytest.raises(UnreachableExecutorError, match=r"'d', 'c' cannot be reached.*'a'"):
        builder.build()


# --- caches give each graph and each class its own answer ---------------------------------------


@dataclasses.dataclass
class Parcel:
    weight: float


@dataclasses.dataclass
class Letter:
    text: str


class Weigh(Executor):
    @handler
    async def on_parcel(self, parcel: Parcel, ctx: WorkflowContext[Parcel]) -> None: ...


class Read(Executor):
    @handler
    async def on_letter(self, letter: Letter, ctx: WorkflowContext[Letter]) -> None: ...


def test_two_graphs_built_in_one_process_keep_their_own_types_and_signatures() -> None:
    parcels = WorkflowBuilder("p", start=Weigh("w")).add_edge("w", Weigh("w2")).build()
    letters = WorkflowBuilder("p", start=Read("w")).add_edge("w", Read("w2")).build()
    assert parcels.signature != letters.signature
    assert parcels.registry.resolve("Parcel") is Parcel
    assert parcels.registry.resolve("Letter") is None
    assert letters.registry.resolve("Letter") is Letter
    assert letters.registry.resolve("Parcel") is None
    assert parcels.codec.decode(parcels.codec.encode(Parcel(2.5))) == Parcel(2.5)
    assert letters.codec.decode(letters.codec.encode(Letter("hi"))) == Letter("hi")


def test_a_class_adapter_is_shared_while_used_and_let_go_after() -> None:
    @dataclasses.dataclass
    class Local:
        n: int

    first = adapter_for(Local)
    assert adapter_for(Local) is first
    assert adapter_for(Parcel) is not first
    assert first.validate_python({"n": 1}) == Local(1)
    del first
    gc.collect()
    # the cache held it weakly: a fresh one is built (and works) when asked again
    assert adapter_for(Local).validate_python({"n": 2}) == Local(2)


@dataclasses.dataclass
class Box:
    item: Later


EARLY_ADAPTER = adapter_for(Box)  # built while ``Later`` does not exist yet


@dataclasses.dataclass
class Later:
    size: int


def test_a_cached_adapter_built_before_a_forward_reference_resolves_it_later() -> None:
    assert adapter_for(Box) is EARLY_ADAPTER
    assert EARLY_ADAPTER.validate_python({"item": {"size": 3}}) == Box(Later(3))


class EarlyExecutor(Executor):
    """Its handler names a class defined further down this module."""

    @handler
    async def on_late(self, message: LateMessage, ctx: WorkflowContext[LateMessage]) -> None: ...


@dataclasses.dataclass
class LateMessage:
    body: str


def test_a_handler_type_defined_after_the_executor_class_is_resolved() -> None:
    workflow = WorkflowBuilder(start=EarlyExecutor("e")).add_edge("e", EarlyExecutor("f")).build()
    assert workflow.executors[0].input_types == (LateMessage,)
    assert workflow.registry.resolve("LateMessage") is LateMessage


async def shout(text: str, ctx: WorkflowContext[str]) -> None: ...


def test_a_function_executor_reads_its_hints_once_and_a_wrapper_gets_its_own() -> None:
    first, second = FunctionExecutor(shout), FunctionExecutor(shout, id="again")
    assert first.handlers[0] is second.handlers[0]

    @functools.wraps(shout)  # copies shout.__dict__, the cached spec included
    async def wrapper(text: str, ctx: WorkflowContext[str]) -> None: ...

    wrapped = FunctionExecutor(wrapper)
    assert wrapped.handlers[0].func is wrapper  # the wrapper runs, not what it wraps
    assert first.handlers[0].func is shout


def test_a_function_executor_rereads_hints_that_changed() -> None:
    async def echo(text: str, ctx: WorkflowContext[str]) -> None: ...

    assert FunctionExecutor(echo).input_types == (str,)
    echo.__annotations__ = {"text": int, "ctx": WorkflowContext[int], "return": None}
    assert FunctionExecutor(echo).input_types == (int,)


class Charge(Executor):
    @handler
    async def charge(self, order: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(f"charged {order}")


class Receipt(Executor):
    @handler
    async def keep(self, said: str, ctx: WorkflowContext[None, str]) -> None:
        await ctx.yield_output(said)


def build_charge() -> Workflow:
    charge, receipt = Charge("charge"), Receipt("receipt")
    return WorkflowBuilder("charge", start=charge).add_edge(charge, receipt).build()


@handler
async def pretend(self: Charge, order: str, ctx: WorkflowContext[str]) -> None:
    await ctx.send_message(f"pretended {order}")


@handler
async def counts(self: Charge, order: int, ctx: WorkflowContext[int]) -> None: ...


@pytest.mark.anyio
async def test_a_build_sees_a_handler_patched_after_an_earlier_build() -> None:
    """A handler replaced after a build (``mock.patch.object`` in a test) was not seen by the
    next build, the replaced one ran; after the patch ended, the patch ran on (outside tester
    147). Each build reads the class as it is then -- types too."""
    assert (await build_charge().run("o1")).outputs == ["charged o1"]
    with mock.patch.object(Charge, "charge", pretend):
        assert (await build_charge().run("o2")).outputs == ["pretended o2"]
    assert (await build_charge().run("o3")).outputs == ["charged o3"]
    with mock.patch.object(Charge, "charge", counts), pytest.raises(EdgeTypeMismatchError):
        build_charge()
    assert (await build_charge().run("o4")).outputs == ["charged o4"]


OPEN_AND_READ = textwrap.dedent(
    """
    import asyncio, json, sys, threading
    from workflow_engine.storage import SqliteStore

    async def main(path):
        store = SqliteStore(path)
        await store.open()
        threads = [t.name for t in threading.enumerate() if t.name.startswith("workflow-engine")]
        runs = await store.list_runs()
        await store.close()
        return {{
            "sqlalchemy": "sqlalchemy" in sys.modules,
            "threads": threads,
            "runs": len(runs),
        }}

    print(json.dumps(asyncio.run(main({path!r}))))
    """
)


def open_in_fresh_process(path: Path) -> dict:
    code = OPEN_AND_READ.format(path=str(path))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_opening_an_existing_store_loads_no_sqlalchemy_and_starts_no_thread(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.db"
    # a new database: the schema is created (SQLAlchemy), on the store's worker thread
    created = open_in_fresh_process(path)
    assert created == {"sqlalchemy": True, "threads": ["workflow-engine-sqlite:runs.db"], "runs": 0}
    reopened = open_in_fresh_process(path)  # current schema: opened on the event loop
    assert reopened == {"sqlalchemy": False, "threads": [], "runs": 0}
