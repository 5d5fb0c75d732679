"""Side effects exactly once, with real processes: SIGKILL an approved transfer's run anywhere.

The run (``ledger_workflow.py``) is an agent whose approval-required ``transfer`` tool appends to
a ledger file (the "bank") and whose free ``balance`` tool (declared idempotent) reads it; both
log every invocation to a second file. Each scenario has its own SQLite file, ledger and log,
and every step runs in a fresh process forked by the crash harness's zygote (``crash_worker.py``,
command ``ledger``): start the run until it pauses for approval, answer in another process, then
resume in a process that SIGKILLs itself at the k-th call of the store's fault hook -- for every
k of the resume: the intent and the result journaled around each tool call, the model call's
result, and before, inside and after the superstep's commit (which also applies the approvals:
an answer stored by ``respond`` needs no commit of its own) -- or is killed by a timer; then
resume in fresh processes until the run is done.

The contract under test: a journaled step never runs again once its result is durable, and a
step that is not idempotent (a transfer) is never repeated blindly. Before a transfer starts the
engine journals an *intent*; a process killed after the intent and before the result leaves the
transfer in doubt, and the next resume does not run it but pauses the run with an
``InDoubtEffect`` request. The harness answers it truthfully, from the bank's side (did the
ledger record a transfer with the idempotency key this step's invocations used?):
``{"happened": true, "result": <the bank's answer>}`` records that as the step's result,
``{"happened": false}`` lets the transfer run. An idempotent step (``balance``, the model call)
is simply run again, with the same idempotency key.

A model of the engine predicts, from what a fresh process reads in the database, what a resume
does next: the fault points it reports (each labelled with the journal step it writes), the
tools it runs between them, and what is durable at each point. After every process a fresh one
reads the database, and the test checks:

* the killed process died of SIGKILL, at the fault point it was told, without finishing;
* every process reported exactly the fault points the model predicts (a journal write only for
  a step without a durable result, a question instead of a transfer in doubt, ...), left the
  database as the model says it is at the point where it died (intents, results, questions,
  answers, checkpoints: an entry is durable exactly when the process got past its COMMIT), and
  ran exactly the tools the model says it reached -- never one whose result was journaled, never
  a transfer whose intent was journaled unless a person said it did not happen;
* a journaled result never changes; a transfer's journaled result is what the bank recorded;
* every invocation of a step used one idempotency key (``<run id>:<32 hex digits>``), different
  for every step; the ledger never holds a key twice, nor a key of a rejected call, and the bank
  never sees a key again once it recorded it (it logs every deduplication: there is none);

and at the end: exactly one ledger line per approved transfer, written by the last invocation of
its step; the journal is empty (a committed superstep's entries are compacted away); the run's
status, outputs (the agent's final message and whole conversation) and approvals equal an
uninterrupted run's, every question was answered and applied, and the history is the
uninterrupted run's plus two checkpoints per question (the question, the answer).
A transfer in doubt a second time (it did not happen, ran again, and the process died again
before its result) is asked about again: ``test_in_doubt_again_after_it_did_not_happen``.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.integration.ledger_workflow import AGENT_NAME, BATCH_PROMPT, SINGLE_PROMPT, read_lines
from tests.integration.test_crash_safety import Pool, Reply, Zygote, died_of_sigkill
from workflow_engine.executors._agent import REJECTED

pytestmark = pytest.mark.slow

ZYGOTES = 2
RUN_ID = "transfer-run"
"""Every scenario's run has this id (each in its own database), like its reference run. Its
step secret is random, so its idempotency keys and request ids are its own."""
SUPERSTEP = 2
"""The superstep after the approvals, which runs the tools: every journal entry a test sees."""
KEY = re.compile(rf"{RUN_ID}:[0-9a-f]{{32}}")
STEP_KEY = re.compile(
    rf"{SUPERSTEP}/{AGENT_NAME}/r:(?P<request>[0-9a-f]{{32}})/(?P<name>(?:tool|model)#\d+)"
)
MODEL = "model#0"
"""The model's answer after the tools ran (the first model call of that handler invocation)."""

Label = tuple[str | None, str]
"""A fault point and, for a journal write, its step: ("tool#0", "intent:after"). The intent's
transaction reports the store's "journal:inside" point; it is labelled "intent:inside"."""


# --- the workloads --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """A tool call the model makes."""

    call_id: str
    tool: str
    asked: dict[str, str]  # its arguments as the model asked for them
    logged: dict[str, Any]  # ... as the tool logs them (how invocations are told apart)
    step: str = ""  # its journal step; "" if it is rejected (it never runs)
    approved: bool | None = None  # None: it needs no approval
    idempotent: bool = False

    @property
    def in_doubt_after_a_crash(self) -> bool:
        return bool(self.step) and not self.idempotent


@dataclass(frozen=True)
class Workload:
    name: str
    prompt: str
    calls: tuple[Call, ...]
    final_text: str

    @property
    def decisions(self) -> dict[str, bool]:
        """Approval-required call id -> approved."""
        return {c.call_id: c.approved for c in self.calls if c.approved is not None}

    @property
    def runs(self) -> list[Call]:
        """The calls that must run (approved or free), in order."""
        return [c for c in self.calls if c.step]

    @property
    def steps(self) -> list[tuple[str, Call | None]]:
        """The journaled steps of the turn after the approvals, in order: the tool calls that
        run, then the model's answer."""
        return [(c.step, c) for c in self.runs] + [(MODEL, None)]

    def call_at(self, step: str) -> Call:
        (call,) = [c for c in self.calls if c.step == step]
        return call

    @property
    def transfer(self) -> str:
        """The step of the (first) approved transfer."""
        return next(c.step for c in self.runs if c.in_doubt_after_a_crash)


def _transfer(call_id: str, src: str, dst: str, amount: int, **extra: Any) -> Call:
    return Call(
        call_id,
        "transfer",
        {"amount": str(amount), "from_account": src, "to_account": dst},
        {"amount": float(amount), "from": src, "to": dst},
        **extra,
    )


SINGLE = Workload(
    "single",
    SINGLE_PROMPT,
    (_transfer("call_1", "111111", "222222", 250, step="tool#0", approved=True),),
    "Done. transfer: Transferred 250.00 from 111111 to 222222.",
)
BATCH = Workload(
    "batch",  # two guarded transfers, one approved and one rejected, and a free balance check
    BATCH_PROMPT,
    (
        _transfer("call_1", "111111", "222222", 100, step="tool#0", approved=True),
        _transfer("call_2", "111111", "333333", 900, approved=False),
        Call(
            "call_3",
            "balance",
            {"account": "111111"},
            {"account": "111111"},
            step="tool#1",
            idempotent=True,
        ),
    ),
    f"Done. transfer: Transferred 100.00 from 111111 to 222222. | transfer: {REJECTED} | "
    "balance: Balance of 111111: 900.00 EUR.",
)
WORKLOADS = {w.name: w for w in (SINGLE, BATCH)}


def labels_of(reply: Reply) -> list[Label]:
    labels: list[Label] = []
    step: str | None = None
    writing = ""
    for event in reply.events:
        if event["event"] in ("intent", "journal"):
            match = STEP_KEY.fullmatch(event["key"])
            assert match is not None, f"journal key {event['key']!r} is not a step key"
            step, writing = match["name"], event["event"]
        elif event["event"] == "point":
            point = event["point"]
            if not point.startswith(("intent:", "journal:")):
                labels.append((None, point))
                continue
            if writing == "intent" and point == "journal:inside":
                point = "intent:inside"
            labels.append((step, point))
    return labels


def raw_point(label: Label) -> str:
    """The store's fault point behind a label."""
    return "journal:inside" if label[1] == "intent:inside" else label[1]


# --- a model of the engine ------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """A request asking whether a step in doubt happened."""

    step: str
    status: str  # pending, answered, applied
    happened: bool | None  # the answer, once given


@dataclass(frozen=True)
class Durable:
    """What the course of a resume depends on, as a fresh process reads it from the database."""

    approvals: str  # the approvals' status (they share one: answered together, applied together)
    questions: tuple[Question, ...]
    journal: tuple[tuple[str, str], ...]  # (step, "intent" or "value"), sorted
    history: int
    done: bool  # the turn's superstep is committed: the run is idle

    @property
    def entries(self) -> dict[str, str]:
        return dict(self.journal)

    def describe(self) -> str:
        questions = [f"{q.step}:{q.status}:{q.happened}" for q in self.questions]
        return (
            f"approvals {self.approvals}, questions {questions}, journal {dict(self.journal)}, "
            f"{self.history} checkpoints{', done' if self.done else ''}"
        )


@dataclass(frozen=True)
class Moment:
    """One thing a resume does: report a fault point (``label``) or, unreported, run a tool
    (``ran``: its step) or forget a step (a person said it did not happen); ``after``: what is
    durable once it is done."""

    label: Label | None
    ran: str | None
    after: Durable


@dataclass
class Course:
    """What a resume from ``start`` does, and the status it ends with unless it is killed."""

    start: Durable
    moments: list[Moment]
    status: str

    @property
    def labels(self) -> list[Label]:
        return [m.label for m in self.moments if m.label is not None]

    def outcomes(
        self, reported: int, *, killed: bool, timed: bool
    ) -> list[tuple[Durable, set[str]]]:
        """The (durable state, steps whose tool ran) a process may leave after it reported
        ``reported`` fault points: killed by its fault hook at the last one, killed by a timer
        anywhere until the next one, or finished."""
        moments = self.moments
        positions = [i for i, m in enumerate(moments) if m.label is not None]
        if not killed:
            assert reported == len(positions)
            return [(moments[-1].after if moments else self.start, self.ran(len(moments)))]
        last = positions[reported - 1] if reported else -1
        if not timed:
            return [(moments[last].after if reported else self.start, self.ran(last))]
        out: list[tuple[Durable, set[str]]] = []
        following = [p for p in positions if p > last]
        end = following[0] if following else len(moments)
        for i in range(last, end):  # unreported moments until the next fault point
            out.append((moments[i].after if i >= 0 else self.start, self.ran(i + 1)))
        label = moments[last].label if reported else None
        if label is not None and label[1].endswith(":inside") and following:
            out.append((moments[end].after, self.ran(end)))  # COMMIT done, "after" not reported
        return out

    def ran(self, until: int) -> set[str]:
        return {m.ran for m in self.moments[:until] if m.ran is not None}


class Simulation:
    """Builds a :class:`Course`, one moment at a time."""

    def __init__(self, start: Durable) -> None:
        self.approvals = start.approvals
        self.questions = list(start.questions)
        self.journal = start.entries
        self.history = start.history
        self.done = start.done
        self.moments: list[Moment] = []

    def now(self) -> Durable:
        return Durable(
            self.approvals,
            tuple(self.questions),
            tuple(sorted(self.journal.items())),
            self.history,
            self.done,
        )

    def mark(self, label: Label | None, ran: str | None = None) -> None:
        self.moments.append(Moment(label, ran, self.now()))

    def transaction(self, step: str | None, kind: str, change: Callable[[], None]) -> None:
        """Before, inside (killed there: rolled back), COMMIT, after."""
        self.mark((step, f"{kind}:before"))
        self.mark((step, f"{kind}:inside"))
        change()
        self.mark((step, f"{kind}:after"))

    def journal_result(self, step: str) -> None:
        """A result is stored unless one exists (first writer wins); it replaces an intent."""
        self.transaction(step, "journal", partial(self.journal.__setitem__, step, "value"))

    def settle(self) -> None:
        """The answers about effects: committed at once, alone (they wrote the journal)."""
        self.questions = [
            replace(q, status="applied") if q.status == "answered" else q for q in self.questions
        ]
        self.history += 1

    def _apply_approvals(self) -> None:
        """A resume's first superstep commit applies the approvals (the question's, if the run
        asks instead): stored by ``respond``, they need no commit of their own."""
        if self.approvals == "answered":
            self.approvals = "applied"

    def ask(self, step: str) -> None:
        self._apply_approvals()
        self.questions.append(Question(step, "pending", None))
        self.history += 1

    def finish(self) -> None:
        self._apply_approvals()
        self.journal.clear()  # compacted by the superstep's commit
        self.history += 1
        self.done = True


def course_of(workload: Workload, start: Durable) -> Course:
    """What a resume does from ``start`` (see the module docstring)."""
    if start.done:
        return Course(start, [], "idle")
    if any(q.status == "pending" for q in start.questions):
        return Course(start, [], "idle_with_pending_requests")  # waits for a person
    sim = Simulation(start)
    answered = [q for q in start.questions if q.status == "answered"]
    if answered:
        for q in answered:  # the answers about effects go to the journal first
            if q.happened:
                sim.journal_result(q.step)
            else:
                sim.journal.pop(q.step, None)
                sim.mark(None)
        sim.transaction(None, "commit", sim.settle)
    for step, call in workload.steps:
        entry = sim.journal.get(step)
        if entry == "value":
            continue  # replayed
        idempotent = call is None or call.idempotent
        if entry == "intent" and not idempotent:  # in doubt: ask, do not run it
            sim.transaction(None, "commit", partial(sim.ask, step))
            return Course(start, sim.moments, "idle_with_pending_requests")
        if not idempotent:
            sim.transaction(step, "intent", partial(sim.journal.__setitem__, step, "intent"))
        if call is not None:
            sim.mark(None, ran=step)
        sim.journal_result(step)
    sim.transaction(None, "commit", sim.finish)
    return Course(start, sim.moments, "idle")


# --- one run under test ---------------------------------------------------------------------------


@dataclass
class Reference:
    """The uninterrupted run of a workload."""

    labels: list[Label]  # of the resume after the answers
    state: dict[str, Any]
    ledger: list[dict[str, Any]]
    keys: dict[str, str]  # step -> idempotency key
    resume_seconds: float


class LedgerRun:
    """One run in its own files, driven through forked processes, checked after each."""

    def __init__(
        self,
        zygote: Zygote,
        workdir: Path,
        name: str,
        workload: Workload,
        reference: Reference | None,
    ) -> None:
        self.zygote = zygote
        self.name = name
        self.workload = workload
        self.reference = reference
        self.db = workdir / f"{name}.db"
        self.ledger = workdir / f"{name}.ledger"
        self.invocations = workdir / f"{name}.invocations"
        self.state: dict[str, Any] = {}
        self.durable = Durable("pending", (), (), 0, False)  # until the first inspect
        self.kills = 0
        self.timer_kills = 0
        self.answers: list[tuple[str, bool]] = []  # (step, happened) for every answered question
        self.keys: dict[str, str] = {}  # step -> the idempotency key its invocations used
        self.values: dict[str, Any] = {}  # step -> its journaled result, while it is journaled
        self.trail: list[str] = []
        self.last: Reply | None = None  # the last process's

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
        reply = self.last = self.zygote.call(cmd)
        assert reply.killed_by_zygote != "timeout", f"{action} hung: {reply.describe()}"
        return reply

    def finished(self, reply: Reply) -> dict[str, Any]:
        result = reply.event("result")
        assert reply.exited_ok and result is not None, reply.describe()
        return result

    # --- reading the database and the bank ------------------------------------------------------

    def inspect(self) -> dict[str, Any]:
        """What a fresh process reads from the database."""
        self.state = self.finished(self.call("inspect"))
        self.durable = self.durable_of(self.state)
        self.check_values()
        return self.state

    def durable_of(self, state: dict[str, Any]) -> Durable:
        approvals = [r for r in state["requests"] if r["kind"] == "approval"]
        assert sorted(r["call_id"] for r in approvals) == sorted(self.workload.decisions)
        (status,) = {r["status"] for r in approvals}
        questions = []
        for r in state["requests"]:
            if r["kind"] != "effect":
                continue
            answer = r["answer"]
            assert (answer is None) == (r["status"] == "pending"), r
            questions.append(Question(r["step"], r["status"], answer and answer["happened"]))
        journal = []
        for key, value in state["journal"]:
            match = STEP_KEY.fullmatch(key)
            assert match is not None, f"journal key {key!r} is not a step of superstep {SUPERSTEP}"
            assert match["request"] in {r["request_id"] for r in approvals}, (
                f"{key}: the turn runs in the delivery of an approval's answer"
            )
            assert set(value) in ({"value"}, {"intent", "executor", "step"}), value
            if "executor" in value:  # the intent names its executor and step (they may hold "/")
                assert (value["executor"], value["step"]) == (AGENT_NAME, match["name"]), value
            journal.append((match["name"], "value" if "value" in value else "intent"))
        assert len({step for step, _ in journal}) == len(journal), f"one step twice: {journal}"
        return Durable(
            status,
            tuple(questions),
            tuple(sorted(journal)),
            state["history"],
            state["status"] == "idle",
        )

    def check_values(self) -> None:
        """A journaled result never changes; a transfer's is what the bank recorded."""
        self.invoked()  # learns the steps' keys
        ledger = {e["key"]: e for e in read_lines(self.ledger)}
        current = {}
        for key, value in self.state["journal"]:
            if "value" not in value:
                continue
            match = STEP_KEY.fullmatch(key)
            assert match is not None
            step = match["name"]
            current[step] = value
            assert self.values.get(step, value) == value, f"the journaled result of {step} changed"
            if step != MODEL and self.workload.call_at(step).tool == "transfer":
                entry = ledger.get(self.keys.get(step, ""))
                assert entry is not None, f"{step} journaled a result, but the bank has no transfer"
                assert value["value"]["data"]["result"] == entry["result"], (
                    f"{step} journaled {value}, but the bank answered {entry['result']!r}"
                )
        self.values = current

    def invoked(self) -> list[dict[str, Any]]:
        """Every tool invocation, with the step of the call it was for (told by its arguments)."""
        out = []
        for line in read_lines(self.invocations):
            if line["event"] != "invoked":
                continue
            (call,) = [
                c
                for c in self.workload.calls
                if (c.tool, c.logged) == (line["tool"], line["arguments"])
            ]
            assert call.step, f"{call.call_id} ran although it was rejected"
            key = line["key"]
            assert KEY.fullmatch(key), f"idempotency key {key!r} is not '<run id>:<32 hex>'"
            assert self.keys.setdefault(call.step, key) == key, (
                f"{call.step} ran with {key}, earlier with {self.keys[call.step]}"
            )
            out.append({**line, "step": call.step})
        assert len(set(self.keys.values())) == len(self.keys), f"two steps, one key: {self.keys}"
        return out

    def invocation_counts(self) -> Counter[str]:
        return Counter(i["step"] for i in self.invoked())

    def truth(self, question: dict[str, Any]) -> dict[str, Any]:
        """The bank's answer to a question about a step in doubt: did it record a transfer with
        the idempotency key of the step's invocations? (None entered the tool: it did not.)"""
        call = self.workload.call_at(question["step"])
        assert call.in_doubt_after_a_crash, f"asked about {call.step}, which is idempotent"
        assert question["executor_id"] == AGENT_NAME
        # the arguments as the tool ran with them: the model's "300" is 300.0
        ran_with = {k: float(v) if k == "amount" else v for k, v in call.asked.items()}
        assert question["description"] == {
            "tool": call.tool,
            "arguments": ran_with,
            "call_id": call.call_id,
            "agent": AGENT_NAME,
        }, question
        keys = {i["key"] for i in self.invoked() if i["step"] == call.step}
        entries = [e for e in read_lines(self.ledger) if e["key"] in keys]
        if not entries:
            return {"happened": False}
        return {"happened": True, "result": entries[0]["result"]}

    def questions(self) -> list[dict[str, Any]]:
        """The unanswered questions (the checkpoint's pending requests include answered ones
        until a resume applies them)."""
        return [
            r for r in self.state["requests"] if r["kind"] == "effect" and r["status"] == "pending"
        ]

    # --- the processes --------------------------------------------------------------------------

    def start_and_approve(self) -> None:
        started = self.finished(self.call("start"))
        assert started["status"] == "idle_with_pending_requests", started
        state = self.inspect()
        assert sorted(p["call_id"] for p in state["pending"]) == sorted(self.workload.decisions)
        assert state["journal"] == [], "superstep 1 is committed: its journal is compacted"
        answered = self.finished(self.call("respond"))
        assert answered["outcomes"] == dict.fromkeys(self.workload.decisions, "stored")
        self.inspect()
        assert self.durable == Durable("answered", (), (), self.durable.history, False)
        assert not self.invocations.exists() and not self.ledger.exists()
        self.trail.append(f"started, paused, approved: {self.durable.describe()}")

    def kill_at(self, label: Label) -> Reply:
        """Resume in a process that kills itself at the first ``label`` of its course."""
        labels = course_of(self.workload, self.durable).labels
        assert label in labels, f"{label} is not in the next course: {labels}"
        return self.resume("kill", kill_at=labels.index(label) + 1)

    def resume(self, expect: str = "ok", *, timed: bool = False, **extra: Any) -> Reply:
        """Resume in a fresh process; ``expect`` "kill" (by its fault hook: ``kill_at``), "ok",
        or "maybe" (a timer, ``kill_after``, may strike after the process finished)."""
        before = self.durable
        course = course_of(self.workload, before)
        expected = course.labels
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
                assert len(labels) == extra["kill_at"] and reply.fault == raw_point(labels[-1])
            self.kills += 1
            self.timer_kills += timed
        else:
            assert self.finished(reply)["status"] == course.status, reply.describe()
        self.trail.append(
            f"resume {extra or ''} pid {reply.pid}: {'killed' if killed else 'finished'}"
            + (f" at {labels[-1]}" if killed and labels else "")
        )
        # a replay reports exactly the model's fault points: nothing for a journaled step
        if killed:
            assert labels == expected[: len(labels)], f"points {labels}, predicted {expected}"
        else:
            assert labels == expected, f"points {labels}, predicted {expected}"
        self.inspect()
        self.trail.append(f"  -> {self.state['status']}: {self.durable.describe()}")
        self.check_process(reply, course, labels, killed=killed, timed=timed)
        self.check_ledger()
        return reply

    def answer(self, expect: str = "ok", **extra: Any) -> Reply:
        """Answer the questions about steps in doubt, truthfully, in a fresh process."""
        questions = self.questions()
        assert questions, f"no question to answer: {self.state['pending']}"
        resolutions = {q["request_id"]: self.truth(q) for q in questions}
        before = self.durable
        reply = self.call("respond", resolutions=resolutions, **extra)
        stored = expect == "ok"
        if stored:
            result = self.finished(reply)
            assert result["outcomes"] == dict.fromkeys(resolutions, "stored"), result
            assert reply.points == ["answer:before", "answer:inside", "answer:after"] * len(
                questions
            )
        else:
            assert died_of_sigkill(reply.wait_status) and reply.event("result") is None
            assert len(reply.points) == extra["kill_at"], reply.describe()
            stored = reply.fault == "answer:after"
            self.kills += 1
        self.inspect()
        step_of = {q["request_id"]: q["step"] for q in questions}
        happened = {step_of[rid]: r["happened"] for rid, r in resolutions.items()}
        if stored:
            self.answers.extend(happened.items())
            questions_after = tuple(
                replace(q, status="answered", happened=happened[q.step])
                if q.status == "pending"
                else q
                for q in before.questions
            )
            before = replace(before, questions=questions_after)
        assert self.durable == before, (
            f"after answering {happened} ({reply.points}): {self.durable.describe()}, "
            f"expected {before.describe()}"
        )
        assert not [i for i in self.invoked() if i["pid"] == reply.pid]
        self.trail.append(f"answered {happened} pid {reply.pid}: {reply.points}")
        return reply

    def run_to_end(self) -> None:
        """Resume and answer (truthfully) in fresh processes until the run is done."""
        for _ in range(8):
            if self.durable.done:
                return
            if self.questions():
                self.answer()
            else:
                self.resume()
        raise AssertionError("the run did not finish")

    # --- checks ---------------------------------------------------------------------------------

    def check_process(
        self, reply: Reply, course: Course, labels: list[Label], *, killed: bool, timed: bool
    ) -> None:
        """The process left what the model says it leaves where it died, and ran exactly the
        tools the model says it reached (each once)."""
        mine = [i for i in self.invoked() if i["pid"] == reply.pid]
        ran = [i["step"] for i in mine]
        assert len(ran) == len(set(ran)), f"pid {reply.pid} ran a step twice: {ran}"
        journaled = {s for s, kind in course.start.journal if kind == "value"}
        assert not journaled & set(ran), f"pid {reply.pid} ran {ran}; journaled: {journaled}"
        outcomes = course.outcomes(len(labels), killed=killed, timed=timed)
        found = (self.durable, set(ran))
        assert found in outcomes, (
            f"pid {reply.pid} left {self.durable.describe()} and ran {sorted(ran)}; the model "
            f"allows: {[(d.describe(), sorted(r)) for d, r in outcomes]}"
        )
        if not (killed and timed):  # a transfer that ran got to the bank before the next point
            transfers = {e["key"]: e["pid"] for e in read_lines(self.ledger)}
            for i in mine:
                if i["tool"] == "transfer":
                    assert transfers.get(i["key"]) == reply.pid, f"{i} left no ledger line"

    def check_ledger(self) -> None:
        """Every transfer once, by the last invocation of its step: the bank never saw a key
        again once it recorded it."""
        lines = read_lines(self.invocations)
        duplicates = [line for line in lines if line["event"] == "deduplicated"]
        assert not duplicates, f"a transfer ran again after it happened: {duplicates}"
        invoked = self.invoked()
        ledger = read_lines(self.ledger)
        keys = [e["key"] for e in ledger]
        assert len(keys) == len(set(keys)), f"a transfer is in the ledger twice: {keys}"
        for entry in ledger:
            (call,) = [
                c
                for c in self.workload.calls
                if c.tool == "transfer"
                and c.logged == {k: entry[k] for k in ("amount", "from", "to")}
            ]
            assert call.approved, f"{call.call_id} was not approved: {entry}"
            assert call.step and entry["key"] == self.keys[call.step]
            pids = [i["pid"] for i in invoked if i["step"] == call.step]
            assert entry["pid"] == pids[-1], f"{entry}: invocations by {pids}"

    def check_final(self) -> None:
        """Exactly one transfer per approved call; the run ends as an uninterrupted one, plus
        the questions."""
        reference = self.reference
        assert reference is not None
        state = self.state
        durable = self.durable
        assert durable.done
        assert state["status"] == "idle" and state["pending"] == []
        assert state["journal"] == [], "a committed superstep left journal entries"
        assert durable.approvals == "applied"
        assert all(q.status == "applied" for q in durable.questions), durable.describe()
        assert [(q.step, q.happened) for q in durable.questions] == self.answers

        def approvals(s: dict[str, Any]) -> list[tuple[str, str, Any]]:
            return sorted(
                (r["call_id"], r["status"], r["answer"])
                for r in s["requests"]
                if r["kind"] == "approval"
            )

        assert approvals(state) == approvals(reference.state)
        assert state["history"] == reference.state["history"] + 2 * len(durable.questions)
        for key in ("outputs", "status"):
            assert state[key] == reference.state[key], f"{key} differs from the uninterrupted run"
        assert state["outputs"][-1]["messages"][-1]["contents"][0]["text"] == (
            self.workload.final_text
        )
        ledger = read_lines(self.ledger)
        transfers = [c for c in self.workload.runs if c.tool == "transfer"]
        assert sorted(e["key"] for e in ledger) == sorted(self.keys[c.step] for c in transfers)
        assert [{**e, "key": "", "pid": 0} for e in ledger] == [
            {**e, "key": "", "pid": 0} for e in reference.ledger
        ]
        counts = self.invocation_counts()
        assert set(counts) == {c.step for c in self.workload.runs}, f"invocations {counts}"
        if not self.timer_kills:  # a tool cut off before it reached the bank runs again
            for call in transfers:
                assert counts[call.step] == 1, f"{call.step} ran {counts[call.step]} times"
        if reference.keys is not self.keys:  # each run has its own secret
            assert not set(self.keys.values()) & set(reference.keys.values())


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
            reply = run.resume()
            state = run.state
            assert state["status"] == "idle" and run.answers == []
            assert run.invocation_counts() == Counter(c.step for c in workload.runs)
            ledger = read_lines(run.ledger)
            assert [e["key"] for e in ledger] == [
                run.keys[c.step] for c in workload.runs if c.tool == "transfer"
            ]
            out[workload.name] = Reference(labels_of(reply), state, ledger, run.keys, reply.seconds)
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


def transaction(step: str | None, kind: str) -> list[Label]:
    return [(step, f"{kind}:{when}") for when in ("before", "inside", "after")]


# --- tests ----------------------------------------------------------------------------------------


def test_fault_points_of_the_resume_after_approval(references: dict[str, Reference]) -> None:
    """For each call that runs, an intent (unless it is idempotent) and its result; the
    model's next answer; the superstep's commit, which applies the answers too. The rejected
    call writes nothing."""
    for workload in WORKLOADS.values():
        calls = [
            (transaction(c.step, "intent") if not c.idempotent else [])
            + transaction(c.step, "journal")
            for c in workload.runs
        ]
        assert references[workload.name].labels == (
            [label for call in calls for label in call]
            + transaction(MODEL, "journal")
            + transaction(None, "commit")
        )


def test_the_model_predicts_an_uninterrupted_resume(references: dict[str, Reference]) -> None:
    """From the answered approvals the model runs every tool once and ends idle, reporting the
    uninterrupted resume's fault points (one checkpoint after the answers: the turn's, which
    applies them)."""
    for workload in WORKLOADS.values():
        start = Durable("answered", (), (), references[workload.name].state["history"] - 1, False)
        course = course_of(workload, start)
        assert course.labels == references[workload.name].labels
        assert course.status == "idle" and course.moments[-1].after.done
        assert course.ran(len(course.moments)) == {c.step for c in workload.runs}


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_kill_at_every_point_after_approval(
    pool: Pool, references: dict[str, Reference], tmp_path: Path, name: str
) -> None:
    """Killed between a transfer's intent and its result, the run asks (it did not happen if
    the process died before the transfer started, it did if after); killed anywhere else it
    goes on by itself. No transfer ever runs twice; an idempotent tool runs again only when
    killed after it ran, before its result committed."""
    workload, reference = WORKLOADS[name], references[name]
    points = reference.labels
    asked = {"intent:after": False, "journal:before": True, "journal:inside": True}

    def scenario(index: int) -> Scenario:
        def run(r: LedgerRun) -> None:
            r.start_and_approve()
            r.resume("kill", kill_at=index)
            r.run_to_end()
            r.check_final()
            step, point = points[index - 1]
            call = workload.call_at(step) if step is not None and step != MODEL else None
            if call is not None and call.in_doubt_after_a_crash and point in asked:
                assert r.answers == [(step, asked[point])]
            else:
                assert r.answers == []
            expected = Counter(c.step for c in workload.runs)
            if call is not None and call.idempotent and point != "journal:after":
                expected[call.step] += 1
            assert r.invocation_counts() == expected

        return run

    runs = run_scenarios(
        pool,
        tmp_path,
        workload,
        reference,
        [
            (f"{name}-{i}-{step or 'run'}-{point}".replace("#", "").replace(":", "-"), scenario(i))
            for i, (step, point) in enumerate(points, 1)
        ],
    )
    assert sum(r.kills for r in runs) == len(points)
    again = sum(sum(r.invocation_counts().values()) - len(workload.runs) for r in runs)
    questions = sum(len(r.answers) for r in runs)
    idempotent = sum(c.idempotent for c in workload.runs)
    assert again == 2 * idempotent  # killed at journal:before or :inside of an idempotent tool
    assert questions == 3 * (len(workload.runs) - idempotent)  # intent:after, journal:before/inside
    print(f"{name}: {len(points)} kill points, {questions} questions, {again} re-executions")


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_relay_the_transfer_did_not_happen(
    pool: Pool, references: dict[str, Reference], tmp_path: Path, name: str
) -> None:
    """A relay: processes die at the transfer's intent (before, inside, after its COMMIT), the
    next while asking (inside its commit, after it), the answer's process before it stores it;
    the person says it did not happen; processes die around the answer's commit, in the
    transfer's second intent, after its result, at every point of each later step, inside the
    superstep's commit. The transfer runs once; an idempotent tool three times, one key."""
    workload = WORKLOADS[name]
    t = workload.transfer
    later = [step for step, _ in workload.steps if step != t]

    def relay(r: LedgerRun) -> None:
        r.start_and_approve()
        for point in ("intent:before", "intent:inside", "intent:after"):
            r.kill_at((t, point))
        assert r.invocation_counts() == Counter()
        r.kill_at((None, "commit:inside"))  # asking, rolled back
        r.kill_at((None, "commit:after"))  # asked
        assert [q["step"] for q in r.questions()] == [t]
        r.answer("kill", kill_at=2)  # inside the answer's transaction: not stored
        r.answer()  # it did not happen: nothing entered the tool
        r.kill_at((None, "commit:before"))  # the intent is forgotten; the answer not applied yet
        assert t not in r.durable.entries
        r.kill_at((None, "commit:after"))  # applied
        r.kill_at((t, "intent:inside"))
        r.kill_at((t, "journal:after"))  # ran, its result is durable: nothing in doubt
        for step in later:
            for point in ("journal:before", "journal:inside", "journal:after"):
                r.kill_at((step, point))
        r.kill_at((None, "commit:inside"))  # rolled back: the superstep runs again, all replayed
        r.run_to_end()
        r.check_final()
        assert r.answers == [(t, False)]
        assert r.invocation_counts() == Counter(
            {c.step: 1 if c.in_doubt_after_a_crash else 3 for c in workload.runs}
        )

    (run,) = run_scenarios(
        pool, tmp_path, workload, references[name], [(f"relay-no-{name}", relay)]
    )
    assert run.kills == 3 + 2 + 1 + 2 + 2 + 3 * len(later) + 1


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_relay_the_transfer_happened(
    pool: Pool, references: dict[str, Reference], tmp_path: Path, name: str
) -> None:
    """A relay: processes die at the transfer's intent, after the transfer and before its
    result, before asking, before storing the answer; the person says it happened (with the
    bank's answer); processes die at every point of recording that answer as the step's
    result and inside and after the answer's commit (recorded again: the first write wins), at
    every point of each later step, inside the superstep's commit. The transfer runs once."""
    workload = WORKLOADS[name]
    t = workload.transfer
    later = [step for step, _ in workload.steps if step != t]

    def relay(r: LedgerRun) -> None:
        r.start_and_approve()
        r.kill_at((t, "intent:before"))
        r.kill_at((t, "intent:inside"))
        r.kill_at((t, "journal:before"))  # the transfer happened; its result is not journaled
        assert r.invocation_counts() == Counter({t: 1})
        r.kill_at((None, "commit:before"))  # about to ask
        r.resume()  # asks
        assert [q["step"] for q in r.questions()] == [t]
        r.answer("kill", kill_at=1)  # before the answer's transaction
        r.answer()  # it happened
        for point in ("journal:before", "journal:inside", "journal:after"):
            r.kill_at((t, point))  # recording the bank's answer as the step's result
        assert r.durable.entries[t] == "value"
        r.kill_at((None, "commit:inside"))  # the answer is recorded again: first write wins
        r.kill_at((None, "commit:after"))
        for step in later:
            for point in ("journal:before", "journal:inside", "journal:after"):
                r.kill_at((step, point))
        r.kill_at((None, "commit:inside"))
        r.run_to_end()
        r.check_final()
        assert r.answers == [(t, True)]
        assert r.invocation_counts() == Counter(
            {c.step: 1 if c.in_doubt_after_a_crash else 3 for c in workload.runs}
        )

    (run,) = run_scenarios(
        pool, tmp_path, workload, references[name], [(f"relay-yes-{name}", relay)]
    )
    assert run.kills == 3 + 1 + 1 + 3 + 2 + 3 * len(later) + 1


def test_in_doubt_again_after_it_did_not_happen(
    pool: Pool, references: dict[str, Reference], tmp_path: Path
) -> None:
    """Killed after the transfer's intent, the person says it did not happen; it runs and the
    process dies again before its result: the run must ask again (it happened now), and
    finish with the transfer done once."""
    zygote = pool.borrow()
    try:
        r = LedgerRun(zygote, tmp_path, "twice", SINGLE, references[SINGLE.name])
        t = SINGLE.transfer
        r.start_and_approve()
        r.kill_at((t, "intent:after"))
        r.resume()
        r.answer()
        r.kill_at((t, "journal:before"))
        r.resume()  # asks again, with a new question
        r.answer()
        r.run_to_end()
        r.check_final()
        assert r.answers == [(t, False), (t, True)]
        assert r.invocation_counts() == Counter({t: 1})
    finally:
        pool.give_back(zygote)


def test_kills_at_random_times(
    pool: Pool, references: dict[str, Reference], tmp_path: Path
) -> None:
    """Processes killed by a timer wherever they are (opening the store, inside the tool,
    between the tool and its journal write, in SQLite...), again and again; each question
    answered truthfully as it comes (a transfer may be in doubt more than once); until one
    finishes."""

    def scenario(reference: Reference, seed: int) -> Scenario:
        def run(r: LedgerRun) -> None:
            rng = random.Random(seed)
            r.start_and_approve()
            for attempt in range(6):
                if r.durable.done:
                    break
                if r.questions():
                    r.answer()
                    continue
                # resumes vary twofold in duration: aim the first kill well inside the run
                span = reference.resume_seconds * (0.5 if attempt == 0 else 1.2)
                reply = r.resume("maybe", timed=True, kill_after=rng.uniform(0.01, span))
                if not reply.sigkilled:
                    break
            r.run_to_end()
            r.check_final()

        return run

    total = again = questions = 0
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
        questions += sum(len(r.answers) for r in runs)
    print(f"{total} processes killed by a timer, {questions} questions, {again} re-executions")
    assert total >= 6  # 8 chains
