"""The driver: plays one seed's run against the engine, through crashes, to the end.

It behaves like the world around a deployment: worker processes (each a ``Runtime`` with its own
store connection, and its own store proxy that can kill it) resume the run; a client answers pending
requests -- in an order drawn from the seed at each point where the run rests, with answers that
are a pure function of the request -- and an observer reads the store. When a worker dies
(:class:`~tests.sim.world.SimulatedCrash`) the driver discards it, lets the world do what the
fault plan says (wait out the lease, retry at once and get ``RunBusyError``, or answer another
request first) and carries on with a fresh worker. Every loop is bounded.

When the run pauses on an in-doubt step (an ``InDoubtEffect`` request: a non-idempotent step
started before a crash and journaled no result), an operator answers it truthfully from the
outside ledger -- did the effect happen, and what did it return -- before anything else; such a
rest does not count as one of the user's rests, so the user's answers arrive at the same
points as in the uninterrupted run.

After the main run it forks the run at a past superstep and drives the fork to its end, and
forks it at a paused superstep and cancels that fork, when the scenario says so.

The driver's decisions depend only on the seed, the plan and what it observes in the store, so a
seed replays exactly.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import random
import re
import sqlite3
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup

from tests.sim.faults import CrashingStore, FaultPlan
from tests.sim.generator import (
    IN_DOUBT,
    WorkflowSpec,
    answer_for,
    effect_of,
    generate,
    request_identity,
    resolution_for,
)
from tests.sim.world import (
    Ledger,
    SimProcess,
    SimulatedCrash,
    World,
    current_branch,
    current_process,
    jsonable,
)
from workflow_engine import (
    InDoubtEffect,
    RequestCancelledError,
    RunBusyError,
    RunNotFoundError,
    RunNotResumableError,
    Runtime,
    StoredRequest,
    UnknownRequestError,
    WorkflowRunState,
)
from workflow_engine.storage import InMemoryRunStore, SqliteStore

RUN_ID = "sim-run"
LEASE = 30.0
MAX_ACTIONS = 300
MAX_ERRORS = 3

IDLE = WorkflowRunState.IDLE
PAUSED = WorkflowRunState.IDLE_WITH_PENDING_REQUESTS


class SimFailure(AssertionError):
    """The driver cannot go on: the run does not finish, or the engine keeps failing."""


@dataclass(frozen=True)
class Scenario:
    """The logical inputs of a seed: the same in the uninterrupted and the faulty run."""

    seed: int
    spec: WorkflowSpec
    api: str  # "start" (start, then resume) or "run" (admit and execute at once)
    fork_at: float | None  # fork at this fraction of the run's supersteps and finish the fork
    cancel_at: float | None  # fork at a paused superstep (this fraction) and cancel it
    batching: str = "seeded"  # which requests to answer at a rest: seeded, "one" or "all"

    def describe(self) -> str:
        extra = [f"api={self.api}"]
        if self.fork_at is not None:
            extra.append(f"fork@{self.fork_at:.2f}")
        if self.cancel_at is not None:
            extra.append(f"cancel-fork@{self.cancel_at:.2f}")
        return f"{self.spec.describe()} [{', '.join(extra)}]"


def draw_scenario(seed: int) -> Scenario:
    rng = random.Random(f"scenario:{seed}")
    spec = generate(seed)
    api = rng.choice(["start", "run"])
    fork_at = rng.random() if rng.random() < 0.3 else None
    cancel_at = rng.random() if rng.random() < 0.2 else None
    return Scenario(seed, spec, api, fork_at, cancel_at)


@dataclass
class BranchOutcome:
    """One run (the main run, a fork, a cancelled fork) as the store holds it at the end."""

    label: str
    run_id: str
    status: str
    outputs: list[str]  # canonical JSON, in order
    requests: dict[str, str]  # request id -> logical identity (every request stored)
    request_status: dict[str, str]
    schedule: list[tuple[int, tuple[str, ...]]]  # (superstep, answers applied there)
    supersteps: list[tuple[int, str]]  # (superstep, status) of every checkpoint, in order
    created: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    """(superstep, requests that became pending there, in the order they were made)"""


@dataclass
class Outcome:
    """What one play of a seed left behind."""

    scenario: Scenario
    plan: FaultPlan
    ledger: Ledger
    branches: dict[str, BranchOutcome] = field(default_factory=dict)
    violations: list[tuple[str, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)
    trace: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)
    user_labels: list[str] = field(default_factory=list)  # every user point, in order
    in_doubt: list[str] = field(default_factory=list)  # in-doubt questions and their answers
    points: int = 0
    user_points: int = 0
    resumes: int = 0


@dataclass
class Worker:
    proc: SimProcess
    runtime: Runtime
    sqlite: SqliteStore | None
    closed: bool = False


def canonical(value: Any) -> str:
    return json.dumps(jsonable(value), sort_keys=True, separators=(",", ":"))


def agrees(sent: Any, stored: Any) -> bool:
    """The stored answer says what was sent (a model stored for a dict may add its defaults)."""
    if isinstance(sent, dict) and isinstance(stored, dict):
        return all(k in stored and agrees(v, stored[k]) for k, v in sent.items())
    if isinstance(sent, list) and isinstance(stored, list):
        return len(sent) == len(stored) and all(map(agrees, sent, stored))
    return bool(sent == stored)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def classify(exc: BaseException) -> str:
    """crash | busy | stale | error"""
    leaves = _leaves(exc)
    if any(isinstance(e, SimulatedCrash) for e in leaves):
        return "crash"
    if all(isinstance(e, RunBusyError) for e in leaves):
        return "busy"
    if all(isinstance(e, RunNotResumableError) for e in leaves):
        return "stale"
    return "error"


class Driver:
    def __init__(
        self,
        scenario: Scenario,
        plan: FaultPlan,
        world: World,
        workdir: Path | None,
        memory_store: Callable[..., Any] = InMemoryRunStore,
        sqlite_hook: Callable[[SimProcess], Callable[[str], None]] | None = None,
    ) -> None:
        self.scenario = scenario
        self.sqlite_hook = sqlite_hook  # a process's SqliteStore fault_hook (SIGKILL sweep)
        self.spec = scenario.spec
        self.plan = plan
        self.world = world
        self.memory = memory_store(clock=world.now) if plan.store == "memory" else None
        if plan.store == "sqlite" and workdir is None:
            raise ValueError("a SQLite plan needs a directory")
        self.db = (workdir / "sim.db") if workdir is not None else None
        self.workers: list[Worker] = []
        self.current: Worker | None = None
        self.helper = self._spawn("client", counted=False)
        self.tg: TaskGroup | None = None
        self.active_run = RUN_ID
        self.resumes = 0
        self.errors = 0
        self.handled_crashes = 0
        self.early = 0  # answers to deliver before the next recovery
        self.early_count = 0
        self.log: list[str] = []
        self.violations: list[tuple[str, str]] = []  # (invariant, what broke)
        self.seen: dict[str, str] = {}  # request id -> logical identity
        self._identities: dict[tuple[str, str], str] = {}
        self.answers: dict[str, tuple[str, Any]] = {}  # request id -> (logical, answer JSON)
        self.in_doubt: list[str] = []  # what was asked about, and what the operator said
        if plan.stall is not None:
            world.hooks[plan.stall] = self._stall
        if plan.midrun_answer is not None:
            world.hooks[plan.midrun_answer] = self._answer_midrun

    def violate(self, invariant: str, text: str) -> None:
        self.violations.append((invariant, text))

    # --- processes ------------------------------------------------------------------------------

    def _spawn(self, name: str | None = None, *, counted: bool = True) -> Worker:
        proc = self.world.process(name, counted=counted)
        sqlite = None
        if self.memory is not None:
            real: Any = self.memory
        else:
            assert self.db is not None
            real = sqlite = SqliteStore(
                self.db,
                clock=self.world.now,
                snapshot_every=self.plan.snapshot_every,
                span_every=self.plan.span_every,
                fault_hook=self.sqlite_hook(proc) if self.sqlite_hook else None,
            )
            if self.spec.seed % 2:  # every list kept apart from its snapshot, read when needed
                sqlite._lists_apart_from = 1
            if self.spec.seed % 3 == 1:  # every array of a row in chunks, through indexes
                sqlite._chunking = (1, 2, 2, 8, 2)
        runtime = Runtime(CrashingStore(real, proc), lease_seconds=LEASE)  # type: ignore[arg-type]
        runtime.register(self.spec.build())
        worker = Worker(proc, runtime, sqlite)
        self.workers.append(worker)
        return worker

    def worker(self) -> Worker:
        if self.current is None or not self.current.proc.alive:
            self.current = self._spawn()
        return self.current

    async def _close(self, worker: Worker) -> None:
        """A dead (or finished) process's connection goes away; nothing is committed by it."""
        if worker.closed:
            return
        worker.closed = True
        if worker.sqlite is not None:
            self.world.clock.io_in_flight += 1
            try:
                await worker.sqlite.close()
            finally:
                self.world.clock.io_in_flight -= 1

    async def close(self) -> None:
        for worker in self.workers:
            await self._close(worker)

    async def absorb_crashes(self) -> None:
        """Deal with every process death since the last call, as the plan says."""
        while self.handled_crashes < len(self.world.crashes):
            index = self.handled_crashes
            self.handled_crashes += 1
            policy = self.plan.recovery[index] if index < len(self.plan.recovery) else "wait"
            self.log.append(f"crash: {self.world.crashes[index]} → {policy}")
            for worker in self.workers:
                if not worker.proc.alive:
                    await self._close(worker)
            if policy == "wait":
                await anyio.sleep(LEASE + 1)
            elif policy == "early":
                self.early += 1
        if self.current is not None and not self.current.proc.alive:
            self.current = None

    async def attempt(self, what: str, fn: Callable[[Worker], Awaitable[Any]]) -> tuple[bool, Any]:
        """``fn`` on the current worker: (True, result), or (False, None) once the fault it met
        was dealt with (a crash, a busy run, a stale view of the run, an error)."""
        worker = self.worker()
        token = current_process.set(worker.proc)
        try:
            return True, await fn(worker)
        except BaseException as exc:
            kind = classify(exc)
            self.world.ledger.process_gave_up(worker.proc.name)
            if kind == "crash":
                await self.absorb_crashes()
            elif kind == "busy":
                self.log.append(f"{what}: busy, waiting out the lease")
                await anyio.sleep(LEASE + 1)
            elif kind == "stale":
                self.log.append(f"{what}: {exc}")
            else:
                self.errors += 1
                text = "; ".join(f"{type(e).__name__}: {e}" for e in _leaves(exc))
                self.violate("engine", f"engine error during {what}: {text}")
                if self.errors >= MAX_ERRORS:
                    raise SimFailure(f"the engine keeps failing ({text})") from exc
                worker.proc.alive = False  # start over in a fresh process
                self.current = None
                await self._close(worker)
            return False, None
        finally:
            current_process.reset(token)
            worker.proc.after_stall = False

    # --- observing ------------------------------------------------------------------------------

    async def observe(self, run_id: str) -> tuple[Any, list[tuple[StoredRequest, str]]]:
        """The run row and every request of the run with its logical identity."""
        runtime = self.helper.runtime
        try:
            run = await runtime.store.get_run(run_id)
        except RunNotFoundError:
            return None, []
        requests = []
        for r in await runtime.store.list_requests(run_id, status=None):
            logical = self._identity(r)
            known = self.seen.setdefault(r.request_id, logical)
            if known != logical:
                self.violate(
                    "request-ids",
                    f"request id {r.request_id} reused: it was {known}, now it is {logical}",
                )
                self.seen[r.request_id] = logical
            requests.append((r, logical))
        return run, requests

    def _identity(self, request: StoredRequest) -> str:
        """The logical identity of a stored request (cached by its id and raw data)."""
        key = (request.request_id, json.dumps(request.data, sort_keys=True))
        logical = self._identities.get(key)
        if logical is None:
            codec = self.helper.runtime.workflow(self.spec.name).codec
            logical = request_identity(request.port_id, codec.decode(request.data))
            self._identities[key] = logical
        return logical

    # --- actions --------------------------------------------------------------------------------

    async def _start(self, worker: Worker) -> None:
        name, message = self.spec.name, self.spec.start_message()
        if self.scenario.api == "run":
            await worker.runtime.run(name, message, run_id=RUN_ID)
        else:
            await worker.runtime.start(name, message, run_id=RUN_ID)

    async def _resume(self, worker: Worker, run_id: str) -> None:
        self.resumes += 1
        if self.resumes not in self.plan.races:
            await worker.runtime.resume(run_id)
            return
        rival = self._spawn()
        self.log.append(f"resume #{self.resumes}: {worker.proc.name} races {rival.proc.name}")
        failures: list[BaseException] = []
        ran = 0

        async def one(w: Worker) -> None:
            nonlocal ran
            current_process.set(w.proc)
            try:
                await w.runtime.resume(run_id)
                ran += 1
            except BaseException as exc:
                self.world.ledger.process_gave_up(w.proc.name)
                failures.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, worker)
            tg.start_soon(one, rival)
        if rival.proc.alive:
            await self._close(rival)
        if ran > 1:
            self.violate("exactly-once", f"resume #{self.resumes}: two racing workers both ran")
        if failures and (not ran or any(classify(e) != "busy" for e in failures)):
            raise BaseExceptionGroup("race", failures)  # type: ignore[type-var]

    async def _respond(self, worker: Worker, request_id: str, logical: str, answer: Any) -> None:
        self.answers[request_id] = (logical, jsonable(answer))
        await worker.runtime.respond(request_id, answer)

    async def _answer_with_helper(self, run_id: str, salt: str) -> None:
        """An answer from outside arrives now (not at a point where the run rests). In-doubt
        questions are the operator's, answered where the run rests."""
        _, requests = await self.observe(run_id)
        pending = sorted(
            (logical, r)
            for r, logical in requests
            if r.status == "pending" and not logical.startswith(IN_DOUBT)
        )
        if not pending:
            return
        logical, request = random.Random(f"{self.scenario.seed}:{salt}").choice(pending)
        self.log.append(f"answer arrives early ({salt}): {logical}")
        codec = self.helper.runtime.workflow(self.spec.name).codec
        answer = answer_for(codec.decode(request.data))
        await self._respond(self.helper, request.request_id, logical, answer)

    # --- faults inside workflow code ------------------------------------------------------------

    async def _stall(self, proc: SimProcess, label: str) -> None:
        """A worker stalls past its lease; meanwhile another worker tries to take the run over
        -- after an answer arrived, if the plan says so. A stall is one slow call: the
        worker's lease keeper goes on renewing, so the other worker must be refused. A freeze
        stops the whole process (a GC pause, SIGSTOP, a VM migration): the lease expires, the
        other worker takes over, and the frozen one must start no side effect once it thaws
        and must write nothing more."""
        assert self.tg is not None
        what = "freezes" if self.plan.freeze else "stalls"
        self.log.append(f"{proc.name} {what} at {label} for {2 * LEASE:g} s")
        self.world.stalled.append(proc.name)
        if self.plan.freeze:
            proc.frozen_until = self.world.clock.elapsed + 2 * LEASE
        self.tg.start_soon(self._take_over, self.active_run, current_branch.get(), proc)
        self.world.stalls_active += 1
        try:
            await anyio.sleep(2 * LEASE)
        finally:
            self.world.stalls_active -= 1
            proc.after_stall = True

    async def _take_over(self, run_id: str, branch: str, stalled: SimProcess) -> None:
        current_branch.set(branch)
        await anyio.sleep(LEASE + 1)
        if self.plan.stall_answer:
            await self._answer_with_helper(run_id, "stall")
        rival = self._spawn()
        current_process.set(rival.proc)
        try:
            try:
                await rival.runtime.resume(run_id)
                self.log.append(f"{rival.proc.name} took the run over")
            finally:
                granted = (run_id, rival.proc.name) in self.world.grants
                if granted and not self.plan.freeze and stalled.alive:
                    self.violate(
                        "lease",
                        f"{rival.proc.name} was granted the run while {stalled.name} was "
                        "executing it, alive and not frozen: its lease was not kept renewed",
                    )
        except BaseException as exc:
            kind = classify(exc)
            self.world.ledger.process_gave_up(rival.proc.name)
            self.log.append(f"{rival.proc.name} could not take over: {kind} ({exc})")
            if kind == "error":
                self.violate("engine", f"engine error during a takeover: {exc!r}")
        finally:
            await self._close(rival)

    async def _answer_midrun(self, proc: SimProcess, label: str) -> None:
        await self._answer_with_helper(self.active_run, f"midrun:{label}")

    # --- driving a run to its end ---------------------------------------------------------------

    async def drive(self, label: str, run_id: str) -> None:
        """Drive ``run_id`` until it is idle: resume, answer, recover, repeat (bounded)."""
        token = current_branch.set(label)
        self.active_run = run_id
        try:
            await self._drive(label, run_id)
        finally:
            current_branch.reset(token)

    async def _drive(self, label: str, run_id: str) -> None:
        rest = 0
        idle = 0  # resumes in a row that applied none of the stored answers
        batch: list[str] = []
        for _ in range(MAX_ACTIONS):
            await self.absorb_crashes()
            run, requests = await self.observe(run_id)
            if run is None:
                await self.attempt("start", self._start)
                continue
            doubts = {
                lo: r for r, lo in requests if r.status == "pending" and lo.startswith(IN_DOUBT)
            }
            pending = {
                lo: r for r, lo in requests if r.status == "pending" and not lo.startswith(IN_DOUBT)
            }
            answered = [r for r, _ in requests if r.status == "answered"]
            if run.status == IDLE:
                if pending or answered:
                    self.violate(
                        "liveness", f"{label} is idle with requests still open: {sorted(pending)}"
                    )
                return
            if run.status in (WorkflowRunState.CANCELLED, WorkflowRunState.FAILED):
                self.violate("liveness", f"{label} ended {run.status.value}: {run.error}")
                return
            if self.early:  # another answer arrives before the run is recovered
                self.early -= 1
                if pending:
                    self.early_count += 1
                    await self._answer_with_helper(run_id, f"early:{self.early_count}")
                    continue
            if run.status == PAUSED and doubts:  # the operator settles in-doubt steps first
                logical = min(doubts)
                request = doubts[logical]
                answer = self._resolve(run_id, request)
                await self.attempt(
                    f"resolve {logical}",
                    lambda w, r=request, lo=logical, a=answer: self._respond(
                        w, r.request_id, lo, a
                    ),
                )
                continue
            batch = [logical for logical in batch if logical in pending]
            if run.status == PAUSED and not batch and not answered:
                if not pending:
                    self.violate("liveness", f"{label} is paused but nothing is pending")
                    return
                rest += 1
                batch = self._choose(label, rest, sorted(pending))
                self.log.append(f"{label} rest {rest}: answering {batch}")
            if run.status == PAUSED and batch:
                logical = batch[0]
                request = pending[logical]
                codec = self.helper.runtime.workflow(self.spec.name).codec
                answer = answer_for(codec.decode(request.data))
                ok, _ = await self.attempt(
                    f"answer {logical}",
                    lambda w, r=request, lo=logical, a=answer: self._respond(
                        w, r.request_id, lo, a
                    ),
                )
                if ok:
                    batch.pop(0)
                continue
            ok, _ = await self.attempt(f"resume {label}", lambda w: self._resume(w, run_id))
            if ok and answered:
                after, _ = await self.observe(run_id)
                if after.latest_checkpoint_id != run.latest_checkpoint_id:
                    idle = 0
                    continue
                idle += 1
                if idle >= 3:
                    ids = sorted(self.seen.get(r.request_id, r.request_id) for r in answered)
                    raise SimFailure(
                        f"{label}: resuming applies none of the stored answers {ids} "
                        f"({after.status.value}, checkpoint unchanged)"
                    )
        raise SimFailure(f"{label} did not finish within {MAX_ACTIONS} actions")

    def _resolve(self, run_id: str, request: StoredRequest) -> Any:
        """The operator's truthful answer to an in-doubt question (checked for sense first)."""
        codec = self.helper.runtime.workflow(self.spec.name).codec
        question = codec.decode(request.data)
        assert isinstance(question, InDoubtEffect)
        branch = self.world.branch(run_id)
        answer = resolution_for(question, branch, self.world.ledger)
        found = effect_of(question, branch)
        assert found is not None
        identity = found[0]
        self.in_doubt.append(
            f"{branch}: {question.executor_id} {question.step}: "
            f"{'happened' if answer['happened'] else 'did not happen'}"
        )
        self.log.append(f"in doubt: {identity} -> happened={answer['happened']}")
        if not identity.startswith(f"{branch}|{question.executor_id}|"):
            self.violate(
                "in-doubt", f"{branch}: a question of {question.executor_id} about {identity}"
            )
        for e in self.world.ledger.executions.get(identity, []):
            if e.idempotent:
                self.violate("in-doubt", f"asked whether idempotent {identity} happened")
            if e.settled:
                self.violate(
                    "in-doubt",
                    f"asked whether {identity} happened, but {e.process} journaled its result",
                )
            if e.step is not None and e.step != question.step_key:
                self.violate(
                    "in-doubt",
                    f"asked about step {question.step_key}, but {identity} ran as {e.step}",
                )
        return answer

    def _choose(self, label: str, rest: int, pending: list[str]) -> list[str]:
        """Which requests the user answers at this rest, in which order (from the seed)."""
        if self.scenario.batching == "one":
            return pending[:1]
        if self.scenario.batching == "all":  # depends on nothing but what is pending
            return list(pending)
        rng = random.Random(f"{self.scenario.seed}:{label}:rest:{rest}")
        order = list(pending)
        rng.shuffle(order)
        mode = rng.choices(["all", "one", "some"], [3, 2, 2])[0]
        if mode == "one":
            return order[:1]
        if mode == "some":
            return order[: rng.randint(1, len(order))]
        return order

    # --- forks and cancels ----------------------------------------------------------------------

    async def _superstep_at(self, run_id: str, fraction: float, paused_only: bool) -> int | None:
        history = await self.helper.runtime.history(run_id)
        first: dict[int, WorkflowRunState] = {}
        for info in history:
            first.setdefault(info.superstep, info.status)
        steps = sorted(s for s, status in first.items() if not paused_only or status == PAUSED)
        return steps[int(fraction * len(steps))] if steps else None

    async def fork(self, run_id: str, superstep: int, label: str) -> str:
        for _ in range(MAX_ACTIONS):
            await self.absorb_crashes()
            orphan = [
                r.run_id
                for r in await self.helper.runtime.list_runs()
                if r.parent_run_id == run_id and r.run_id not in self.world.branches
            ]
            if orphan:  # a crashed fork call admitted it: adopt it
                fork_id = orphan[0]
                break
            ok, fork_id = await self.attempt(
                f"fork {label}", lambda w: w.runtime.fork(run_id, superstep)
            )
            if ok:
                break
        else:
            raise SimFailure(f"could not fork {run_id} at superstep {superstep}")
        self.world.branches[fork_id] = label
        self.log.append(f"forked {label} at superstep {superstep}")
        return fork_id

    async def cancel(self, run_id: str, label: str) -> None:
        for _ in range(MAX_ACTIONS):
            await self.absorb_crashes()
            run, _ = await self.observe(run_id)
            if run.status == WorkflowRunState.CANCELLED:
                break
            ok, info = await self.attempt(f"cancel {label}", lambda w: w.runtime.cancel(run_id))
            if ok and info.status != WorkflowRunState.CANCELLED:
                # another worker holds the run: the cancel is stored, for it to honour at its
                # next superstep boundary -- or for us once its lease has expired
                self.log.append(f"cancel {label}: stored while the run is held")
                await anyio.sleep(LEASE + 1)
        else:
            raise SimFailure(f"could not cancel {label}")
        await self._check_cancelled(run_id, label)

    async def _check_cancelled(self, run_id: str, label: str) -> None:
        runtime = self.helper.runtime
        info = await runtime.get_run(run_id)
        if info.pending_requests:
            self.violate("cancel", f"cancelled {label} still has pending requests")
        for r in await runtime.store.list_requests(run_id, status=None):
            if r.status not in ("cancelled", "applied"):
                self.violate("cancel", f"cancelled {label}: request {r.request_id} is {r.status}")
            if r.status == "cancelled":
                data = runtime.workflow(self.spec.name).codec.decode(r.data)
                answer = (
                    {"happened": False} if isinstance(data, InDoubtEffect) else answer_for(data)
                )
                try:
                    await runtime.respond(r.request_id, answer)
                    self.violate("cancel", f"cancelled {label} accepted an answer")
                except RequestCancelledError:
                    pass
        token = current_process.set(self.helper.proc)
        try:
            await runtime.resume(run_id)
            self.violate("cancel", f"cancelled {label} could be resumed")
        except RunNotResumableError:
            pass
        finally:
            current_process.reset(token)

    # --- the whole play -------------------------------------------------------------------------

    async def play(self) -> None:
        self.world.branches[RUN_ID] = "main"
        await self.drive("main", RUN_ID)
        if self.scenario.fork_at is not None:
            step = await self._superstep_at(RUN_ID, self.scenario.fork_at, False)
            if step is not None:
                fork_id = await self.fork(RUN_ID, step, "fork")
                await self.drive("fork", fork_id)
        if self.scenario.cancel_at is not None:
            step = await self._superstep_at(RUN_ID, self.scenario.cancel_at, True)
            if step is not None:
                fork_id = await self.fork(RUN_ID, step, "cancelled")
                await self.cancel(fork_id, "cancelled")

    # --- what the store holds at the end --------------------------------------------------------

    async def collect(self, outcome: Outcome) -> None:
        runtime = self.helper.runtime
        store = runtime.store
        wf = runtime.workflow(self.spec.name)
        runs = list(await store.list_runs())
        identities: dict[str, str] = {}  # request id -> logical identity, over every run
        stored: dict[str, list[Any]] = {}
        for run in runs:
            stored[run.run_id] = list(await store.list_requests(run.run_id, status=None))
            for r in stored[run.run_id]:
                identities[r.request_id] = request_identity(r.port_id, wf.codec.decode(r.data))
                if not REQUEST_ID.fullmatch(r.request_id):
                    self.violate("request-ids", f"request id {r.request_id!r} is not 32 hex")
        for run in runs:
            label = self.world.branches.get(run.run_id, f"orphan:{run.run_id[:8]}")
            info = await runtime.get_run(run.run_id)
            history = await store.history(run.run_id)
            checkpoints = [await store.load(h.checkpoint_id) for h in history]
            requests = {}
            statuses = {}
            for r in stored[run.run_id]:
                requests[r.request_id] = identities[r.request_id]
                statuses[r.request_id] = r.status
            self._check_history(label, run, history, checkpoints, wf)
            self._check_answers(label, requests)
            outcome.branches[label] = BranchOutcome(
                label=label,
                run_id=run.run_id,
                status=info.status.value,
                outputs=[canonical(o) for o in info.outputs],
                requests=requests,
                request_status=statuses,
                schedule=_schedule(checkpoints, identities, "answered_requests"),
                supersteps=[(h.superstep, h.status.value) for h in history],
                created=_schedule(checkpoints, identities, "pending_requests"),
            )
        for request_id, (logical, answer) in sorted(self.answers.items()):
            try:
                stored = await store.get_request(request_id)
            except UnknownRequestError:
                self.violate("answers", f"answered request {request_id} ({logical}) vanished")
                continue
            if stored.answer is None or not agrees(
                answer, jsonable(wf.codec.decode(stored.answer))
            ):
                self.violate(
                    "answers",
                    f"answer to {request_id} ({logical}) lost: the store has "
                    f"{stored.status} {stored.answer}",
                )
        self._check_compaction(runs)
        if self.db is not None:
            self._check_sqlite()

    def _journal_left(self) -> list[tuple[str, int, str]]:
        """(run id, superstep, key) of every journal entry the store still keeps."""
        if self.memory is not None:
            journals = self.memory._journal  # run id -> key -> (superstep, entry)
            return [
                (run, step, key)
                for run, entries in journals.items()
                for key, (step, _) in entries.items()
            ]
        assert self.db is not None
        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            return list(conn.execute("SELECT run_id, superstep, key FROM journal"))

    def _check_compaction(self, runs: list[Any]) -> None:
        """A superstep's journal entries go when it commits; a finished run keeps none."""
        by_run = {run.run_id: run for run in runs}
        for run_id, superstep, key in sorted(self._journal_left()):
            run = by_run.get(run_id)
            label = self.world.branches.get(run_id, run_id[:8])
            if run is None:
                self.violate("journal", f"a journal entry {key} of a run that is gone")
            elif superstep <= run.superstep or run.status == IDLE:
                self.violate(
                    "journal",
                    f"{label} ({run.status.value} at superstep {run.superstep}) still keeps "
                    f"the journal entry {key} of superstep {superstep}",
                )

    def _check_history(self, label: str, run: Any, history: Any, checkpoints: Any, wf: Any) -> None:
        problems = []
        seqs = [h.seq for h in history]
        if not seqs:
            problems.append("no checkpoints")
        elif seqs != list(range(seqs[0], seqs[0] + len(seqs))):
            problems.append(f"checkpoint seqs {seqs}")
        steps = [h.superstep for h in history]
        if steps != sorted(steps):
            problems.append(f"supersteps go back: {steps}")
        for previous, cp in itertools.pairwise(checkpoints):
            if cp.parent_id != previous.checkpoint_id:
                problems.append(
                    f"checkpoint {cp.checkpoint_id[:8]} (superstep {cp.superstep}) has parent "
                    f"{str(cp.parent_id)[:8]}, not the previous {previous.checkpoint_id[:8]}"
                )
        if checkpoints:
            latest = checkpoints[-1]
            if run.latest_checkpoint_id != latest.checkpoint_id:
                problems.append("the run row does not point at the last checkpoint")
            if run.superstep != latest.superstep:
                problems.append(f"run row superstep {run.superstep} != {latest.superstep}")
        for cp in checkpoints:
            try:
                wf.restore(cp)
            except Exception as exc:
                problems.append(f"checkpoint {cp.checkpoint_id[:8]} does not restore: {exc}")
        for problem in problems:
            self.violate("history", f"{label}: {problem}")

    def _check_answers(self, label: str, requests: dict[str, str]) -> None:
        for request_id, (logical, _) in self.answers.items():
            if request_id in requests and requests[request_id] != logical:
                self.violate(
                    "answers",
                    f"{label}: request {request_id} was answered as {logical} but the store "
                    f"now holds {requests[request_id]} under that id",
                )

    def _check_sqlite(self) -> None:
        assert self.db is not None
        with contextlib.closing(sqlite3.connect(self.db)) as conn:
            verdict = conn.execute("PRAGMA integrity_check").fetchall()
            if verdict != [("ok",)]:
                self.violate("integrity", f"SQLite integrity_check: {verdict}")
            broken = conn.execute("PRAGMA foreign_key_check").fetchall()
            if broken:
                self.violate("integrity", f"SQLite foreign_key_check: {broken}")
            miscounted = _chunk_counts_wrong(conn)
            if miscounted:
                self.violate("chunks", f"chunks counted wrong (key, counted, used): {miscounted}")


REQUEST_ID = re.compile(r"[0-9a-f]{32}")


def _chunk_counts_wrong(conn: sqlite3.Connection) -> list[tuple[str, int, int]]:
    """Chunks whose ``refs`` is not the rows naming them (once each) and the index chunks
    listing them (once each): a count off means a chunk deleted while used, or kept forever."""
    used: collections.Counter[str] = collections.Counter()
    for (chunked,) in conn.execute("SELECT chunks FROM checkpoints WHERE chunks IS NOT NULL"):
        used.update(
            {key for text in json.loads(chunked).values() for _, keys, _ in text for key in keys}
        )
    counted = {}
    for key, items, refs in conn.execute("SELECT digest, items, refs FROM list_chunks"):
        counted[key] = refs
        if key.startswith("i"):
            used.update(set(json.loads(items)))
    keys = set(counted) | set(used)
    return sorted((k, counted.get(k, 0), used[k]) for k in keys if counted.get(k, 0) != used[k])


def _schedule(
    checkpoints: list[Any], identities: dict[str, str], field_name: str
) -> list[tuple[int, tuple[str, ...]]]:
    """(superstep, logical identities) of the requests that first appear in each checkpoint's
    ``field_name``. Answered: the answers applied there, sorted, at the superstep the run had
    reached when they were applied (the checkpoint before: a resume's first superstep commit
    applies them). Pending: the requests made there, in the order they were made, at the
    superstep each was made in (an answer routed into another port makes one before the
    superstep that commits it). Ids are compared by what they name, never across runs;
    in-doubt questions are left out (only a run that crashed has them)."""
    out: list[tuple[int, tuple[str, ...]]] = []
    seen: set[str] = set()
    answers = field_name == "answered_requests"
    reached = checkpoints[0].superstep if checkpoints else 0
    for cp in checkpoints:
        ids = cp.answered_ids() if answers else list(cp.pending_requests)
        fresh = [rid for rid in ids if rid not in seen]
        seen.update(ids)
        fresh = [rid for rid in fresh if not identities.get(rid, rid).startswith(IN_DOUBT)]
        if answers and fresh:
            out.append((reached, tuple(sorted(identities.get(rid, rid) for rid in fresh))))
        groups: list[tuple[int, tuple[str, ...]]] = []  # this checkpoint's, by superstep made
        for rid in [] if answers else fresh:
            made = cp.pending_requests[rid].superstep
            if not groups or groups[-1][0] != made:
                groups.append((made, ()))
            groups[-1] = (made, (*groups[-1][1], identities.get(rid, rid)))
        out.extend(groups)
        reached = cp.superstep
    return out


async def play(
    scenario: Scenario,
    plan: FaultPlan,
    world: World,
    workdir: Path | None,
    memory_store: Callable[..., Any] = InMemoryRunStore,
) -> Outcome:
    """Play ``scenario`` under ``plan`` in ``world``; never raises for a broken invariant.
    ``memory_store``: the in-memory store class (the simulator's own tests pass broken ones)."""
    driver = Driver(scenario, plan, world, workdir, memory_store)
    outcome = Outcome(scenario, plan, world.ledger)
    try:
        try:
            async with anyio.create_task_group() as tg:
                driver.tg = tg
                await driver.play()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:
            leaves = _leaves(exc)
            if all(isinstance(e, SimFailure) for e in leaves):  # the run did not finish
                for e in leaves:
                    driver.violate("liveness", f"liveness: {e}")
            else:
                text = "; ".join(f"{type(e).__name__}: {e}" for e in leaves)
                driver.violate("simulator", f"the simulation itself failed: {text}")
        try:
            await driver.collect(outcome)
        except Exception as exc:
            driver.violate("integrity", f"reading the store at the end failed: {exc!r}")
    finally:
        await driver.close()
    outcome.violations = driver.violations
    outcome.log = driver.log
    outcome.crashes = list(world.crashes)
    outcome.trace = list(world.trace)
    outcome.stalled = list(world.stalled)
    outcome.user_labels = list(world.user_labels)
    outcome.in_doubt = list(driver.in_doubt)
    outcome.points = world.points
    outcome.user_points = world.user_points
    outcome.resumes = driver.resumes
    return outcome
