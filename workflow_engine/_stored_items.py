"""List items a durable store keeps apart from a checkpoint, read when first needed.

A long list state -- an agent's conversation -- is most of a snapshot's bytes, yet a resumed
turn reads only the end of it. So a store may hand back a checkpoint whose long lists begin
with :class:`StoredItem` placeholders: each stands for one item of a :class:`StoredItems`
group, which the store reads (the whole group, once) when one of its items is first needed --
decoded for a handler, written into a new snapshot, compared with another value. Appending to
such a list, slicing its tail and comparing it with itself read nothing, so a turn resumed in a
new process costs what it touches, not the length of the conversation.

The kernel sees placeholders only as items of an executor's list state; the state's readers
(``get_state``, ``get_state_items``, the tagged codec) and every serialization (pydantic's,
so any ``model_dump_json``) see the items themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic_core import SchemaSerializer, core_schema

from ._errors import StoreCorruptError


class StoredItems:
    """A group of ``count`` list items a store holds elsewhere; ``load`` reads them (once:
    kept after). ``where`` names them for errors: run, checkpoint, executor and key."""

    __slots__ = ("_count", "_load", "_values", "where")

    def __init__(self, load: Callable[[], list[Any]], count: int, where: str) -> None:
        self._load: Callable[[], list[Any]] | None = load
        self._count = count
        self._values: list[Any] | None = None
        self.where = where

    def __len__(self) -> int:
        return self._count

    @property
    def loaded(self) -> bool:
        """Whether the items were read already."""
        return self._values is not None

    def values(self) -> list[Any]:
        """The items (read from the store the first time)."""
        values = self._values
        if values is None:
            assert self._load is not None
            values = self._load()
            if type(values) is not list or len(values) != self._count:
                found = f"{len(values)} items" if type(values) is list else "no list"
                raise StoreCorruptError(
                    f"{self.where} is damaged: {found} stored where its checkpoint counts "
                    f"{self._count}"
                )
            self._values, self._load = values, None  # (the loader's references go)
        return values

    def placeholders(self) -> list[StoredItem]:
        """One placeholder per item, in order: what a list state begins with until read."""
        # (a conversation's thousands: each made bare and given its two attributes here costs
        # about 60% of a call to an ``__init__``, the larger part of a cold turn's fold)
        items: list[StoredItem] = []
        append = items.append
        for index in range(self._count):
            item = StoredItem()
            item.group = self
            item.index = index
            append(item)
        return items


class StoredItem:
    """Item ``index`` of a :class:`StoredItems` group, unread (made by its group's
    ``placeholders``). Immutable; equal to what it stands for (comparing with anything but
    itself reads the group)."""

    __slots__ = ("group", "index")
    group: StoredItems
    index: int

    @property
    def value(self) -> Any:
        return self.group.values()[self.index]

    def __eq__(self, other: object) -> bool:
        if other is self:
            return True
        if type(other) is StoredItem:
            if other.group is self.group:
                return other.index == self.index
            other = other.value
        return bool(self.value == other)

    __hash__ = None  # type: ignore[assignment]  # (equal to unhashable values: lists, dicts)

    def __copy__(self) -> StoredItem:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> StoredItem:
        return self

    def __repr__(self) -> str:
        return f"<item {self.index} of {self.group.where}>"


# pydantic serializes an object by its ``__pydantic_serializer__``: a placeholder as its item
StoredItem.__pydantic_serializer__ = SchemaSerializer(  # type: ignore[attr-defined]
    core_schema.any_schema(
        serialization=core_schema.plain_serializer_function_ser_schema(
            lambda item: item.value, when_used="always"
        )
    )
)


def resolved(value: Any) -> Any:
    """``value`` with the placeholders among its items replaced by what they stand for (only
    a list state holds them); any other value as it is."""
    if type(value) is list and value and StoredItem in set(map(type, value)):
        return [item.value if type(item) is StoredItem else item for item in value]
    return value


def read_placeholders(states: dict[str, dict[str, Any]]) -> None:
    """Read every group of placeholders in an executor-state mapping now: a serialization that
    meets one unread gets its errors as ``StorageError`` s, not wrapped in pydantic's."""
    for state in states.values():
        for value in state.values():
            if has_placeholders(value):
                value[0].group.values()


def has_placeholders(value: Any) -> bool:
    """Whether a list begins with placeholders (they only ever lead: lists grow at the end)."""
    return type(value) is list and bool(value) and type(value[0]) is StoredItem
