"""A coroutine run apart from its caller's task, on asyncio or on trio.

What must outlive the await that started it -- a stream's producer that the consumer pulls from,
a lease given back for a caller that was cancelled -- runs as an ``asyncio.Task`` on asyncio.
Trio has no free-standing tasks; there it runs as a system task
(``trio.lowlevel.spawn_system_task``) under a cancel scope of its own, in a copy of the
spawner's context as an asyncio task is. Either way ``cancel()`` stops it, ``wait()`` waits for
its end, and what it raised is kept for whoever waits (a trio system task's error would end the
whole ``trio.run``).
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio


class Detached(Protocol):
    def done(self) -> bool: ...

    def cancel(self) -> None: ...

    async def wait(self) -> None: ...

    def error(self) -> BaseException | None:
        """What it raised (``None`` if it returned or was cancelled)."""
        ...


def spawn_detached(
    body: Callable[[], Awaitable[None]], on_done: Callable[[], None] | None = None
) -> Detached:
    """Start ``body()`` apart from the calling task; ``on_done()`` runs when it has ended.
    (Called from a loop's callback too, where no task runs: asyncio is told by its loop.)"""
    # (asyncio not loaded: none of its loops runs -- importing the kernel does not load it)
    asyncio = sys.modules.get("asyncio")
    if asyncio is not None and asyncio._get_running_loop() is not None:
        return _AsyncioTask(body, on_done)
    return _TrioSystemTask(body, on_done)


class _AsyncioTask:
    def __init__(
        self, body: Callable[[], Awaitable[None]], on_done: Callable[[], None] | None
    ) -> None:
        import asyncio

        coro: Any = body()
        self._task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._task.add_done_callback(_retrieve)
        if on_done is not None:
            self._task.add_done_callback(lambda _: on_done())

    def done(self) -> bool:
        return self._task.done()

    def cancel(self) -> None:
        self._task.cancel()

    async def wait(self) -> None:
        import asyncio

        await asyncio.wait({self._task})

    def error(self) -> BaseException | None:
        return None if self._task.cancelled() else self._task.exception()


class _TrioSystemTask:
    def __init__(
        self, body: Callable[[], Awaitable[None]], on_done: Callable[[], None] | None
    ) -> None:
        import trio

        self._scope = trio.CancelScope()
        self._finished = trio.Event()
        self._error: BaseException | None = None

        async def run() -> None:
            try:
                with self._scope:
                    await body()
            except trio.Cancelled:
                raise  # trio.run itself is ending: the system nursery cancels its tasks
            except BaseException as exc:
                self._error = exc
            finally:
                self._finished.set()
                if on_done is not None:
                    on_done()

        trio.lowlevel.spawn_system_task(run, context=contextvars.copy_context())

    def done(self) -> bool:
        return self._finished.is_set()

    def cancel(self) -> None:
        self._scope.cancel()

    async def wait(self) -> None:
        await self._finished.wait()

    def error(self) -> BaseException | None:
        return self._error


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a task's exception as seen: its waiter reads it, or no one needs to."""
    if not task.cancelled():
        task.exception()
