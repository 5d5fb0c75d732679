"""The store's worker thread: one ``sqlite3`` connection, one operation at a time, one hop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from queue import SimpleQueue
from typing import Any

import anyio


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller was cancelled; the operation ran anyway
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class Worker:
    """A dedicated thread that runs the store's operations one at a time, in call order.

    ``call`` is one hop: the function goes on the queue, the thread runs it and hands the
    result back to the event loop (``call_soon_threadsafe``). A caller that is cancelled stops
    waiting, but an operation that started runs to its end (a transaction is never cut off).
    """

    def __init__(self, name: str) -> None:
        self._queue: SimpleQueue[Any] = SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        get = self._queue.get
        while True:
            item = get()
            if item is None:
                return
            fn, args, loop, future = item
            del item
            error: BaseException | None = None
            result = None
            try:
                result = fn(*args)
            except BaseException as exc:
                error = exc
            if loop is None:
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(result)
            else:
                # RuntimeError: the event loop is closed, no one is waiting any more
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_settle, future, result, error)
            del fn, args, loop, future, result, error

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn`` without waiting for it."""
        self._queue.put((fn, args, None, concurrent.futures.Future()))

    async def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another backend (trio): wait for the result from a helper thread
            done: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self._queue.put((fn, args, None, done))
            return await anyio.to_thread.run_sync(done.result)
        future = loop.create_future()
        self._queue.put((fn, args, loop, future))
        return await future

    def stop(self) -> None:
        self._queue.put(None)
