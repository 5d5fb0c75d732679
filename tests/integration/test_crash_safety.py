"""Crash safety with real processes: SIGKILL a run at hundreds of points, resume it elsewhere.

Every scenario runs its own run in its own SQLite file. Each step of it (start, answer, resume,
recover) runs in a fresh process forked from a zygote (``crash_worker.py``), and most steps are
killed with SIGKILL: by the process itself on the N-th call of the store's fault hook (exactly
before, inside or after an admit / superstep commit / answer transaction), by the zygote once
the process reports it waits for an answer, or by the zygote after a random delay; some are left
unreaped (zombies) while the next process takes their run over. After every step a fresh
process reads the database, and the harness checks:

* history is linear (checkpoint seqs 0..n, supersteps never decrease), the run row agrees with
  the latest checkpoint, and a transaction is durable exactly when the process got past COMMIT;
* what was committed stays committed, and a stored answer is never lost or changed;
* each process executed only supersteps after the last one committed when it started, and none
  beyond the one after the last committed when it died (or, if it ended normally, none it did
  not commit);
* the journal (the workflow journals one step, the answer's note) holds entries only of the
  superstep in flight -- a superstep's entries are compacted away when it commits -- and an
  entry is durable exactly when the process got past its COMMIT, then kept until that commit;
  a journaled step never runs again: only a process that started without its entry runs it;

and, once a fresh process drove the run to its end: the run is idle, its journal empty, its
outputs equal those of an uninterrupted run, the stored answer is what was sent, and every
superstep of the uninterrupted run executed exactly once -- apart from executions by a killed
process of the superstep after the last one committed when it died (the only work a crash may
repeat) -- and the journaled step ran in the same superstep, again only after a process died
before its result was durable.

The scenarios of a test run two at a time, one per zygote.
"""

from __future__ import annotations

import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
START = {"ticks_a": 4, "ticks_b": 4}
ANSWER = {"approved": True, "note": "ship it", "delay": 0.0}
RACE_START = {"ticks_a": 2, "ticks_b": 2}
SNAPSHOT_EVERY = 4  # mixes snapshots and deltas within one run
ZYGOTES = 2
DURABLE = ("admit:after", "commit:after")
LOG_LINE = re.compile(r"superstep=(\d+) executor=(\S+) run=(\S+) pid=(\d+)")
JOURNAL_KEY = re.compile(r"(\d+)/stepper/[^/]+/note")
"""The journal's only step: ``decided``'s note (``<superstep>/<executor>/<delivery>/<name>``)."""


def is_journaled(executor: str) -> bool:
    """A log line of a journaled step's run (``stepper:note``), not of a handler invocation."""
    return ":" in executor


def superstep_of(key: str) -> int:
    m = JOURNAL_KEY.fullmatch(key)
    assert m is not None, f"journal key {key!r} is not the note's step key"
    return int(m.group(1))


# --- the zygote -----------------------------------------------------------------------------------


def died_of_sigkill(wait_status: int | None) -> bool:
    return (
        wait_status is not None
        and os.WIFSIGNALED(wait_status)
        and os.WTERMSIG(wait_status) == signal.SIGKILL
    )


def is_zombie(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "Z"


@dataclass
class Reply:
    """What the zygote reports about one forked process (``wait_status`` is None while the
    zygote leaves it unreaped; ``reaped``: [pid, wait status] of zombies it reaped after it)."""

    op: str
    pid: int
    wait_status: int | None
    killed_by_zygote: str | None
    events: list[dict[str, Any]]
    seconds: float
    reaped: list[list[int]]

    @property
    def sigkilled(self) -> bool:
        return died_of_sigkill(self.wait_status)

    @property
    def exited_ok(self) -> bool:
        status = self.wait_status
        return status is not None and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0

    @property
    def points(self) -> list[str]:
        return [e["point"] for e in self.events if e["event"] == "point"]

    @property
    def fault(self) -> str | None:
        return next((e["point"] for e in self.events if e["event"] == "fault"), None)

    def event(self, name: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e["event"] == name), None)

    @property
    def result(self) -> dict[str, Any]:
        result = self.event("result")
        assert result is not None and self.exited_ok, f"{self.op} did not finish: {self.describe()}"
        return result

    def describe(self) -> str:
        if self.wait_status is None:
            how = "not reaped yet"
        elif os.WIFSIGNALED(self.wait_status):
            how = f"killed by signal {os.WTERMSIG(self.wait_status)}"
        else:
            how = f"exit code {os.WEXITSTATUS(self.wait_status)}"
        error = self.event("error")
        detail = f"\n{error['traceback']}" if error else ""
        return (
            f"pid {self.pid} ({self.op}) {how}, zygote kill: {self.killed_by_zygote}, "
            f"points: {self.points}{detail}"
        )


class Zygote:
    """A long-lived ``crash_worker`` process that forks one child per command."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.crash_worker"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def wait_ready(self) -> None:
        line = self.read_line()
        assert json.loads(line)["ready"], line

    def read_line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the zygote exited (code {self.proc.wait()})")
        return line

    def call(self, cmd: dict[str, Any]) -> Reply:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return Reply(op=cmd["op"], **json.loads(self.read_line()))

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "exit"}) + "\n")
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


class Pool:
    """Zygotes shared by the module's tests; scenarios borrow one each."""

    def __init__(self, size: int) -> None:
        self.zygotes = [Zygote() for _ in range(size)]
        for z in self.zygotes:
            z.wait_ready()
        self.free: queue.Queue[Zygote] = queue.Queue()
        for z in self.zygotes:
            self.free.put(z)

    def borrow(self) -> Zygote:
        return self.free.get()

    def give_back(self, zygote: Zygote) -> None:
        self.free.put(zygote)

    def close(self) -> None:
        for z in self.zygotes:
            z.close()


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    p = Pool(ZYGOTES)
    try:
        yield p
    finally:
        p.close()


# --- one run under test ---------------------------------------------------------------------------


@dataclass
class Reference:
    """An uninterrupted run: what every crashed run must end up with."""

    outputs: list[str]
    executions: Counter[tuple[int, str]]  # handler invocations
    journaled: Counter[tuple[int, str]]  # runs of journaled steps
    start_points: list[str]
    respond_points: list[str]
    resume_points: list[str]
    recover_seconds: float


class Harness:
    """Drives one run through forked processes and checks the database after every step."""

    def __init__(
        self,
        zygote: Zygote,
        workdir: Path,
        name: str,
        reference: Reference | None,
        *,
        start: dict[str, int] | None = None,
        answer: dict[str, Any] | None = None,
    ) -> None:
        self.zygote = zygote
        self.name = name
        self.reference = reference
        self.db = workdir / f"{name}.db"
        self.log = workdir / f"{name}.log"
        self.start = start or START
        self.answer = answer or ANSWER
        self.committed = -1  # latest committed superstep (-1: the run is not admitted)
        self.history_len = 0
        self.answer_stored = False
        self.journal: set[str] = set()  # the keys of the journal's entries
        self.deaths: dict[int, int] = {}  # pid of a killed process -> committed superstep then
        self.kills = 0
        self.unreaped: set[int] = set()
        self.trail: list[str] = []
        self.state: dict[str, Any] = {"exists": False}

    # --- processes ------------------------------------------------------------------------------

    def call(self, op: str, zygote: Zygote | None = None, **extra: Any) -> Reply:
        cmd = {
            "op": op,
            "db": str(self.db),
            "log": str(self.log),
            "run_id": self.name,
            "start": self.start,
            "answer": self.answer,
            "snapshot_every": SNAPSHOT_EVERY,
            "timeout": 30.0,
            **extra,
        }
        return (zygote or self.zygote).call(cmd)

    def inspect(self) -> dict[str, Any]:
        """The database as a fresh process (fresh SqliteStore and Runtime) reads it."""
        return self.call("inspect").result

    def step(self, op: str, expect: str = "ok", *, timed: bool = False, **extra: Any) -> Reply:
        """Run ``op`` in a fresh process and check what it left in the database.

        ``expect``: "ok" (exit 0), "kill" (must die of SIGKILL) or "error" (a clean exit 1);
        "maybe" accepts a kill or a normal end (timer kills may come too late). ``timed``: the
        kill came from a timer, so the last transaction reported may or may not have committed.
        """
        reply = self.call(op, **extra)
        what = f"{op} {extra}" if extra else op
        assert reply.killed_by_zygote != "timeout", f"{what} hung: {reply.describe()}"
        if expect == "maybe":
            expect = "kill" if reply.sigkilled else "ok"
        if expect == "kill":
            if extra.get("defer_reap"):  # checked when it is reaped
                assert reply.wait_status is None and is_zombie(reply.pid), reply.describe()
                self.unreaped.add(reply.pid)
            else:
                assert reply.sigkilled, f"{what} was to be SIGKILLed: {reply.describe()}"
            if not timed:  # a timer may also strike between the last report and the exit
                assert reply.event("result") is None, f"{what} finished although killed"
            if "kill_at" in extra:  # it killed itself, at the fault point it was told
                assert reply.fault and len(reply.points) == extra["kill_at"], reply.describe()
            self.kills += 1
        elif expect == "ok":
            assert reply.exited_ok and reply.event("result"), f"{what}: {reply.describe()}"
        else:
            status = reply.wait_status
            assert status is not None and os.WIFEXITED(status), reply.describe()
            assert reply.event("error"), reply.describe()
        for pid, status in reply.reaped:
            assert died_of_sigkill(status), f"pid {pid} did not die of SIGKILL: status {status}"
            self.unreaped.remove(pid)
        self.trail.append(
            f"{what}: pid {reply.pid} {expect}"
            + (f" at {reply.fault}" if reply.fault else "")
            + (f" ({reply.killed_by_zygote})" if reply.killed_by_zygote else "")
            + f", points {reply.points}"
        )
        self.check_after(reply, killed=expect == "kill", timed=timed)
        return reply

    # --- checks ---------------------------------------------------------------------------------

    def check_after(self, reply: Reply, *, killed: bool, timed: bool) -> None:
        before_committed, before_len = self.committed, self.history_len
        state = self.inspect()
        self.state = state
        history = state.get("history", [])
        self.trail.append(
            f"  -> {state.get('status', 'no run')}, committed superstep "
            f"{history[-1]['superstep'] if history else None}, {len(history)} checkpoints"
        )
        self.check_store(state)
        # a transaction is durable exactly when the process got past its COMMIT
        points = reply.points
        durable = sum(p in DURABLE for p in points)
        maybe_one_more = timed and bool(points) and points[-1] in ("admit:inside", "commit:inside")
        allowed = {before_len + durable} | ({before_len + durable + 1} if maybe_one_more else set())
        assert len(history) in allowed, (
            f"{len(history)} checkpoints after a process that got past {durable} commits "
            f"(points {points}); there were {before_len} before"
        )
        self.history_len = len(history)
        committed = history[-1]["superstep"] if history else -1
        assert committed >= before_committed, "a committed superstep was lost"
        self.committed = committed
        # answers: durable exactly after answer:after, then never lost
        answered = self.answered_in(state)
        if self.answer_stored or "answer:after" in points:
            assert answered, "a stored answer was lost"
        elif answered:
            assert timed and points[-1:] == ["answer:inside"], (
                f"the answer is stored although the process never got past its COMMIT ({points})"
            )
        self.answer_stored = answered
        # side effects of this process: only supersteps that were not committed when it
        # started; none past the in-flight one when it died; all committed if it ended
        mine = [(s, e) for s, e, pid in self.executions() if pid == reply.pid]
        assert len(mine) == len(set(mine)), f"pid {reply.pid} ran a superstep twice: {mine}"
        upper = committed + 1 if killed else committed
        bad = [(s, e) for s, e in mine if not before_committed < s <= upper]
        assert not bad, (
            f"pid {reply.pid} executed {bad}, but superstep {before_committed} was committed "
            f"when it started and {committed} when it {'died' if killed else 'ended'}"
        )
        if killed:
            self.deaths[reply.pid] = committed
        self.check_journal(state, points, mine, committed, timed=timed)

    def check_journal(
        self,
        state: dict[str, Any],
        points: list[str],
        mine: list[tuple[int, str]],
        committed: int,
        *,
        timed: bool,
    ) -> None:
        """Entries only of the superstep in flight; durable exactly past "journal:after", then
        kept until their superstep commits; a journaled step run only by a process that started
        without its entry."""
        journal = {}
        for key, entry in state.get("journal", []):
            journal[key] = superstep_of(key)
            assert journal[key] == committed + 1, (
                f"{key} is journaled, but superstep {committed} is the last committed: a "
                "committed superstep's entries are compacted, none exist beyond the next one"
            )
            assert set(entry) == {"value"}, f"{key}: an idempotent step journals no intent"
        if state.get("status") in ("idle", "idle_with_pending_requests"):
            assert not journal, f"a resting run keeps journal entries: {sorted(journal)}"
        before = self.journal
        ran = [s for s, e in mine if is_journaled(e)]
        for s in ran:
            assert s not in {superstep_of(k) for k in before}, (
                f"the journaled step of superstep {s} ran again although its result was durable"
            )
        wrote = "journal:after" in points
        for key in set(journal) - before:
            assert wrote or (timed and points[-1:] == ["journal:inside"]), (
                f"{key} is journaled although the process never got past its COMMIT ({points})"
            )
        if wrote:
            assert len(ran) == 1, f"journal:after, but the step ran in superstep(s) {ran}"
            if ran[0] > committed:
                assert ran[0] in journal.values(), "a journaled result was lost"
        for key in before - set(journal):
            assert superstep_of(key) <= committed, f"{key} vanished before its superstep committed"
        self.journal = set(journal)

    def answered_in(self, state: dict[str, Any]) -> bool:
        """Whether the store holds the answer (which must then be exactly what was sent)."""
        answered = False
        for r in state.get("requests", []):
            if r["status"] in ("answered", "applied"):
                assert r["answer"] == self.answer, f"stored answer {r['answer']} != {self.answer}"
                answered = True
            else:
                assert r["answer"] is None, r
        return answered

    def check_store(self, state: dict[str, Any]) -> None:
        if not state["exists"]:
            return
        history = state["history"]
        assert [h["seq"] for h in history] == list(range(len(history))), "history forked"
        steps = [h["superstep"] for h in history]
        assert steps == sorted(steps), f"supersteps went back: {steps}"
        latest = history[-1]
        assert (
            state["latest_checkpoint_id"]
            == latest["checkpoint_id"]
            == (state["latest"]["checkpoint_id"])
        ), "the run row does not point at the latest checkpoint"
        assert state["superstep"] == latest["superstep"] == state["latest"]["superstep"]
        assert latest["status"] == state["latest"]["status"]
        waiting = any(r["status"] == "answered" for r in state.get("requests", []))
        if waiting and latest["status"] == "idle_with_pending_requests":
            # a worker took the run to apply the answer: it runs from then on (or its lease
            # lapses, and recovery applies the answer)
            assert state["status"] in ("in_progress", latest["status"]), state["status"]
        else:
            assert state["status"] == latest["status"], "the run row's status is not the latest's"
        assert history[0]["kind"] == "snapshot"

    def executions(self) -> list[tuple[int, str, int]]:
        """(superstep, executor, pid) for every line of the side-effect log."""
        if not self.log.exists():
            return []
        out = []
        for line in self.log.read_text().splitlines():
            m = LOG_LINE.fullmatch(line)
            assert m is not None and m.group(3) == self.name, f"bad log line {line!r}"
            out.append((int(m.group(1)), m.group(2), int(m.group(4))))
        return out

    def finish(self) -> None:
        """Drive the run to its end in a fresh process, then check it against the reference."""
        self.step("recover")
        self.check_final()

    def check_final(self) -> None:
        state = self.state
        assert state["exists"] and state["status"] == "idle", state.get("status")
        assert state["journal"] == [], "a finished run keeps journal entries"
        (request,) = state["requests"]
        assert request["status"] == "applied" and request["answer"] == self.answer
        assert state["latest"]["pending"] == [] and state["latest"]["answered"] == [
            request["request_id"]
        ]
        if self.reference is None:
            return
        assert state["outputs"] == self.reference.outputs
        # every superstep ran exactly once, except work a killed process lost in flight
        effective: Counter[tuple[int, str]] = Counter()
        lost: Counter[tuple[int, str]] = Counter()
        journaled: dict[tuple[int, str], list[int]] = {}
        for s, e, pid in self.executions():
            if is_journaled(e):
                journaled.setdefault((s, e), []).append(pid)
            elif pid in self.deaths and s == self.deaths[pid] + 1:
                lost[(s, e)] += 1
            else:
                effective[(s, e)] += 1
        assert effective == self.reference.executions, (
            f"executions {sorted(effective.items())} != uninterrupted "
            f"{sorted(self.reference.executions.items())} (lost in flight: {sorted(lost)})"
        )
        assert set(lost) <= set(self.reference.executions)
        # a journaled step ran in the superstep it belongs to; again only after a process died
        # in that superstep (before its result was durable: checked after every process)
        assert set(journaled) == set(self.reference.journaled), journaled
        for (s, e), pids in journaled.items():
            again = [pid for pid in pids[:-1] if self.deaths.get(pid, -2) + 1 != s]
            assert not again, f"{e} of superstep {s} ran in {pids}; {again} did not die in it"

    def request_id(self) -> str:
        (request,) = self.state["requests"]
        return request["request_id"]


Scenario = Callable[[Harness], None]


def run_scenarios(
    pool: Pool,
    workdir: Path,
    reference: Reference,
    scenarios: list[tuple[str, Scenario]],
) -> int:
    """Run the scenarios two at a time (one per zygote); fail listing every failed one.
    Returns the number of processes killed."""

    def run_one(item: tuple[str, Scenario]) -> tuple[int, str | None]:
        name, scenario = item
        zygote = pool.borrow()
        h = Harness(zygote, workdir, name, reference)
        try:
            scenario(h)
        except Exception as exc:
            trail = "\n    ".join(h.trail[-12:])
            return h.kills, f"{name}: {type(exc).__name__}: {exc}\n    {trail}"
        finally:
            pool.give_back(zygote)
        return h.kills, None

    with ThreadPoolExecutor(len(pool.zygotes)) as executor:
        results = list(executor.map(run_one, scenarios))
    failures = [f for _, f in results if f]
    kills = sum(k for k, _ in results)
    if failures:
        names = ", ".join(f.split(": ", 1)[0] for f in failures)
        pytest.fail(
            f"{len(failures)} of {len(scenarios)} scenarios failed ({names}):\n\n"
            + "\n\n".join(failures[:6]),
            pytrace=False,
        )
    print(f"{len(scenarios)} scenarios, {kills} processes SIGKILLed")
    return kills


@pytest.fixture(scope="module")
def reference(pool: Pool, tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """The uninterrupted run: start, answer and resume, each in its own process."""
    workdir = tmp_path_factory.mktemp("reference")
    zygote = pool.borrow()
    try:
        h = Harness(zygote, workdir, "reference", None)
        start = h.step("start")
        assert start.result["status"] == "idle_with_pending_requests"
        respond = h.step("respond", request_id=h.request_id())
        assert respond.result["outcome"] == "stored"
        resume = h.step("resume")
        assert resume.result["status"] == "idle"
        h.check_final()
        outputs = h.state["outputs"]
        assert len(outputs) == 9 and outputs[-2] == (
            "done count=8 total=110 note=ship it mirror_seen=7 superstep=10"
        )
        executions = Counter((s, e) for s, e, _ in h.executions() if not is_journaled(e))
        assert max(executions.values()) == 1 and len(executions) == 1 + 2 * 8 + 1
        journaled = Counter((s, e) for s, e, _ in h.executions() if is_journaled(e))
        ((decided, step),) = journaled  # the superstep after the answer: stepper alone
        assert step == "stepper:note" and journaled[(decided, step)] == 1 and decided == 6
        assert (decided, "stepper") in executions and (decided, "mirror") not in executions
        whole = Harness(zygote, workdir, "reference-recover", None)
        recover = whole.step("recover")
        whole.check_final()
        assert whole.state["outputs"] == outputs
        assert recover.points == start.points + respond.points + resume.points
    finally:
        pool.give_back(zygote)
    return Reference(
        outputs=outputs,
        executions=executions,
        journaled=journaled,
        start_points=start.points,
        respond_points=respond.points,
        resume_points=resume.points,
        recover_seconds=recover.seconds,
    )


# --- scenarios ------------------------------------------------------------------------------------


def test_fault_points_cover_every_transaction(reference: Reference) -> None:
    """Start: admit plus five superstep commits; answer: one; resume: the note's journal write,
    five superstep commits (the first also applies the answer: no commit of its own). Each
    transaction has a before, inside and after point."""

    def transaction(kind: str) -> list[str]:
        return [f"{kind}:before", f"{kind}:inside", f"{kind}:after"]

    assert reference.start_points == transaction("admit") + transaction("commit") * 5
    assert reference.respond_points == transaction("answer")
    assert reference.resume_points == transaction("journal") + transaction("commit") * 5


def test_kill_at_every_point_of_the_first_run(
    pool: Pool, reference: Reference, tmp_path: Path
) -> None:
    def scenario(index: int) -> Scenario:
        def run(h: Harness) -> None:
            reply = h.step("start", "kill", kill_at=index)
            assert reply.fault == reference.start_points[index - 1]
            if index <= 2:  # killed before admit's COMMIT: no trace of the run
                assert not h.state["exists"]
            h.finish()

        return run

    points = reference.start_points
    kills = run_scenarios(
        pool,
        tmp_path,
        reference,
        [(f"start-{i}-{p.replace(':', '-')}", scenario(i)) for i, p in enumerate(points, 1)],
    )
    assert kills == len(points)


def test_kill_while_waiting_for_an_answer(pool: Pool, reference: Reference, tmp_path: Path) -> None:
    def paused(h: Harness) -> None:
        reply = h.step("start", "kill", hold=True, kill_on="waiting")
        assert reply.killed_by_zygote == "on waiting"
        assert h.state["status"] == "idle_with_pending_requests"
        assert [r["status"] for r in h.state["requests"]] == ["pending"]
        assert reply.event("waiting") == {"event": "waiting", "request_ids": [h.request_id()]}

    def then_recover(h: Harness) -> None:
        paused(h)
        h.finish()

    def then_answer_and_resume_elsewhere(h: Harness) -> None:
        paused(h)
        assert h.step("respond", request_id=h.request_id()).result["outcome"] == "stored"
        assert h.step("resume").result["status"] == "idle"
        h.check_final()

    def killed_waiting_twice(h: Harness) -> None:
        paused(h)
        h.step("resume", "kill", hold=True, kill_on="waiting")
        assert h.state["status"] == "idle_with_pending_requests"
        h.finish()

    def answered_then_killed_at_once(h: Harness) -> None:
        paused(h)
        h.step("respond", request_id=h.request_id())
        h.step("resume", "kill", timed=True, kill_after=0.0)  # dies before it gets anywhere
        assert h.answer_stored
        h.finish()

    kills = run_scenarios(
        pool,
        tmp_path,
        reference,
        [
            ("paused-recover", then_recover),
            ("paused-answer-resume", then_answer_and_resume_elsewhere),
            ("paused-twice", killed_waiting_twice),
            ("paused-answered-killed", answered_then_killed_at_once),
        ],
    )
    assert kills == 6


def test_kill_while_storing_the_answer(pool: Pool, reference: Reference, tmp_path: Path) -> None:
    def scenario(index: int, point: str, reanswer: bool) -> Scenario:
        def run(h: Harness) -> None:
            h.step("start")
            rid = h.request_id()
            reply = h.step("respond", "kill", request_id=rid, kill_at=index)
            assert reply.fault == point
            (request,) = h.state["requests"]
            if point == "answer:after":  # committed: durable
                assert request["status"] == "answered" and request["answer"] == h.answer
            else:  # before the transaction, or rolled back inside it
                assert request["status"] == "pending" and request["answer"] is None
            if reanswer:
                if point == "answer:after":
                    other = {**h.answer, "note": "something else"}
                    refused = h.step("respond", "error", request_id=rid, answer=other)
                    error = refused.event("error")
                    assert error and error["error_type"] == "RequestAlreadyAnsweredError"
                outcome = h.step("respond", request_id=rid).result["outcome"]
                assert outcome == ("duplicate" if point == "answer:after" else "stored")
                assert h.step("resume").result["status"] == "idle"
                h.check_final()
            else:
                h.finish()

        return run

    points = reference.respond_points
    kills = run_scenarios(
        pool,
        tmp_path,
        reference,
        [
            (
                f"respond-{i}-{p.replace(':', '-')}-{'reanswer' if again else 'recover'}",
                scenario(i, p, again),
            )
            for i, p in enumerate(points, 1)
            for again in (True, False)
        ],
    )
    assert kills == 2 * len(points)


def test_kill_at_every_point_of_the_resume(
    pool: Pool, reference: Reference, tmp_path: Path
) -> None:
    def scenario(index: int) -> Scenario:
        def run(h: Harness) -> None:
            h.step("start")
            h.step("respond", request_id=h.request_id())
            reply = h.step("resume", "kill", kill_at=index)
            assert reply.fault == reference.resume_points[index - 1]
            h.finish()

        return run

    points = reference.resume_points
    kills = run_scenarios(
        pool,
        tmp_path,
        reference,
        [(f"resume-{i}-{p.replace(':', '-')}", scenario(i)) for i, p in enumerate(points, 1)],
    )
    assert kills == len(points)


def test_takeover_from_a_killed_worker_not_yet_reaped(
    pool: Pool, reference: Reference, tmp_path: Path
) -> None:
    """A killed worker its parent has not reaped still answers kill(pid, 0); the next process
    must still see its owner as dead and take the lease over at once."""

    def scenario(index: int) -> Scenario:
        def run(h: Harness) -> None:
            h.step("start")
            h.step("respond", request_id=h.request_id())
            dead = h.step("resume", "kill", kill_at=index, defer_reap=True)
            owner = h.state["owner"]  # host:pid:nonce:execution
            assert owner is not None and owner.split(":")[1] == str(dead.pid), owner
            h.step("recover", reap=[dead.pid])  # the lease holder is a zombie all along
            assert not h.unreaped
            h.check_final()

        return run

    points = reference.resume_points
    chosen = [1, 2, 3, 9, 11, 17]  # the note's journal write, the supersteps' commits, ...
    kills = run_scenarios(
        pool,
        tmp_path,
        reference,
        [(f"zombie-{i}-{points[i - 1].replace(':', '-')}", scenario(i)) for i in chosen],
    )
    assert kills == len(chosen)


def test_every_process_killed_at_the_same_point(
    pool: Pool, reference: Reference, tmp_path: Path
) -> None:
    """Every process that drives the run (admit, answer, resume) dies at its k-th fault point,
    again and again, until one gets through: recovery of a recovery of a recovery..."""

    def scenario(k: int) -> Scenario:
        def run(h: Harness) -> None:
            for _ in range(40):
                reply = h.step("recover", "maybe", kill_at=k)
                if not reply.sigkilled:
                    break
            else:
                raise AssertionError("no progress after 40 kills")
            h.check_final()

        return run

    # from any state a process's 3rd point is after its first COMMIT, so k >= 3 progresses
    kills = run_scenarios(
        pool, tmp_path, reference, [(f"storm-k{k}", scenario(k)) for k in range(3, 13)]
    )
    assert kills >= 60  # 74 with today's fault points


def test_kills_at_random_points(pool: Pool, reference: Reference, tmp_path: Path) -> None:
    """Chains of processes, each killed at a random fault point, then one left to finish."""
    total = len(reference.start_points + reference.respond_points + reference.resume_points)

    def scenario(seed: int) -> Scenario:
        def run(h: Harness) -> None:
            rng = random.Random(seed)
            for _ in range(rng.randint(8, 16)):
                reply = h.step("recover", "maybe", kill_at=rng.randint(1, min(12, total)))
                if not reply.sigkilled:
                    break
            if h.state.get("status") != "idle":
                h.finish()
            else:
                h.check_final()

        return run

    kills = run_scenarios(
        pool, tmp_path, reference, [(f"random-seed{s}", scenario(s)) for s in range(12)]
    )
    assert kills >= 60  # 89 with today's fault points (the draws are seeded)


def test_kills_at_random_times(pool: Pool, reference: Reference, tmp_path: Path) -> None:
    """Processes killed by a timer, wherever they are: opening the store, taking the lease,
    running a handler, inside SQLite, releasing the lease..."""
    span = reference.recover_seconds * 1.1
    points = reference.start_points + reference.respond_points + reference.resume_points
    units = sum(not p.startswith("journal:") for p in points) // 3  # checkpoints and answer

    def scenario(seed: int) -> Scenario:
        def run(h: Harness) -> None:
            rng = random.Random(1000 + seed)
            for _ in range(12):
                # aim within what is left to do: transactions done so far shorten the run
                left = 1 - (h.history_len + h.answer_stored) / units
                delay = rng.uniform(0, span * max(left, 0.2))
                reply = h.step("recover", "maybe", timed=True, kill_after=delay)
                if not reply.sigkilled:
                    break
            if h.state.get("status") != "idle":
                h.finish()
            else:
                h.check_final()

        return run

    # How many timers land before a run finishes depends on the machine's speed and load, and
    # the reference's duration is one sample (the exact fault-point tests above guarantee
    # coverage): more seeds, eight at a time, until a real number of processes were killed.
    kills, seeds = 0, 0
    while kills < 12 and seeds < 64:
        batch = [(f"timer-seed{s}", scenario(s)) for s in range(seeds, seeds + 8)]
        kills += run_scenarios(pool, tmp_path, reference, batch)
        seeds += 8
    assert kills >= 12


def race(zygotes: list[Zygote], workdir: Path, stagger: float, expected: list[str]) -> None:
    """Answer a paused run, then have two processes resume it (the second ``stagger`` s later)."""
    slow = {**ANSWER, "delay": 0.5}  # every superstep after the answer takes 0.5 s
    h = Harness(zygotes[0], workdir, f"race-{stagger}", None, start=RACE_START, answer=slow)
    h.step("start")
    h.step("respond", request_id=h.request_id())
    at = time.time() + 0.3

    def resume(index: int) -> Reply:
        return h.call("race", zygote=zygotes[index], start_at=at + index * stagger)

    with ThreadPoolExecutor(len(zygotes)) as executor:
        replies = list(executor.map(resume, range(len(zygotes))))
    outcomes = {r.pid: r.result for r in replies}
    assert sorted(r["outcome"] for r in outcomes.values()) == ["busy", "ran"], outcomes
    (winner,) = [pid for pid, r in outcomes.items() if r["outcome"] == "ran"]
    (loser,) = [pid for pid, r in outcomes.items() if r["outcome"] == "busy"]
    assert "being executed by another worker" in outcomes[loser]["message"]
    assert outcomes[winner]["status"] == "idle"
    h.state = h.inspect()
    h.check_store(h.state)  # one linear history: seqs 0..n, supersteps never go back
    h.check_final()
    assert h.state["outputs"] == expected
    runs = h.executions()
    pairs = [(s, e) for s, e, _ in runs]
    assert len(pairs) == len(set(pairs)), f"a superstep ran twice: {runs}"
    assert all(pid != loser for _, _, pid in runs), f"the refused process ran: {runs}"
    assert {pid for s, _, pid in runs if s > 3} == {winner}, runs


def test_two_processes_resuming_one_run(pool: Pool, tmp_path: Path) -> None:
    """Exactly one proceeds; the other is refused with RunBusyError; history never forks."""
    zygotes = [pool.borrow() for _ in range(ZYGOTES)]
    try:
        baseline = Harness(zygotes[0], tmp_path, "race-baseline", None, start=RACE_START)
        baseline.finish()
        for stagger in (0.0, 0.25):  # at the same instant; while the winner is mid-superstep
            race(zygotes, tmp_path, stagger, baseline.state["outputs"])
    finally:
        for z in zygotes:
            pool.give_back(z)
