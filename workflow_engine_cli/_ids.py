"""Ids as people type them: any unique prefix names a run or a request (like git and docker).

Tables show each id's shortest unique prefix, at least :data:`SHORT` characters long, computed
against every id of that kind in the database -- not just the rows shown -- so that whatever a
table shows can be typed back. (Read as the stored ids just before and after each shown one:
in sorted order, the longest prefix an id shares is with a neighbour.)
"""

from __future__ import annotations

import string
from collections.abc import Iterable

from ._term import visible

SHORT = 8
_LISTED = 10  # candidates named in an "ambiguous" error


class AmbiguousIdError(Exception):
    """A prefix matches more than one id."""

    def __init__(self, kind: str, prefix: str, matches: list[str]) -> None:
        self.kind = kind
        self.prefix = prefix
        self.matches = sorted(matches)
        # an id may hold control characters (a thread id from the server is any text): they
        # are shown escaped, never sent to the terminal
        shown = ", ".join(visible(m) for m in self.matches[:_LISTED])
        more = f" and {len(self.matches) - _LISTED} more" if len(self.matches) > _LISTED else ""
        super().__init__(
            f"{kind} id {prefix!r} is ambiguous: {len(self.matches)} {kind}s start with it "
            f"({shown}{more}); type more of the id"
        )


def short_ids(ids: Iterable[str], minimum: int = SHORT) -> dict[str, str]:
    """Each id → its shortest prefix of at least ``minimum`` characters that no other id in
    ``ids`` starts with (the whole id if it is a prefix of another). An id with a namespace
    (``support:<thread>/<n>``, a run of the AG-UI server) keeps ``minimum`` characters after
    it: ``support:`` alone named the run uniquely, and told a person nothing."""
    ordered = sorted(set(ids))
    short = {}
    for i, this in enumerate(ordered):
        need = this.find(":") + 1 + minimum
        for j in (i - 1, i + 1):  # in sorted order the longest shared prefix is with a neighbour
            if 0 <= j < len(ordered):
                need = max(need, _shared(this, ordered[j]) + 1)
        short[this] = this[:need]
    return short


def _shared(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def match(kind: str, prefix: str, ids: Iterable[str]) -> str:
    """The one id in ``ids`` that ``prefix`` names: an exact id, else the only id it starts.

    No match returns ``prefix`` unchanged, so that the lookup that follows reports the store's
    own "not found" error; several raise :class:`AmbiguousIdError`.
    """
    candidates = set(ids)
    if prefix in candidates or not prefix:
        return prefix
    hits = [i for i in candidates if i.startswith(prefix)]
    if len(hits) == 1:
        return hits[0]
    if hits:
        raise AmbiguousIdError(kind, prefix, hits)
    return prefix


def lowered_hex(given: str) -> str | None:
    """``given`` in lower case if it is hex typed with capitals, else None: the ids the engine
    makes are hex, so such an id is looked up in lower case too (outside tester 106). Only
    hex: of runs named ``Order-1`` and ``order-1``, ``ORDER-1`` silently found the second
    (outside tester 112)."""
    if given != given.lower() and all(c in string.hexdigits for c in given):
        return given.lower()
    return None
