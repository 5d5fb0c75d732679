"""Fault injection: a store proxy with crash points around every call, and the seed's fault plan.

:class:`CrashingStore` stands between a ``Runtime`` and its store. Every call of the store
contract (``acquire_latest``, ``commit``, ``renew``, ``request_cancel``, ``journal_intent``,
``journal_put``, ``journal_clear``, ``answer``...: :data:`STORE_CALLS`) is two crash points of
the process that owns the proxy: before the call reaches the store and after it returned, so a
crash lands between any two store operations, and an operation is either fully done or not at
all (a crash *inside* a SQLite transaction is the real-SIGKILL sweep's job). The lease keeper
the engine runs beside every execution renews through the proxy too, so a process can die in
the background, between two renewals. Calls of all processes are serialized (one at a time, in
the order the event loop asks), which keeps SQLite's worker threads from reordering them: the
interleaving is a function of the seed. A frozen process (see ``SimProcess.thaw``) makes no
store call until it thaws. The proxy also tells the world which process the store last leased
each run to, so the ledger can tell an effect started by a worker that had lost its lease.

A :class:`FaultPlan` is drawn from the seed and the uninterrupted run's number of points: which
points crash, what the world does before the process restarts (wait out the lease, retry at once
and get ``RunBusyError``, or answer a request first), which resumes race a second worker, where a
worker stalls -- its handler alone, while its lease keeper keeps renewing, or the whole process
frozen, so its lease expires -- while another worker tries to take the run over, and where an
answer arrives in the middle of a superstep.
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from typing import Any

import anyio

from tests.sim.world import SimProcess, World
from workflow_engine import Lease

RECOVERIES = ("wait", "busy", "early")

STORE_CALLS = frozenset(
    {
        # RunStore
        "admit",
        "acquire",
        "admit_and_acquire",
        "admit_and_commit",
        "acquire_latest",
        "release",
        "renew",
        "request_cancel",
        "commit",
        "commit_and_release",
        "set_status",
        "get_run",
        "get_run_and_latest",
        "list_runs",
        "run_ids",
        "latest",
        "load",
        "history",
        "get_request",
        "get_request_and_run",
        "list_requests",
        "request_ids",
        "answer",
        "answer_all",
        "cancel_requests",
        "answer_and_acquire",
        "prune",
        "close",
        # JournalStore
        "journal_get",
        "journal_intent",
        "journal_put",
        "journal_clear",
    }
)
"""The store contract the engine calls: every one is a pair of crash points (the simulator's
self-test checks that this covers every async method of ``RunStore``)."""

_ACQUIRING = frozenset(
    {"acquire", "admit_and_acquire", "admit_and_commit", "acquire_latest", "answer_and_acquire"}
)


class CrashingStore:
    """Wraps a RunStore (and JournalStore): every call of the contract is a pair of crash points.

    The contract's methods are defined on the class (see :func:`_crash_points`), so protocol
    checks (``isinstance(store, JournalStore)``) see them whatever Python's rules for dynamic
    attributes; any other async method a store has is proxied the same way on demand."""

    def __init__(self, real: Any, proc: SimProcess) -> None:
        self._real = real
        self._proc = proc
        self._calls: dict[str, Any] = {}

    @property
    def real(self) -> Any:
        return self._real

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name.startswith("_") or not inspect.iscoroutinefunction(attr):
            return attr
        return self._proxied(name)

    def _proxied(self, name: str) -> Any:
        call = self._calls.get(name)
        if call is None:
            call = self._calls[name] = self._proxy(name, getattr(self._real, name))
        return call

    def _proxy(self, name: str, attr: Any) -> Any:
        proc = self._proc
        world = proc.world

        async def call(*args: Any, **kwargs: Any) -> Any:
            await proc.thaw()
            proc.point(f"{name}:before")
            async with world.store_lock:
                proc.check_alive(name)  # it may have died while it waited
                world.clock.io_in_flight += 1
                try:
                    # a store call takes time, during which the other simulated processes go
                    # on (a store may finish a short call without suspending its caller: the
                    # SQLite store commits on the event loop's thread)
                    await anyio.lowlevel.checkpoint()
                    result = await attr(*args, **kwargs)
                finally:
                    world.clock.io_in_flight -= 1
                if name == "journal_put":
                    world.ledger.settle((args, kwargs), proc.name)
                _note_lease(world, proc, name, args, result, kwargs)
            await proc.thaw()
            proc.point(f"{name}:after")
            return result

        return call


def _crash_points(name: str) -> Any:
    async def method(self: CrashingStore, *args: Any, **kwargs: Any) -> Any:
        return await self._proxied(name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


for _name in sorted(STORE_CALLS):
    setattr(CrashingStore, _name, _crash_points(_name))


def _note_lease(
    world: World, proc: SimProcess, name: str, args: Any, result: Any, kwargs: dict[str, Any]
) -> None:
    """Keep ``world.lease_holders`` as the store sees it: who was last granted each run."""
    if name == "admit_and_commit" and kwargs.get("release") and not result.cancel_requested:
        world.leased(result.run_id, proc)  # admitted, committed and released at once
        world.leased(result.run_id, None)
    elif name in _ACQUIRING:
        found = result if isinstance(result, Lease) else None
        if isinstance(result, tuple) and name == "answer_and_acquire":
            result = result[1]  # (outcome, None) while another worker holds the run
        if isinstance(result, tuple):
            found = next((r for r in result if isinstance(r, Lease)), None)
        if found is not None:
            world.leased(found.run_id, proc)
    elif (
        name in ("release", "commit_and_release")
        and args
        and isinstance(args[0], Lease)
        and world.lease_holders.get(args[0].run_id) == proc.name
    ):
        world.leased(args[0].run_id, None)


@dataclass(frozen=True)
class FaultPlan:
    """What goes wrong in one seed's run (``describe()`` prints it in every failure)."""

    store: str = "memory"  # or "sqlite"
    snapshot_every: int = 64
    span_every: int = 16  # sqlite: a span every this many deltas after a snapshot (0: none)
    crashes: tuple[int, ...] = ()  # global point ordinals at which the executing process dies
    recovery: tuple[str, ...] = ()  # per crash: wait | busy | early
    races: tuple[int, ...] = ()  # resume ordinals executed by two workers at once
    stall: int | None = None  # user-point ordinal where a worker stalls past its lease
    stall_answer: bool = False  # ... and an answer arrives before the other worker takes over
    freeze: bool = False  # ... the whole process stops (its lease expires), not just a handler
    midrun_answer: int | None = None  # user-point ordinal where an answer arrives

    @property
    def reordered(self) -> bool:
        """Answers may arrive at other supersteps than in the uninterrupted run."""
        return "early" in self.recovery or self.stall_answer or self.midrun_answer is not None

    @property
    def is_clean(self) -> bool:
        return self == FaultPlan(
            store=self.store, snapshot_every=self.snapshot_every, span_every=self.span_every
        )

    def describe(self) -> str:
        parts = [
            self.store
            + (
                f"(snapshot_every={self.snapshot_every}, span_every={self.span_every})"
                if self.store == "sqlite"
                else ""
            )
        ]
        if self.crashes:
            parts.append(
                "crash at "
                + ", ".join(
                    f"#{c} then {r}" for c, r in zip(self.crashes, self.recovery, strict=True)
                )
            )
        if self.races:
            parts.append(f"racing resumes {list(self.races)}")
        if self.stall is not None:
            parts.append(
                f"{'freeze' if self.freeze else 'stall'} past the lease at user point "
                f"{self.stall}" + (" with an answer arriving" if self.stall_answer else "")
            )
        if self.midrun_answer is not None:
            parts.append(f"answer mid-superstep at user point {self.midrun_answer}")
        return "; ".join(parts)


@dataclass(frozen=True)
class ReferenceStats:
    """What the uninterrupted run did, which bounds where faults can land."""

    points: int
    user_points: int
    resumes: int
    forked: bool


def draw_plan(seed: int, stats: ReferenceStats, *, sqlite_share: float = 0.12) -> FaultPlan:
    """The fault plan of ``seed``. Plans of seeds with forks keep answer timing unchanged (a
    fork is compared with the uninterrupted run's fork at the same superstep)."""
    rng = random.Random(f"faults:{seed}")
    store = "sqlite" if rng.random() < sqlite_share else "memory"
    snapshot_every = rng.choice([2, 3, 64])
    span = max(1, int(stats.points * 1.15))
    count = rng.choices([0, 1, 2, 3], [1, 5, 3, 2])[0]
    crashes = tuple(sorted(rng.sample(range(1, span + 1), min(count, span))))
    choices = ("wait", "busy") if stats.forked else RECOVERIES
    recovery = tuple(rng.choice(choices) for _ in crashes)
    races: tuple[int, ...] = ()
    if stats.resumes and rng.random() < 0.25:
        races = (rng.randint(1, stats.resumes),)
    stall = None
    stall_answer = False
    freeze = False
    if stats.user_points and rng.random() < 0.2:
        stall = rng.randint(1, stats.user_points)
        stall_answer = not stats.forked and rng.random() < 0.5
        freeze = rng.random() < 0.5
    midrun = None
    if not stats.forked and stats.user_points and rng.random() < 0.15:
        midrun = rng.randint(1, stats.user_points)
        if midrun == stall:
            midrun = None
    # drawn apart, so that adding it changed no other seed's plan
    span_every = random.Random(f"spans:{seed}").choice([0, 1, 2, 5, 32])
    return FaultPlan(
        store,
        snapshot_every,
        span_every,
        crashes,
        recovery,
        races,
        stall,
        stall_answer,
        freeze,
        midrun,
    )


def single_crash_plan(point: int, recovery: str = "wait", store: str = "memory") -> FaultPlan:
    """The exhaustive sweep's plan: one crash at ``point``."""
    return FaultPlan(store=store, crashes=(point,), recovery=(recovery,))
