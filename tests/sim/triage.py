"""Which engine bug broke a seed: a diagnosis from the violations and the fault plan.

The simulator only knows invariants; this module maps what broke to the causes found so far in
the engine (those marked fixed stay, so that a regression is named), so a sweep can be
summarized (``python -m tests.sim.triage 0 1000``) and the regression table can say why each
seed is there. A seed with no known cause is ``unknown``: look at it first.
"""

from __future__ import annotations

import re
import sys
import time
from collections import defaultdict

from tests.sim.simulate import SeedResult, simulate

CAUSES = {
    # --- found against the old kernel (e963ce4), fixed by the step-identity rewrite (a7197fa,
    # 139ea90); their signatures stay, so a regression is named
    "shared-key": (
        "run_once keys are scoped by executor and starting checkpoint only: two messages "
        "delivered to one executor in one superstep share one key, the second gets the first's "
        "result (workflow_engine/_context.py WorkflowContext.run_once) [fixed]"
    ),
    "call-id": (
        "agent tool calls are journaled under the model's call id (tool/<call_id>) and get the "
        "idempotency key run_id:call_id; a model that reuses ids gets another call's result "
        "(executors/_agent.py Agent._run_batch, Agent._invoke) [fixed]"
    ),
    "request-id": (
        "request ids restart at each resume of the same superstep: an answer routed from one "
        "request port into another gets request_id_for(run, superstep, 'port#answer', index), "
        "index counted per resume -- a second resume overwrites a pending request (memory) or "
        "hits a UNIQUE constraint (SQLite) (workflow_engine/_workflow.py "
        "Workflow._apply_answers, workflow_engine/_runner.py RunLoop.port_request) [fixed]"
    ),
    "answer-scope": (
        "run_once results are keyed by the checkpoint a superstep started from; an answer that "
        "arrives before a crashed superstep is recovered makes _prepare commit a new checkpoint, "
        "and the re-executed superstep no longer finds its journal (workflow_engine/_runner.py "
        "RunLoop.superstep journal_scope, workflow_engine/_workflow.py Workflow._prepare) [fixed]"
    ),
    "lease": (
        "a lease is renewed only when a superstep commits: a superstep longer than the lease "
        "lets a second worker take the run while the first, alive, still executes it "
        "(workflow_engine/_runtime.py _LeasedStore.keep_alive / _RenewalTimer) [fixed]"
    ),
    "answer-order": (
        "answers delivered by one resume are applied in the store's order (created_at, "
        "request_id): when requests were created at different wall-clock times the same "
        "answers give a different message and output order (workflow_engine/_runtime.py "
        "Runtime._resume_point) [fixed]"
    ),
    # --- found against the new kernel
    "in-doubt-twice": (
        "an in-doubt question's request id is derived from the step key alone "
        "(derive_id(secret, 'effect', run_id, step_key) in workflow_engine/_runner.py "
        "RunLoop._ask_about_effects): when the operator says 'did not happen', the step runs "
        "again, and the process dies between intent and result again, the second question "
        "gets the first one's id -- the memory store resets the applied request to pending, "
        "Workflow.validate_responses drops its answer as a repeat (rid in state.answered), and "
        "the run stays IDLE_WITH_PENDING_REQUESTS for ever; SQLite fails every resume with "
        "UNIQUE constraint failed: requests.request_id [fixed in 1f0f6c1]"
    ),
    "in-doubt-id": (
        "the in-doubt question about a step has the request id "
        "derive_id(secret, 'effect', run_id, step_key) -- exactly the hex part of the "
        "idempotency key WorkflowContext.idempotency_key hands the step's outside service, so "
        "that service can answer the question (e.g. 'did not happen', to have a payment "
        "repeated) (workflow_engine/_runner.py RunLoop._ask_about_effects, "
        "workflow_engine/_context.py WorkflowContext.idempotency_key) [fixed in 1f0f6c1]"
    ),
    "stale-start": (
        "a worker learns that its lease is lost only from a failed renewal or a refused write "
        "(_LeasedStore.lost); WorkflowContext.run_once checks that flag but never the lease's "
        "expiry, so a worker paused past its lease (GC, SIGSTOP) calls the step's function "
        "when it thaws although another worker holds the run: an idempotent step (no fenced "
        "write before it) runs again, and a non-idempotent one whose intent was journaled "
        "before the pause runs after the other worker asked about it -- if the operator "
        "answered 'did not happen' meanwhile, the effect happens twice "
        "(workflow_engine/_context.py WorkflowContext.run_once, workflow_engine/_runtime.py "
        "_LeasedStore.lease_lost)"
    ),
    "catch-up-lost": (
        "Runtime._go_on (resume again when answers arrived while the run executed) took every "
        "RunBusyError of the catch-up for 'another worker took the run first' -- also a "
        "LeaseLostError raised mid-step when this worker was frozen past its lease -- and "
        "returned the earlier result: the caller never learned that its process's step was "
        "cut off, so an idempotent step's retry by the worker that took over looked like a "
        "second whole execution (workflow_engine/_runtime.py Runtime._go_on) [fixed]"
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
        if v.invariant == "order":
            causes.add("answer-order")
        if v.invariant == "lease" and "was started by" in text:
            causes.add("stale-start")
        if v.invariant == "lease" and "not kept renewed" in text:
            causes.add("lease")
    asked = [line.rsplit(": ", 1)[0] for line in result.faulted.in_doubt]  # branch: step
    if len(set(asked)) < len(asked) and any(
        v.invariant in ("liveness", "engine", "simulator") for v in result.violations
    ):
        causes.add("in-doubt-twice")  # the same step asked about again, and the run stuck
    elif any("UNIQUE constraint" in v.detail for v in result.violations):
        causes.add("request-id")
    frozen = set(result.faulted.stalled) if result.plan.freeze else set()
    for runs in result.faulted.ledger.executions.values():
        if sum(not e.torn for e in runs) > 1 and not any(e.stale for e in runs):
            if any(e.process in frozen and not e.torn and not e.settled for e in runs):
                causes.add("catch-up-lost")  # a frozen worker's cut-off step, never reported
            else:
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
