"""One seed, end to end: the uninterrupted run, the fault plan, the faulty run, the verdict.

``simulate(seed)`` is deterministic: the workflow, the answers and their order, the faults and
virtual time all come from the seed, so a failing seed fails the same way every time (replay it
with ``SIM_SEED=<seed> pytest tests/sim -k replay``).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.sim.driver import RUN_ID, Driver, Outcome, Scenario, draw_scenario, play
from tests.sim.faults import FaultPlan, ReferenceStats, draw_plan
from tests.sim.invariants import Violation, check
from tests.sim.vtime import VirtualClock, run_virtual
from tests.sim.world import World, seeded_uuids
from workflow_engine.storage import InMemoryRunStore

LOG_LINES = 25
SCRATCH = os.environ.get("SIM_TMPDIR") or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
"""Where SQLite seeds keep their database (tmpfs when there is one: twice as fast)."""


def run_world(
    scenario: Scenario,
    plan: FaultPlan,
    workdir: Path | None = None,
    memory_store: Callable[..., Any] = InMemoryRunStore,
) -> Outcome:
    """Play ``scenario`` under ``plan`` on a fresh virtual-time loop."""

    async def main(clock: VirtualClock, where: Path | None) -> Outcome:
        world = World(clock, frozenset(plan.crashes))
        return await play(scenario, plan, world, where, memory_store)

    with seeded_uuids(scenario.seed):
        if plan.store == "sqlite" and workdir is None:
            with tempfile.TemporaryDirectory(prefix="sim-", dir=SCRATCH) as tmp:
                return run_virtual(lambda clock: main(clock, Path(tmp)))
        return run_virtual(lambda clock: main(clock, workdir), real_io=plan.store != "memory")


@dataclass
class SeedResult:
    seed: int
    scenario: Scenario
    plan: FaultPlan
    reference: Outcome
    faulted: Outcome
    violations: list[Violation]

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def invariants(self) -> list[str]:
        return sorted({v.invariant for v in self.violations})

    def report(self) -> str:
        """Everything needed to understand and replay a failing seed."""
        lines = [
            f"seed {self.seed}: {len(self.violations)} invariant(s) broken "
            f"({', '.join(self.invariants)})",
            f"  workflow: {self.scenario.describe()}",
            f"  faults:   {self.plan.describe() or 'none'}",
        ]
        if draw_scenario(self.seed) == self.scenario:
            lines += [
                f"  replay:   SIM_SEED={self.seed} {sys.executable} -m pytest tests/sim -k replay",
                f"            (or: pytest tests/sim -k 'seed_{self.seed}')",
            ]
        else:
            lines.append("  replay:   rerun this test (a hand-written scenario)")
        lines += [f"  {v}" for v in self.violations[:20]]
        if len(self.violations) > 20:
            lines.append(f"  ... and {len(self.violations) - 20} more")
        if self.faulted.crashes:
            lines.append(f"  crashes: {self.faulted.crashes}")
        lines.append("  driver log (last lines):")
        lines += [f"    {line}" for line in self.faulted.log[-LOG_LINES:]]
        lines.append("  last points: " + " ".join(self.faulted.trace[-15:]))
        return "\n".join(lines)


def reference_of(seed: int) -> tuple[Scenario, Outcome]:
    scenario = draw_scenario(seed)
    return scenario, run_world(scenario, FaultPlan())


def stats_of(scenario: Scenario, reference: Outcome) -> ReferenceStats:
    return ReferenceStats(
        points=reference.points,
        user_points=reference.user_points,
        resumes=reference.resumes,
        forked=scenario.fork_at is not None,
    )


def simulate(seed: int, plan: FaultPlan | None = None) -> SeedResult:
    """Run ``seed`` uninterrupted, then under its fault plan (or ``plan``), and compare."""
    scenario, reference = reference_of(seed)
    if plan is None:
        plan = draw_plan(seed, stats_of(scenario, reference))
    return compare(scenario, reference, plan)


def compare(
    scenario: Scenario,
    reference: Outcome,
    plan: FaultPlan,
    memory_store: Callable[..., Any] = InMemoryRunStore,
) -> SeedResult:
    """Run ``scenario`` under ``plan`` and hold it to the uninterrupted ``reference``."""
    faulted = run_world(scenario, plan, memory_store=memory_store)
    violations = check(reference, faulted)
    return SeedResult(scenario.seed, scenario, plan, reference, faulted, violations)


def inspect_sqlite(scenario: Scenario, workdir: Path) -> Outcome:
    """What a SQLite file left by other processes holds (the store-side invariants checked)."""

    async def main(clock: VirtualClock) -> Outcome:
        world = World(clock)
        world.branches[RUN_ID] = "main"
        driver = Driver(scenario, FaultPlan(store="sqlite"), world, workdir)
        outcome = Outcome(scenario, driver.plan, world.ledger)
        try:
            await driver.collect(outcome)
        finally:
            await driver.close()
        outcome.violations = driver.violations
        return outcome

    return run_virtual(main)
