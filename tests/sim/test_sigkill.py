"""The simulator's faults for real: SIGKILL processes at chosen points, recover in new ones.

The in-process simulator stands a ``BaseException`` in for ``kill -9``. Here, for a few seeds,
a process forked from a zygote (``kill_worker.py``) plays the seed against a SQLite file and
SIGKILLs itself at its k-th point -- before or after a store call, inside a SQLite transaction
just before COMMIT, or inside workflow code -- and a fresh process drives the run to its end.
Then the file is inspected, and the run held to the uninterrupted (in-memory) run: the same
side effects, a non-idempotent one executed exactly once (a step cut off by the kill is asked
about, and the recovering process answers from the ledger file, which outlives processes), an
idempotent one once more at most, right after a kill of the process that executed it; the same
outputs (as a multiset: processes come and go in real time); history linear; SQLite's integrity
check passing; no request left open.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sim.faults import FaultPlan
from tests.sim.invariants import Violation, check
from tests.sim.kill_worker import kill_scenario, read
from tests.sim.simulate import inspect_sqlite, run_world
from tests.sim.world import Execution, Ledger

pytestmark = [pytest.mark.sim, pytest.mark.slow]  # real SIGKILLs: `make test` only

ROOT = Path(__file__).resolve().parents[2]
KILL_SEEDS = (263, 154, 257, 81)
"""Fan-outs, merges, chained ports, request_info, a loop and agents between them."""
KILLS_PER_SEED = int(os.environ.get("SIM_KILLS_PER_SEED", "8"))


class Zygote:
    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.sim.kill_worker"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert json.loads(self._line())["ready"]

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote exited (code {self.proc.wait()})")
        return line

    def drive(self, seed: int, where: Path, kill_at: int | None) -> dict[str, Any]:
        assert self.proc.stdin is not None
        cmd = {"op": "drive", "seed": seed, "dir": str(where), "kill_at": kill_at}
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return json.loads(self._line())

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    try:
        yield z
    finally:
        z.close()


def killed(reply: dict[str, Any]) -> bool:
    status = reply["status"]
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def exited_ok(reply: dict[str, Any]) -> bool:
    status = reply["status"]
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def ledger_of(where: Path, dead: set[int]) -> Ledger:
    """The ledger file as a Ledger; an execution by a SIGKILLed process counts as torn (an
    idempotent step may be retried after it; any other runs once, a person answering for it)."""
    ledger = Ledger()
    for line in read(where / "ledger.jsonl"):
        execution = Execution(
            f"pid{line['pid']}",
            line["key"],
            idempotent=line["idempotent"],
            crashed=line["pid"] in dead,
            stale=line["stale"],
        )
        ledger.executions.setdefault(line["identity"], []).append(execution)
    return ledger


def play_killed(zygote: Zygote, seed: int, where: Path, kill_at: int | None) -> list[str]:
    """Kill a process of the seed at ``kill_at`` (None: no kill), finish the run in a fresh
    one, and hold the file to the uninterrupted run; the broken invariants."""
    where.mkdir()
    problems = []
    dead = set()
    if kill_at is not None:
        first = zygote.drive(seed, where, kill_at)
        if not killed(first):
            report = read(where / "report.jsonl")
            return [f"the process was to die at point {kill_at}: {first}, {report}"]
        dead.add(first["pid"])
    last = zygote.drive(seed, where, None)
    report = read(where / "report.jsonl")
    if not exited_ok(last):
        return [f"the recovering process failed: {last}, {report}"]
    for event in report:
        problems += [f"[{i}] {text}" for i, text in event.get("violations", [])]
    scenario = kill_scenario(seed)
    outcome = inspect_sqlite(scenario, where)
    outcome.ledger = ledger_of(where, dead)
    reference = run_world(scenario, FaultPlan())
    problems += [str(v) for v in check(reference, outcome, same_schedule=False)]
    return problems


def _points(zygote: Zygote, seed: int, where: Path) -> int:
    """How many points an uninterrupted process of the seed reaches (it must finish clean)."""
    problems = play_killed(zygote, seed, where, None)
    assert not problems, f"seed {seed} without a kill: {problems}"
    done = [e for e in read(where / "report.jsonl") if e["event"] == "done"]
    return done[-1]["points"]


@pytest.mark.parametrize("seed", [pytest.param(s, id=f"kill_{s}") for s in KILL_SEEDS])
def test_sigkill_sweep(zygote: Zygote, tmp_path: Path, seed: int) -> None:
    points = _points(zygote, seed, tmp_path / "clean")
    rng = random.Random(f"kill:{seed}")
    chosen = sorted(rng.sample(range(1, points + 1), min(KILLS_PER_SEED, points)))
    failures = {}
    for point in chosen:
        problems = play_killed(zygote, seed, tmp_path / f"kill-{point}", point)
        if problems:
            failures[point] = problems
    assert not failures, "\n".join(
        f"seed {seed}, SIGKILL at point {point}: " + "; ".join(p[:300] for p in problems[:4])
        for point, problems in failures.items()
    )


def test_violations_are_reported() -> None:
    """(The check itself.) A surviving process that repeats an effect is caught."""
    ledger = Ledger()
    ledger.executions["main|g1|relay|x"] = [Execution("pid1", None), Execution("pid2", None)]
    reference = run_world(kill_scenario(KILL_SEEDS[0]), FaultPlan())
    outcome = run_world(kill_scenario(KILL_SEEDS[0]), FaultPlan())
    outcome.ledger = ledger
    found = check(reference, outcome, same_schedule=False)
    assert Violation("exactly-once", "main|g1|relay|x ran 2 times (pid1, pid2)") in found
