"""Seeds that failed once: each is run on every test run, whatever ``SIM_SEEDS`` says.

``REGRESSIONS`` maps a seed to why it was added (its cause, see ``CAUSES`` in
``tests/sim/triage.py``). A seed joins when a sweep finds it failing (``python -m
tests.sim.triage FIRST LAST`` groups a range's failing seeds by cause); it stays after the fix,
as a regression test. (The first seven were found against the old kernel; fault plans depend on
how many store calls the engine makes, so since the rewrite they exercise other points -- they
still run, as seeds that once mattered.)

``KNOWN_FAILING`` lists the seeds of the default sweep and of ``REGRESSIONS`` that fail on the
engine as it is today, each with its cause: every one is an engine bug, not a simulator one,
and the tests mark them ``xfail(strict=True)`` -- when a fix lands they XPASS and fail the run,
so the entry must go (regenerate with ``python -m tests.sim.triage 0 1000 --table``). The
kernel rewrite (a7197fa .. 139ea90) fixed every cause found against the old kernel; the
simulator, updated for its contract (step identity, intents and in-doubt questions, leases
renewed and fenced, per-run request ids, answers in request order, durable cancel), found
``in-doubt-twice`` (fixed since, 1f0f6c1) and ``stale-start`` (a worker paused past its lease
started a step after a takeover; fixed: a step checks, and if need be renews, the lease right
before it starts). A sweep of seeds 1,000-20,000 found ``catch-up-lost`` (fixed). None is
failing today.
"""

from __future__ import annotations

REGRESSIONS: dict[int, str] = {
    2000: "shared-key: a relay with a constant run_once key gets two messages in one superstep",
    2003: "call-id: the model restarts its call ids; lookup and pay share tool/call_1",
    2018: "lease: a worker stalls inside an effect past its lease; another takes over",
    2023: "answer-scope: crash after a journaled effect, an answer arrives before recovery",
    2037: "request-id: chained ports answered one at a time reuse a request id (memory)",
    3239: "request-id: the same on SQLite: UNIQUE constraint failed: requests.request_id",
    2739: "answer-order: two answers applied in one resume, requests created at other times",
    1118: "in-doubt-twice: a merge relay's step is in doubt twice (two kills after its intent)",
    1156: "in-doubt-twice: the same in a fork: the sink's step asked about twice",
    1648: "stale-start: a frozen worker thaws and runs a loop step after a takeover (SQLite)",
    1851: "stale-start: a frozen worker thaws and runs a merge branch's loop step",
    17451: "catch-up-lost: frozen past its lease in a catch-up resume, the worker returned "
    "normally instead of raising LeaseLostError",
}

KNOWN_FAILING: dict[int, str] = {}
