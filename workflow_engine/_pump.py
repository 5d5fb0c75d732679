"""EventPump: a producer running in its own task, its events handed to one consumer.

Streams (``Workflow.run_stream``, ``Runtime.resume_stream``) run the workflow in a task of their
own rather than inside an async generator: a consumer that ``break``s out of ``async for`` and
drops the stream must stop the run at once and release what it holds -- from the consumer's own
task, never from a garbage-collection hook in another one (a cancel scope must be left in the
task that entered it). Dropping the pump cancels the task; ``close()`` cancels it and waits; so
does cancelling the consumer while it waits for the next event.

The task is an ``asyncio.Task`` on asyncio, a system task on trio (see ``_detached``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

import anyio

from ._detached import spawn_detached

T = TypeVar("T")

Producer = Callable[[Callable[[T], None]], Awaitable[None]]

BACKLOG = 128
"""Events a stream holds unread before its run waits for the consumer, before its next
superstep. A consumer slower than the run so bounds how far the run gets ahead of what it has
seen: the events a crash leaves unseen, and what the stream holds in memory (a 30,000-superstep
run finished while its consumer was at superstep 4,000, every event held: outside tester 182).
"""


class Emitter(Generic[T]):
    """What a pump's producer emits through: calling it queues an event (it never waits);
    ``behind`` says the consumer has more than ``BACKLOG`` unread, ``caught_up()`` waits until
    it has read half of them."""

    __slots__ = ("_send", "unread", "waiter")

    def __init__(self, send: Callable[[T], None]) -> None:
        self._send = send
        self.unread = 0
        self.waiter: anyio.Event | None = None

    def __call__(self, event: T) -> None:
        self._send(event)
        self.unread += 1

    @property
    def behind(self) -> bool:
        return self.unread > BACKLOG

    async def caught_up(self) -> None:
        while self.unread > BACKLOG // 2:
            waiter = self.waiter = anyio.Event()
            await waiter.wait()

    def read_one(self) -> None:
        """The consumer took an event."""
        self.unread -= 1
        waiter = self.waiter
        if waiter is not None and self.unread <= BACKLOG // 2:
            self.waiter = None
            waiter.set()


def waits_for_its_reader(emit: Callable[[T], None]) -> Emitter[T] | None:
    """``emit`` if it is a stream's (whose producer should wait for a slow reader), else None."""
    return emit if type(emit) is Emitter else None


class EventPump(Generic[T]):
    """Runs ``produce(emit)`` in a task; ``next()`` returns what it emits, in order, then raises
    ``StopAsyncIteration`` -- or what ``produce`` raised."""

    def __init__(self, produce: Producer[T]) -> None:
        send, self._receive = anyio.create_memory_object_stream[T](math.inf)
        emitter = self._emitter = Emitter(send.send_nowait)
        self.unread: list[T] = []
        """What the producer emitted and no one read, once the pump is closed."""

        async def run() -> None:
            async with send:
                await produce(emitter)

        self._task = spawn_detached(run)
        self._closed = False

    async def next(self) -> T:
        try:
            event = await self._receive.receive()
            self._emitter.read_one()
            return event
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            pass
        except BaseException:
            # the consumer was cancelled while it waited: the stream ends, as an async
            # generator's would -- the producer stops and cleans up before this returns, even
            # if the cancelled task (and so the stream) is kept alive by a reference
            with anyio.CancelScope(shield=True):
                await self.close()
            raise
        await self._task.wait()
        self._receive.close()
        error = self._task.error()
        if error is not None:
            raise error
        raise StopAsyncIteration

    @property
    def done(self) -> bool:
        return self._task.done()

    async def close(self) -> None:
        """Cancel the producer (if it still runs) and wait until it has cleaned up. What it
        emitted and no one read is kept (``unread``)."""
        if not self._closed:
            self._closed = True
            self._task.cancel()
            await self._task.wait()
            while True:
                try:
                    self.unread.append(self._receive.receive_nowait())
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
            self._receive.close()

    def __del__(self) -> None:
        # the consumer dropped the stream without closing it: stop the producer now (its own
        # task runs the cleanup, e.g. releasing a lease)
        task = getattr(self, "_task", None)
        if task is not None and not task.done():
            with contextlib.suppress(RuntimeError):  # the event loop is already closed
                task.cancel()
        receive = getattr(self, "_receive", None)
        if receive is not None:
            receive.close()
