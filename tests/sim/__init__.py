"""Deterministic simulation of the workflow engine (FoundationDB-style): one seed drives the
workflow, the user's answers, the faults and time; a failing seed replays exactly.

* ``vtime.py`` -- an asyncio loop on virtual time (leases expire instantly, deterministically);
* ``world.py`` -- simulated processes that die at numbered points (or freeze), the outside
  ledger of side effects, who holds each run's lease, seeded uuids;
* ``generator.py`` -- random workflows from a vocabulary of executor kinds (steps idempotent or
  not), the user's answers, and the operator's truthful answers to in-doubt questions;
* ``faults.py`` -- the crashing store proxy and the fault plan drawn from a seed;
* ``driver.py`` -- plays a scenario under a plan: workers, answers, in-doubt questions,
  recovery, forks, cancels;
* ``invariants.py`` -- what must hold, comparing a faulty run with the uninterrupted one;
* ``simulate.py`` -- one seed end to end, and its failure report;
* ``triage.py`` -- which known engine bug a failing seed shows (``python -m tests.sim.triage``);
* ``regressions.py`` -- seeds that failed once (always run) and today's known failures;
* ``kill_worker.py`` -- the zygote of the real-SIGKILL sweep.

Run: ``pytest tests/sim`` (``SIM_SEEDS=<n>`` seeds; ``SIM_SEED=<seed> pytest tests/sim -k replay``
to replay one).
"""
