"""W4: pause on a request port, then answer and resume in a new process (start → port → end).

``start`` sends the topic to the ``RequestPort`` ``review`` (str → bool); the answer flows to
``end``, which yields the output. Reported (SQLite WAL, ``synchronous=NORMAL``, a fresh file):

* **pause**: ``runtime.run(...)`` until ``IDLE_WITH_PENDING_REQUESTS`` in a warm process (admit +
  lease + one committed superstep + release), median; and the same as ``start`` (admit) followed
  by ``resume`` (lease + restore + superstep + release), timed separately;
* **resume in a new process**: a subprocess per sample builds ``SqliteStore`` + ``Runtime``,
  registers the workflow, opens the store, ``respond``s and ``resume``s to completion -- timed
  inside the subprocess after its imports (cold: first database use in that process), then a
  second paused run in the same subprocess (warm);
* **build in a new process**: a subprocess per sample builds one workflow -- the W4 graph
  (``build_review``) or the support-handoff demo (``workflow_engine_cli.demos.support_handoff``:
  three agents, offline) -- timed after its imports (the first build in that process: what a
  restart pays), then the same build again in that process (warm);
* **import**: ``import workflow_engine, workflow_engine.storage`` in a fresh interpreter
  (``perf_counter`` around the import, median): as this environment runs it, with a bytecode
  cache (what an installed package pays: ``PYTHONDONTWRITEBYTECODE`` would otherwise compile our
  modules on every start); since public names are imported on first use (PEP 562), also with
  the names a resuming process uses (``Runtime``, ``WorkflowBuilder``, ..., ``SqliteStore``:
  what such a process pays at least); and the floor -- the dependencies alone (pydantic and one
  model, asyncio, anyio, sqlite3) -- interleaved; and the import self time per package of those
  names (``python -X importtime``).

    .venv/bin/python benchmarks/bench_w4_pause_resume.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from _durable import open_store, temp_dir

from workflow_engine import (
    Executor,
    RequestPort,
    Runtime,
    Workflow,
    WorkflowBuilder,
    WorkflowContext,
    WorkflowRunState,
    handler,
)
from workflow_engine.storage import SqliteStore

START_MESSAGE = "supersteps"
ANSWER = True
ROOT = Path(__file__).resolve().parent.parent
IMPORT_CODE = "import workflow_engine, workflow_engine.storage"
"""Issue 12's figure. Public names are imported on first use (PEP 562), so this alone loads
almost nothing: ``USED_CODE`` is what a process that resumes runs pays at least."""
USED_CODE = (
    "import workflow_engine, workflow_engine.storage\n"
    "from workflow_engine import Executor, RequestPort, Runtime, WorkflowBuilder, "
    "WorkflowContext, handler\n"
    "from workflow_engine.storage import SqliteStore\n"
)
DEPS_CODE = (
    "import asyncio, sqlite3, anyio, sniffio\n"
    "from pydantic import BaseModel\n"
    "class M(BaseModel):\n    x: int\n"
)
"""What importing the engine costs at least: the packages it needs, and one pydantic model
(pydantic imports most of its machinery when the first model class is built)."""


class Start(Executor):
    @handler
    async def on_topic(self, topic: str, ctx: WorkflowContext[str]) -> None:
        await ctx.send_message(f"A note about {topic}.")


class End(Executor):
    @handler
    async def on_verdict(self, approved: bool, ctx: WorkflowContext[None, str]) -> None:
        await ctx.yield_output("published" if approved else "dropped")


def build_review() -> Workflow:
    start, end = Start("start"), End("end")
    review = RequestPort("review", request_type=str, response_type=bool)
    return (
        WorkflowBuilder("w4-review", start=start).add_edge(start, review).add_edge(review, end)
    ).build()


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


# --- child process: resume ------------------------------------------------------------------------


async def child(db: str, pairs: list[tuple[str, str]]) -> dict[str, list[float]]:
    """Resume each (run_id, request_id) to completion; timings per phase, first one cold."""
    out: dict[str, list[float]] = {"setup": [], "open": [], "respond": [], "resume": []}
    t0 = time.perf_counter()
    store = SqliteStore(db)
    runtime = Runtime(store)
    name = runtime.register(build_review)
    t1 = time.perf_counter()
    await store.open()
    t2 = time.perf_counter()
    out["setup"].append(t1 - t0)
    out["open"].append(t2 - t1)
    for run_id, request_id in pairs:
        t2 = time.perf_counter()
        await runtime.respond(request_id, ANSWER)
        t3 = time.perf_counter()
        result = await runtime.resume(run_id)
        t4 = time.perf_counter()
        assert result.status is WorkflowRunState.IDLE, result.status
        assert result.outputs == ["published"], result.outputs
        out["respond"].append(t3 - t2)
        out["resume"].append(t4 - t3)
    await runtime.close()
    assert name == "w4-review"
    return out


# --- parent process -----------------------------------------------------------------------------


async def pause_once(runtime: Runtime) -> tuple[float, str, str]:
    """``runtime.run`` until paused: seconds, run id, request id."""
    t0 = time.perf_counter()
    result = await runtime.run("w4-review", START_MESSAGE)
    t1 = time.perf_counter()
    assert result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, result.status
    return t1 - t0, result.run_id, result.pending_requests[0].request_id


async def pause_split(runtime: Runtime) -> tuple[float, float, str, str]:
    """``start`` then ``resume`` until paused: seconds of each, run id, request id."""
    t0 = time.perf_counter()
    run_id = await runtime.start("w4-review", START_MESSAGE)
    t1 = time.perf_counter()
    result = await runtime.resume(run_id)
    t2 = time.perf_counter()
    assert result.status is WorkflowRunState.IDLE_WITH_PENDING_REQUESTS, result.status
    return t1 - t0, t2 - t1, run_id, result.pending_requests[0].request_id


def build_child(which: str) -> dict[str, Any]:
    """Seconds of the first and of a second build of one workflow in this fresh process."""
    build: Callable[[], Workflow] = build_review
    if which == "handoff":
        from workflow_engine_cli.demos.support_handoff import build_support_workflow

        def build() -> Workflow:
            return build_support_workflow(offline=True)

    t0 = time.perf_counter()
    build()
    t1 = time.perf_counter()
    build()
    t2 = time.perf_counter()
    return {"first": t1 - t0, "again": t2 - t1, "networkx": "networkx" in sys.modules}


def build_times(which: str, repeats: int) -> tuple[float, float, bool]:
    """Median seconds of the first and of a second build of a workflow in new processes, and
    whether any of those builds imported networkx."""
    firsts, agains, networkx = [], [], False
    for _ in range(repeats):
        proc = subprocess.run(
            [sys.executable, __file__, "--build-child", which],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
            env=child_env(),
        )
        t = json.loads(proc.stdout.strip().splitlines()[-1])
        firsts.append(t["first"])
        agains.append(t["again"])
        networkx = networkx or t["networkx"]
    return statistics.median(firsts), statistics.median(agains), networkx


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), str(ROOT / "benchmarks"), env.get("PYTHONPATH")) if p
    )
    return env


def import_env(pycache: Path | None) -> dict[str, str]:
    """The child environment; with ``pycache``, bytecode is cached there (as for an installed
    package) even if ``PYTHONDONTWRITEBYTECODE`` is set here."""
    env = child_env()
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def time_snippet(code: str, env: dict[str, str]) -> float:
    """Seconds ``code`` takes in a fresh interpreter (timed inside it, interpreter start not
    counted)."""
    snippet = f"import time\nt = time.perf_counter()\n{code}\nprint(time.perf_counter() - t)"
    out = subprocess.run(
        [sys.executable, "-c", snippet],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
    )
    return float(out.stdout.strip())


def self_times(env: dict[str, str]) -> list[tuple[str, float]]:
    """Seconds of import self time per top-level package (``-X importtime``), heaviest first."""
    trace = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", USED_CODE],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env=env,
    ).stderr
    totals: dict[str, float] = {}
    for line in trace.splitlines():
        parts = line.split("|")
        own = parts[0].rpartition(":")[2].strip()
        if len(parts) != 3 or not own.isdigit():
            continue
        root = parts[2].strip().split(".")[0]
        totals[root] = totals.get(root, 0.0) + int(own) / 1e6
    return sorted(totals.items(), key=lambda kv: -kv[1])


def import_times(repeats: int) -> dict[str, Any]:
    """Medians (seconds) of ``import workflow_engine, workflow_engine.storage`` in fresh
    interpreters: in this environment, with a bytecode cache, then with the names a resuming
    process uses (``USED_CODE``, bytecode cache), and of the dependencies alone (the floor);
    samples interleaved. Plus the import self time per package of ``USED_CODE``."""
    with temp_dir("w4-pyc-") as pycache:
        cached = import_env(pycache)
        time_snippet(IMPORT_CODE, cached)  # fills the cache
        time_snippet(USED_CODE, cached)
        time_snippet(DEPS_CODE, cached)
        samples: dict[str, list[float]] = {"here": [], "cached": [], "used": [], "deps": []}
        for _ in range(repeats):
            samples["here"].append(time_snippet(IMPORT_CODE, import_env(None)))
            samples["cached"].append(time_snippet(IMPORT_CODE, cached))
            samples["used"].append(time_snippet(USED_CODE, cached))
            samples["deps"].append(time_snippet(DEPS_CODE, cached))
        out: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items()}
        out["self"] = self_times(cached)
    return out


async def main(repeats: int) -> None:
    with temp_dir("w4-") as tmp:
        db = tmp / "w4.db"
        store = await open_store(db)
        runtime = Runtime(store)
        runtime.register(build_review())
        await pause_once(runtime)  # warm-up
        await pause_split(runtime)
        starts, resumes, totals, paused = [], [], [], []
        for _ in range(2 * repeats):
            total_s, run_id, request_id = await pause_once(runtime)
            totals.append(total_s)
            paused.append((run_id, request_id))
            start_s, resume_s, _, _ = await pause_split(runtime)
            starts.append(start_s)
            resumes.append(resume_s)
        await runtime.close()
        print(
            f"W4 pause (runtime.run until IDLE_WITH_PENDING_REQUESTS, warm process): "
            f"{ms(statistics.median(totals))} (median of {len(totals)}); as start + resume: "
            f"start/admit {ms(statistics.median(starts))} + execute to pause "
            f"{ms(statistics.median(resumes))}"
        )
        phases: dict[str, list[float]] = {"setup": [], "open": [], "cold": [], "warm": []}
        respond_cold, resume_cold, respond_warm, resume_warm = [], [], [], []
        for i in range(repeats):
            pairs = paused[2 * i : 2 * i + 2]
            proc = subprocess.run(
                [sys.executable, __file__, "--child", str(db), json.dumps(pairs)],
                capture_output=True,
                text=True,
                check=True,
                cwd=ROOT,
                env=child_env(),
            )
            t = json.loads(proc.stdout.strip().splitlines()[-1])
            phases["setup"].append(t["setup"][0])
            phases["open"].append(t["open"][0])
            respond_cold.append(t["respond"][0])
            resume_cold.append(t["resume"][0])
            respond_warm.append(t["respond"][1])
            resume_warm.append(t["resume"][1])
            phases["cold"].append(t["setup"][0] + t["open"][0] + t["respond"][0] + t["resume"][0])
            phases["warm"].append(t["respond"][1] + t["resume"][1])
        med = statistics.median
        print(
            f"W4 resume-complete in a new process (after imports, median of {repeats} "
            f"subprocesses): {ms(med(phases['cold']))} = Runtime + register "
            f"{ms(med(phases['setup']))} + open store {ms(med(phases['open']))} + respond "
            f"{ms(med(respond_cold))} + resume {ms(med(resume_cold))}"
        )
        print(
            f"W4 second resume in that process (warm): {ms(med(phases['warm']))} = respond "
            f"{ms(med(respond_warm))} + resume {ms(med(resume_warm))}"
        )
    for which, label in (("w4", "W4 graph"), ("handoff", "support-handoff demo")):
        first, again, networkx = build_times(which, repeats)
        print(
            f"W4 build the {label} in a new process (after imports, median of {repeats} "
            f"subprocesses): first build {ms(first)}, a second build {ms(again)}"
            + ("; imported networkx" if networkx else "")
        )
    n = max(repeats, 5)
    imp = import_times(n)
    note = " (PYTHONDONTWRITEBYTECODE: our modules compiled)" if sys.dont_write_bytecode else ""
    print(
        "W4 import workflow_engine, workflow_engine.storage "
        f"(fresh interpreter, median of {n}, interleaved): "
        f"{ms(imp['here'])} in this environment{note}; {ms(imp['cached'])} with a bytecode "
        f"cache (as installed); with the names a resuming process uses (Runtime, "
        f"WorkflowBuilder, Executor, ..., SqliteStore; bytecode cache): {ms(imp['used'])}; "
        f"floor, its dependencies alone (pydantic + one model, asyncio, anyio, sqlite3): "
        f"{ms(imp['deps'])}"
    )
    print(
        "  import self time per package of those names (-X importtime, bytecode cache): "
        + ", ".join(f"{name} {ms(sec)}" for name, sec in imp["self"][:8])
    )
    print("  targets: pause ≤ 1 ms, resume ≤ 1 ms, build in a new process ≤ 10 ms, import ≤ 120 ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-r", "--repeats", type=int, default=7, help="samples per figure")
    parser.add_argument("--child", nargs=2, metavar=("DB", "PAIRS"), help=argparse.SUPPRESS)
    parser.add_argument("--build-child", choices=("w4", "handoff"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_child:
        print(json.dumps(build_child(args.build_child)))
    elif args.child:
        db, pairs = args.child
        timings = anyio.run(child, db, [tuple(p) for p in json.loads(pairs)])
        print(json.dumps(timings))
    else:
        anyio.run(main, args.repeats)
