"""Keys of an answer that no field takes.

A person answers a request with JSON-shaped data (``respond --data``, an AG-UI resume, a dict
passed to ``Runtime.respond``). Pydantic drops a key no field takes unless the model says
otherwise (``extra="ignore"`` is its default), so a typo -- ``"feedbak"`` for ``"feedback"`` --
would vanish while the run goes on without it. ``unknown_keys`` finds such keys by walking the
validated answer beside the data it came from, in every model and dataclass that does not
declare its own ``extra`` setting (one that does gets what it declares).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import AliasChoices, BaseModel, RootModel


def unknown_keys(value: Any, data: Any, at: str = "") -> list[tuple[str, type]]:
    """(path, class) of each key of ``data`` that the model or dataclass validated from it has
    no field for; ``value`` is what ``data`` validated as."""
    found: list[tuple[str, type]] = []
    if isinstance(value, RootModel):  # its data is the root's
        return unknown_keys(value.root, data, at)
    if isinstance(data, dict):
        fields = _fields_by_key(type(value))
        if fields is not None:
            checked, attributes = fields
            for key, item in data.items():
                attribute = attributes.get(key)
                if attribute is None:
                    if checked:
                        found.append((f"{at}{key}", type(value)))
                    continue
                found += unknown_keys(getattr(value, attribute, None), item, f"{at}{key}.")
        elif isinstance(value, dict):
            for key, item in data.items():
                if key in value:  # (keys validated into other types are not followed)
                    found += unknown_keys(value[key], item, f"{at}{key}.")
    elif (
        isinstance(data, list | tuple)
        and isinstance(value, list | tuple)
        and (len(data) == len(value))
    ):
        for i, (item, validated) in enumerate(zip(data, value, strict=True)):
            found += unknown_keys(validated, item, f"{at}{i}.")
    return found


def _fields_by_key(cls: type) -> tuple[bool, dict[str, str]] | None:
    """For a model or dataclass: whether its unknown keys are refused (it declares no
    ``extra`` of its own) and the attribute each accepted key fills; ``None`` otherwise."""
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
    checked = "extra" not in config
    attributes: dict[str, str] = {}
    for name, info in infos.items():
        attributes[name] = name
        for key in _aliases(info):
            if key is None:  # an alias path: which keys it reads is not followed here
                checked = False
            else:
                attributes[key] = name
    return checked, attributes


def _aliases(info: Any) -> list[str | None]:
    """The keys a field is also given by (``None`` for an alias path)."""
    keys: list[str | None] = []
    for alias in (getattr(info, "alias", None), getattr(info, "validation_alias", None)):
        if alias is None:
            continue
        if isinstance(alias, str):
            keys.append(alias)
        elif isinstance(alias, AliasChoices):
            keys += [c if isinstance(c, str) else None for c in alias.choices]
        else:
            keys.append(None)
    return keys
