"""A zygote for the real-SIGKILL sweep: imports everything once, forks one child per command.

Run as ``python -m tests.sim.kill_worker`` from the project root. Protocol: one JSON command per
line on stdin, one JSON reply per line on stdout (the first line is ``{"ready": true}``). For
``{"op": "drive", "seed", "dir", "kill_at"}`` the zygote forks a child that plays the seed's
scenario (answer every pending request at each rest, no forks) against the SQLite file in
``dir`` with real time, until the run is idle -- and SIGKILLs *itself* at the ``kill_at``-th
point it reaches: before or after a store call, inside a SQLite transaction (the store's own
fault hook, just before COMMIT), or inside workflow code. Side effects are appended to
``dir/ledger.jsonl`` (one ``write`` on an ``O_APPEND`` descriptor each, so a line is there whole
or not at all); the child appends what it did to ``dir/report.jsonl``. The reply is the
child's pid and raw wait status.

The zygote never starts a thread or an event loop before it forks, so every child starts
single-threaded and opens its own loop, connection and store thread.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

import anyio

from tests.sim.driver import Driver, Scenario, draw_scenario
from tests.sim.faults import FaultPlan
from tests.sim.vtime import VirtualClock
from tests.sim.world import Ledger, SimProcess, World

PRELOAD = (
    "anyio._backends._asyncio",
    "sqlalchemy",
    "workflow_engine.storage._schema",
)


def kill_scenario(seed: int) -> Scenario:
    """The seed's workflow, answered without memory of earlier rests (so a fresh process after
    a kill makes the same choices), without forks."""
    scenario = draw_scenario(seed)
    return dataclasses.replace(scenario, fork_at=None, cancel_at=None, batching="all")


class RealClock(VirtualClock):
    """Wall-clock time: processes come and go, and a store's timestamps must keep increasing."""

    def now(self) -> float:
        return time.time()


def append(path: Path, record: dict[str, Any]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


class FileLedger(Ledger):
    """The outside world survives the process: every execution is also a line in a file."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def perform(
        self,
        proc: SimProcess,
        identity: str,
        engine_key: str | None = None,
        *,
        idempotent: bool,
        step: str | None = None,
        stale: bool = False,
    ) -> str:
        receipt = super().perform(
            proc, identity, engine_key, idempotent=idempotent, step=step, stale=stale
        )
        record = {"identity": identity, "pid": os.getpid(), "key": engine_key}
        append(self.path, {**record, "idempotent": idempotent, "stale": stale})
        return receipt

    def happened(self, identity: str) -> bool:
        """The outside world outlives processes: a person asked about an effect a killed
        process may have run looks it up in the file."""
        return any(line["identity"] == identity for line in read(self.path))


def drive(cmd: dict[str, Any]) -> None:
    """The child: play the scenario to its end, or die at the planned point."""
    where = Path(cmd["dir"])
    report = where / "report.jsonl"
    kill_at = cmd.get("kill_at")
    world = World(RealClock(), frozenset([kill_at]) if kill_at else frozenset())
    world.ledger = FileLedger(where / "ledger.jsonl")

    def die(proc: SimProcess, label: str) -> None:
        append(report, {"event": "killed", "pid": os.getpid(), "point": kill_at, "at": label})
        os.kill(os.getpid(), signal.SIGKILL)

    world.on_crash = die

    def sqlite_hook(proc: SimProcess) -> Callable[[str], None]:
        def hook(point: str) -> None:
            if point.endswith(":inside"):  # just before COMMIT, on the store's thread
                proc.point(f"sqlite-{point}")

        return hook

    plan = FaultPlan(
        store="sqlite",
        snapshot_every=cmd.get("snapshot_every", 3),
        span_every=cmd.get("span_every", 2),
    )
    driver = Driver(kill_scenario(cmd["seed"]), plan, world, where, sqlite_hook=sqlite_hook)

    async def main() -> None:
        try:
            async with anyio.create_task_group() as tg:
                driver.tg = tg
                await driver.play()
        finally:
            await driver.close()

    anyio.run(main)
    append(
        report,
        {
            "event": "done",
            "pid": os.getpid(),
            "points": world.points,
            "violations": driver.violations,
            "log": driver.log,
        },
    )


def spawn(cmd: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)  # the zygote's command stream is not ours
            os.dup2(2, 1)  # nor its reply stream
            drive(cmd)
            code = 0
        except BaseException as exc:
            append(Path(cmd["dir"]) / "report.jsonl", {"event": "error", "error": repr(exc)})
        finally:
            os._exit(code)
    deadline = started + cmd.get("timeout", 60.0)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            return {"pid": pid, "status": status, "timeout": True}
        time.sleep(0.002)
    return {"pid": pid, "status": status, "seconds": time.monotonic() - started}


def main() -> None:
    warnings.simplefilter("error")
    for module in PRELOAD:
        import_module(module)
    gc.freeze()  # children's collections skip the zygote's objects: fewer copy-on-write faults
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd.get("op") == "exit":
            break
        print(json.dumps(spawn(cmd)), flush=True)


if __name__ == "__main__":
    main()
