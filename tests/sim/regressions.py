"""Seeds that failed once: each is run on every test run, whatever ``SIM_SEEDS`` says.

``REGRESSIONS`` maps a seed to why it was added (the cause, see ``tests/sim/triage.py``). A
seed joins when a sweep finds it failing; it stays after the fix, as a regression test.

``KNOWN_FAILING`` lists the seeds of the default sweep (``0 <= seed < SIM_SEEDS``) that fail
on the engine as it is today, with their causes; the tests mark them ``xfail(strict=False)``
so the suite stays green while the kernel rewrite is under way. Remove a seed once its cause is
fixed (an XPASS in the test summary says so). Regenerate with ``python -m tests.sim.triage``.
"""

from __future__ import annotations

REGRESSIONS: dict[int, str] = {}

KNOWN_FAILING: dict[int, str] = {}
