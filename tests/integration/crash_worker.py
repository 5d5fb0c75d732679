"""A zygote for the crash-safety tests: imports everything once, then forks one child per command.

Run as ``python -m tests.integration.crash_worker`` from the project root. Protocol: one JSON
command per line on stdin, one JSON reply per line on stdout (the first line is ``{"ready":
...}``). For every command the zygote forks a child, which runs the command on a fresh event
loop with a fresh ``SqliteStore`` and reports JSON events on a private pipe, then ``os._exit``s.
The zygote kills the child with SIGKILL when asked to (``kill_on``: an event name the child
reports; ``kill_after``: seconds after the fork), reaps it (unless ``defer_reap``: then it stays
a zombie until a later command lists it in ``reap``) and replies with its raw wait status and
the events it reported. The child kills *itself* with SIGKILL on the ``kill_at``-th call of
the store's fault hook, so it dies exactly before, inside or after a given transaction.

The zygote never creates a thread or an event loop, so forking it is safe: every child starts
single-threaded and creates its own loop, SQLite connection and store worker thread.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import signal
import sqlite3
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from importlib import import_module
from typing import Any

import anyio

from tests.integration import ledger_workflow
from tests.integration.crash_workflow import (
    LOG_ENV,
    WORKFLOW_NAME,
    Decision,
    Start,
    build_workflow,
)
from workflow_engine import (
    EffectResolution,
    InDoubtEffect,
    RunBusyError,
    RunNotFoundError,
    Runtime,
    WorkflowRunState,
)
from workflow_engine.executors import ToolApprovalRequestContent
from workflow_engine.storage import SqliteStore

Send = Callable[..., None]
ZOMBIES: set[int] = set()  # killed children the zygote was asked not to reap yet

# Imported lazily on a first event loop / first connection; import them once here, not per child.
PRELOAD = (
    "anyio._backends._asyncio",
    "anyio._core._sockets",
    "anyio._core._streams",
    "anyio.lowlevel",
)


class Reporter:
    """Writes JSON events to the zygote over a pipe (one unbuffered ``write`` per event)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __call__(self, event: str, **fields: Any) -> None:
        data = (json.dumps({"event": event, **fields}) + "\n").encode()
        while data:
            data = data[os.write(self.fd, data) :]


class FaultPlan:
    """The store's fault hook: records every point and SIGKILLs this process at call ``kill_at``."""

    def __init__(self, kill_at: int | None, send: Send) -> None:
        self.kill_at = kill_at
        self.send = send
        self.points: list[str] = []

    def __call__(self, point: str) -> None:
        self.points.append(point)
        self.send("point", index=len(self.points), point=point)
        if self.kill_at is not None and len(self.points) == self.kill_at:
            self.send("fault", index=len(self.points), point=point)
            os.kill(os.getpid(), signal.SIGKILL)
            while True:  # pragma: no cover - SIGKILL is not deferred
                time.sleep(1)


def open_runtime(cmd: dict[str, Any], hook: FaultPlan | None) -> Runtime:
    store = SqliteStore(cmd["db"], snapshot_every=cmd.get("snapshot_every", 64), fault_hook=hook)
    runtime = Runtime(store)
    runtime.register(build_workflow)
    return runtime


def start_message(cmd: dict[str, Any]) -> Start:
    return Start(**cmd["start"])


async def hold(send: Send, runtime: Runtime, run_id: str) -> None:
    """Report that the run waits for an answer, then wait until killed."""
    pending = await runtime.pending_requests(run_id)
    send("waiting", request_ids=[p.request_id for p in pending])
    await anyio.sleep_forever()


async def op_start(cmd: dict[str, Any], runtime: Runtime, send: Send) -> dict[str, Any]:
    run_id = await runtime.start(WORKFLOW_NAME, start_message(cmd), run_id=cmd["run_id"])
    send("admitted", run_id=run_id)
    result = await runtime.resume(run_id)
    if cmd.get("hold") and result.pending_requests:
        await hold(send, runtime, run_id)
    return {"status": result.status.value}


async def op_respond(cmd: dict[str, Any], runtime: Runtime, send: Send) -> dict[str, Any]:
    outcome = await runtime.respond(cmd["request_id"], cmd["answer"])
    return {"outcome": outcome.value}


async def op_resume(cmd: dict[str, Any], runtime: Runtime, send: Send) -> dict[str, Any]:
    result = await runtime.resume(cmd["run_id"])
    if cmd.get("hold") and result.pending_requests:
        await hold(send, runtime, cmd["run_id"])
    return {"status": result.status.value}


async def op_recover(cmd: dict[str, Any], runtime: Runtime, send: Send) -> dict[str, Any]:
    """Drive the run to its end from whatever state a crash left: admit it if it is missing,
    answer its request if it is unanswered, resume it until it is idle."""
    run_id = cmd["run_id"]
    try:
        await runtime.store.get_run(run_id)
    except RunNotFoundError:
        await runtime.start(WORKFLOW_NAME, start_message(cmd), run_id=run_id)
        send("admitted", run_id=run_id)
    for _ in range(10):
        run = await runtime.store.get_run(run_id)
        if run.status is WorkflowRunState.IDLE:
            return {"status": run.status.value}
        for request in await runtime.store.list_requests(run_id, status="pending"):
            outcome = await runtime.respond(request.request_id, cmd["answer"])
            send("answered", request_id=request.request_id, outcome=outcome.value)
        await runtime.resume(run_id)
    raise AssertionError(f"run {run_id} did not finish after 10 resumes")


async def op_race(cmd: dict[str, Any], runtime: Runtime, send: Send) -> dict[str, Any]:
    """Resume at wall-clock time ``start_at`` (so two processes start together)."""
    await anyio.sleep(max(0.0, cmd["start_at"] - time.time()))
    send("resuming")
    try:
        result = await runtime.resume(cmd["run_id"])
    except RunBusyError as exc:
        return {"outcome": "busy", "message": str(exc)}
    return {"outcome": "ran", "status": result.status.value}


async def op_inspect(cmd: dict[str, Any], runtime: Runtime, send: Send) -> dict[str, Any]:
    """What a fresh process finds in the database."""
    store = runtime.store
    assert isinstance(store, SqliteStore)
    run_id = cmd["run_id"]
    try:
        run = await store.get_run(run_id)
    except RunNotFoundError:
        return {"exists": False}
    workflow = runtime.workflow(WORKFLOW_NAME)
    history = await store.history(run_id)
    latest = await store.latest(run_id)
    assert latest is not None
    info = await runtime.get_run(run_id)
    requests = []
    for r in await store.list_requests(run_id, status=None):
        answer = None
        if r.answer is not None:
            decoded = workflow.codec.decode(r.answer)
            assert isinstance(decoded, Decision)
            answer = decoded.model_dump()
        requests.append({"request_id": r.request_id, "status": r.status, "answer": answer})
    return {
        "exists": True,
        "status": run.status.value,
        "superstep": run.superstep,
        "owner": run.owner,
        "latest_checkpoint_id": run.latest_checkpoint_id,
        "history": [
            {
                "seq": h.seq,
                "superstep": h.superstep,
                "status": h.status.value,
                "kind": h.kind,
                "checkpoint_id": h.checkpoint_id,
            }
            for h in history
        ],
        "latest": {
            "checkpoint_id": latest.checkpoint_id,
            "superstep": latest.superstep,
            "status": latest.status.value,
            "pending": sorted(latest.pending_requests),
            "answered": sorted(latest.answered_ids()),
        },
        "outputs": info.outputs,
        "requests": requests,
        "journal": journal_rows(store, run_id),
    }


def describe_request(data: Any) -> dict[str, Any]:
    """A ledger run's request, as the side-effect tests see it: an approval of a tool call, or
    a question about a step whose effect is in doubt after a crash."""
    if isinstance(data, InDoubtEffect):
        return {
            "kind": "effect",
            "executor_id": data.executor_id,
            "step": data.step,
            "step_key": data.step_key,
            "description": data.description,
        }
    assert isinstance(data, ToolApprovalRequestContent), data
    return {"kind": "approval", "call_id": data.function_call.call_id}


def journal_rows(store: SqliteStore, run_id: str) -> list[list[Any]]:
    """The run's journal entries as stored: [key, entry]."""
    with contextlib.closing(sqlite3.connect(store.path)) as raw:
        rows = raw.execute(
            "SELECT key, value FROM journal WHERE run_id = ? ORDER BY created_at", (run_id,)
        ).fetchall()
    return [[key, json.loads(value)] for key, value in rows]


async def op_ledger(cmd: dict[str, Any], runtime: Runtime, send: Send) -> dict[str, Any]:
    """The side-effect tests' command, on ``ledger_workflow`` (an agent whose approved transfer
    tool appends to the ledger file ``cmd["ledger"]``). ``action``: ``start`` (admit and run
    until the run pauses for approval), ``respond`` (answer every pending request: an approval
    from ``decisions``, call id -> approved; a question about an in-doubt effect from
    ``resolutions``, request id -> answer), ``resume`` or ``inspect``. Every journal write is
    reported first, as an ``intent`` or ``journal`` event naming its key (and a ``clear`` event
    before a step's entry is forgotten), so a fault point can be told apart by the step it
    journals."""
    os.environ[ledger_workflow.LEDGER_ENV] = cmd["ledger"]
    os.environ[ledger_workflow.INVOCATIONS_ENV] = cmd["invocations"]
    name = runtime.register(ledger_workflow.build_workflow)
    store = runtime.store
    assert isinstance(store, SqliteStore)
    journal_put = store.journal_put
    journal_intent = store.journal_intent
    journal_clear = store.journal_clear

    async def reporting_journal_put(
        run_id: str, key: str, value: Any, superstep: int, *, lease: Any = None
    ) -> Any:
        send("journal", key=key)
        return await journal_put(run_id, key, value, superstep, lease=lease)

    async def reporting_journal_intent(
        run_id: str, key: str, entry: Any, superstep: int, *, lease: Any = None
    ) -> None:
        send("intent", key=key)
        await journal_intent(run_id, key, entry, superstep, lease=lease)

    async def reporting_journal_clear(run_id: str, key: str, *, lease: Any = None) -> None:
        send("clear", key=key)
        await journal_clear(run_id, key, lease=lease)

    store.journal_put = reporting_journal_put  # type: ignore[method-assign]
    store.journal_intent = reporting_journal_intent  # type: ignore[method-assign]
    store.journal_clear = reporting_journal_clear  # type: ignore[method-assign]
    run_id = cmd["run_id"]
    action = cmd["action"]
    if action == "start":
        await runtime.start(name, cmd["prompt"], run_id=run_id)
        send("admitted", run_id=run_id)
        return {"status": (await runtime.resume(run_id)).status.value}
    if action == "respond":
        outcomes = {}
        for request in await runtime.pending_requests(run_id):
            data = request.data
            if isinstance(data, InDoubtEffect):
                answered = request.request_id
                answer = cmd["resolutions"][answered]
            else:
                answered = data.function_call.call_id
                answer = {"approved": cmd["decisions"][answered]}
            outcome = await runtime.respond(request.request_id, answer)
            outcomes[answered] = outcome.value
        return {"outcomes": outcomes}
    if action == "resume":
        return {"status": (await runtime.resume(run_id)).status.value}
    assert action == "inspect", action
    info = await runtime.get_run(run_id)
    codec = runtime.workflow(name).codec
    requests = []
    for r in await store.list_requests(run_id, status=None):
        described = describe_request(codec.decode(r.data))
        assert r.kind == ("effect" if described["kind"] == "effect" else "executor"), r.kind
        answer = r.answer
        if answer is not None and described["kind"] == "effect":
            resolution = codec.decode(answer)
            assert isinstance(resolution, EffectResolution), resolution
            answer = resolution.model_dump(mode="json")
        requests.append(
            {"request_id": r.request_id, **described, "status": r.status, "answer": answer}
        )
    return {
        "status": info.status.value,
        "outputs": [o.model_dump(mode="json") for o in info.outputs],
        "pending": [
            {"request_id": p.request_id, **describe_request(p.data)} for p in info.pending_requests
        ],
        "requests": requests,
        "history": len(await store.history(run_id)),
        "journal": journal_rows(store, run_id),
    }


OPS = {
    "ledger": op_ledger,
    "start": op_start,
    "respond": op_respond,
    "resume": op_resume,
    "recover": op_recover,
    "race": op_race,
    "inspect": op_inspect,
}


async def run_command(cmd: dict[str, Any], send: Send) -> None:
    hook = FaultPlan(cmd.get("kill_at"), send)
    runtime = open_runtime(cmd, hook if cmd["op"] != "inspect" else None)
    started = time.monotonic()
    try:
        result = await OPS[cmd["op"]](cmd, runtime, send)
    finally:
        await runtime.close()
    send("result", points=hook.points, seconds=time.monotonic() - started, **result)


def child(cmd: dict[str, Any], fd: int) -> None:
    """The forked child: run one command, report on ``fd``, never return into the zygote."""
    code = 1
    send = Reporter(fd)
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)  # the zygote's command stream is not ours to read
        os.dup2(2, 1)  # nor is its reply stream ours to write
        if cmd.get("log"):
            os.environ[LOG_ENV] = cmd["log"]
        anyio.run(run_command, cmd, send)
        code = 0
    except BaseException as exc:
        send(
            "error",
            error_type=type(exc).__name__,
            message=str(exc),
            traceback=traceback.format_exc(),
        )
    finally:
        os._exit(code)


def spawn(cmd: dict[str, Any]) -> dict[str, Any]:
    """Fork a child for ``cmd``, kill it when asked, reap it; the reply for the test."""
    if threading.active_count() != 1:
        raise RuntimeError("the zygote must stay single-threaded to fork safely")
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        child(cmd, write_fd)
    os.close(write_fd)
    kill_on = cmd.get("kill_on")
    kill_at_time = started + cmd["kill_after"] if cmd.get("kill_after") is not None else None
    give_up_at = started + cmd.get("timeout", 30.0)
    events: list[dict[str, Any]] = []
    killed_by_zygote: str | None = None
    buffer = b""
    while True:
        now = time.monotonic()
        deadline = give_up_at
        if kill_at_time is not None and killed_by_zygote is None:
            deadline = min(deadline, kill_at_time)
        wait = None if deadline == float("inf") else max(0.0, deadline - now)
        ready, _, _ = select.select([read_fd], [], [], wait)
        if ready:
            chunk = os.read(read_fd, 65536)
            if not chunk:
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                event = json.loads(line)
                events.append(event)
                if killed_by_zygote is None and kill_on and event["event"] == kill_on:
                    os.kill(pid, signal.SIGKILL)
                    killed_by_zygote = f"on {kill_on}"
            continue
        now = time.monotonic()
        if now >= give_up_at:
            os.kill(pid, signal.SIGKILL)
            killed_by_zygote = "timeout"
            give_up_at = float("inf")
        elif kill_at_time is not None and now >= kill_at_time and killed_by_zygote is None:
            os.kill(pid, signal.SIGKILL)
            killed_by_zygote = f"after {cmd['kill_after']:.4f} s"
    os.close(read_fd)
    seconds = time.monotonic() - started
    status: int | None = None
    if cmd.get("defer_reap"):  # leave it a zombie, as a slow supervisor would
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # until it has exited; not reaped
        ZOMBIES.add(pid)
    else:
        _, status = os.waitpid(pid, 0)
    reaped = []
    for zombie in cmd.get("reap", []):  # only now that this child has finished
        ZOMBIES.remove(zombie)
        reaped.append([zombie, os.waitpid(zombie, 0)[1]])
    return {
        "pid": pid,
        "wait_status": status,
        "killed_by_zygote": killed_by_zygote,
        "events": events,
        "seconds": seconds,
        "reaped": reaped,
    }


def main() -> None:
    warnings.simplefilter("error")  # like the test suite's filterwarnings = error
    for module in PRELOAD:
        import_module(module)
    # A new database's tables are declared through SQLAlchemy, 150+ ms of imports on a child's
    # first open: declare them here, so a child's time is its run's own (timer kills aim in it).
    import_module("storage._schema").metadata  # noqa: B018
    build_workflow()  # import and validate everything before the first fork
    ledger_workflow.build_workflow()
    gc.freeze()  # children's collections skip the zygote's objects: fewer copy-on-write faults
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("op") == "exit":
            break
        reply = spawn(cmd)
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
