"""The side-effect journal: what journaled steps started and what they returned, per run.

``ctx.run_once(key, fn)`` looks the step up first; on a miss it records an *intent*, runs
``fn``, stores the result durably and only then returns it. A superstep that crashed and runs
again therefore replays journaled results instead of repeating the work, and a step whose intent
has no result is known to be in doubt (the process died while it ran): see
:meth:`WorkflowContext.run_once`.

Keys are step keys (``_identity.step_key``) and start with the superstep, so once a superstep is
committed its entries are never read again: stores delete them at that commit (compaction), and
``prune`` deletes a run's journal with the run.

A store that also implements :class:`JournalStore` (SQLite and the in-memory run store do) makes
the journal durable; with any other store it lives as long as the process. Such a store may also
offer ``journal_after(run_id, superstep)``: the entries ``(key, entry)`` of supersteps after
``superstep``, oldest first -- those of the superstep that never committed (the run stopped
mid-step, or was cancelled or failed), among which an intent is an effect in doubt
(``Runtime.get_run`` reports them as ``effects_in_doubt``).
"""

from __future__ import annotations

from typing import Any, Protocol, TypeGuard, runtime_checkable


@runtime_checkable
class JournalStore(Protocol):
    async def journal_get(self, run_id: str, key: str) -> Any | None:
        """The entry: ``{"value": <encoded>}`` (a result), ``{"intent": ...}`` or None."""
        ...

    async def journal_intent(self, run_id: str, key: str, entry: Any, superstep: int) -> None:
        """Record that step ``key`` is about to start (kept if an entry exists)."""
        ...

    async def journal_put(self, run_id: str, key: str, value: Any, superstep: int) -> Any:
        """Store a result (replacing an intent) unless one exists; return the stored result
        (first writer wins)."""
        ...

    async def journal_clear(self, run_id: str, key: str) -> None:
        """Forget step ``key`` (its effect did not happen, so it may run again)."""
        ...


class InMemoryJournal:
    """A process-local journal, for runs without a durable store."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], Any] = {}

    async def journal_get(self, run_id: str, key: str) -> Any | None:
        return self._entries.get((run_id, key))

    async def journal_intent(self, run_id: str, key: str, entry: Any, superstep: int) -> None:
        self._entries.setdefault((run_id, key), entry)

    async def journal_put(self, run_id: str, key: str, value: Any, superstep: int) -> Any:
        current = self._entries.get((run_id, key))
        if current is not None and "value" in current:
            return current
        self._entries[(run_id, key)] = value
        return value

    async def journal_clear(self, run_id: str, key: str) -> None:
        self._entries.pop((run_id, key), None)

    def compact(self, run_id: str, through_superstep: int) -> None:
        """Drop entries of supersteps up to ``through_superstep`` (they are committed)."""
        doomed = [
            k for k in self._entries if k[0] == run_id and _superstep(k[1]) <= through_superstep
        ]
        for k in doomed:
            del self._entries[k]


def _superstep(key: str) -> int:
    head = key.partition("/")[0]
    return int(head) if head.isdigit() else -1


_JOURNAL_KEEPERS: dict[type, bool] = {}


def keeps_journal(store: object) -> TypeGuard[JournalStore]:
    """``isinstance(store, JournalStore)``, remembered per class (a protocol check inspects
    every member: tens of µs, once per continuation otherwise)."""
    kind = type(store)
    known = _JOURNAL_KEEPERS.get(kind)
    if known is None:
        known = _JOURNAL_KEEPERS[kind] = isinstance(store, JournalStore)
    return known
