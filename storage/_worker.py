"""A store's helper thread: runs what may block long (a busy lock, a WAL checkpoint, big reads)
off the event loop, one operation at a time, in submission order."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

import anyio

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
        except RuntimeError:  # another backend (trio): wait for the result from a helper thread
            result: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self._put((fn, args, None, lambda r, e: _resolve(result, r, e)))
            return await anyio.to_thread.run_sync(result.result)
        future = loop.create_future()
        self.submit(loop, fn, args, lambda r, e: _settle(future, r, e, abandoned))
        return await given_up_on(future, abandoned)

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


def _resolve(
    future: concurrent.futures.Future[Any], result: Any, error: BaseException | None
) -> None:
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
