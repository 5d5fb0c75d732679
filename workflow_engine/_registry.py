"""The type registry: which classes a workflow's codec may store, under which stable tags.

A tag is a name chosen to survive refactors, never a module path read back from the data:

1. ``name=`` passed to :meth:`TypeRegistry.register` (``WorkflowBuilder.register_types``), else
2. a ``__workflow_type__ = "Name"`` string set in the class body (not inherited by subclasses),
3. else the class's ``__qualname__`` (``Order``, ``Outer.Inner``).

Two classes with one tag are refused with a :class:`SerializationError` saying how to tell them
apart. The tag older versions wrote (``module.qualname``) is kept as an alias, so existing
checkpoints still decode. Registering a class also registers the classes its fields declare.

Subclasses: a subclass of a registered class is registered when it is first met -- when a value
of it is encoded, or when its tag is decoded and it is among the imported subclasses of a
registered class (found through ``__subclasses__()``). The registry never imports a module or
builds a class named only by data: an unknown tag stays unknown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import enum
import threading
import typing
import uuid
import weakref
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, RootModel, TypeAdapter

from ._errors import SerializationError, UnregisteredTypeError
from ._types import concrete_classes, type_name

MODEL, ROOT, DATACLASS, ENUM, NAMEDTUPLE, OTHER, LEGACY = range(7)
"""How an entry's values are stored (see ``_codec``). LEGACY: a class with its own marker
(datetime, Decimal, ...) that older versions stored under ``$type``: only decoded."""

NATIVE = frozenset({_dt.datetime, _dt.date, _dt.time, _dt.timedelta, Decimal, uuid.UUID})
"""Classes the codec stores with a marker of their own rather than a ``$type``."""


_ADAPTERS: weakref.WeakValueDictionary[type, TypeAdapter[Any]] = weakref.WeakValueDictionary()
"""One pydantic adapter per class, shared by every registry that holds it (a dataclass's adapter
costs ~0.2-1 ms to build, and every build of a workflow registers the same classes again). Weak
values: an adapter lives as long as a registry uses it, so classes made at run time (tool
argument models) are not kept alive by this cache."""


def adapter_for(cls: type) -> TypeAdapter[Any]:
    """The pydantic adapter for ``cls`` (built once per process while in use; raises what
    ``TypeAdapter`` raises for a class pydantic cannot handle, and caches no failure)."""
    try:
        return _ADAPTERS[cls]
    except KeyError:
        pass
    except TypeError:  # an unhashable class: no caching
        return TypeAdapter(cls)
    adapter: TypeAdapter[Any] = TypeAdapter(cls)
    _ADAPTERS[cls] = adapter
    return adapter


def schema_refusal(exc: BaseException) -> str:
    """The first sentence of pydantic's refusal to describe a class (its advice to allow
    arbitrary types does not apply to values that must be stored)."""
    said = str(exc).strip()
    return said.splitlines()[0].split(". ")[0] if said else type(exc).__name__


def default_tag(cls: type) -> str:
    """The tag a class gets unless registered with ``name=``: a ``__workflow_type__`` string set
    in the class body itself, else ``__qualname__``."""
    own = cls.__dict__.get("__workflow_type__")
    return own if isinstance(own, str) and own else cls.__qualname__


# Packages that moved: a module path older versions wrote under the old name still decodes.
_FORMER_PACKAGES = (
    ("workflow_engine.executors.", "executors."),
    ("workflow_engine.storage.", "storage."),
    ("workflow_engine_cli.demos.", "examples."),
)


def display_name(tp: Any, registry: TypeRegistry | None = None) -> str:
    """The name people and clients see for a type (errors, CLI output, the AG-UI wire): the
    stable tag ``registry`` stores it under, else its ``__workflow_type__`` or ``__qualname__``;
    generics as ``list[Order] | None``. Never a module path, which changes when code moves."""

    def naming(cls: type) -> str:
        return (registry.name_of(cls) if registry is not None else None) or default_tag(cls)

    # ``tuple[int, ...]``: ``type_name`` says ``Ellipsis`` there, in the signatures runs
    # were stored with, so only the name people see is spelled as Python spells it
    return type_name(tp, naming=naming).replace(", Ellipsis]", ", ...]")


def legacy_tag(cls: type) -> str:
    """The tag older versions wrote by default (``module.qualname``); still decoded."""
    return type_name(cls)


def legacy_tags(cls: type) -> tuple[str, ...]:
    """Every tag older versions may have written for ``cls``: ``module.qualname``, also under
    the name its package had before it moved."""
    tag = type_name(cls)
    for current, former in _FORMER_PACKAGES:
        if tag.startswith(current):
            return (tag, former + tag.removeprefix(current))
    return (tag,)


def _kind_of(cls: type) -> int:
    if issubclass(cls, RootModel):
        return ROOT
    if issubclass(cls, BaseModel):
        return MODEL
    if dataclasses.is_dataclass(cls):
        return DATACLASS
    if issubclass(cls, enum.Enum):
        return ENUM
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return NAMEDTUPLE
    return OTHER


def _reads_raw_input(cls: type) -> bool:
    """Whether a model or pydantic dataclass sees its input before its fields do (a ``before``
    or ``wrap`` model validator): it may read keys that are no field's, e.g. to migrate old
    records, so the codec leaves stored keys to it."""
    decorators = getattr(cls, "__pydantic_decorators__", None)
    validators = getattr(decorators, "model_validators", {}) if decorators else {}
    return any(v.info.mode in ("before", "wrap") for v in validators.values())


class TypeEntry:
    """One registered class: its tag, how it is stored, and what the codec needs to do so."""

    __slots__ = ("adapter", "cls", "fields", "kind", "late", "names", "open", "tag")

    def __init__(self, cls: type, tag: str, kind: int) -> None:
        self.cls = cls
        self.tag = tag
        self.kind = kind
        self.adapter: TypeAdapter[Any] = adapter_for(cls)  # fails early for unusable classes
        self.fields: tuple[str, ...] = ()  # models and dataclasses: field names, in order
        self.late: frozenset[str] = frozenset()  # dataclass fields with init=False
        self.open = True
        """Whether a stored value may hold keys that are not fields (a model's extras)."""
        if kind == MODEL:
            self.fields = tuple(cls.model_fields)  # type: ignore[attr-defined]
            self.open = cls.model_config.get("extra") == "allow" or _reads_raw_input(cls)  # type: ignore[attr-defined]
        elif kind == DATACLASS:
            fields = dataclasses.fields(cls)
            self.fields = tuple(f.name for f in fields)
            self.late = frozenset(f.name for f in fields if not f.init)
            self.open = _reads_raw_input(cls)
        # (by field name only: the codec validates by name, so an alias reads nothing stored)
        self.names = frozenset(self.fields)

    def annotations(self) -> list[Any]:
        """The declared types of this class's fields."""
        if self.kind in (MODEL, ROOT):
            return [f.annotation for f in self.cls.model_fields.values()]  # type: ignore[attr-defined]
        if self.kind in (DATACLASS, NAMEDTUPLE):
            try:
                return list(typing.get_type_hints(self.cls).values())
            except Exception:  # an unresolvable forward reference: those classes stay unknown
                return []
        return []


class AmbiguousTagError(SerializationError):
    """A stored type name that several imported, unregistered subclasses answer to: what was
    stored is fine; this process cannot tell which class wrote it."""


class TypeRegistry:
    """The closed set of classes a workflow may decode, keyed by a stable tag."""

    def __init__(self) -> None:
        self._by_class: dict[type, TypeEntry] = {}
        self._by_tag: dict[str, TypeEntry] = {}
        self._aliases: dict[str, TypeEntry] = {}  # legacy module.qualname tags, former names
        self._lock = threading.RLock()
        self._refused: dict[type, str] = {}  # declared classes pydantic cannot describe: why

    # public -------------------------------------------------------------------------------------

    def register(self, cls: type, name: str | None = None) -> str:
        """Allow ``cls`` to be encoded and decoded under ``name`` (default: see module docs).

        A tag taken by another class is a :class:`SerializationError`. Registering a class again
        with a new ``name`` renames it (the former tag still decodes). A class pydantic cannot
        build a schema for raises pydantic's error.
        """
        with self._lock:
            return self._register(cls, name).tag

    def name_of(self, cls: type) -> str | None:
        """The tag values of ``cls`` are stored under, or None (not registered, not a subclass of
        a registered class, or stored with a marker of its own)."""
        try:
            entry = self.entry_for_class(cls)
        except SerializationError:
            return None
        return entry.tag if entry is not None and entry.kind != LEGACY else None

    def adapter(self, name: str) -> TypeAdapter[Any] | None:
        """The pydantic adapter for a tag (current or legacy), or None if it is unknown."""
        entry = self.entry_for_tag(name)
        return entry.adapter if entry is not None else None

    def resolve(self, name: str) -> type | None:
        """The class a stored tag (current or legacy) names, or None if it is unknown."""
        entry = self.entry_for_tag(name)
        return entry.cls if entry is not None else None

    def names(self) -> list[str]:
        """Every current tag, sorted."""
        return sorted(self._by_tag)

    def annotation_name(self, tp: Any) -> str:
        """A stable name for an annotation: ``type_name`` with registered classes spelled by
        their tags (``list[Answer] | None``), so moving a class to another module keeps it."""
        return type_name(tp, naming=self.name_of)

    def __contains__(self, cls: object) -> bool:
        return cls in self._by_class

    # lookups used by the codec ------------------------------------------------------------------

    def register_declared(self, cls: type) -> None:
        """Register a class an annotation names. One pydantic cannot describe is not an error
        here (the annotation may never carry a value): why is remembered, and a value of it
        then fails to encode saying so (``why_refused``), not that it was never declared."""
        if cls in self._by_class:
            return
        try:
            with self._lock:
                self._register(cls, None)
        except SerializationError:
            raise
        except Exception as exc:
            with contextlib.suppress(TypeError):  # an unhashable class
                self._refused.setdefault(cls, schema_refusal(exc))

    def why_refused(self, cls: type) -> str | None:
        """Why ``cls``, or a class it derives from, was declared but not registered
        (``register_declared``), or None."""
        for base in getattr(cls, "__mro__", (cls,)):
            try:
                said = self._refused.get(base)
            except TypeError:
                continue
            if said is not None:
                return said if base is cls else f"{type_name(base)}: {said}"
        return None

    def entry_for_class(self, cls: type) -> TypeEntry | None:
        """The entry values of ``cls`` are encoded with; a subclass of a registered class is
        registered on the way. None if the class is unknown."""
        entry = self._by_class.get(cls)
        if entry is not None:
            return entry
        by_class = self._by_class
        if not any(b in by_class and by_class[b].kind != LEGACY for b in cls.__mro__[1:]):
            return None
        with self._lock:
            tag = default_tag(cls)
            rivals = [c for c in self._subclasses() if c is not cls and default_tag(c) == tag]
            if rivals:
                raise SerializationError(self._ambiguous(tag, [cls, *rivals]))
            return self._register_found(cls)

    def entry_for_tag(self, tag: str) -> TypeEntry | None:
        """The entry for a stored tag (current or legacy); an imported subclass of a registered
        class is registered on the way. None if nothing known has that tag."""
        entry = self._by_tag.get(tag) or self._aliases.get(tag)
        if entry is not None:
            return entry
        with self._lock:
            found = [
                c for c in self._subclasses() if tag == default_tag(c) or tag in legacy_tags(c)
            ]
            if len(found) > 1:
                raise AmbiguousTagError(self._ambiguous(tag, found))
            return self._register_found(found[0]) if found else None

    # internals ----------------------------------------------------------------------------------

    def _register(self, cls: type, name: str | None) -> TypeEntry:
        known = self._by_class.get(cls)
        if known is not None:
            if name is not None and name != known.tag and known.kind != LEGACY:
                self._claim(name, cls)
                self._aliases[known.tag] = known
                del self._by_tag[known.tag]
                known.tag = name
                self._by_tag[name] = known
            return known
        if cls in NATIVE:  # only its old $type tag needs to decode
            entry = TypeEntry(cls, name or legacy_tag(cls), LEGACY)
            self._by_class[cls] = entry
            self._aliases.setdefault(entry.tag, entry)
            return entry
        tag = name or default_tag(cls)
        self._claim(tag, cls)
        entry = TypeEntry(cls, tag, _kind_of(cls))
        self._by_class[cls] = entry
        self._by_tag[tag] = entry
        for legacy in legacy_tags(cls):
            if legacy != tag and legacy not in self._by_tag:
                self._aliases.setdefault(legacy, entry)
        for annotation in entry.annotations():
            for field_cls in concrete_classes(annotation):
                self.register_declared(field_cls)
        return entry

    def _register_found(self, cls: type) -> TypeEntry:
        try:
            return self._register(cls, None)
        except SerializationError:
            raise
        except Exception as exc:
            raise UnregisteredTypeError(
                f"{type_name(cls)} (a subclass of a registered class) cannot be registered: {exc}"
            ) from exc

    def _claim(self, tag: str, cls: type) -> None:
        other = self._by_tag.get(tag)
        if other is not None and other.cls is not cls:
            raise SerializationError(
                f"type name {tag!r} is already registered for {type_name(other.cls)}, so "
                f"{type_name(cls)} cannot use it: set __workflow_type__ = '...' in the body of "
                "one of them, or register it with WorkflowBuilder.register_types(cls, name=...)"
            )

    @staticmethod
    def _ambiguous(tag: str, classes: list[type]) -> str:
        names = ", ".join(sorted(type_name(c) for c in classes))
        return (
            f"type name {tag!r} fits several subclasses of registered classes ({names}): set "
            "__workflow_type__ = '...' in their class bodies or register them with name=..."
        )

    def _subclasses(self) -> Iterator[type]:
        """Every imported, not yet registered subclass of a registered class."""
        seen: set[type] = set()
        todo = [e.cls for e in self._by_class.values() if e.kind != LEGACY]
        while todo:
            subclasses: list[type] = type.__subclasses__(todo.pop())
            for sub in subclasses:
                if sub not in seen:
                    seen.add(sub)
                    todo.append(sub)
                    if sub not in self._by_class:
                        yield sub
