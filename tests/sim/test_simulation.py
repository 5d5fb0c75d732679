"""Deterministic simulation: thousands of seeded workflows, runs and faults, every invariant.

``SIM_SEEDS`` (default below) seeds run here; each one generates a workflow, runs it
uninterrupted, then again under its fault plan (crashes at chosen points of the runner, the
store, the journal, the lease keeper and the workflow's own code; slow calls and frozen
processes past the lease; racing resumers; answers arriving mid-run; in-doubt steps answered
from the outside ledger; forks; cancels), and compares (see ``tests/sim/invariants.py``). Two
seeds are also crashed at every single point of their run, one point at a time; focused
scenarios below pin one fault each.

Replay one seed: ``SIM_SEED=1234 pytest tests/sim -k replay`` (or ``-k seed_1234``); add
``SIM_CRASH=57`` (and ``SIM_RECOVERY=busy``) to replay one point of the exhaustive sweep. A
seed that failed once goes into ``tests/sim/regressions.py`` and runs every time.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.sim.driver import RUN_ID, Driver, Scenario
from tests.sim.faults import FaultPlan, single_crash_plan
from tests.sim.generator import IN_DOUBT, Segment, WorkflowSpec
from tests.sim.regressions import KNOWN_FAILING, REGRESSIONS
from tests.sim.simulate import SeedResult, compare, reference_of, run_world, simulate
from tests.sim.triage import CAUSES, diagnose
from tests.sim.vtime import VirtualClock, run_virtual
from tests.sim.world import Execution, SimProcess, SimulatedCrash, World, seeded_uuids
from workflow_engine import WorkflowRunState

pytestmark = pytest.mark.sim

SIM_SEEDS = int(os.environ.get("SIM_SEEDS", "1000"))
"""About 25 s of CPU (the whole directory about 40 s): ``make test-fast`` runs it."""
SWEEP_SEEDS = (500, 931, 59)
"""Seeds crashed at every point (about 370 in all): between them every segment kind, steps
idempotent and not, an agent (in-doubt tools), both APIs, a fork and a cancelled fork."""


def _param(seed: int, prefix: str = "seed") -> object:
    marks = []
    if seed in KNOWN_FAILING:
        cause = KNOWN_FAILING[seed]
        reason = f"engine bug {cause}: {CAUSES[cause]}"
        marks.append(pytest.mark.xfail(strict=True, reason=reason))
    return pytest.param(seed, id=f"{prefix}_{seed}", marks=marks)


def _verdict(result: SeedResult) -> None:
    if not result.ok:
        causes = ", ".join(diagnose(result))
        pytest.fail(f"{result.report()}\n  likely cause: {causes}", pytrace=False)


@pytest.mark.parametrize("seed", [_param(s) for s in range(SIM_SEEDS)])
def test_seed(seed: int) -> None:
    _verdict(simulate(seed))


@pytest.mark.parametrize("seed", [_param(s, "regression") for s in sorted(REGRESSIONS)])
def test_regression(seed: int) -> None:
    _verdict(simulate(seed))


@pytest.mark.skipif("SIM_SEED" not in os.environ, reason="set SIM_SEED=<seed> to replay a seed")
def test_replay() -> None:
    seed = int(os.environ["SIM_SEED"])
    plan = None
    if "SIM_CRASH" in os.environ:
        plan = single_crash_plan(
            int(os.environ["SIM_CRASH"]), os.environ.get("SIM_RECOVERY", "wait")
        )
    _verdict(simulate(seed, plan))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [pytest.param(s, id=f"sweep_{s}") for s in SWEEP_SEEDS])
def test_every_crash_point(seed: int) -> None:
    """Crash the run at each of its points in turn (before and after every store and journal
    call, inside every executor, tool and model call), recovering after the lease expired
    (odd points) or at once, through ``RunBusyError`` (even points)."""
    scenario, reference = reference_of(seed)
    failures = []
    for point in range(1, reference.points + 1):
        recovery = "wait" if point % 2 else "busy"
        result = compare(scenario, reference, single_crash_plan(point, recovery))
        if not result.ok:
            failures.append((point, recovery, result))
    if failures:
        point, recovery, first = failures[0]
        listed = ", ".join(f"#{p} ({r}): {', '.join(res.invariants)}" for p, r, res in failures)
        pytest.fail(
            f"{len(failures)} of {reference.points} crash points break invariants: {listed}\n"
            f"first one (replay: SIM_SEED={seed} SIM_CRASH={point} SIM_RECOVERY={recovery} "
            f"pytest tests/sim -k replay):\n{first.report()}",
            pytrace=False,
        )


# --- focused scenarios: one fault each, on small hand-written workflows ---------------------------


def _scenario(seed: int, *segments: Segment) -> Scenario:
    """A hand-written workflow whose user answers one pending request at a time."""
    return Scenario(seed, WorkflowSpec(seed, tuple(segments)), "start", None, None, "one")


def _user_point(scenario: Scenario, label: str) -> int:
    """The ordinal of the first user point ``label`` in the uninterrupted run."""
    labels = run_world(scenario, FaultPlan()).user_labels
    return labels.index(label) + 1


def test_racing_resumers_do_not_fork_history() -> None:
    """Every resume of the run is raced by a second worker: one runs, the other is told the
    run is busy, and the result is the uninterrupted one."""
    scenario = _scenario(
        9001,
        Segment("ports", "g1", True, chain=2),
        Segment(
            "fan", "g2", True, branches=(Segment("ask", "g2a", True), Segment("relay", "g2b", True))
        ),
        Segment("loop", "g3", True, rounds=2),
    )
    reference = run_world(scenario, FaultPlan())
    plan = FaultPlan(races=tuple(range(1, reference.resumes + 1)))
    result = compare(scenario, reference, plan)
    _verdict(result)
    assert any("races" in line for line in result.faulted.log)


def test_cancelled_fork_refuses_answers_and_resumes() -> None:
    """A fork of a paused run is cancelled: no request stays pending, an answer to one of its
    requests is refused and resuming it is refused (checked by the driver), while the original
    run and a second fork finish exactly as without faults."""
    spec = WorkflowSpec(9002, (Segment("ask", "g1", True), Segment("ports", "g2", True, chain=1)))
    scenario = Scenario(9002, spec, "start", 0.5, 0.5)
    reference = run_world(scenario, FaultPlan())
    assert {"main", "fork", "cancelled"} <= set(reference.branches)
    assert reference.branches["cancelled"].status == "cancelled"
    for point in range(1, reference.points + 1, 3):
        _verdict(compare(scenario, reference, single_crash_plan(point)))


def _points(scenario: Scenario, plan: FaultPlan | None = None) -> list[str]:
    """The label of every point of the run (uninterrupted, or under ``plan``), in order."""
    return [line.split(":", 2)[2] for line in run_world(scenario, plan or FaultPlan()).trace]


def _point_after(trace: list[str], first: str, then: str, start: int = 0) -> int:
    """The ordinal of the first point ``then`` after the first point ``first`` (from
    ``start``)."""
    at = trace.index(first, start)
    return trace.index(then, at) + 1


def _runs(result: SeedResult, fragment: str) -> list[Execution]:
    return next(r for i, r in result.faulted.ledger.executions.items() if fragment in i)


def test_a_crash_after_an_idempotent_effect_repeats_it_once_at_most() -> None:
    """Killed after an idempotent effect happened but before its journal entry: the
    re-execution runs it once more (with the same idempotency key) -- never a third time."""
    scenario = _scenario(9003, Segment("relay", "g1", True, idempotent=True))
    reference = run_world(scenario, FaultPlan())
    point = _points(scenario).index("g1:inside") + 1
    result = compare(scenario, reference, single_crash_plan(point))
    _verdict(result)
    assert [e.torn for e in _runs(result, "|g1|")] == [True, False]
    assert not result.faulted.in_doubt


def test_a_crash_after_an_effect_asks_instead_of_repeating_it() -> None:
    """Killed after a non-idempotent effect happened but before its journal entry: the run
    pauses with an in-doubt question; the operator, looking at the outside world, says it
    happened and what it returned; the effect is not repeated and the run ends as without
    the crash."""
    scenario = _scenario(9007, Segment("relay", "g1", True), Segment("relay", "g2", False))
    reference = run_world(scenario, FaultPlan())
    for executor in ("g1", "g2"):
        point = _points(scenario).index(f"{executor}:inside") + 1
        result = compare(scenario, reference, single_crash_plan(point))
        _verdict(result)
        assert len(_runs(result, f"|{executor}|")) == 1
        assert [line.rsplit(": ", 1)[1] for line in result.faulted.in_doubt] == ["happened"]


def test_a_crash_before_the_effect_asks_and_runs_it_once() -> None:
    """Killed after the intent was journaled but before the effect: the operator says it did
    not happen, and the step runs (once) -- also when the process applying that answer is
    killed just before or after it clears the intent."""
    scenario = _scenario(9008, Segment("relay", "g1", True))
    reference = run_world(scenario, FaultPlan())
    point = _point_after(_points(scenario), "g1:before", "journal_intent:after")
    result = compare(scenario, reference, single_crash_plan(point))
    _verdict(result)
    assert len(_runs(result, "|g1|")) == 1
    assert [line.rsplit(": ", 1)[1] for line in result.faulted.in_doubt] == ["did not happen"]
    trace = _points(scenario, single_crash_plan(point))
    for label in ("journal_clear:before", "journal_clear:after"):
        plan = FaultPlan(crashes=(point, trace.index(label) + 1), recovery=("wait", "busy"))
        result = compare(scenario, reference, plan)
        _verdict(result)
        assert len(_runs(result, "|g1|")) == 1
        assert any(label in crash for crash in result.faulted.crashes)


def test_an_agent_tool_cut_off_by_a_crash() -> None:
    """An agent's non-idempotent tools (``pay``, ``audit``) cut off by a crash are asked
    about -- before the call (it did not happen: it runs once) and after it (it happened: its
    result text is the answer, and the model sees exactly what the tool returned); the
    idempotent ``lookup`` and the model are simply retried."""
    scenario = _scenario(9006, Segment("agent", "g1"))
    reference = run_world(scenario, FaultPlan())
    trace = _points(scenario)
    cases = {
        "g1agent:pay": (["did not happen"], "pay", [False]),
        "g1agent:pay-done": (["happened"], "pay", [True]),
        "g1agent:audit-done": (["happened"], "audit", [True]),
        "g1agent:lookup-done": ([], "lookup", [True, False]),
    }
    for label, (said, tool, torn) in cases.items():
        result = compare(scenario, reference, single_crash_plan(trace.index(label) + 1))
        _verdict(result)
        assert [line.rsplit(": ", 1)[1] for line in result.faulted.in_doubt] == said, label
        assert [e.torn for e in _runs(result, f"|tool|{tool} ")] == torn, label


def test_lease_expiry_mid_superstep() -> None:
    """A worker stalls inside a side effect (after it happened, before it is journaled) for
    twice the lease; another worker tries to take the run over. The first worker's lease is
    renewed in the background while its superstep runs, so the second one is refused and
    exactly once holds."""
    scenario = _scenario(9004, Segment("relay", "g1", True), Segment("relay", "g2", True))
    plan = FaultPlan(stall=_user_point(scenario, "g1:inside"))
    result = compare(scenario, run_world(scenario, FaultPlan()), plan)
    _verdict(result)
    assert any("could not take over: busy" in line for line in result.faulted.log)


def test_a_frozen_worker_loses_its_lease_and_writes_nothing() -> None:
    """The whole process freezes inside a non-idempotent effect (after it happened) for twice
    the lease: its lease expires, another worker takes over and -- finding the step's intent
    and no result -- asks; the operator says it happened. The frozen worker thaws, its journal
    write is refused (``LeaseLostError``), and the effect happened once."""
    scenario = _scenario(9009, Segment("relay", "g1", True), Segment("relay", "g2", True))
    plan = FaultPlan(stall=_user_point(scenario, "g1:inside"), freeze=True)
    result = compare(scenario, run_world(scenario, FaultPlan()), plan)
    _verdict(result)
    assert any("took the run over" in line for line in result.faulted.log)
    assert [line.rsplit(": ", 1)[1] for line in result.faulted.in_doubt] == ["happened"]
    assert [(e.process, e.abandoned) for e in _runs(result, "|g1|")] == [("p2", True)]


def test_answer_arriving_before_recovery() -> None:
    """Two questions are pending; one is answered and its superstep crashes right after its
    side effect was journaled; the other answer arrives before the run is recovered. The
    recovered superstep must replay the journaled effect, not run it again."""
    scenario = _scenario(
        9005,
        Segment(
            "fan", "g1", True, branches=(Segment("ask", "g1a", True), Segment("ask", "g1b", True))
        ),
    )
    reference = run_world(scenario, FaultPlan())
    trace = _points(scenario)
    effect = next(i for i, line in enumerate(trace) if line.startswith("g1a:inside"))
    journaled = next(i + 1 for i in range(effect, len(trace)) if trace[i] == "journal_put:after")
    plan = FaultPlan(crashes=(journaled,), recovery=("early",))
    result = compare(scenario, reference, plan)
    _verdict(result)


Cancelled = tuple[World, Driver, Any, Any]


def _cancel_midrun(scenario: Scenario, crash: str | None = None) -> Cancelled:
    """Start ``scenario``'s run and resume it in a worker; at ``g1:inside`` another client
    process cancels the run (killed at its point ``crash``, if given). The world, the driver,
    what the client's cancel returned (None if it was killed) and the run at the end (a
    cancelled run is checked to refuse answers and resumes)."""
    point = _user_point(scenario, "g1:inside")

    async def main(clock: VirtualClock, crash_at: frozenset[int]) -> Cancelled:
        world = World(clock, crash_at)
        driver = Driver(scenario, FaultPlan(), world, None)
        world.branches[RUN_ID] = "main"
        seen: list[Any] = []

        async def cancel(proc: SimProcess, label: str) -> None:
            client = driver._spawn("canceller")
            try:
                seen.append(await client.runtime.cancel(RUN_ID))
            except SimulatedCrash:
                seen.append(None)

        world.hooks[point] = cancel
        try:
            await driver.attempt("start", driver._start)
            ok, _ = await driver.attempt("resume", lambda w: w.runtime.resume(RUN_ID))
            assert ok
            info = await driver.helper.runtime.get_run(RUN_ID)
            if info.status == WorkflowRunState.CANCELLED:
                await driver._check_cancelled(RUN_ID, "main")
        finally:
            await driver.close()
        return world, driver, seen[0], info

    with seeded_uuids(scenario.seed):
        world = run_virtual(lambda clock: main(clock, frozenset()), real_io=False)[0]
        crash_at = frozenset()
        if crash is not None:
            labels = [line.split(":", 2)[2] for line in world.trace]
            crash_at = frozenset({labels.index(crash) + 1})
        return run_virtual(lambda clock: main(clock, crash_at), real_io=False)


def test_a_cancel_while_another_worker_executes_is_honoured_at_its_next_boundary() -> None:
    """While a worker executes a superstep, a client cancels the run: the call returns the run
    still in progress (the cancel is stored); the worker finishes the superstep, commits it,
    and cancels the run at that boundary -- no later superstep runs, no request stays
    pending, answers and resumes are refused. A client killed before its cancel reached the
    store cancels nothing; one killed after it did, cancels."""
    scenario = _scenario(9010, Segment("relay", "g1", True), Segment("ask", "g2", True))
    reference = run_world(scenario, FaultPlan())
    for crash in (None, "request_cancel:after", "request_cancel:before"):
        world, driver, during, info = _cancel_midrun(scenario, crash)
        counts = world.ledger.counts()
        assert set(counts.values()) == {1} and set(counts) <= set(reference.ledger.executions)
        assert not driver.violations, (crash, driver.violations)
        if crash == "request_cancel:before":  # the cancel never reached the store
            assert during is None and info.status == WorkflowRunState.IDLE_WITH_PENDING_REQUESTS
            continue
        if crash is None:
            assert during.status == WorkflowRunState.IN_PROGRESS
        assert info.status == WorkflowRunState.CANCELLED, crash
        assert not info.pending_requests
        assert sorted(i.split("|")[1] for i in counts) == ["g1", "s0"]  # nothing after it


def test_a_step_in_doubt_twice() -> None:
    """Killed after the intent and before the effect; the operator says it did not happen;
    the step runs again and the process is killed at the same place again. The second
    question is a new request the operator can answer, and the run finishes. (It once got the
    first question's id: the run stuck, or a UNIQUE constraint on SQLite -- fixed in 1f0f6c1.)"""
    scenario = _scenario(9011, Segment("relay", "g1", True))
    reference = run_world(scenario, FaultPlan())
    first = _point_after(_points(scenario), "g1:before", "journal_intent:after")
    trace = _points(scenario, single_crash_plan(first))
    resolved = trace.index("answer:after")  # the operator's answer to the first question
    second = _point_after(trace, "g1:before", "journal_intent:after", resolved)
    plan = FaultPlan(crashes=(first, second), recovery=("wait", "wait"))
    _verdict(compare(scenario, reference, plan))


def test_an_in_doubt_question_id_is_not_the_steps_idempotency_key() -> None:
    """The id of the question about a step is not derivable from what the step handed an
    outside service (its idempotency key), or that service could answer it. (It once was the
    key's hex part -- fixed in 1f0f6c1.)"""
    scenario = _scenario(9012, Segment("relay", "g1", True))
    reference = run_world(scenario, FaultPlan())
    point = _points(scenario).index("g1:inside") + 1
    result = compare(scenario, reference, single_crash_plan(point))
    _verdict(result)
    (question,) = [
        rid
        for rid, logical in result.faulted.branches["main"].requests.items()
        if logical.startswith(IN_DOUBT)
    ]
    keys = {e.engine_key for e in _runs(result, "|g1|")}
    assert not any(question in str(key) for key in keys), (question, keys)


# --- engine bugs the simulator found and that are not fixed yet (tests/sim/triage.py CAUSES) ----


@pytest.mark.parametrize("idempotent", [True, False], ids=["idempotent", "not-idempotent"])
def test_a_frozen_worker_starts_no_step_after_losing_its_lease(idempotent: bool) -> None:
    """A fan-out to two relays; the process freezes past its lease right after the first
    relay's effect, while the second relay's handler is inside a journal call (a read, or its
    intent); another worker takes the run over. When the frozen worker thaws, it must not
    start the second relay's effect: its lease is gone."""
    branches = (
        Segment("relay", "g1a", True, idempotent=idempotent),
        Segment("relay", "g1b", True, idempotent=idempotent),
    )
    scenario = _scenario(9013, Segment("fan", "g1", True, branches=branches))
    plan = FaultPlan(stall=_user_point(scenario, "g1a:after"), freeze=True)
    _verdict(compare(scenario, run_world(scenario, FaultPlan()), plan))
