"""The simulator's own tests: it replays exactly, and its invariants catch broken stores.

A simulator that cannot fail proves nothing. These tests give it stores with a bug planted
(a journal that forgets, an inbox that drops answers, commits that ignore the lease) and check
that the invariant meant to catch each one does; and they check that a seed is a complete
description of a run: the same seed gives the same run, in this process or another one, with
another hash seed.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.sim.driver import Scenario
from tests.sim.faults import STORE_CALLS, CrashingStore, FaultPlan, single_crash_plan
from tests.sim.generator import Segment, WorkflowSpec
from tests.sim.simulate import SeedResult, compare, run_world, simulate
from tests.sim.vtime import VirtualClock, run_virtual
from tests.sim.world import World
from workflow_engine import AnswerOutcome, Checkpoint, Lease, RunStore, Runtime
from workflow_engine._journal import JournalStore
from workflow_engine.storage import InMemoryRunStore

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[2]
REPLAYED = (211, 54)
"""A memory seed with a fork, a cancelled fork, a race and three crashes; a SQLite seed with
three crashes, early answers and an answer arriving mid-superstep."""


def fingerprint(result: SeedResult) -> str:
    """Everything observable about a faulty run, hashed."""
    faulted = result.faulted
    data: dict[str, Any] = {
        "plan": result.plan.describe(),
        "trace": faulted.trace,
        "log": faulted.log,
        "crashes": faulted.crashes,
        "ledger": faulted.ledger.counts(),
        "outputs": {label: b.outputs for label, b in sorted(faulted.branches.items())},
        "violations": [str(v) for v in result.violations],
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


@pytest.mark.parametrize("seed", REPLAYED)
def test_a_seed_replays_exactly(seed: int) -> None:
    assert fingerprint(simulate(seed)) == fingerprint(simulate(seed))


@pytest.mark.slow
def test_a_seed_replays_in_another_process_with_another_hash_seed() -> None:
    here = {seed: fingerprint(simulate(seed)) for seed in REPLAYED}
    code = (
        "from tests.sim.simulate import simulate\n"
        "from tests.sim.test_simulator import fingerprint\n"
        f"print(*(fingerprint(simulate(s)) for s in {REPLAYED!r}))\n"
    )
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [here[s] for s in REPLAYED], f"PYTHONHASHSEED={hash_seed}"


def test_every_store_call_is_a_pair_of_crash_points() -> None:
    """The proxy covers the whole store contract (the engine's journal, lease renewal and
    durable cancel included), and a call through it is a point before and one after."""
    contract = {name for name, f in vars(RunStore).items() if inspect.iscoroutinefunction(f)}
    contract |= {name for name, f in vars(JournalStore).items() if inspect.iscoroutinefunction(f)}
    assert contract <= STORE_CALLS, sorted(contract - STORE_CALLS)
    assert all(inspect.iscoroutinefunction(vars(CrashingStore)[name]) for name in contract)

    async def main(clock: VirtualClock) -> list[str]:
        world = World(clock)
        store = CrashingStore(InMemoryRunStore(clock=world.now), world.process())
        assert isinstance(store, JournalStore) and isinstance(store, RunStore)
        spec = WorkflowSpec(9102, (Segment("relay", "g1", True),))
        runtime = Runtime(store)  # type: ignore[arg-type]
        runtime.register(spec.build())
        run_id = await runtime.start(spec.name, spec.start_message())
        await store.request_cancel(run_id)
        await store.journal_intent(run_id, "1/x/y/k", {"intent": None}, 1)
        await store.journal_clear(run_id, "1/x/y/k")
        return [line.split(":", 2)[2] for line in world.trace]

    trace = run_virtual(main, real_io=False)
    for name in ("admit", "request_cancel", "journal_intent", "journal_clear"):
        assert trace.index(f"{name}:after") == trace.index(f"{name}:before") + 1, trace


# --- planted bugs ---------------------------------------------------------------------------------


class ForgetfulJournal(InMemoryRunStore):
    """Says it journaled a result, keeps nothing."""

    async def journal_put(
        self, run_id: str, key: str, value: Any, superstep: int, *, lease: Lease | None = None
    ) -> Any:
        return value


class NoIntents(InMemoryRunStore):
    """Says it journaled an intent, keeps nothing: a step cut off by a crash looks as if it
    never started."""

    async def journal_intent(
        self, run_id: str, key: str, entry: Any, superstep: int, *, lease: Lease | None = None
    ) -> None:
        return None


class NoRenewal(InMemoryRunStore):
    """Says it renewed a lease, extends nothing."""

    async def renew(self, lease: Lease) -> Lease:
        return lease


class DroppingInbox(InMemoryRunStore):
    """Says it stored an answer, keeps nothing."""

    async def answer(self, request_id: str, answer: Any) -> AnswerOutcome:
        return AnswerOutcome.STORED


class Unfenced(InMemoryRunStore):
    """Commits whoever asks, lease or not, after whichever checkpoint it names."""

    def _fenced(self, lease: Lease) -> Any:
        return self._run(lease.run_id)

    async def commit(self, lease: Lease, checkpoint: Checkpoint) -> Lease:
        run = self._run(lease.run_id)
        self._runs[lease.run_id] = replace(run, latest_checkpoint_id=checkpoint.parent_id)
        return await super().commit(lease, checkpoint)


def _relays() -> tuple[Scenario, Any]:
    spec = WorkflowSpec(9100, (Segment("relay", "g1", True), Segment("relay", "g2", True)))
    scenario = Scenario(9100, spec, "start", None, None, "one")
    return scenario, run_world(scenario, FaultPlan())


def test_a_forgetful_journal_breaks_exactly_once() -> None:
    """Crashing just before a superstep commits makes it run again: with a journal that
    forgets, its side effects run twice, and the ledger says so."""
    scenario, reference = _relays()
    trace = [line.split(":", 2)[2] for line in reference.trace]
    commit = trace.index("commit:before", trace.index("g1:after")) + 1
    plan = single_crash_plan(commit)
    assert compare(scenario, reference, plan).ok  # the real store keeps its journal
    broken = compare(scenario, reference, plan, memory_store=ForgetfulJournal)
    assert "exactly-once" in broken.invariants, broken.report()


def test_a_journal_without_intents_breaks_exactly_once() -> None:
    """Killed after a non-idempotent effect, before its result was journaled: with the intent
    kept, the run asks and the operator says it happened; without it, the step runs again --
    and the ledger says it ran twice."""
    scenario, reference = _relays()
    point = [line.split(":", 2)[2] for line in reference.trace].index("g1:inside") + 1
    plan = single_crash_plan(point)
    assert compare(scenario, reference, plan).ok
    broken = compare(scenario, reference, plan, memory_store=NoIntents)
    assert "exactly-once" in broken.invariants, broken.report()


def test_a_lease_that_is_not_renewed_is_caught() -> None:
    """A worker stalls in a long call (alive, its lease keeper running): without renewals the
    store lets another worker take the run over, and the lease invariant says so."""
    scenario, reference = _relays()
    plan = FaultPlan(stall=reference.user_labels.index("g1:inside") + 1)
    assert compare(scenario, reference, plan).ok
    broken = compare(scenario, reference, plan, memory_store=NoRenewal)
    assert "lease" in broken.invariants, broken.report()


def test_a_dropped_answer_is_caught() -> None:
    spec = WorkflowSpec(9101, (Segment("ask", "g1", True),))
    scenario = Scenario(9101, spec, "start", None, None, "one")
    reference = run_world(scenario, FaultPlan())
    broken = compare(scenario, reference, FaultPlan(), memory_store=DroppingInbox)
    assert {"answers", "liveness"} <= set(broken.invariants), broken.report()


def test_commits_without_a_fence_fork_history() -> None:
    """A worker frozen past its lease commits after the one that took over: unfenced, the
    store accepts it and the run's history forks."""
    scenario, reference = _relays()
    labels = reference.user_labels
    plan = FaultPlan(stall=labels.index("g1:after") + 1, freeze=True)
    assert compare(scenario, reference, plan).ok
    broken = compare(scenario, reference, plan, memory_store=Unfenced)
    assert "history" in broken.invariants, broken.report()
