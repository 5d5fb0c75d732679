"""The side-effect journal: results of work that must not run twice, keyed per run.

``ctx.run_once(key, fn)`` looks the key up first; on a miss it runs ``fn``, stores the result
durably and only then returns it. A superstep that crashed and runs again therefore replays
journaled results instead of repeating the work. Work that was started but not journaled when
the process died runs again (at-least-once): give outside services the idempotency key.

A store that also implements :class:`JournalStore` (SQLite does) makes the journal durable; with
any other store the journal lives as long as the process.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class JournalStore(Protocol):
    async def journal_get(self, run_id: str, key: str) -> Any | None:
        """The stored value (an encoded JSON value) or None."""
        ...

    async def journal_put(self, run_id: str, key: str, value: Any) -> Any:
        """Store ``value`` unless the key exists; return what is stored (first writer wins)."""
        ...


class InMemoryJournal:
    """A process-local journal, for runs without a durable store."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], Any] = {}

    async def journal_get(self, run_id: str, key: str) -> Any | None:
        return self._entries.get((run_id, key))

    async def journal_put(self, run_id: str, key: str, value: Any) -> Any:
        return self._entries.setdefault((run_id, key), value)
