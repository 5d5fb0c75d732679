"""The simulated world around the engine: processes that can die, time, and the outside ledger.

* :class:`SimProcess` -- one simulated OS process (a ``Runtime`` with its own store connection
  and its own copy of the workflow). ``point(label)`` marks a place where the process may be
  killed: the world counts every point of every process, and the fault plan names the ordinals
  at which the process dies. A dead process raises :class:`SimulatedCrash` at every later point,
  so nothing it does after its death reaches the store or the ledger -- like ``kill -9``.
* :class:`Ledger` -- the outside services the workflow's side effects hit. It counts executions
  by *logical* identity (what the effect is, derived by the test from the workflow's inputs,
  never from engine keys), records whether each one was declared idempotent, whether its
  result became durable in the store by the process that ran it, whether that process died or
  gave the run up (a *torn* execution of an idempotent step may legitimately run again), and
  whether the process still held the run's lease when the step started. It is also what a
  person consults to answer an in-doubt question truthfully (:meth:`Ledger.happened`).
* :class:`World` -- the shared clock, the ledger, the run-id → branch labels, the crash plan,
  who holds each run's lease (as the store granted it), and the hooks that fire at chosen user
  points (a stall or a freeze past the lease, an answer mid-superstep).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import re
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from tests.sim.vtime import VirtualClock

RECEIPT = re.compile(r"rcpt-[0-9a-f]{12}")

current_branch: ContextVar[str] = ContextVar("current_branch", default="?")
"""The branch (``main``, ``fork``...) the driver is executing; read by the scripted model,
which cannot see the run id."""

current_process: ContextVar[SimProcess] = ContextVar("current_process")
"""The simulated process whose ``Runtime`` call is running (tasks the engine starts inherit it)."""


def here() -> SimProcess:
    """The simulated process executing the calling workflow code."""
    return current_process.get()


@contextlib.contextmanager
def seeded_uuids(seed: int) -> Iterator[None]:
    """Make ``uuid.uuid4()`` a function of the seed while the simulation runs.

    The engine draws fork run ids (which name the fork's requests, and so order them) and lease
    owners from ``uuid4``. Each calling function gets its own stream, so the uninterrupted and
    the faulty run draw the same fork id even if one of them took more leases.
    """
    streams: dict[str, random.Random] = {}
    real = uuid.uuid4

    def uuid4() -> uuid.UUID:
        caller = sys._getframe(1).f_code.co_name
        rng = streams.setdefault(caller, random.Random(f"uuid:{seed}:{caller}"))
        return uuid.UUID(int=rng.getrandbits(128), version=4)

    uuid.uuid4 = uuid4
    try:
        yield
    finally:
        uuid.uuid4 = real


class SimulatedCrash(BaseException):
    """The process died here (kill -9). A ``BaseException``: no ``except Exception`` stops it."""


def digest(value: Any, size: int = 10) -> str:
    """A short stable digest of a JSON-able value (pydantic models included)."""
    text = json.dumps(jsonable(value), sort_keys=True, separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()[:size]


def jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def receipt_of(identity: str) -> str:
    return "rcpt-" + hashlib.sha1(identity.encode()).hexdigest()[:12]


@dataclass
class Execution:
    """One time an effect ran in the outside world."""

    process: str  # the name of the process that ran it
    engine_key: str | None
    idempotent: bool = False  # the step was declared idempotent (retried, never asked about)
    step: str | None = None  # the engine's step key it ran under (when the code can see it)
    settled: bool = False  # its own process got its result into the store
    crashed: bool = False  # its process died (set when the process is declared dead)
    abandoned: bool = False  # its process gave the run up (lost its lease, failed) unsettled
    overlapped: bool = False  # ran while a worker stalled past its lease, or by that worker
    stale: bool = False  # its step started in a process that no longer held the run's lease

    @property
    def torn(self) -> bool:
        """Cut off before its result was durable: its process died or gave the run up."""
        return (self.crashed or self.abandoned) and not self.settled


@dataclass
class Ledger:
    """Executions of logical side effects, as the outside world saw them."""

    executions: dict[str, list[Execution]] = field(default_factory=dict)
    by_receipt: dict[str, str] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)

    def perform(
        self,
        proc: SimProcess,
        identity: str,
        engine_key: str | None = None,
        *,
        idempotent: bool,
        step: str | None = None,
        stale: bool = False,
    ) -> str:
        """The effect happens (once more); returns its receipt, which names it. ``stale``: the
        step started while ``proc`` did not hold the run's lease (see :meth:`World.holds`)."""
        receipt = receipt_of(identity)
        self.by_receipt[receipt] = identity
        overlapped = proc.world.stalls_active > 0 or proc.after_stall
        execution = Execution(
            proc.name, engine_key, idempotent, step, overlapped=overlapped, stale=stale
        )
        self.executions.setdefault(identity, []).append(execution)
        return receipt

    def happened(self, identity: str) -> bool:
        """What the outside world says when a person asks whether an effect happened."""
        return bool(self.executions.get(identity))

    def settle(self, args: Any, process: str) -> None:
        """Receipts that ``process`` got into a journal entry: its own current executions of
        those effects are durable. A receipt stored otherwise settles nothing: another
        process's journal entry, a person's answer to an in-doubt question, or an answer whose
        message carries the receipt in its lineage; nor does a later execution's entry settle
        one its process already gave up."""
        for receipt in set(_receipts(args)):
            identity = self.by_receipt.get(receipt)
            if identity is None:
                continue
            for execution in self.executions[identity]:
                if execution.process == process and not (execution.crashed or execution.abandoned):
                    execution.settled = True

    def process_died(self, process: str) -> None:
        for runs in self.executions.values():
            for execution in runs:
                if execution.process == process:
                    execution.crashed = True

    def process_gave_up(self, process: str) -> None:
        """``process``'s call on the run failed (it lost its lease, or the engine failed): what
        it ran and did not get into the store is cut off, as if it had died."""
        for runs in self.executions.values():
            for execution in runs:
                if execution.process == process and not execution.settled:
                    execution.abandoned = True

    def mismatch(self, text: str) -> None:
        self.mismatches.append(text)

    def counts(self) -> dict[str, int]:
        return {identity: len(runs) for identity, runs in sorted(self.executions.items())}


def _receipts(value: Any) -> list[str]:
    """Every receipt mentioned anywhere in ``value`` (args of a store call).

    Checkpoints are not searched (walking them is most of the cost): a superstep that
    committed is never executed again anyway, and a journal entry reaches the store before the
    superstep commits."""
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "rcpt-" in item:
                found.extend(RECEIPT.findall(item))
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend(item)
        elif isinstance(item, BaseModel) and not hasattr(item, "executor_states"):
            stack.extend(item.__dict__.values())
    return found


Hook = Callable[["SimProcess", str], Awaitable[None]]


class World:
    """Everything outside the engine, shared by every simulated process of one seed."""

    def __init__(self, clock: VirtualClock, crash_at: frozenset[int] = frozenset()) -> None:
        self.clock = clock
        self.ledger = Ledger()
        self.crash_at = crash_at
        self.points = 0  # every point of every counted process
        self.user_points = 0  # points inside workflow code only
        self.user_labels: list[str] = []
        self.crashes: list[str] = []
        self.trace: list[str] = []  # "<ordinal>:<process>:<label>" for every counted point
        self.hooks: dict[int, Hook] = {}  # user-point ordinal -> what happens there
        self.branches: dict[str, str] = {}  # run id -> branch label
        self.stalled: list[str] = []  # processes that stalled past their lease
        self.stalls_active = 0
        self.lease_holders: dict[str, str] = {}  # run id -> process it is leased to ("": none)
        self.grants: set[tuple[str, str]] = set()  # (run id, process) the store ever leased
        self.store_lock = asyncio.Lock()
        self.on_crash: Callable[[SimProcess, str], None] = lambda proc, label: None
        """Called as a process dies, before it raises (the SIGKILL sweep kills itself here)."""
        self._next_pid = 0

    def now(self) -> float:
        return self.clock.now()

    def branch(self, run_id: str) -> str:
        return self.branches.get(run_id, f"unknown:{run_id[:8]}")

    def run_of(self, branch: str) -> str | None:
        """The run id of a branch label (the scripted model and tools know only the label)."""
        return next((run for run, label in self.branches.items() if label == branch), None)

    def holds(self, proc: SimProcess, run_id: str | None) -> bool:
        """Whether the store's latest lease of ``run_id`` went to ``proc`` (a process that
        lost its lease to another one must start no side effect)."""
        return run_id is None or self.lease_holders.get(run_id, proc.name) == proc.name

    def leased(self, run_id: str, proc: SimProcess | None) -> None:
        """The store granted ``run_id``'s lease to ``proc`` (None: it was released)."""
        self.lease_holders[run_id] = proc.name if proc is not None else ""
        if proc is not None:
            self.grants.add((run_id, proc.name))

    def process(self, name: str | None = None, *, counted: bool = True) -> SimProcess:
        """A new process, named ``p<pid>`` unless ``name`` is given."""
        self._next_pid += 1
        return SimProcess(self, self._next_pid, name or f"p{self._next_pid}", counted)


class SimProcess:
    """One simulated process. ``counted=False``: a helper (e.g. a client answering requests)
    whose points neither count nor crash."""

    def __init__(self, world: World, pid: int, name: str, counted: bool) -> None:
        self.world = world
        self.pid = pid
        self.name = name
        self.counted = counted
        self.alive = True
        self.after_stall = False  # it stalled past its lease during the current call
        self.frozen_until = 0.0  # virtual time before which none of its tasks gets anywhere

    async def thaw(self) -> None:
        """Wait while the whole process is frozen (a stop-the-world pause): every task of the
        process -- the handler, the lease keeper -- stops at its next point or store call."""
        clock = self.world.clock
        while clock.elapsed < self.frozen_until:
            await asyncio.sleep(self.frozen_until - clock.elapsed)

    def point(self, label: str) -> None:
        """A place where this process may die (raises :class:`SimulatedCrash` if it does)."""
        if not self.alive:
            raise SimulatedCrash(f"{self.name} is dead ({label})")
        if not self.counted:
            return
        world = self.world
        world.points += 1
        world.trace.append(f"{world.points}:{self.name}:{label}")
        if world.points in world.crash_at:
            self.die(f"#{world.points} {label}")
            world.on_crash(self, label)
            raise SimulatedCrash(f"{self.name} killed at point #{world.points} ({label})")

    def check_alive(self, label: str) -> None:
        """Raise if the process died (not a point: it neither counts nor crashes)."""
        if not self.alive:
            raise SimulatedCrash(f"{self.name} is dead ({label})")

    async def user_point(self, label: str) -> None:
        """A point inside workflow code, where a planned stall or answer may happen."""
        await self.thaw()
        self.point(label)
        if not self.counted:
            return
        world = self.world
        world.user_points += 1
        world.user_labels.append(label)
        hook = world.hooks.pop(world.user_points, None)
        if hook is not None:
            await hook(self, label)
            if not self.alive:
                raise SimulatedCrash(f"{self.name} is dead ({label})")

    def die(self, where: str) -> None:
        if self.alive:
            self.alive = False
            self.world.crashes.append(f"{self.name} {where}")
            self.world.ledger.process_died(self.name)
