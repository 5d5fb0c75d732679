"""Keys of an answer that no field takes.

A person answers a request with JSON-shaped data (``respond --data``, an AG-UI resume, a dict
passed to ``Runtime.respond``). Pydantic drops a key no field takes unless the model says
otherwise (``extra="ignore"`` is its default), so a typo -- ``"feedbak"`` for ``"feedback"`` --
would vanish while the run goes on without it. So would a field's Python name where the model
reads only its alias. ``unknown_keys`` finds such keys by walking the validated answer beside
the data it came from, in every model, dataclass and TypedDict that does not declare its own
``extra`` setting (one that does gets what it declares).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from pydantic import AliasChoices, AliasPath, BaseModel, RootModel
from typing_extensions import is_typeddict


def unknown_keys(
    value: Any, data: Any, at: str = "", hint: Any = None
) -> list[tuple[str, type | str]]:
    """(path, class) of each key of ``data`` that the model, dataclass or TypedDict validated
    from it takes no value from; ``value`` is what ``data`` validated as, ``hint`` the
    annotation it was validated against where known (a plain dict does not say it was a
    TypedDict)."""
    found: list[tuple[str, type | str]] = []
    if isinstance(value, RootModel):  # its data is the root's
        return unknown_keys(value.root, data, at, _root_hint(type(value)))
    if isinstance(data, dict):
        fields = _fields_by_key(type(value))
        if fields is None and isinstance(value, dict) and is_typeddict(hint):
            fields = _typeddict_keys(hint)
            owner: type | str = hint.__name__
        else:
            owner = type(value)
        if fields is not None:
            checked, attributes, hints = fields
            for key, item in data.items():
                attribute = attributes.get(key)
                if attribute is None:
                    if checked:
                        found.append((f"{at}{key}", owner))
                    continue
                if isinstance(value, dict):
                    inner = value.get(attribute)
                else:
                    inner = getattr(value, attribute, None)
                found += unknown_keys(inner, item, f"{at}{key}.", hints.get(attribute))
        elif isinstance(value, dict):
            item_hint = _args(hint)[-1:] or [None]
            if len(data) == len(value):  # (validation keeps the order; keys may be converted)
                pairs = list(zip(data.items(), value.values(), strict=True))
            else:
                pairs = [((k, item), value[k]) for k, item in data.items() if k in value]
            for (key, item), validated in pairs:
                found += unknown_keys(validated, item, f"{at}{key}.", item_hint[0])
    elif (
        isinstance(data, list | tuple)
        and isinstance(value, list | tuple)
        and (len(data) == len(value))
    ):
        item_hints = _args(hint)
        for i, (item, validated) in enumerate(zip(data, value, strict=True)):
            each = item_hints[0] if len(item_hints) == 1 else None
            found += unknown_keys(validated, item, f"{at}{i}.", each)
    return found


Keys = tuple[bool, dict[str, str], dict[str, Any]]
"""Whether unknown keys are refused, the attribute each accepted key fills, and each
attribute's annotation."""


def _fields_by_key(cls: type) -> Keys | None:
    """For a model or dataclass: whether its unknown keys are refused (it declares no ``extra``
    of its own), the attribute each key it reads fills, and each attribute's annotation;
    ``None`` for other classes. A key counts as read as pydantic reads it: by the field's
    validation alias or alias when it has one, by its name when it has none or the model
    validates by name too."""
    if isinstance(cls, type) and issubclass(cls, BaseModel):
        config: Any = cls.model_config
        infos: dict[str, Any] = dict(cls.model_fields)
    elif dataclasses.is_dataclass(cls):
        config = getattr(cls, "__pydantic_config__", None) or {}
        infos = getattr(cls, "__pydantic_fields__", None) or {
            f.name: None for f in dataclasses.fields(cls)
        }
    else:
        return None
    by_name = bool(config.get("validate_by_name") or config.get("populate_by_name"))
    by_alias = config.get("validate_by_alias", True) is not False
    attributes: dict[str, str] = {}
    hints: dict[str, Any] = {}
    for name, info in infos.items():
        hints[name] = getattr(info, "annotation", None)
        keys = _alias_keys(info) if by_alias else []
        if not keys or by_name:
            attributes[name] = name
        for key in keys:
            attributes[key] = name
    # keys a class reads beside its fields (a ``before`` validator's): declared by the class,
    # as its stored name is (``__workflow_type__``)
    for key in getattr(cls, "__workflow_input_keys__", ()):
        attributes.setdefault(key, key)
    return "extra" not in config, attributes, hints


def _alias_keys(info: Any) -> list[str]:
    """The keys pydantic reads a field's value from instead of its name: its validation alias
    if it has one, else its alias (a path: its first key)."""
    alias = getattr(info, "validation_alias", None)
    if alias is None:
        alias = getattr(info, "alias", None)
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias]
    keys = []
    for choice in choices:
        if isinstance(choice, AliasPath):
            choice = choice.path[0] if choice.path else None
        if isinstance(choice, str):
            keys.append(choice)
    return keys


def _typeddict_keys(td: Any) -> Keys:
    config = getattr(td, "__pydantic_config__", None) or {}
    hints = typing.get_type_hints(td)
    return "extra" not in config, {k: k for k in hints}, hints


def _root_hint(cls: type) -> Any:
    field = getattr(cls, "model_fields", {}).get("root")
    return getattr(field, "annotation", None)


def _args(hint: Any) -> list[Any]:
    """The type arguments of ``list[X]``, ``tuple[X, ...]``, ``dict[K, V]`` (not of unions)."""
    if hint is None or typing.get_origin(hint) not in (list, tuple, dict, set, frozenset):
        return []
    return [a for a in typing.get_args(hint) if a is not Ellipsis]


_JSON_SCALARS = (str, int, float, bool, type(None))


def is_json_data(data: Any, max_depth: int) -> bool:
    """Whether ``data`` is made of JSON values only: dicts with str keys, lists, str, int, float,
    bool and None (walked without recursion: it may be deep). ``ValueError`` if it nests
    deeper than ``max_depth``: a cycle (``d["self"] = d``) was walked for ever, hanging the
    event loop, and 3,000 levels failed later with a bare ``RecursionError``."""
    stack = [(data, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)
        if kind is dict or kind is list:
            if depth >= max_depth:
                raise ValueError(f"it nests deeper than {max_depth} levels (a cycle?)")
            if kind is dict:
                if not all(type(k) is str for k in item):
                    return False
                stack.extend((v, depth + 1) for v in item.values())
            else:
                stack.extend((v, depth + 1) for v in item)
        elif kind not in _JSON_SCALARS:
            return False
    return True
