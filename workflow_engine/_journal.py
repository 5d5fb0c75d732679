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

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

if TYPE_CHECKING:
    from ._requests import InDoubtEffect


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

    async def journal_after(self, run_id: str, superstep: int) -> list[tuple[str, Any]]:
        """The entries ``(key, entry)`` of supersteps after ``superstep``."""
        return [
            (key, entry)
            for (run, key), entry in self._entries.items()
            if run == run_id and _superstep(key) > superstep
        ]

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


def cut_off_steps(
    entries: Iterable[tuple[str, Any]],
    secret: str,
    run_id: str,
    answered_elsewhere: Callable[[str], bool] | None = None,
) -> list[InDoubtEffect]:
    """The intents among a superstep's journal ``entries`` that have no result: steps whose
    effect may have happened before the run stopped. ``answered_elsewhere(key)``: a person
    already said what happened to step ``key`` (left out)."""
    from ._identity import idempotency_key
    from ._requests import InDoubtEffect

    found = []
    for key, entry in entries:
        if not isinstance(entry, dict) or "value" in entry:
            continue  # (a result: the effect happened and was recorded)
        if answered_elsewhere is not None and answered_elsewhere(key):
            continue
        executor_id = entry.get("executor")
        if not isinstance(executor_id, str):  # an intent journaled before executors were named
            executor_id = key.split("/")[1] if key.count("/") >= 3 else ""
        step = entry.get("step")
        if not isinstance(step, str):  # (journaled before steps were named)
            step = key.rsplit("/", 1)[-1]
        found.append(
            InDoubtEffect(
                executor_id=executor_id,
                step=step,
                description=entry.get("intent"),
                step_key=key,
                idempotency_key=idempotency_key(secret, run_id, key) if secret else "",
            )
        )
    return found
