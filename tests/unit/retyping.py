"""Values that compare equal to the original but are stored differently -- what a delta or a
span must not mistake for the items it already holds."""

from __future__ import annotations

from typing import Any


def retyped(x: Any) -> Any:
    """``x`` as an equal value of another type (True <-> 1, False <-> 0), zero with the other
    sign, or a dict with its keys in the other order; anything else unchanged."""
    if type(x) is bool:
        return int(x)
    if type(x) is int and x in (0, 1):
        return bool(x)
    if type(x) is float and x == 0.0:
        return -x
    if type(x) is dict:
        return dict(reversed(list(x.items())))
    return x
