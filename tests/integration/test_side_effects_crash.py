"""Side effects exactly once, with real processes: SIGKILL an approved transfer's run anywhere.

The run (``ledger_workflow.py``) is an agent whose approval-required ``transfer`` tool appends to
a ledger file, deduplicating by the idempotency key it receives, and logs every invocation to a
second file. Each scenario has its own SQLite file, ledger and log, and every step runs in a
fresh process forked by the crash harness's zygote (``crash_worker.py``, command ``ledger``):
start the run until it pauses for approval, answer in another process, then resume in a process
that SIGKILLs itself at the k-th call of the store's fault hook -- for every k of the resume:
before, inside and after the commit that applies the answers, the journal write of each tool
call and of the model call, and the superstep's commit -- or is killed by a timer; then resume
in fresh processes until the run is done. After every process a fresh one reads the database,
and the test checks:

* the killed process died of SIGKILL, at the fault point it was told, without finishing;
* every process reported exactly the fault points a replay predicts from what is durable: the
  answers' commit only while it is not committed, a journal write only for a call that is not
  journaled yet (each fault point is labelled with the journal key it writes);
* a tool ran in a process exactly when its call was not journaled when the process reached it
  -- so it ran again only after a kill before its journal entry committed ("journal:after" not
  reached) -- once journaled, never again; a journal entry never changes;
* the ledger never holds a key twice nor a key of a rejected call;

and at the end: exactly one ledger line per approved call (by the first invocation that got to
the bank), none for the rejected one, and the run's status, outputs (the agent's final message
and whole conversation), requests, history length and journal equal an uninterrupted run's.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from executors._agent import REJECTED
from tests.integration.ledger_workflow import BATCH_PROMPT, SINGLE_PROMPT, read_lines
from tests.integration.test_crash_safety import Pool, Reply, died_of_sigkill

pytestmark = pytest.mark.slow

ZYGOTES = 2
RUN_ID = "transfer-run"
"""Every scenario's run has this id (each in its own database), like its reference run: the
idempotency keys and the request ids -- whose order sets the order in which the agent records
the answers -- are the same in all of them."""
Label = tuple[str | None, str]
"""A fault point and, for a journal write, the call: ("tool/call_1", "journal:after")."""


@dataclass(frozen=True)
class Workload:
    name: str
    prompt: str
    decisions: dict[str, bool]  # approval-required call id -> approved
    runs: dict[str, str]  # call id -> tool, for every call that must run (approved or free)
    final_text: str

    @property
    def approved(self) -> list[str]:
        return [c for c, ok in self.decisions.items() if ok]


SINGLE = Workload(
    "single",
    SINGLE_PROMPT,
    {"call_1": True},
    {"call_1": "transfer"},
    "Done. transfer: Transferred 250.00 from 111111 to 222222.",
)
BATCH = Workload(
    "batch",  # two guarded transfers, one approved and one rejected, and a free balance check
    BATCH_PROMPT,
    {"call_1": True, "call_2": False},
    {"call_1": "transfer", "call_3": "balance"},
    f"Done. transfer: Transferred 100.00 from 111111 to 222222. | transfer: {REJECTED} | "
    "balance: Balance of 111111: 900.00 EUR.",
)
WORKLOADS = {w.name: w for w in (SINGLE, BATCH)}


def call_of(key: str) -> str:
    """'<checkpoint>/<executor>/tool/call_1' -> 'tool/call_1' (the key without its scope)."""
    return key.split("/", 2)[2]


def labels_of(reply: Reply) -> list[Label]:
    labels: list[Label] = []
    journaling: str | None = None
    for event in reply.events:
        if event["event"] == "journal":
            journaling = call_of(event["key"])
        elif event["event"] == "point":
            point = event["point"]
            labels.append((journaling if point.startswith("journal:") else None, point))
    return labels


def journaled_tools(state: dict[str, Any]) -> dict[str, Any]:
    """call id -> journaled result, for the tool calls in the journal."""
    out = {}
    for key, value in state["journal"]:
        kind, _, call_id = call_of(key).partition("/")
        if kind == "tool":
            assert call_id not in out, (
                f"{call_id} journaled twice, under two checkpoints: it ran again after it was "
                f"journaled ({[k for k, _ in state['journal']]})"
            )
            out[call_id] = value
    return out


@dataclass
class Reference:
    """The uninterrupted run of a workload."""

    labels: list[Label]  # of the resume after the answers
    state: dict[str, Any]
    ledger: list[dict[str, Any]]
    resume_seconds: float


class LedgerRun:
    """One run in its own files, driven through forked processes, checked after each."""

    def __init__(
        self, zygote: Any, workdir: Path, name: str, workload: Workload, reference: Reference | None
    ) -> None:
        self.zygote = zygote
        self.name = name
        self.workload = workload
        self.reference = reference
        self.db = workdir / f"{name}.db"
        self.ledger = workdir / f"{name}.ledger"
        self.invocations = workdir / f"{name}.invocations"
        self.state: dict[str, Any] = {}
        self.kills = 0
        self.timer_kills = 0
        self.trail: list[str] = []

    def key(self, call_id: str) -> str:
        return f"{RUN_ID}:{call_id}"

    def call(self, action: str, **extra: Any) -> Reply:
        cmd = {
            "op": "ledger",
            "action": action,
            "db": str(self.db),
            "run_id": RUN_ID,
            "ledger": str(self.ledger),
            "invocations": str(self.invocations),
            "prompt": self.workload.prompt,
            "decisions": self.workload.decisions,
            "timeout": 30.0,
            **extra,
        }
        reply = self.zygote.call(cmd)
        assert reply.killed_by_zygote != "timeout", f"{action} hung: {reply.describe()}"
        return reply

    def finished(self, reply: Reply) -> dict[str, Any]:
        result = reply.event("result")
        assert reply.exited_ok and result is not None, reply.describe()
        return result

    def inspect(self) -> dict[str, Any]:
        """What a fresh process reads from the database."""
        self.state = self.finished(self.call("inspect"))
        return self.state

    def start_and_approve(self) -> None:
        started = self.finished(self.call("start"))
        assert started["status"] == "idle_with_pending_requests", started
        assert sorted(self.inspect()["pending"]) == sorted(self.workload.decisions)
        answered = self.finished(self.call("respond"))
        assert answered["outcomes"] == dict.fromkeys(self.workload.decisions, "stored")
        state = self.inspect()
        assert {r["status"] for r in state["requests"]} == {"answered"}
        assert journaled_tools(state) == {}  # nothing ran before the approval
        assert not self.invocations.exists() and not self.ledger.exists()
        self.trail.append("started, paused, approved")

    # --- the resume under test ------------------------------------------------------------------

    def expected_labels(self) -> list[Label]:
        """The fault points a resume from the current database reports: the reference resume's,
        minus the answers' commit once it is durable and minus every journaled call."""
        assert self.reference is not None
        applied = all(r["status"] == "applied" for r in self.state["requests"])
        journaled = {call_of(key) for key, _ in self.state["journal"]}
        return [
            label
            for index, label in enumerate(self.reference.labels)
            if not (applied and index < 3) and label[0] not in journaled
        ]

    def resume(self, expect: str = "ok", *, timed: bool = False, **extra: Any) -> Reply:
        """Resume in a fresh process; ``expect`` "kill" (by its fault hook: ``kill_at``), "ok",
        or "maybe" (a timer, ``kill_after``, may strike after the process finished)."""
        expected = self.expected_labels()
        before = journaled_tools(self.state)
        reply = self.call("resume", **extra)
        labels = labels_of(reply)
        if expect == "maybe":
            expect = "kill" if reply.sigkilled else "ok"
        killed = expect == "kill"
        if killed:
            assert died_of_sigkill(reply.wait_status), f"not SIGKILLed: {reply.describe()}"
            if not timed:  # a timer may also strike between the last report and the exit
                assert reply.event("result") is None, f"finished though killed: {reply.describe()}"
            if "kill_at" in extra:
                assert len(labels) == extra["kill_at"] and reply.fault == labels[-1][1]
            self.kills += 1
            self.timer_kills += timed
        else:
            assert self.finished(reply)["status"] == "idle", reply.describe()
        self.trail.append(
            f"resume {extra or ''} pid {reply.pid}: {'killed' if killed else 'finished'}"
            + (f" at {labels[-1]}" if killed and labels else "")
        )
        after = journaled_tools(self.inspect())
        self.trail.append(f"  -> {self.state['status']}, journaled {sorted(after)}")
        self.check_tools(reply, labels, expected, before, after, killed=killed, timed=timed)
        self.check_ledger()
        # a replay reports exactly what is not durable yet: no journal write for a journaled call
        if killed:
            assert labels == expected[: len(labels)], f"points {labels}, predicted {expected}"
        else:
            assert labels == expected, f"points {labels}, predicted {expected}"
        return reply

    def check_tools(
        self,
        reply: Reply,
        labels: list[Label],
        expected: list[Label],
        before: dict[str, Any],
        after: dict[str, Any],
        *,
        killed: bool,
        timed: bool,
    ) -> None:
        """Each tool ran in this process exactly when its call was not journaled yet (and the
        process got that far); what it journaled is durable exactly past "journal:after"."""
        invocations = read_lines(self.invocations)
        for call_id, tool in self.workload.runs.items():
            call = f"tool/{call_id}"
            mine = [i for i in invocations if i["key"] == self.key(call_id)]
            assert {i["tool"] for i in mine} <= {tool}
            mine = [i for i in mine if i["pid"] == reply.pid]
            assert len(mine) <= 1, f"pid {reply.pid} ran {call_id} {len(mine)} times"
            if call_id in before:
                assert not mine, f"{call_id} ran again although journaled before pid {reply.pid}"
                assert after[call_id] == before[call_id], f"the journal entry of {call_id} changed"
                continue
            if not killed:
                assert mine and call_id in after, f"{call_id} did not run and journal: {labels}"
            wrote = (call, "journal:before") in labels  # it reached the journal write
            if mine and not wrote:  # a timer struck between the call and its journal write
                assert timed and expected[len(labels)] == (call, "journal:before"), labels
            assert bool(mine) >= wrote, f"pid {reply.pid} journaled {call_id} without running it"
            if timed and labels and labels[-1] == (call, "journal:inside"):
                continue  # killed inside the transaction: committed or not, either is fine
            committed = (call, "journal:after") in labels
            assert (call_id in after) == committed, (
                f"{call_id} journaled: {call_id in after}, but the process reported {labels}"
            )

    def check_ledger(self) -> None:
        ledger = read_lines(self.ledger)
        keys = [e["key"] for e in ledger]
        assert len(keys) == len(set(keys)), f"a transfer is in the ledger twice: {keys}"
        approved = {self.key(c) for c in self.workload.approved}
        assert set(keys) <= approved, f"ledger {keys}, approved {sorted(approved)}"
        invocations = read_lines(self.invocations)
        for entry in ledger:
            pids = [i["pid"] for i in invocations if i["key"] == entry["key"]]
            if self.timer_kills:  # a timer may strike between the invocation and the transfer
                assert entry["pid"] in pids, "a ledger line no invocation wrote"
            else:
                assert entry["pid"] == pids[0], "the ledger line is not the first invocation's"

    def run_to_end(self) -> None:
        for _ in range(5):
            if self.state["status"] == "idle":
                return
            self.resume()
        raise AssertionError("the run did not finish")

    # --- the end --------------------------------------------------------------------------------

    def invocation_counts(self) -> Counter[str]:
        return Counter(i["key"].rsplit(":", 1)[1] for i in read_lines(self.invocations))

    def check_final(self) -> None:
        """Exactly one transfer per approved call; the run ends as an uninterrupted one."""
        reference = self.reference
        assert reference is not None
        state = self.state
        assert state["status"] == "idle" and state["pending"] == []
        ledger = read_lines(self.ledger)
        assert sorted(e["key"] for e in ledger) == sorted(
            self.key(c) for c in self.workload.approved
        )
        assert [{**e, "key": "", "pid": 0} for e in ledger] == [
            {**e, "key": "", "pid": 0} for e in reference.ledger
        ]
        counts = self.invocation_counts()
        assert set(counts) == set(self.workload.runs), f"invocations {counts}"  # none rejected
        for key in ("outputs", "requests", "history", "status"):
            assert state[key] == reference.state[key], f"{key} differs from the uninterrupted run"
        assert state["outputs"][-1]["messages"][-1]["contents"][0]["text"] == (
            self.workload.final_text
        )
        journal = [(call_of(k), v) for k, v in state["journal"]]
        assert sorted(journal, key=repr) == sorted(
            [(call_of(k), v) for k, v in reference.state["journal"]], key=repr
        ), "the journal differs from the uninterrupted run's"
        transfers = {t["key"]: t["result"] for t in ledger}
        for call_id, value in journaled_tools(state).items():
            if self.key(call_id) in transfers:  # the agent saw what the bank recorded
                assert value["value"]["data"]["result"] == transfers[self.key(call_id)]


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    p = Pool(ZYGOTES)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture(scope="module")
def references(pool: Pool, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Reference]:
    """Each workload uninterrupted: start, answer and resume, each in its own process."""
    workdir = tmp_path_factory.mktemp("reference")
    zygote = pool.borrow()
    out = {}
    try:
        for workload in WORKLOADS.values():
            run = LedgerRun(zygote, workdir, f"reference-{workload.name}", workload, None)
            run.start_and_approve()
            reply = run.call("resume")
            assert run.finished(reply)["status"] == "idle", reply.describe()
            state = run.inspect()
            assert state["status"] == "idle"
            assert [r["status"] for r in state["requests"]] == ["applied"] * len(workload.decisions)
            assert run.invocation_counts() == Counter(dict.fromkeys(workload.runs, 1))
            ledger = read_lines(run.ledger)
            assert [e["key"] for e in ledger] == [run.key(c) for c in workload.approved]
            out[workload.name] = Reference(labels_of(reply), state, ledger, reply.seconds)
            run.reference = out[workload.name]
            run.check_final()
    finally:
        pool.give_back(zygote)
    return out


Scenario = Callable[[LedgerRun], None]


def run_scenarios(
    pool: Pool,
    workdir: Path,
    workload: Workload,
    reference: Reference,
    scenarios: list[tuple[str, Scenario]],
) -> list[LedgerRun]:
    """Run the scenarios two at a time (one per zygote); fail listing every failed one."""

    def run_one(item: tuple[str, Scenario]) -> tuple[LedgerRun, str | None]:
        name, scenario = item
        zygote = pool.borrow()
        run = LedgerRun(zygote, workdir, name, workload, reference)
        try:
            scenario(run)
        except Exception as exc:
            trail = "\n    ".join(run.trail[-10:])
            return run, f"{name}: {type(exc).__name__}: {exc}\n    {trail}"
        finally:
            pool.give_back(zygote)
        return run, None

    with ThreadPoolExecutor(len(pool.zygotes)) as executor:
        results = list(executor.map(run_one, scenarios))
    failures = [f for _, f in results if f]
    if failures:
        names = ", ".join(f.split(": ", 1)[0] for f in failures)
        pytest.fail(
            f"{len(failures)} of {len(scenarios)} scenarios failed ({names}):\n\n"
            + "\n\n".join(failures[:6]),
            pytrace=False,
        )
    return [run for run, _ in results]


# --- tests ----------------------------------------------------------------------------------------


def test_fault_points_of_the_resume_after_approval(references: dict[str, Reference]) -> None:
    """The answers' commit, one journal write per call that runs and one for the model's next
    answer, the superstep's commit; the rejected call writes nothing."""

    def transaction(call: str | None, kind: str) -> list[Label]:
        return [(call, f"{kind}:{when}") for when in ("before", "inside", "after")]

    for workload in WORKLOADS.values():
        calls = [transaction(f"tool/{c}", "journal") for c in workload.runs]
        assert references[workload.name].labels == (
            transaction(None, "commit")
            + [label for call in calls for label in call]
            + transaction("model/5", "journal")
            + transaction(None, "commit")
        )


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_kill_at_every_point_after_approval(
    pool: Pool, references: dict[str, Reference], tmp_path: Path, name: str
) -> None:
    workload, reference = WORKLOADS[name], references[name]
    points = reference.labels

    def scenario(index: int) -> Scenario:
        def run(r: LedgerRun) -> None:
            r.start_and_approve()
            r.resume("kill", kill_at=index)
            r.run_to_end()
            r.check_final()
            # the tool ran twice exactly when killed after it ran, before its entry committed
            call, point = points[index - 1]
            expected = Counter(dict.fromkeys(workload.runs, 1))
            if call is not None and call.startswith("tool/") and point != "journal:after":
                expected[call.removeprefix("tool/")] += 1
            assert r.invocation_counts() == expected

        return run

    runs = run_scenarios(
        pool,
        tmp_path,
        workload,
        reference,
        [
            (f"{name}-{i}-{call or 'run'}-{point}".replace("/", "-").replace(":", "-"), scenario(i))
            for i, (call, point) in enumerate(points, 1)
        ],
    )
    assert sum(r.kills for r in runs) == len(points)
    again = sum(max(r.invocation_counts().values()) > 1 for r in runs)
    assert again == 2 * len(workload.runs)  # killed at journal:before or :inside of each call
    print(f"{name}: {len(points)} kill points, {again} tool re-executions (same key, deduplicated)")


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_resume_killed_at_the_next_point(
    pool: Pool, references: dict[str, Reference], tmp_path: Path, name: str
) -> None:
    """A relay: each process dies at the next journal point (before, inside, after each call's
    write, then the model's), then inside the commit; every attempt that did not get past a
    call's journal write reruns its tool with the same key, none after."""
    workload, reference = WORKLOADS[name], references[name]
    journal = ("journal:before", "journal:inside", "journal:after")
    calls = [f"tool/{c}" for c in workload.runs] + ["model/5"]

    def relay(r: LedgerRun) -> None:
        r.start_and_approve()
        for call in calls:
            for point in journal:
                r.resume("kill", kill_at=r.expected_labels().index((call, point)) + 1)
        assert r.expected_labels() == [(None, f"commit:{w}") for w in ("before", "inside", "after")]
        r.resume("kill", kill_at=2)  # rolled back: the superstep runs again, all replayed
        r.run_to_end()
        r.check_final()
        assert r.invocation_counts() == Counter(dict.fromkeys(workload.runs, 3))

    (run,) = run_scenarios(pool, tmp_path, workload, reference, [(f"relay-{name}", relay)])
    assert run.kills == 3 * len(calls) + 1


def test_kills_at_random_times(
    pool: Pool, references: dict[str, Reference], tmp_path: Path
) -> None:
    """Processes killed by a timer wherever they are (opening the store, inside the tool, between
    the tool and its journal write, in SQLite...), again and again until one finishes."""

    def scenario(reference: Reference, seed: int) -> Scenario:
        def run(r: LedgerRun) -> None:
            rng = random.Random(seed)
            r.start_and_approve()
            for attempt in range(4):
                # resumes vary twofold in duration: aim the first kill well inside the run
                span = reference.resume_seconds * (0.5 if attempt == 0 else 1.2)
                reply = r.resume("maybe", timed=True, kill_after=rng.uniform(0.01, span))
                if not reply.sigkilled or r.state["status"] == "idle":
                    break
            r.run_to_end()
            r.check_final()

        return run

    total = again = 0
    for workload in WORKLOADS.values():
        reference = references[workload.name]
        runs = run_scenarios(
            pool,
            tmp_path,
            workload,
            reference,
            [(f"timer-{workload.name}-{s}", scenario(reference, s)) for s in range(4)],
        )
        total += sum(r.kills for r in runs)
        again += sum(sum(r.invocation_counts().values()) - len(workload.runs) for r in runs)
    print(f"{total} processes killed by a timer, {again} tool re-executions")
    assert total >= 6  # 8 chains; usually 30-50 kills
