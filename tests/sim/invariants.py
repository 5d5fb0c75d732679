"""The invariants every seed must keep, comparing a faulty run with the uninterrupted one.

* **exactly-once** -- every logical side effect of the uninterrupted run happened, and no
  other. A step not declared idempotent ran exactly once, whatever died where: a crash between
  its effect and its journal entry leaves an intent, and the run asks (the operator answers
  truthfully) instead of repeating it. An idempotent step ran once too, except that
  executions cut off before their result was durable -- their process died, or gave the run up
  having lost its lease (*torn* ones) -- come with exactly one that was not (a worker that
  lost its lease in the middle of a call may finish it after the retry); its idempotency key
  stays the same across such a retry, and no key is ever shared by two different effects. The
  uninterrupted run itself runs everything once.
* **lease** -- no step starts in a process after the store leased the run to another one,
  and a worker that is alive and executing (a slow call, not a frozen process) keeps its lease:
  another worker is refused the run.
* **in-doubt** -- a question is asked only about a non-idempotent step whose result is not
  journaled, names the step the effect ran as, and only in a run that crashed or lost a lease
  (the uninterrupted run asks none); answers to it are applied like any other.
* **journal** -- ``run_once`` (and the agent's journal) hands back the result of the very effect
  asked for, never another one's; a superstep's entries are gone once it committed (a finished
  run keeps none).
* **outputs** -- every branch's outputs equal the uninterrupted run's as a multiset, and
  **order** -- in the same order when answers arrived at the same points (the engine promises a
  deterministic order for the same inputs); only a multiset when the plan moved answers.
* **answers** -- every answer the store accepted is applied and still says what was sent; no
  request is left pending or unapplied in a finished run; answers are applied at the same
  supersteps as in the uninterrupted run (when the plan did not move them).
* **request-ids** -- no request id ever names two different requests; ids are 32 hex digits
  and secret per run (the faulty run shares none with the uninterrupted one); the same requests
  exist, made at the same supersteps in the same order when answers arrived at the same points.
* **history** -- every run's checkpoints form one chain (seqs contiguous, each checkpoint's
  parent the previous one, supersteps never going back), the run row points at its last
  checkpoint, and every checkpoint restores.
* **integrity** -- SQLite's own integrity and foreign-key checks pass; every run reads back.
* **cancel** -- a cancelled run has no pending requests, refuses answers and cannot resume.
* **liveness** -- the run and its forks finish within the driver's bounds, with no engine error.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

from tests.sim.driver import BranchOutcome, Outcome
from tests.sim.generator import IN_DOUBT
from tests.sim.world import Execution, Ledger


@dataclass(frozen=True)
class Violation:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.detail}"


def check(
    reference: Outcome, faulted: Outcome, *, same_schedule: bool | None = None
) -> list[Violation]:
    """Every violation of ``faulted`` against ``reference``. ``same_schedule``: answers were
    applied at the same supersteps, so order and schedule must match too (default: unless the
    fault plan moved answers)."""
    if same_schedule is None:
        same_schedule = not faulted.plan.reordered
    out: list[Violation] = []
    for invariant, detail in reference.violations:
        out.append(Violation(invariant, f"(uninterrupted run) {detail}"))
    out.extend(_ledger_alone(reference.ledger, "(uninterrupted run) "))
    for invariant, detail in faulted.violations:
        out.append(Violation(invariant, detail))
    out.extend(_ledger_alone(faulted.ledger, ""))
    out.extend(_ledgers(reference.ledger, faulted.ledger))
    out.extend(_branches(reference, faulted, same_schedule))
    out.extend(_questions(reference, faulted))
    return _dedupe(out)


def _questions(reference: Outcome, faulted: Outcome) -> list[Violation]:
    """In-doubt questions only where something went wrong; request ids secret per run."""
    out = []
    for label, branch in sorted(reference.branches.items()):
        asked = sorted(lo for lo in branch.requests.values() if lo.startswith(IN_DOUBT))
        if asked:
            out.append(Violation("in-doubt", f"(uninterrupted run) {label} asked in-doubt {asked}"))
    ours = {rid for b in reference.branches.values() for rid in b.requests}
    for label, branch in sorted(faulted.branches.items()):
        shared = sorted(ours & set(branch.requests))
        if shared:
            out.append(
                Violation(
                    "request-ids",
                    f"{label}: request ids {shared[:3]} also name requests of another run "
                    "(the uninterrupted one): ids are not secret per run",
                )
            )
    return out


def _ledger_alone(ledger: Ledger, prefix: str) -> list[Violation]:
    """What one ledger shows by itself: double executions, journal mix-ups, key misuse."""
    out = []
    for mismatch in ledger.mismatches:
        out.append(Violation("journal", f"{prefix}{mismatch}"))
    owners: dict[tuple[str, str], set[str]] = defaultdict(set)
    for identity, runs in ledger.executions.items():
        idempotent = all(e.idempotent for e in runs)
        # an idempotent step may be retried after cut-off executions (before or after the
        # retry: a worker that lost its lease mid-step may finish its call late); a stale
        # start is the lease invariant's (below), not a second count
        whole = [e for e in runs if not e.torn and not e.stale] if idempotent else runs
        if len(whole) > 1:
            shown = ", ".join(f"{e.process}{_flags(e)}" for e in runs)
            kind = "idempotent " if idempotent else ""
            out.append(
                Violation(
                    "exactly-once", f"{prefix}{kind}{identity} ran {len(runs)} times ({shown})"
                )
            )
        for e in ledger.executions[identity]:
            if e.stale:
                out.append(
                    Violation(
                        "lease",
                        f"{prefix}{identity} was started by {e.process} after the store had "
                        "leased the run to another worker",
                    )
                )
        keys = {e.engine_key for e in runs if e.engine_key is not None}
        if len(keys) > 1:
            out.append(
                Violation(
                    "exactly-once",
                    f"{prefix}{identity} was retried with another idempotency key: {sorted(keys)}",
                )
            )
        branch = identity.split("|", 1)[0]
        for key in keys:
            owners[(branch, key)].add(identity)
    for (_, key), identities in sorted(owners.items()):
        if len(identities) > 1:
            out.append(
                Violation(
                    "exactly-once",
                    f"{prefix}idempotency key {key} given to {len(identities)} different "
                    f"effects: {sorted(identities)}",
                )
            )
    return out


def _flags(e: Execution) -> str:
    flags = [
        name
        for name, on in (
            ("crashed", e.crashed),
            ("abandoned", e.abandoned),
            ("settled", e.settled),
            ("stale", e.stale),
            ("overlapped", e.overlapped),
        )
        if on
    ]
    return f" {'/'.join(flags)}" if flags else ""


def _ledgers(reference: Ledger, faulted: Ledger) -> list[Violation]:
    expected = set(reference.executions)
    got = set(faulted.executions)
    out = []
    for identity in sorted(expected - got):
        out.append(Violation("exactly-once", f"{identity} never happened"))
    for identity in sorted(got - expected):
        out.append(
            Violation("exactly-once", f"{identity} happened, but not in the uninterrupted run")
        )
    return out


def _branches(reference: Outcome, faulted: Outcome, same_schedule: bool) -> list[Violation]:
    out = []
    reordered = not same_schedule
    for label, ref in sorted(reference.branches.items()):
        got = faulted.branches.get(label)
        if got is None:
            if label == "cancelled" and reordered and not _paused(faulted.branches.get("main")):
                continue  # answers came early: the run never rested where it could be forked
            out.append(Violation("liveness", f"{label} does not exist in the faulty run"))
            continue
        if got.status != ref.status:
            out.append(Violation("liveness", f"{label} ended {got.status}, not {ref.status}"))
        if reordered and label != "main":
            continue  # forked where the faulty run's own history was: not comparable
        if reordered:
            if sorted(got.outputs) != sorted(ref.outputs):
                out.append(
                    Violation("outputs", f"{label}: {_diff(ref.outputs, got.outputs)} (multiset)")
                )
        elif got.outputs != ref.outputs:
            same = sorted(got.outputs) == sorted(ref.outputs)
            out.append(
                Violation(
                    "order" if same else "outputs", f"{label}: {_diff(ref.outputs, got.outputs)}"
                )
            )
        asked = Counter(lo for lo in got.requests.values() if not lo.startswith(IN_DOUBT))
        if asked != Counter(ref.requests.values()):
            missing = Counter(ref.requests.values()) - asked
            extra = asked - Counter(ref.requests.values())
            out.append(
                Violation(
                    "request-ids",
                    f"{label}: other requests than uninterrupted: missing {sorted(missing)}, "
                    f"extra {sorted(extra)}",
                )
            )
        if not reordered and got.created != ref.created:
            out.append(
                Violation(
                    "request-ids",
                    f"{label}: requests made at {got.created}, uninterrupted at {ref.created}",
                )
            )
        if not reordered and got.schedule != ref.schedule:
            out.append(
                Violation(
                    "answers",
                    f"{label}: answers applied at {got.schedule}, uninterrupted at {ref.schedule}",
                )
            )
        if got.status == "idle":
            stuck = {rid: s for rid, s in got.request_status.items() if s != "applied"}
            if stuck:
                out.append(Violation("answers", f"{label} finished with requests {stuck}"))
    for label in sorted(set(faulted.branches) - set(reference.branches)):
        if not label.startswith("orphan:"):
            out.append(Violation("liveness", f"{label} exists only in the faulty run"))
    return out


def _paused(branch: BranchOutcome | None) -> bool:
    """Whether a superstep of ``branch`` was first committed paused (where the driver forks the
    run to cancel the fork)."""
    first: dict[int, str] = {}
    for superstep, status in branch.supersteps if branch is not None else []:
        first.setdefault(superstep, status)
    return "idle_with_pending_requests" in first.values()


def _diff(expected: list[str], got: list[str]) -> str:
    missing = Counter(expected) - Counter(got)
    extra = Counter(got) - Counter(expected)
    if not missing and not extra:
        return f"same outputs in another order ({len(got)})"
    return (
        f"{len(got)} outputs, {len(expected)} expected; missing {list(missing.elements())[:3]}, "
        f"extra {list(extra.elements())[:3]}"
    )


def _dedupe(violations: list[Violation]) -> list[Violation]:
    seen = set()
    out = []
    for v in violations:
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out
