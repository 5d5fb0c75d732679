"""Type annotations as the engine understands them.

Handlers, contexts and ports declare types with ordinary annotations: classes, pydantic models,
dataclasses, primitives, ``X | Y``, ``list[X]``, ``dict[K, V]``, ``Any``. This module answers three
questions about them, all without I/O:

* does this runtime value match the annotation? (handler dispatch, output enforcement)
* can a value of annotation A be accepted by annotation B? (edge validation at build time)
* which concrete classes appear in it? (the codec's registry of decodable types)
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any, Union, get_args, get_origin

from typing_extensions import is_typeddict

from ._errors import DefinitionError, shown

Matcher = Callable[[Any], bool]

_NONE_TYPES: tuple[Any, ...] = (None, type(None))


def type_name(tp: Any, naming: Callable[[type], str | None] | None = None) -> str:
    """A readable name for an annotation (used in errors, signatures and type tags).

    Classes are spelled ``module.qualname`` unless ``naming`` gives them another name (the codec
    passes its registry's stable tags, see ``TypeRegistry.annotation_name``).
    """
    if tp in _NONE_TYPES:
        return "None"
    if tp is Any:
        return "Any"
    if tp is typing.Never or tp is typing.NoReturn:
        return "Never"
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a, naming) for a in get_args(tp))
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in get_args(tp))}]"
    if origin is not None:
        args = get_args(tp)
        base = type_name(origin, naming)
        return f"{base}[{', '.join(type_name(a, naming) for a in args)}]" if args else base
    if isinstance(tp, type):
        if tp.__module__ == "builtins":
            return tp.__qualname__
        name = naming(tp) if naming is not None else None
        return name or f"{tp.__module__}.{tp.__qualname__}"
    try:
        return repr(tp)
    except Exception:  # (a caller's value in place of a type: its repr may fail -- tester 144)
        return f"<a {type(tp).__name__}>"


def union_members(tp: Any) -> tuple[Any, ...]:
    """The alternatives of a union annotation, or the annotation itself."""
    if get_origin(tp) in (Union, types.UnionType):
        return get_args(tp)
    if tp is typing.Never or tp is typing.NoReturn:
        return ()
    return (tp,)


def _no_typeddict(tp: Any) -> None:
    """A TypedDict cannot route messages: at run time its values are plain dicts, which no
    check tells apart (``isinstance`` refuses it)."""
    if is_typeddict(tp):  # (typing_extensions': it knows both kinds, as pydantic needs)
        raise DefinitionError(
            f"{type_name(tp)} is a TypedDict, which cannot be a message or answer type: its "
            "values are plain dicts at run time, so nothing tells them apart from other dicts; "
            "use a pydantic model or a dataclass (or dict[str, ...])"
        )


def takes_float(tp: Any) -> bool:
    """Whether ``float`` is part of ``tp``: itself, or inside a union or a container's type
    arguments -- where a matcher takes an int for a float, as Python's typing does."""
    return tp is float or any(takes_float(arg) for arg in get_args(tp))


def holds_int(value: Any, at_least: int = 0) -> bool:
    """Whether ``value`` is an int or a list, tuple, set or dict holding one (not a bool), of
    ``at_least`` that size."""
    t = type(value)
    if t is int:
        return abs(value) >= at_least
    if t in (list, tuple, set, frozenset):
        return any(holds_int(item, at_least) for item in value)
    return t is dict and any(holds_int(item, at_least) for item in value.values())


def holds_infinity(value: Any, depth: int = 64) -> bool:
    """Whether ``value`` is an infinite float, or holds one: in a list, tuple, set, deque or
    dict, or a pydantic model's or a dataclass's field, down to ``depth``."""
    if isinstance(value, float):
        return math.isinf(value)
    if depth <= 0 or isinstance(value, type):
        return False
    if isinstance(value, dict):
        items: Any = value.values()
    elif isinstance(value, list | tuple | set | frozenset | collections.deque):
        items = value
    elif dataclasses.is_dataclass(value):
        items = (getattr(value, f.name, None) for f in dataclasses.fields(value))
    elif hasattr(type(value), "__pydantic_fields__"):  # (a model: its fields' values)
        items = vars(value).values()
    else:
        return False
    return any(holds_infinity(item, depth - 1) for item in items)


def build_matcher(tp: Any) -> Matcher:
    """Compile an annotation into a fast runtime check ``value -> bool``."""
    if tp is Any or tp is object:
        return lambda value: True
    _no_typeddict(tp)
    if tp in _NONE_TYPES:
        return lambda value: value is None
    origin = get_origin(tp)
    if origin is typing.Annotated:  # (a class on 3.11: it was matched as one, never true)
        raise DefinitionError(
            f"{shown(tp, 200)} is not supported as a message or answer type: its metadata "
            "(a constraint, say) would not be checked; use the type it annotates, or a pydantic "
            "model with the constrained field"
        )
    if origin in (Union, types.UnionType):
        parts = [build_matcher(a) for a in get_args(tp)]
        return lambda value: any(p(value) for p in parts)
    if origin is typing.Literal:
        # by type and value: ``1 == True == 1.0``, but Literal[1] accepts neither True nor 1.0
        allowed = frozenset(_literal_keys(get_args(tp)))
        return lambda value: _literal_key(value) in allowed
    if origin in (list, typing.List):  # noqa: UP006
        (item_tp,) = get_args(tp) or (Any,)
        item = build_matcher(item_tp)
        return lambda value: type(value) is list and all(item(v) for v in value)
    if origin in (dict, typing.Dict):  # noqa: UP006
        key_tp, val_tp = get_args(tp) or (Any, Any)
        key, val = build_matcher(key_tp), build_matcher(val_tp)
        return lambda value: (
            isinstance(value, dict) and all(key(k) and val(v) for k, v in value.items())
        )
    if origin is tuple:
        return _tuple_matcher(get_args(tp))
    if origin in (set, frozenset):  # each item too: {"x"} is no set[bytes] (tester 99)
        (item_tp,) = get_args(tp) or (Any,)
        item = build_matcher(item_tp)
        return lambda value: isinstance(value, origin) and all(item(v) for v in value)
    if origin is not None and isinstance(origin, type):
        return lambda value: isinstance(value, origin)
    if tp is int:
        # bool is a subclass of int, but a handler for int should not receive True.
        return lambda value: isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return lambda value: isinstance(value, float | int) and not isinstance(value, bool)
    if isinstance(tp, type):
        if getattr(tp, "_is_protocol", False) and not getattr(tp, "_is_runtime_protocol", False):
            raise DefinitionError(
                f"{type_name(tp)} is a Protocol not marked @runtime_checkable, so no value can "
                "be checked against it at run time (a bare TypeError came from the first value "
                "checked); as a message type, mark it @typing.runtime_checkable; as an answer "
                "type, use a pydantic model or a dataclass"
            )
        return lambda value: isinstance(value, tp)
    if isinstance(tp, typing.NewType):
        raise DefinitionError(
            f"{type_name(tp)} is a NewType, whose values are plain {type_name(tp.__supertype__)} "
            f"at run time, so nothing tells them apart; annotate with "
            f"{type_name(tp.__supertype__)}, or use a class"
        )
    raise DefinitionError(f"unsupported annotation {shown(tp, 200)}")


def _tuple_items(args: tuple[Any, ...]) -> tuple[list[Any], bool]:
    """A tuple annotation's arguments as (item types, any length): ``tuple[int, str]`` is
    ``([int, str], False)``, ``tuple[int, ...]`` ``([int], True)``, ``tuple[()]`` ``([],
    False)``."""
    if args == ((),):
        return [], False
    if len(args) == 2 and args[1] is Ellipsis:
        return [args[0]], True
    return list(args), False


def _tuple_matcher(args: tuple[Any, ...]) -> Matcher:
    """``tuple[int, str]`` (that many items, each its type), ``tuple[int, ...]`` (any number of
    ints), ``tuple[()]`` (empty); a bare ``tuple`` takes any tuple."""
    if not args:
        return lambda value: isinstance(value, tuple)
    types, any_length = _tuple_items(args)
    if any_length:
        item = build_matcher(types[0])
        return lambda value: isinstance(value, tuple) and all(item(v) for v in value)
    items = [build_matcher(a) for a in types]
    n = len(items)
    return lambda value: (
        isinstance(value, tuple)
        and len(value) == n
        and all(m(v) for m, v in zip(items, value, strict=True))
    )


def is_assignable(source: Any, target: Any) -> bool:
    """Whether a value declared as ``source`` can be accepted by a parameter declared ``target``.

    Unions are handled per member: a source union is assignable when *any* member is, because the
    question the builder asks is "can this edge ever carry a message?".
    """
    if target is Any or target is object or source is Any:
        return True
    with contextlib.suppress(TypeError):  # (an unhashable annotation compares as well)
        if source == target:  # (``Callable[[int], int]`` to itself was refused)
            return True
    targets = union_members(target)
    sources = union_members(source)
    if len(targets) > 1 or len(sources) > 1:
        return any(is_assignable(s, t) for s in sources for t in targets)
    if source in _NONE_TYPES or target in _NONE_TYPES:
        return source in _NONE_TYPES and target in _NONE_TYPES
    s_origin, t_origin = get_origin(source), get_origin(target)
    if t_origin is typing.Literal:
        return s_origin is typing.Literal and set(_literal_keys(get_args(source))) <= set(
            _literal_keys(get_args(target))
        )
    if s_origin is typing.Literal:
        accepts = build_matcher(target)
        return all(accepts(v) for v in get_args(source))
    if t_origin is not None or s_origin is not None:
        s_base, t_base = s_origin or source, t_origin or target
        if not (isinstance(s_base, type) and isinstance(t_base, type)):
            return False
        if not issubclass(s_base, t_base):
            return False
        s_args, t_args = get_args(source), get_args(target)
        if t_base is tuple and s_args and t_args:
            return _tuple_assignable(s_args, t_args)
        if not s_args or not t_args or len(s_args) != len(t_args):
            return True
        return all(is_assignable(a, b) for a, b in zip(s_args, t_args, strict=True))
    if target is float and source is int:
        return True
    _no_typeddict(source)
    _no_typeddict(target)
    if source is bool and target in (int, float):
        return False  # as at run time: a handler of int or float is not given True
    if not (isinstance(source, type) and isinstance(target, type)):
        return False
    try:
        return issubclass(source, target)
    except TypeError:  # a runtime-checkable Protocol with data members: values tell, not types
        return True  # (it was a bare TypeError out of build(): outside tester 152)


def _tuple_assignable(s_args: tuple[Any, ...], t_args: tuple[Any, ...]) -> bool:
    """Whether a tuple declared ``tuple[s_args]`` can fit ``tuple[t_args]`` (``X, ...`` is any
    number of X, ``()`` none): ``tuple[int, int]`` fits ``tuple[int, ...]``, and both fit
    ``tuple[int, ...]`` -- a ``...`` compared with a ``...`` used to refuse every such edge."""

    s_items, s_any_length = _tuple_items(s_args)
    t_items, t_any_length = _tuple_items(t_args)
    if t_any_length:
        return all(is_assignable(i, t_items[0]) for i in s_items)
    if s_any_length:  # some length of it may fit
        return all(is_assignable(s_items[0], t) for t in t_items)
    return len(s_items) == len(t_items) and all(
        is_assignable(a, b) for a, b in zip(s_items, t_items, strict=True)
    )


def _literal_key(value: Any) -> tuple[type, Any]:
    try:
        hash(value)
    except TypeError:
        return (type(value), id(value))  # never equal to a (hashable) Literal member
    return (type(value), value)


def _literal_keys(values: tuple[Any, ...]) -> list[tuple[type, Any]]:
    return [(type(v), v) for v in values]


def depends_on_value(tp: Any) -> bool:
    """Whether matching ``tp`` looks at a value's contents, not only at its class.

    ``Literal["yes"]`` accepts the str "yes" but not "no", and ``list[int]`` a list of ints only:
    a dispatch cache keyed by ``type(message)`` must not remember a choice made on such a type.
    """
    if tp is Any or tp is object or tp in _NONE_TYPES:
        return False
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        return any(depends_on_value(a) for a in get_args(tp))
    if origin is typing.Literal:
        return True
    if origin in (list, typing.List, dict, typing.Dict):  # noqa: UP006
        return any(a is not Any for a in get_args(tp))
    return False


def concrete_classes(tp: Any) -> Iterator[type]:
    """Every user-defined class mentioned anywhere in an annotation (for the type registry)."""
    if tp is Any or tp in _NONE_TYPES:
        return
    origin = get_origin(tp)
    if origin is typing.Literal:  # Literal[Color.RED] needs Color to be decodable
        for arg in get_args(tp):
            if isinstance(arg, enum.Enum):
                yield type(arg)
        return
    if origin is not None:
        if (
            isinstance(origin, type)
            and origin.__module__ != "builtins"
            and origin is not types.UnionType
        ):
            yield origin
        for arg in get_args(tp):
            if not isinstance(arg, str | int | bool | bytes):
                yield from concrete_classes(arg)
        return
    if isinstance(tp, type) and tp.__module__ not in ("builtins", "typing"):
        yield tp
