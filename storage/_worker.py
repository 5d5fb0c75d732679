"""A store's helper thread: runs what may block long (a busy lock, a WAL checkpoint, big reads)
off the event loop, one operation at a time, in submission order."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

Done = Callable[[Any, BaseException | None], None]
"""Called on the submitting event loop (``submit``) with the result or the error."""


Abandoned = Callable[[Any], None]
"""Called on the event loop with the result of an operation whose caller was cancelled after it
started: what it took (a lease) is then no one's but the store's to give back."""


def _settle(
    future: asyncio.Future[Any],
    result: Any,
    error: BaseException | None,
    abandoned: Abandoned | None = None,
) -> None:
    if future.done():  # the caller was cancelled; the operation ran anyway
        if abandoned is not None and error is None:
            abandoned(result)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Worker:
    """A dedicated thread that runs functions one at a time, in call order.

    ``pending`` counts what was submitted from the event loop and is not yet settled there:
    while it is not zero, the thread may be using the store's connection, so the store sends
    every operation here too (in order) instead of running it on the loop. A caller that is
    cancelled stops waiting, but an operation that started runs to its end (a transaction is
    never cut off).

    The thread starts with the first operation queued: a store whose operations all run on the
    event loop (the common case) never pays for starting it -- ``Thread.start`` waits until
    the new thread runs, which costs a scheduling round (ms on a busy machine) at every open.
    """

    def __init__(self, name: str) -> None:
        self._queue: SimpleQueue[Any] = SimpleQueue()
        self.pending = 0
        self._name = name
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def started(self) -> bool:
        """Whether the thread was started (something was queued before ``stop``)."""
        return self._thread is not None

    def _put(self, item: Any) -> None:
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        self._queue.put(item)

    def _serve(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is None:
                return
            fn, args, loop, done = item
            del item
            error: BaseException | None = None
            result = None
            try:
                result = fn(*args)
            except BaseException as exc:
                error = exc
            if loop is None:
                done(result, error)
            else:
                # RuntimeError: the event loop is closed, no one is waiting any more
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._settled, done, result, error)
            del fn, args, loop, done, result, error

    def _settled(self, done: Done, result: Any, error: BaseException | None) -> None:
        self.pending -= 1
        done(result, error)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn`` without waiting for it (not counted in ``pending``)."""
        self._put((fn, args, None, _ignore))

    def submit(
        self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], args: tuple, done: Done
    ) -> None:
        """From ``loop``'s thread: queue ``fn(*args)``; ``done`` runs on ``loop`` afterwards."""
        self.pending += 1
        self._put((fn, args, loop, done))

    async def call(
        self, fn: Callable[..., Any], *args: Any, abandoned: Abandoned | None = None
    ) -> Any:
        """``fn(*args)`` on the thread. A caller cancelled meanwhile stops waiting; the
        operation still runs, and ``abandoned`` gets its result."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another backend: trio
            return await self._call_from_trio(fn, args, abandoned)
        future = loop.create_future()
        self.submit(loop, fn, args, lambda r, e: _settle(future, r, e, abandoned))
        return await given_up_on(future, abandoned)

    async def _call_from_trio(
        self, fn: Callable[..., Any], args: tuple, abandoned: Abandoned | None
    ) -> Any:
        """``call`` on trio: a caller cancelled before the operation is queued queues nothing;
        one cancelled after stops waiting, and ``abandoned`` gets the result (on trio's
        thread, as on asyncio's loop). It queued the operation and then met the cancellation
        at the wait, which ran the operation anyway and told no one what it took (a commit
        its runtime never learned of, a lease never given back)."""
        import trio

        await trio.lowlevel.checkpoint_if_cancelled()
        token = trio.lowlevel.current_trio_token()
        arrived = trio.Event()
        outcome: list[tuple[Any, BaseException | None]] = []
        gone = False

        def settle(result: Any, error: BaseException | None) -> None:  # on trio's thread
            if gone:
                if error is None and abandoned is not None:
                    abandoned(result)
                return
            outcome.append((result, error))
            arrived.set()

        def done(result: Any, error: BaseException | None) -> None:  # on the worker
            with contextlib.suppress(trio.RunFinishedError):  # (nobody is left to tell)
                token.run_sync_soon(settle, result, error)

        self._put((fn, args, None, done))
        try:
            await arrived.wait()
        except BaseException:
            if outcome:  # it arrived as the caller was cancelled
                result, error = outcome[0]
                if error is None and abandoned is not None:
                    abandoned(result)
            else:
                gone = True
            raise
        result, error = outcome[0]
        if error is not None:
            raise error
        return result

    def stop(self) -> None:
        """The thread ends after what was queued; nothing queued later runs (never started:
        nothing to stop)."""
        self._stopped = True
        if self._thread is not None:
            self._queue.put(None)


async def given_up_on(future: asyncio.Future[Any], abandoned: Abandoned | None) -> Any:
    """``await future``; if the caller is cancelled after the result arrived (it was set, the
    caller had not resumed yet), ``abandoned`` gets that result."""
    try:
        return await future
    except asyncio.CancelledError:
        if (
            abandoned is not None
            and future.done()
            and not future.cancelled()
            and future.exception() is None
        ):
            abandoned(future.result())
        raise


def _ignore(result: Any, error: BaseException | None) -> None:
    return None
