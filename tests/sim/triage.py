"""Which engine bug broke a seed: a diagnosis from the violations and the fault plan.

The simulator only knows invariants; this module maps what broke to the causes found so far in
the engine, so a sweep can be summarized (``python -m tests.sim.triage 0 2000``) and the
regression table can say why each seed is there. A seed with no known cause is ``unknown``:
look at it first.
"""

from __future__ import annotations

import re
import sys
import time
from collections import defaultdict

from tests.sim.simulate import SeedResult, simulate

CAUSES = {
    "shared-key": (
        "run_once keys are scoped by executor and starting checkpoint only: two messages "
        "delivered to one executor in one superstep share one key, the second gets the first's "
        "result (workflow_engine/_context.py WorkflowContext.run_once)"
    ),
    "call-id": (
        "agent tool calls are journaled under the model's call id (tool/<call_id>) and get the "
        "idempotency key run_id:call_id; a model that reuses ids gets another call's result "
        "(executors/_agent.py Agent._run_batch, Agent._invoke)"
    ),
    "request-id": (
        "request ids restart at each resume of the same superstep: an answer routed from one "
        "request port into another gets request_id_for(run, superstep, 'port#answer', index), "
        "index counted per resume -- a second resume overwrites a pending request (memory) or "
        "hits a UNIQUE constraint (SQLite) (workflow_engine/_workflow.py "
        "Workflow._apply_answers, workflow_engine/_runner.py RunLoop.port_request)"
    ),
    "answer-scope": (
        "run_once results are keyed by the checkpoint a superstep started from; an answer that "
        "arrives before a crashed superstep is recovered makes _prepare commit a new checkpoint, "
        "and the re-executed superstep no longer finds its journal (workflow_engine/_runner.py "
        "RunLoop.superstep journal_scope, workflow_engine/_workflow.py Workflow._prepare)"
    ),
    "lease": (
        "a lease is renewed only when a superstep commits: a superstep longer than the lease "
        "lets a second worker take the run, and the first one's side effects still run "
        "(workflow_engine/_runtime.py _LeasedStore / Runtime._drive; no renewal, no fencing "
        "before run_once)"
    ),
    "answer-order": (
        "answers delivered by one resume are applied in the store's order (created_at, "
        "request_id): when requests were created at different wall-clock times the same "
        "answers give a different message and output order (workflow_engine/_runtime.py "
        "Runtime._resume_point)"
    ),
    "unknown": "no known cause matches: a new bug, or a simulator bug",
}


def diagnose(result: SeedResult) -> list[str]:
    """The known causes whose signature the seed's violations show."""
    causes: set[str] = set()
    for v in result.violations:
        text = v.detail
        if "run_once('effect')" in text:
            causes.add("shared-key")
        if v.invariant == "journal" and re.search(r": call call_\d+ ", text):
            causes.add("call-id")
        if "given to" in text and "idempotency key" in text:
            causes.add("call-id")
        if v.invariant == "request-ids" and "reused" in text:
            causes.add("request-id")
        if "UNIQUE constraint" in text or "paused but nothing is pending" in text:
            causes.add("request-id")
        if v.invariant == "order":
            causes.add("answer-order")
    for runs in result.faulted.ledger.executions.values():
        repeated = [e for e in runs[:-1] if not e.torn]
        if not repeated:
            continue
        if any(e.overlapped for e in runs):
            causes.add("lease")  # ran while a worker was stalled past its lease
        if sum(not e.overlapped and not e.torn for e in runs) > 1:
            causes.add("answer-scope" if result.plan.reordered else "unknown")
    return sorted(causes) or ["unknown"]


def sweep(first: int, last: int) -> dict[str, list[int]]:
    """Simulate seeds ``first``..``last - 1``; failing seeds grouped by cause."""
    groups: dict[str, list[int]] = defaultdict(list)
    for seed in range(first, last):
        result = simulate(seed)
        if not result.ok:
            groups["+".join(diagnose(result))].append(seed)
    return dict(groups)


def main(argv: list[str]) -> None:
    """``python -m tests.sim.triage FIRST LAST [--table]``: sweep and group; ``--table``
    prints the ``KNOWN_FAILING`` entries for ``regressions.py`` instead."""
    first, last = int(argv[0]), int(argv[1])
    started = time.perf_counter()
    groups = sweep(first, last)
    seconds = time.perf_counter() - started
    if "--table" in argv:
        causes = {seed: cause for cause, seeds in groups.items() for seed in seeds}
        for seed in sorted(causes):
            print(f'    {seed}: "{causes[seed]}",')
        return
    failing = sum(len(seeds) for seeds in groups.values())
    print(f"{last - first} seeds in {seconds:.1f} s, {failing} failing")
    for cause, seeds in sorted(groups.items(), key=lambda item: -len(item[1])):
        print(f"{cause}: {len(seeds)} seeds: {seeds}")


if __name__ == "__main__":
    main(sys.argv[1:])
