"""Deterministic simulation: thousands of seeded workflows, runs and faults, every invariant.

``SIM_SEEDS`` (default 2000) seeds run here; each one generates a workflow, runs it
uninterrupted, then again under its fault plan (crashes at chosen points of the runner, the
store, the journal and the workflow's own code; lease expiries; racing resumers; answers
arriving mid-run; forks; cancels), and compares (see ``tests/sim/invariants.py``).

Replay one seed: ``SIM_SEED=1234 pytest tests/sim -k replay`` (or ``-k seed_1234``). A seed that
failed once goes into ``tests/sim/regressions.py`` and runs every time.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sim.regressions import KNOWN_FAILING, REGRESSIONS
from tests.sim.simulate import SeedResult, simulate
from tests.sim.triage import CAUSES, diagnose

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[2]
SIM_SEEDS = int(os.environ.get("SIM_SEEDS", "2000"))


def _param(seed: int) -> object:
    marks = []
    if seed in KNOWN_FAILING:
        reason = "; ".join(CAUSES.get(c, c) for c in KNOWN_FAILING[seed].split("+"))
        marks.append(pytest.mark.xfail(strict=False, reason=reason))
    return pytest.param(seed, id=f"seed_{seed}", marks=marks)


def _verdict(result: SeedResult) -> None:
    if not result.ok:
        causes = ", ".join(diagnose(result))
        pytest.fail(f"{result.report()}\n  likely cause: {causes}", pytrace=False)


@pytest.mark.parametrize("seed", [_param(s) for s in range(SIM_SEEDS)])
def test_seed(seed: int) -> None:
    _verdict(simulate(seed))


@pytest.mark.parametrize("seed", [_param(s) for s in sorted(REGRESSIONS)])
def test_regression(seed: int) -> None:
    _verdict(simulate(seed))


@pytest.mark.skipif("SIM_SEED" not in os.environ, reason="set SIM_SEED=<seed> to replay a seed")
def test_replay() -> None:
    _verdict(simulate(int(os.environ["SIM_SEED"])))
