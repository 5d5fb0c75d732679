"""Virtual time: an asyncio event loop whose clock jumps instead of waiting.

When every task is blocked and the next thing that can happen is a timer, the loop moves its
clock to that timer at once (FoundationDB's simulator does the same). ``anyio.sleep(30)`` then
costs nothing, a lease of 30 s expires in microseconds of real time, and a background task that
renews a lease every few seconds runs exactly when it would have -- in the simulator's time.

Real I/O still happens (SQLite runs on the store's worker thread): while a store call is in
flight (``VirtualClock.io_in_flight`` > 0) the loop waits for it in real time and the virtual
clock stands still, so a slow disk never makes a lease expire.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")

EPOCH = 1_750_000_000.0
"""Where virtual wall-clock time starts (stores keep ``created_at`` etc. in these seconds)."""

REAL_WAIT_LIMIT = 30.0
"""Longest real wait for a store call in flight; longer means the simulation is stuck."""


class SimulationDeadlock(RuntimeError):
    """Every task waits, no timer is due and no I/O is in flight: nothing can ever happen."""


class VirtualClock:
    """The simulated wall clock: ``now()`` for stores, advanced only by the event loop."""

    def __init__(self, *, real_io: bool = True) -> None:
        self.elapsed = 0.0
        self.io_in_flight = 0
        self.real_io = real_io
        """False: nothing in this loop talks to threads or sockets, so a poll can be skipped."""

    def now(self) -> float:
        return EPOCH + self.elapsed


class _JumpingSelector:
    """Wraps the loop's selector: polls for real events, and when there are none and the loop
    would sleep until a timer, advances the virtual clock by that timeout instead."""

    def __init__(self, real: selectors.BaseSelector, clock: VirtualClock) -> None:
        self._real = real
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[Any]:
        if timeout is not None and timeout <= 0:
            return self._real.select(0) if self._clock.real_io else []
        if self._clock.io_in_flight:
            wait = REAL_WAIT_LIMIT if timeout is None else min(timeout, REAL_WAIT_LIMIT)
            return self._real.select(wait)  # the clock stands still while I/O runs
        events = self._real.select(0)
        if events:
            return events
        if timeout is None:
            # a thread may still be about to call back (e.g. a store closing): wait a little
            events = self._real.select(1.0)
            if events:
                return events
            raise SimulationDeadlock("every task waits and nothing is scheduled")
        self._clock.elapsed += timeout
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on virtual time (see the module docstring)."""

    def __init__(self, clock: VirtualClock | None = None) -> None:
        self.clock = clock or VirtualClock()
        super().__init__(selectors.DefaultSelector())
        self._selector = _JumpingSelector(self._selector, self.clock)  # type: ignore[has-type]

    def time(self) -> float:
        return self.clock.elapsed


def run_virtual(func: Callable[[VirtualClock], Awaitable[T]], *, real_io: bool = True) -> T:
    """Run ``func(clock)`` to completion on a fresh virtual-time loop (``real_io=False``: no
    thread or socket will ever wake the loop, so it need not poll while tasks are ready)."""
    clock = VirtualClock(real_io=real_io)

    async def main() -> T:
        return await func(clock)

    return anyio.run(
        main, backend="asyncio", backend_options={"loop_factory": lambda: VirtualTimeLoop(clock)}
    )
