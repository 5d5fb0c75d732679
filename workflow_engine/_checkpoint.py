"""The checkpoint model and the store contract.

A :class:`Checkpoint` is everything needed to continue a run in another process: in-flight
messages, executor and shared state, fan-in buffers, pending/answered/cancelled requests, outputs
and status -- as versioned JSON (every payload already encoded by the named codec). ``changes``
says what differs from the parent checkpoint, so a store can write only that.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Sequence
from itertools import islice
from typing import (
    Annotated,
    Any,
    Literal,
    Protocol,
    Self,
    TypeVar,
    get_args,
    get_origin,
    runtime_checkable,
)

from annotated_types import Ge
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
)
from pydantic_core import SchemaValidator, core_schema

from ._codec import (
    UNREADABLE_INT,
    TaggedJsonCodec,
    holds_unreadable_number,
    starts_with,
    strictly_equal,
)
from ._errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointNotLatestError,
    CheckpointVersionError,
    UsageError,
    WorkflowError,
    shown,
)
from ._events import WorkflowRunState
from ._stored_items import read_placeholders

CHECKPOINT_SCHEMA_VERSION = 7
"""1: every answered request kept whole in ``answered_requests``. 2: only the answers applied by
the checkpoint's own commit or still in flight are kept whole; every other answer is a digest in
``answered_digests`` (a 1,000-turn chat parsed 1,000 stored answers at every resume). 3: a span
leaves out a state value unchanged since its base (``executor_state_same``,
``shared_state_same``): a big value set once was stored again in every span. 4: a message in
flight whose field holds a list that extends the same field of a message before it (an agent's
conversation passed on with its new turn) is stored as the items it gained
(``CheckpointChanges.message_appends``, ``CheckpointSpan.messages_kept``): a loop of two agents
wrote its whole conversation again at every superstep. 5: a store may keep a snapshot's long
lists apart from its body, which then holds them empty (``SqliteStore``'s ``list_items``): an
engine that does not know to put them back refuses the checkpoint instead of reading them
empty. 6: a store may keep the long arrays of a large row as chunks shared with other rows
(``SqliteStore``'s ``list_chunks``), the row's text holding them empty: likewise refused by an
engine that would read them empty. 7: a span leaves out the pending requests it keeps of its
base's (``CheckpointSpan.pending_kept``): a run waiting on 2,000 requests stored them all again
in every span while they were answered one at a time (36 MB: outside tester 215)."""

_M = TypeVar("_M", bound=BaseModel)

Count = Annotated[int, Strict(), Ge(0)]
"""How many items a delta or a span keeps of a list before it: a JSON integer, never negative
(a damaged one -- ``-5``, ``true``, ``"32"`` -- cut a conversation short and read on)."""


# Default factories are plain functions, not ``list``/``dict``/``time.time``: pydantic reads each
# factory's signature when it builds a model class, and a builtin's is parsed from its text
# signature (~75 µs a field, ~1.5 ms of importing this module).


def _new_list() -> list[Any]:
    return []


def _new_dict() -> dict[str, Any]:
    return {}


def _empty(value: Any) -> bool:
    return not value


def _now() -> float:
    return time.time()


_ALL_FIELDS: dict[type, set[str]] = {}
"""Per model class, the fields-set its instances built by ``construct`` with every field share:
a set per instance is one more object each garbage collection walks (five per run in flight).
Shared safely: these models are frozen, and ``model_copy`` copies the set before adding to it."""


def construct(cls: type[_M], **values: Any) -> _M:
    """Build a model from already-valid values, every field given, without validation.

    The runner builds a checkpoint per superstep from data it produced itself; pydantic's
    ``model_construct`` spends most of a superstep's budget re-deriving defaults it won't use.
    """
    obj = cls.__new__(cls)
    setattr_ = object.__setattr__
    setattr_(obj, "__dict__", values)
    fields = _ALL_FIELDS.get(cls)
    if fields is None or fields != values.keys():
        fields = set(values)
        if len(fields) == len(cls.model_fields):
            _ALL_FIELDS[cls] = fields
    setattr_(obj, "__pydantic_fields_set__", fields)
    setattr_(obj, "__pydantic_extra__", None)
    setattr_(obj, "__pydantic_private__", None)
    return obj


def _fields_of(data: Any) -> dict[str, Any] | None:
    """The fields of an encoded message: a registered class's payload (``{"$type", "data"}``)
    or a plain dict's own items; None for anything else."""
    if type(data) is not dict:
        return None
    if "$type" in data:
        payload = data.get("data")
        return payload if len(data) == 2 and type(payload) is dict else None
    return data


def _with_field(data: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    """``data`` (an encoded message, see ``_fields_of``) with ``field`` set to ``value``."""
    if "$type" in data:
        return {**data, "data": {**data["data"], field: value}}
    return {**data, field: value}


def message_prefixes(
    messages: Sequence[MessageRecord], before: Sequence[MessageRecord]
) -> list[tuple[int, str, int, int]]:
    """For each message of ``messages`` whose field holds a list beginning exactly with the
    items (two or more) of the same field of a message of ``before`` (an agent's conversation,
    passed on with its new turn): ``(index, field, index in before, items kept)``, the longest
    such prefix. What lets a delta or a span store only the new items.

    Earlier lists are indexed by field and length, and a candidate must end with the item the
    new list has at that place before the whole prefix is compared: a broadcast of one long
    conversation to many receivers costs about what encoding it does, not that times their
    number."""
    found: list[tuple[int, str, int, int]] = []
    if not before:
        return found
    lists: dict[str, dict[int, list[_Held]]] | None = None  # field -> length -> lists
    for i, message in enumerate(messages):
        data = message.data
        if type(data) is not dict:  # (most messages: a number, a text)
            continue
        fields = _fields_of(data)
        if not fields:
            continue
        for field, value in fields.items():
            if type(value) is not list or len(value) < 2:
                continue
            if lists is None:
                lists = _lists_by_field(before)
            by_length = lists.get(field)
            if by_length:
                kept = _longest_prefix(value, by_length)
                if kept is not None:
                    found.append((i, field, *kept))
    return found


_Held = tuple[int, list[Any]]
"""A list a message in flight holds: (the message's index, the list)."""


def _lists_by_field(messages: Sequence[MessageRecord]) -> dict[str, dict[int, list[_Held]]]:
    """field -> length -> [(index, list)] of the lists (two items or more) ``messages`` hold,
    lengths longest first."""
    out: dict[str, dict[int, list[_Held]]] = {}
    for j, message in enumerate(messages):
        fields = _fields_of(message.data)
        for field, value in (fields or {}).items():
            if type(value) is list and len(value) > 1:
                out.setdefault(field, {}).setdefault(len(value), []).append((j, value))
    return {f: dict(sorted(by.items(), reverse=True)) for f, by in out.items()}


def _longest_prefix(value: list[Any], by_length: dict[int, list[_Held]]) -> tuple[int, int] | None:
    """(index, length) of the longest of ``by_length``'s lists that ``value`` begins with."""
    for n, candidates in by_length.items():
        if n > len(value):
            continue
        at = value[n - 1]
        for j, old in candidates:
            if old[-1] == at and starts_with(value, old):
                return j, n
    return None


def _cut_messages(
    messages: Sequence[MessageRecord], kept: Sequence[tuple[int, str, int, int]]
) -> list[MessageRecord]:
    """``messages`` with each list ``kept`` names cut to the items after the kept ones."""
    out = list(messages)
    for i, field, _, n in kept:
        record = out[i]
        fields = _fields_of(record.data)
        assert fields is not None  # (message_prefixes found a list there)
        data = _with_field(record.data, field, fields[field][n:])
        out[i] = record.model_copy(update={"data": data})
    return out


def _grown_messages(
    messages: Sequence[MessageRecord],
    before: Sequence[MessageRecord],
    kept: Sequence[tuple[int, str, int, int]],
) -> list[MessageRecord]:
    """The messages ``_cut_messages`` cut, whole again: each cut list after the items it kept
    of the message of ``before`` it names. ``ValueError`` when they do not fit (damaged)."""
    out = list(messages)
    for i, field, j, n in kept:
        try:
            tail = _fields_of(out[i].data)[field]  # type: ignore[index]
            head = _fields_of(before[j].data)[field]  # type: ignore[index]
        except (IndexError, KeyError, TypeError):
            raise ValueError(
                f"message {i} keeps items of message {j} before it, which has no list {field!r}"
            ) from None
        if type(tail) is not list or type(head) is not list or len(head) < n:
            raise ValueError(
                f"message {i} keeps {n} items of {field!r} of message {j} before it, which "
                "does not have them"
            )
        data = _with_field(out[i].data, field, [*head[:n], *tail])
        out[i] = out[i].model_copy(update={"data": data})
    return out


class MessageRecord(BaseModel):
    """An encoded message in flight (``request_id`` set when it answers a request_info)."""

    model_config = ConfigDict(frozen=True)

    source_id: str
    target_id: str
    data: Any
    request_id: str | None = None
    message_id: str | None = None
    """The delivery's deterministic id (``_identity``); None in checkpoints before it existed."""


class RequestRecord(BaseModel):
    """A request as stored: who answers it, the encoded question, the expected answer type."""

    model_config = ConfigDict(frozen=True)

    request_id: str
    port_id: str
    source_executor_id: str
    kind: Literal["port", "executor", "effect"]
    data: Any
    response_type: str
    superstep: int


class CheckpointChanges(BaseModel):
    """What this checkpoint changed relative to its parent (empty for a first checkpoint)."""

    model_config = ConfigDict(frozen=True)

    executor_state_keys: dict[str, list[str]] = Field(default_factory=_new_dict)
    executor_state_appends: dict[str, dict[str, Count]] = Field(default_factory=_new_dict)
    """Of those keys, the ones whose list value only grew: key -> items kept from the parent
    (a delta then stores only the new items, so a growing conversation is stored once)."""
    shared_state_keys: list[str] = Field(default_factory=_new_list)
    shared_state_appends: dict[str, Count] = Field(default_factory=_new_dict, exclude_if=_empty)
    """Of those keys, the ones whose list value only grew: key -> items kept from the parent.
    Left out of the JSON when empty, so a run that never grows a shared list writes exactly the
    bytes it wrote before the field existed."""
    outputs_added: Count = 0
    requests_added: list[str] = Field(default_factory=_new_list)
    requests_answered: list[str] = Field(default_factory=_new_list)
    requests_cancelled: list[str] = Field(default_factory=_new_list)
    message_appends: list[tuple[Count, str, Count, Count]] = Field(
        default_factory=_new_list, exclude_if=_empty
    )
    """Messages in flight whose field (of the message's own fields) holds a list that begins
    with the items of the same field of a message of the parent checkpoint: ``(message index,
    field, index of the parent's message, items kept)``; a delta stores only the rest. (See
    :func:`message_prefixes`; left out of the JSON when empty.)"""


def _refuse_newer(cls: type[BaseModel], version: Any, handler: Any) -> int:
    """A checkpoint from a newer engine is refused by name (a newer layout read as this one
    could drop what it does not know); a version no engine writes (not a JSON integer, or
    below 1) is damage. A check of the field, not of the whole input: a model validator that
    runs before the fields makes pydantic turn JSON into Python objects first and validate
    those, which reads a snapshot about 1.3x slower. ``schema_version`` is the first field, so
    this runs before any other field can fail; :class:`_Versioned` names the checkpoint."""
    if type(version) is not int:  # every engine writes a JSON integer
        raise ValueError(f"{shown(version)} is not a schema version")
    checked: int = handler(version)
    if checked < 1:
        raise ValueError(f"{checked} is not a schema version")
    if checked > CHECKPOINT_SCHEMA_VERSION:
        refusal = newer_version_refusal(checked)
        error = CheckpointVersionError(f"a checkpoint {refusal}")
        error.refusal = refusal  # type: ignore[attr-defined]
        raise error
    return checked


def newer_version_refusal(version: int) -> str:
    """What is said of a checkpoint (or its row) whose schema ``version`` is newer than this
    engine reads, after naming it."""
    return (
        f"has schema version {version}, written by a newer workflow-engine; this version reads "
        f"up to {CHECKPOINT_SCHEMA_VERSION}. Upgrade workflow-engine to resume it."
    )


def version_refusal(exc: CheckpointVersionError) -> str:
    """What ``exc`` says of the version alone, without the checkpoint it names."""
    return getattr(exc, "refusal", str(exc))


def _named_refusal(exc: CheckpointVersionError, given: Any) -> CheckpointVersionError:
    """``exc``, raised reading ``given`` (JSON text or a dict), with the checkpoint (and its
    run) named: the field's check cannot see them, so they are read from ``given`` again, on
    this error only."""
    data = given
    if isinstance(given, str | bytes | bytearray):
        try:
            data = json.loads(given)
        except ValueError:
            data = None
    named = data if isinstance(data, dict) else {}
    inner = named.get("checkpoint")
    if "checkpoint_id" not in named and isinstance(inner, dict):  # a span: its checkpoint
        named = inner
    checkpoint_id, run = named.get("checkpoint_id"), named.get("run_id")
    refusal = version_refusal(exc)
    what = f"checkpoint {shown(checkpoint_id)}" if checkpoint_id else "a checkpoint"
    error = CheckpointVersionError(f"{what}{f' of run {shown(run)}' if run else ''} {refusal}")
    error.refusal = refusal  # type: ignore[attr-defined]
    return error


class _Versioned(BaseModel):
    """A checkpoint model that names the checkpoint it refuses as too new when read from a
    dict or JSON text. (Not when built from keywords: a model with its own ``__init__`` is
    validated through it, in Python, even from JSON -- the slow path again.)"""

    @classmethod
    def model_validate(cls, obj: Any, **options: Any) -> Self:
        try:
            return super().model_validate(obj, **options)
        except CheckpointVersionError as exc:
            raise _named_refusal(exc, obj) from None

    @classmethod
    def model_validate_json(cls, json_data: str | bytes | bytearray, **options: Any) -> Self:
        try:
            return super().model_validate_json(json_data, **options)
        except CheckpointVersionError as exc:
            raise _named_refusal(exc, json_data) from None


class Checkpoint(_Versioned):
    """A run's complete, JSON-serializable state after a superstep (or on admit/continue)."""

    model_config = ConfigDict(frozen=True)

    _refuse_newer = field_validator("schema_version", mode="wrap")(_refuse_newer)

    schema_version: int = CHECKPOINT_SCHEMA_VERSION
    codec: str
    checkpoint_id: str
    parent_id: str | None = None
    run_id: str
    workflow_name: str
    workflow_signature: str
    superstep: int
    status: WorkflowRunState
    created_at: float = Field(default_factory=_now)
    step_secret: str = ""
    """The run's random secret for request ids and idempotency keys ("" in old checkpoints)."""
    messages: list[MessageRecord] = Field(default_factory=_new_list)
    executor_states: dict[str, dict[str, Any]] = Field(default_factory=_new_dict)
    shared_state: dict[str, Any] = Field(default_factory=_new_dict)
    fan_in_buffers: dict[str, dict[str, list[Any]]] = Field(default_factory=_new_dict)
    pending_requests: dict[str, RequestRecord] = Field(default_factory=_new_dict)
    answered_requests: dict[str, Any] = Field(default_factory=_new_dict)
    """Answers kept whole (``{"data", "response_type"[, "request"]}``): those this checkpoint's
    commit applied and those whose message is still in flight (all of them in version 1)."""
    answered_digests: dict[str, str] = Field(default_factory=_new_dict)
    """Every other answered request: ``"<answer digest> <response type>"`` -- enough to refuse a
    different answer and accept the same one again, at a bounded size per answer."""
    cancelled_requests: list[str] = Field(default_factory=_new_list)
    outputs: list[Any] = Field(default_factory=_new_list)
    changes: CheckpointChanges = Field(default_factory=CheckpointChanges)

    def answered_ids(self) -> list[str]:
        """Every request the run has answered (kept whole or as a digest)."""
        return [*self.answered_digests, *self.answered_requests]

    def to_json(self) -> str:
        read_placeholders(self.executor_states)  # (a store's error raised as itself)
        text = self.model_dump_json()
        if holds_unreadable_number(text):
            raise CheckpointError(
                f"checkpoint {self.checkpoint_id} of run {self.run_id!r} holds {UNREADABLE_INT}"
            )
        return text

    @classmethod
    def from_json(cls, text: str | bytes) -> Checkpoint:
        """The checkpoint ``to_json`` wrote. Text that is not one is ``CheckpointError`` saying
        where it is wrong (``CheckpointVersionError`` for a newer engine's)."""
        try:
            return cls.model_validate_json(text)
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            where = ".".join(str(part) for part in first["loc"])
            more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
            raise CheckpointError(
                f"not a checkpoint: {where + ': ' if where else ''}{first['msg']}{more}"
            ) from None


@runtime_checkable
class CheckpointStore(Protocol):
    """Where checkpoints live. The runner saves one per superstep and fails the run if it can't."""

    async def save(self, checkpoint: Checkpoint) -> None: ...

    async def load(self, checkpoint_id: str) -> Checkpoint:
        """The checkpoint, or ``CheckpointNotFoundError``."""
        ...

    async def latest(self, run_id: str) -> Checkpoint | None: ...

    async def list(self, run_id: str) -> Sequence[Checkpoint]:
        """A run's checkpoints, oldest first."""
        ...

    async def delete(self, checkpoint_id: str) -> None: ...


class InMemoryCheckpointStore:
    """Keeps checkpoints in a dict: for tests and short-lived runs. Checkpoints are immutable,
    so storing the objects is as safe as storing their JSON."""

    def __init__(self) -> None:
        self._by_id: dict[str, Checkpoint] = {}
        self._by_run: dict[str, list[str]] = {}

    async def save(self, checkpoint: Checkpoint) -> None:
        """Append ``checkpoint``; like every store, refuse one that does not follow the run's
        latest (``CheckpointNotLatestError``): a run's history never forks."""
        ids = self._by_run.get(checkpoint.run_id)
        parent = checkpoint.parent_id
        if ids and parent is not None and parent != ids[-1]:
            raise CheckpointNotLatestError(
                f"run {checkpoint.run_id!r}: checkpoint {checkpoint.checkpoint_id} follows "
                f"{parent}, but the run's latest checkpoint is {ids[-1]}; continue from the "
                "latest, or fork it into a new run"
            )
        self._by_id[checkpoint.checkpoint_id] = checkpoint
        self._by_run.setdefault(checkpoint.run_id, []).append(checkpoint.checkpoint_id)

    async def load(self, checkpoint_id: str) -> Checkpoint:
        try:
            return self._by_id[checkpoint_id]
        except KeyError:
            raise CheckpointNotFoundError(f"no checkpoint {checkpoint_id!r}") from None

    async def latest(self, run_id: str) -> Checkpoint | None:
        ids = self._by_run.get(run_id)
        return self._by_id[ids[-1]] if ids else None

    async def list(self, run_id: str) -> Sequence[Checkpoint]:
        return [self._by_id[i] for i in self._by_run.get(run_id, [])]

    async def delete(self, checkpoint_id: str) -> None:
        cp = self._by_id.pop(checkpoint_id, None)
        if cp is not None:
            self._by_run[cp.run_id].remove(checkpoint_id)


class CheckpointDelta(_Versioned):
    """A checkpoint written as what changed since its parent: what a durable store persists for
    every superstep between snapshots. ``apply_delta(parent, delta_of(cp)) == cp``."""

    model_config = ConfigDict(frozen=True)

    _refuse_newer = field_validator("schema_version", mode="wrap")(_refuse_newer)

    schema_version: int = CHECKPOINT_SCHEMA_VERSION
    checkpoint_id: str
    parent_id: str
    superstep: int
    status: WorkflowRunState
    created_at: float
    messages: list[MessageRecord] = Field(default_factory=_new_list)
    executor_states: dict[str, dict[str, Any]] = Field(default_factory=_new_dict)
    shared_state: dict[str, Any] = Field(default_factory=_new_dict)
    fan_in_buffers: dict[str, dict[str, list[Any]]] = Field(default_factory=_new_dict)
    requests_added: dict[str, RequestRecord] = Field(default_factory=_new_dict)
    requests_answered: dict[str, Any] = Field(default_factory=_new_dict)
    requests_cancelled: list[str] = Field(default_factory=_new_list)
    outputs_added: list[Any] = Field(default_factory=_new_list)
    changes: CheckpointChanges = Field(default_factory=CheckpointChanges)


def delta_of(checkpoint: Checkpoint) -> CheckpointDelta:
    """The part of ``checkpoint`` that its ``changes`` say is new (it must have a parent)."""
    if checkpoint.parent_id is None:
        raise UsageError("a first checkpoint has no parent to be a delta of")
    ch = checkpoint.changes
    states = checkpoint.executor_states
    n_out = ch.outputs_added
    return construct(
        CheckpointDelta,
        schema_version=checkpoint.schema_version,
        checkpoint_id=checkpoint.checkpoint_id,
        parent_id=checkpoint.parent_id,
        superstep=checkpoint.superstep,
        status=checkpoint.status,
        created_at=checkpoint.created_at,
        messages=(
            _cut_messages(checkpoint.messages, ch.message_appends)
            if ch.message_appends
            else checkpoint.messages
        ),
        executor_states={
            e: {k: _tail(states[e][k], ch.executor_state_appends.get(e, {}).get(k)) for k in keys}
            for e, keys in ch.executor_state_keys.items()
        },
        shared_state={
            k: _tail(checkpoint.shared_state[k], ch.shared_state_appends.get(k))
            for k in ch.shared_state_keys
        },
        fan_in_buffers=checkpoint.fan_in_buffers,
        requests_added={
            r: checkpoint.pending_requests[r]
            for r in ch.requests_added
            if r in checkpoint.pending_requests
        },
        requests_answered={r: checkpoint.answered_requests[r] for r in ch.requests_answered},
        requests_cancelled=list(ch.requests_cancelled),
        outputs_added=checkpoint.outputs[len(checkpoint.outputs) - n_out :] if n_out else [],
        changes=ch,
    )


def apply_delta(parent: Checkpoint, delta: CheckpointDelta) -> Checkpoint:
    """Rebuild the checkpoint ``delta`` was taken from, given its parent."""
    return apply_deltas(parent, [delta])


def apply_deltas(parent: Checkpoint, deltas: Sequence[CheckpointDelta]) -> Checkpoint:
    """Rebuild the checkpoint the last of ``deltas`` was taken from, given the parent of the
    first: each delta applied in turn to one working copy of the parent's state, so folding a
    chain costs what its deltas hold, not the whole state once per delta."""
    if not deltas:
        raise UsageError("apply_deltas needs at least one delta")
    states = {e: dict(v) for e, v in parent.executor_states.items()}
    grown: set[tuple[str, str]] = set()  # lists this fold built (and so may extend in place)
    shared = dict(parent.shared_state)
    grown_shared: set[str] = set()  # shared lists this fold built
    pending = dict(parent.pending_requests)
    answered = dict(parent.answered_requests)
    digests = dict(parent.answered_digests)
    cancelled = list(parent.cancelled_requests)
    outputs = list(parent.outputs)
    messages: Sequence[MessageRecord] = parent.messages
    follows = parent.checkpoint_id
    for delta in deltas:
        if delta.parent_id != follows:
            raise UsageError(
                f"delta {delta.checkpoint_id} follows {delta.parent_id}, not {follows}"
            )
        follows = delta.checkpoint_id
        kept_messages = delta.changes.message_appends
        messages = (
            _grown_messages(delta.messages, messages, kept_messages)
            if kept_messages
            else delta.messages
        )
        appends = delta.changes.executor_state_appends
        for executor_id, values in delta.executor_states.items():
            state = states.setdefault(executor_id, {})
            kept_items = appends.get(executor_id, {})
            for key, value in values.items():
                kept = kept_items.get(key)
                if kept is None:
                    state[key] = value
                    grown.discard((executor_id, key))
                elif (executor_id, key) in grown:
                    del state[key][kept:]
                    state[key].extend(value)
                else:
                    state[key] = [*state[key][:kept], *value]
                    grown.add((executor_id, key))
        for request_id in (*delta.requests_answered, *delta.requests_cancelled):
            pending.pop(request_id, None)
        pending.update(delta.requests_added)
        shared_appends = delta.changes.shared_state_appends
        for key, value in delta.shared_state.items():
            kept = shared_appends.get(key)
            if kept is None:
                shared[key] = value
                grown_shared.discard(key)
            elif key in grown_shared:
                del shared[key][kept:]
                shared[key].extend(value)
            else:
                shared[key] = [*shared[key][:kept], *value]
                grown_shared.add(key)
        answered.update(delta.requests_answered)
        if delta.schema_version >= 2:
            keep = {m.request_id for m in delta.messages if m.request_id is not None}
            keep.update(delta.changes.requests_answered)
            answered = settle_answers(answered, digests, keep)
        cancelled.extend(delta.requests_cancelled)
        outputs.extend(delta.outputs_added)
    last = deltas[-1]
    return construct(
        Checkpoint,
        schema_version=last.schema_version,
        codec=parent.codec,
        checkpoint_id=last.checkpoint_id,
        parent_id=last.parent_id,
        run_id=parent.run_id,
        workflow_name=parent.workflow_name,
        workflow_signature=parent.workflow_signature,
        superstep=last.superstep,
        status=last.status,
        created_at=last.created_at,
        step_secret=parent.step_secret,
        messages=list(messages),
        executor_states=states,
        shared_state=shared,
        fan_in_buffers=dict(last.fan_in_buffers),
        pending_requests=pending,
        answered_requests=answered,
        answered_digests=digests,
        cancelled_requests=cancelled,
        outputs=outputs,
        changes=last.changes,
    )


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"))
"""``json.dumps(value, sort_keys=True, separators=(",", ":"))``, without building an encoder per
call (a fold digests every answer its deltas hold)."""


def canonical_answer(encoded: Any) -> str:
    """An encoded answer as canonical JSON, as a JSON client sees it (``json_seen``): keys
    sorted, a float with no fraction written as an integer, the codec's markers gone. JSON does
    not tell ``10`` from ``10.0`` (a browser sends ``10.0`` as ``10``), nor a tuple from a list,
    so an answer sent again through another client is the same answer, not a conflicting one."""
    return _CANONICAL.encode(json_seen(encoded))


_SEQUENCE_MARKERS = frozenset({"$tuple", "$set", "$frozenset"})
_VALUE_MARKERS = frozenset({"$decimal", "$uuid", "$date", "$datetime", "$time", "$timedelta"})


def json_seen(encoded: Any) -> Any:
    """An encoded value (the tagged codec's JSON) as a JSON client writes it back: a tuple or
    set as a list (a set in the wire's order), bytes as base64 text, a Decimal, UUID, date,
    time or duration as the text pydantic writes for it, a float with no fraction as an
    integer. What the wire does not show is kept where it tells different answers apart:
    which class a value is (``Approved`` and ``Rejected`` with the same fields; a client's
    answer is validated into its class again), which non-finite float (``inf``, ``-inf``,
    ``nan``: all null on the wire), a dict whose keys look like markers (``$dict``), and a
    dict's keys that are not text (``$items``: the wire writes them as text, where ``inf`` and
    ``"inf"`` would meet). What is not one of the codec's markers is left as it is (and so is a
    marker of the wrong shape, from a damaged record: it compares as written)."""
    kind = type(encoded)
    if kind is float:
        return int(encoded) if encoded.is_integer() else encoded
    if kind is list:
        return [json_seen(item) for item in encoded]
    if kind is not dict:
        return encoded
    if len(encoded) == 2 and "$type" in encoded and "data" in encoded:
        return {"$type": encoded["$type"], "data": json_seen(encoded["data"])}
    first = next(iter(encoded), None)
    if len(encoded) != 1 or not (type(first) is str and first.startswith("$")):
        # (by its keys, in whatever order they come: a dict whose first key only looked like
        # a marker was compared as written, its ``10.0`` apart from ``10``, in one key order)
        return {key: json_seen(item) for key, item in encoded.items()}
    body = encoded[first]
    if first == "$dict" and type(body) is dict:  # (kept: its keys look like markers)
        return {"$dict": {key: json_seen(item) for key, item in body.items()}}
    if first in _SEQUENCE_MARKERS and type(body) is list:
        items = [json_seen(item) for item in body]
        if first != "$tuple":  # (in the order the wire sends a set in)
            items.sort(key=lambda item: json.dumps(item, sort_keys=True))
        return items
    if first == "$items" and type(body) is list:  # (keys kept as they are: outside tester 98)
        if not all(type(pair) is list and len(pair) == 2 for pair in body):
            return encoded
        pairs = [[json_seen(key), json_seen(item)] for key, item in body]
        pairs.sort(key=lambda pair: json.dumps(pair[0], sort_keys=True))
        return {"$items": pairs}
    if first == "$float":
        return encoded
    if first == "$bytes":
        return body
    if first in _VALUE_MARKERS:
        from pydantic_core import to_jsonable_python

        try:
            return to_jsonable_python(_classless_codec().decode(encoded))
        except (WorkflowError, ValueError, TypeError, OverflowError):
            return encoded  # (damaged: compared as written)
    return encoded


@functools.cache
def _classless_codec() -> TaggedJsonCodec:
    """A codec registering no class: what decodes the markers that name none (a Decimal, a
    datetime)."""
    from ._registry import TypeRegistry

    return TaggedJsonCodec(TypeRegistry())


def integral_numbers(value: Any) -> Any:
    """``value`` with each float that has no fraction as an integer, inside dicts and lists
    too (``10.0`` as ``10``): a JSON value as a browser would write it."""
    kind = type(value)
    if kind is float:
        return int(value) if value.is_integer() else value
    if kind is dict:
        return {key: integral_numbers(item) for key, item in value.items()}
    if kind is list:
        return [integral_numbers(item) for item in value]
    return value


_SEEN_DIGEST = b"json-seen\n"
"""What ``answer_digest`` hashes before the canonical answer: its digests are apart from those
earlier versions wrote (of the answer with the codec's markers), so an answer never matches a
digest of another one written the other way (outside tester 97)."""


def answer_digest(encoded: Any) -> str:
    """A digest of an encoded answer: equal for equal answers (``canonical_answer``), 128 bits."""
    return hashlib.sha256(_SEEN_DIGEST + canonical_answer(encoded).encode()).hexdigest()[:32]


def answer_has_digest(encoded: Any, digest: str) -> bool:
    """Whether an encoded answer is the one a checkpoint digested: by ``answer_digest``, or as
    digested by earlier versions -- with the codec's markers kept (a tuple then differed from a
    list), and before that with integral floats as written (``10.0``): a run that paused before
    then keeps such digests."""
    if answer_digest(encoded) == digest:
        return True
    for older in (integral_numbers(encoded), encoded):
        if hashlib.sha256(_CANONICAL.encode(older).encode()).hexdigest()[:32] == digest:
            return True
    return False


def settle_answers(
    answered: dict[str, Any], digests: dict[str, str], keep: set[str]
) -> dict[str, Any]:
    """The answers to keep whole (those in ``keep``: just applied, or still in flight); every
    other one is added to ``digests`` (in place) as ``"<digest> <response type>"``.

    Runner and delta fold both call this with the same inputs, so a delta rebuilds exactly the
    checkpoint it was taken from.
    """
    if len(answered) <= len(keep) and all(r in keep for r in answered):
        return answered
    whole: dict[str, Any] = {}
    for request_id, record in answered.items():
        if request_id in keep:
            whole[request_id] = record
            continue
        if not isinstance(record, dict) or "response_type" not in record:
            raise ValueError(f"answered request {request_id!r} has no stored answer")
        digests[request_id] = f"{answer_digest(record.get('data'))} {record['response_type']}"
    return whole


def _tail(value: Any, kept: int | None) -> Any:
    """What a delta stores for a state value: the new items of a list that only grew."""
    return value if kept is None else value[kept:]


# --- spans: a checkpoint stored relative to an earlier one, so a fold skips the deltas between ---


class CheckpointSpan(_Versioned):
    """A whole checkpoint whose growing parts are stored as what they gained since ``base_id``
    (an earlier checkpoint of the run): every list in its state that extends the base's, its
    outputs, cancelled requests and answer digests. A store writes one now and then in place
    of a delta, so that restoring folds a snapshot, a few spans and the deltas after the last
    one -- not every delta since the snapshot -- while each item is still stored about once.
    ``apply_span(base, span_of(cp, base)) == cp``."""

    # (built when a run first writes or reads a span: a short run never does)
    model_config = ConfigDict(frozen=True, defer_build=True)

    _refuse_newer = field_validator("schema_version", mode="wrap")(_refuse_newer)

    schema_version: int = CHECKPOINT_SCHEMA_VERSION
    base_id: str
    checkpoint: Checkpoint
    """The checkpoint, with each value counted below cut to the items after the kept ones."""
    executor_state_kept: dict[str, dict[str, Count]] = Field(default_factory=_new_dict)
    shared_state_kept: dict[str, Count] = Field(default_factory=_new_dict)
    executor_state_same: dict[str, list[str]] = Field(default_factory=_new_dict)
    """Per executor, the keys whose values are the base's (``None`` in ``checkpoint``, where
    they keep their place among the keys)."""
    shared_state_same: list[str] = Field(default_factory=_new_list)
    outputs_kept: Count = 0
    cancelled_kept: Count = 0
    digests_kept: Count = 0
    messages_kept: list[tuple[Count, str, Count, Count]] = Field(
        default_factory=_new_list, exclude_if=_empty
    )
    """Messages whose list field keeps items of the base's messages (``message_prefixes``)."""
    pending_kept: Count = Field(0, exclude_if=_empty)
    """How many of the base's pending requests, in order and skipping ``pending_dropped``, begin
    the checkpoint's (left out of ``checkpoint``, whose pending requests are those after them)."""
    pending_dropped: list[str] = Field(default_factory=_new_list, exclude_if=_empty)
    """The base's pending requests among those that no longer are (answered or cancelled)."""
    written_before: Count = Field(0, exclude_if=_empty)
    """What its store had written for the run since the last snapshot, before this span (bytes
    of rows): a store whose snapshot policy counts them reads it back after a restart, since
    the deltas this span stands for are not read again. 0: not recorded."""


def read_span(body: str) -> CheckpointSpan:
    """``CheckpointSpan.model_validate_json(body)``, without building the model's validator.

    Pydantic builds a model's validator in Python, field by field: ~0.6 ms for a span's twelve,
    paid in a new process by the first resume that folds a span (most of W6's cold turn over
    its 5 ms target; built at import instead, it would add the same to every import). The
    validator here is assembled from the same fields' types as the core schemas pydantic makes
    of them (~0.15 ms), so it accepts and refuses what the model's would."""
    validator = _span_validator()
    try:
        values = validator.validate_json(body)
    except CheckpointVersionError as exc:
        raise _named_refusal(exc, body) from None
    return construct(CheckpointSpan, **values)


@functools.cache
def _span_validator() -> SchemaValidator:
    fields = {}
    for name, field in CheckpointSpan.model_fields.items():
        schema = _constrained(_core_schema_of(field.annotation), field.metadata)
        if name == "schema_version":
            schema = core_schema.no_info_wrap_validator_function(
                functools.partial(_refuse_newer, CheckpointSpan), schema
            )
        if field.default_factory is not None:
            schema = core_schema.with_default_schema(schema, default_factory=field.default_factory)
        elif not field.is_required():
            schema = core_schema.with_default_schema(schema, default=field.default)
        fields[name] = core_schema.typed_dict_field(schema, required=field.is_required())
    return SchemaValidator(core_schema.typed_dict_schema(fields))


def _core_schema_of(annotation: Any) -> core_schema.CoreSchema:
    """The core schema pydantic makes of a span field's type (of the types a span's fields
    have: a new one is refused here, by name, the first time a span is read)."""
    args = get_args(annotation)
    if get_origin(annotation) is Annotated:
        return _constrained(_core_schema_of(args[0]), args[1:])
    if annotation is int:
        return core_schema.int_schema()
    if annotation is str:
        return core_schema.str_schema()
    if annotation is Checkpoint:
        return Checkpoint.__pydantic_core_schema__
    if get_origin(annotation) is dict:
        return core_schema.dict_schema(_core_schema_of(args[0]), _core_schema_of(args[1]))
    if get_origin(annotation) is list:
        return core_schema.list_schema(_core_schema_of(args[0]))
    if get_origin(annotation) is tuple and ... not in args:
        return core_schema.tuple_schema([_core_schema_of(arg) for arg in args])
    raise TypeError(f"read_span: no core schema for a span field of type {annotation!r}")


def _constrained(schema: Any, marks: Sequence[Any]) -> Any:
    """``schema`` with the constraints pydantic reads from ``marks`` (of those a span has)."""
    for mark in marks:
        if isinstance(mark, Ge) and schema["type"] == "int":
            schema = {**schema, "ge": mark.ge}
        elif isinstance(mark, Strict):
            schema = {**schema, "strict": mark.strict}
        else:
            raise TypeError(f"read_span: no core schema for a span field's {mark!r}")
    return schema


_MISSING: Any = object()


def _same_as_base(new: Any, old: Any) -> bool:
    """A value worth leaving out of a span because the base holds it exactly: a container or a
    long text (a scalar costs less stored than named)."""
    big = type(new) in (list, dict) or (type(new) is str and len(new) > 64)
    return big and strictly_equal(new, old)


def _kept_of(new: Any, old: Any) -> int | None:
    """How many leading items ``new`` keeps exactly from ``old`` (a list that only grew: equal
    and of the same types), or None. Short lists are stored whole: nothing to save."""
    grew = type(new) is list and type(old) is list and len(old) > 1
    return len(old) if grew and starts_with(new, old) else None


def _digests_kept(new: dict[str, str], old: dict[str, str]) -> int:
    """How many leading entries of ``new`` are ``old``'s, in order (digests are only added).
    Keys and values are text, so ``==`` is exact; compared as lists of the dicts' own strings
    at C speed (as ``(key, value)`` pairs, a 10,000-turn chat built 20,000 tuples and compared
    each in Python at every span: 4 ms)."""
    n = len(old)
    if n < 2 or len(new) < n:
        return 0
    if list(islice(new, n)) != list(old) or list(islice(new.values(), n)) != list(old.values()):
        return 0
    return n


def span_of(checkpoint: Checkpoint, base: Checkpoint) -> CheckpointSpan | None:
    """``checkpoint`` stored relative to ``base`` (an earlier checkpoint of the same run; None
    for another run's). Only what it kept exactly (``starts_with``) is left out, so
    ``apply_span`` rebuilds it exactly."""
    if base.run_id != checkpoint.run_id:
        return None
    states: dict[str, dict[str, Any]] = {}
    state_kept: dict[str, dict[str, int]] = {}
    state_same: dict[str, list[str]] = {}
    for executor_id, state in checkpoint.executor_states.items():
        old_state = base.executor_states.get(executor_id, {})
        values: dict[str, Any] = {}
        for key, value in state.items():
            old = old_state.get(key, _MISSING)
            kept = _kept_of(value, old)
            if kept is not None:
                state_kept.setdefault(executor_id, {})[key] = kept
                value = value[kept:]
            elif old is not _MISSING and _same_as_base(value, old):
                state_same.setdefault(executor_id, []).append(key)
                value = None
            values[key] = value
        states[executor_id] = values
    shared: dict[str, Any] = {}
    shared_kept: dict[str, int] = {}
    shared_same: list[str] = []
    for key, value in checkpoint.shared_state.items():
        old = base.shared_state.get(key, _MISSING)
        kept = _kept_of(value, old)
        if kept is not None:
            shared_kept[key] = kept
            value = value[kept:]
        elif old is not _MISSING and _same_as_base(value, old):
            shared_same.append(key)
            value = None
        shared[key] = value
    outputs_kept = _kept_of(checkpoint.outputs, base.outputs) or 0
    cancelled_kept = _kept_of(checkpoint.cancelled_requests, base.cancelled_requests) or 0
    digests = checkpoint.answered_digests
    digests_kept = _digests_kept(digests, base.answered_digests)
    messages_kept = message_prefixes(checkpoint.messages, base.messages)
    pending_kept, pending_dropped = _pending_kept(checkpoint.pending_requests, base)
    pending = checkpoint.pending_requests
    if pending_kept:
        pending = dict(islice(pending.items(), pending_kept, None))
    cut = checkpoint.model_copy(
        update={
            "pending_requests": pending,
            "messages": _cut_messages(checkpoint.messages, messages_kept),
            "executor_states": states,
            "shared_state": shared,
            "outputs": checkpoint.outputs[outputs_kept:],
            "cancelled_requests": checkpoint.cancelled_requests[cancelled_kept:],
            "answered_digests": dict(islice(digests.items(), digests_kept, None)),
        }
    )
    span = construct(
        CheckpointSpan,
        schema_version=CHECKPOINT_SCHEMA_VERSION,
        base_id=base.checkpoint_id,
        checkpoint=cut,
        executor_state_kept=state_kept,
        shared_state_kept=shared_kept,
        executor_state_same=state_same,
        shared_state_same=shared_same,
        outputs_kept=outputs_kept,
        cancelled_kept=cancelled_kept,
        digests_kept=digests_kept,
        messages_kept=messages_kept,
        pending_kept=pending_kept,
        pending_dropped=pending_dropped if pending_kept else [],
    )
    return span


def _pending_kept(pending: dict[str, RequestRecord], base: Checkpoint) -> tuple[int, list[str]]:
    """How many of ``pending`` (in order) are the base's pending requests, in the base's order
    -- those of the base that are not pending any more skipped, and listed -- and that list."""
    ours = iter(pending.items())
    kept, dropped = 0, []
    following = next(ours, None)
    for request_id, record in base.pending_requests.items():
        if following is None:
            break
        if request_id == following[0]:
            if not _same_record(following[1], record):
                break
            kept += 1
            following = next(ours, None)
        elif request_id not in pending:
            dropped.append(request_id)
        else:
            break
    return kept, dropped


def _same_record(a: RequestRecord, b: RequestRecord) -> bool:
    """The same stored request: usually the same object, carried from checkpoint to
    checkpoint; else equal field by field, its data strictly (``True`` is not ``1``)."""
    if a is b:
        return True
    return (
        a.request_id == b.request_id
        and a.port_id == b.port_id
        and a.source_executor_id == b.source_executor_id
        and a.kind == b.kind
        and a.response_type == b.response_type
        and a.superstep == b.superstep
        and strictly_equal(a.data, b.data)
    )


def apply_span(base: Checkpoint, span: CheckpointSpan, *, consume_base: bool = False) -> Checkpoint:
    """The checkpoint ``span`` was taken from, given the checkpoint it is relative to.

    ``consume_base``: ``base`` is a fold's own intermediate, never read again, so its growing
    lists and digests are extended in place -- a chain of spans then costs what the spans
    hold, not a copy of the whole conversation per span."""
    if span.base_id != base.checkpoint_id:
        raise ValueError(f"a span relative to {span.base_id} applied to {base.checkpoint_id}")

    def grown(old: list[Any], kept: int, new: list[Any]) -> list[Any]:
        if not consume_base:
            return [*old[:kept], *new]
        del old[kept:]
        old.extend(new)
        return old

    cp = span.checkpoint
    states = {e: dict(v) for e, v in cp.executor_states.items()}
    for executor_id, kept_items in span.executor_state_kept.items():
        old_state = base.executor_states[executor_id]
        state = states[executor_id]
        for key, kept in kept_items.items():
            state[key] = grown(old_state[key], kept, state[key])
    for executor_id, keys in span.executor_state_same.items():
        old_state = base.executor_states[executor_id]
        state = states[executor_id]
        for key in keys:
            state[key] = old_state[key]  # (the key is there already: its place is kept)
    shared = dict(cp.shared_state)
    for key, kept in span.shared_state_kept.items():
        shared[key] = grown(base.shared_state[key], kept, shared[key])
    for key in span.shared_state_same:
        shared[key] = base.shared_state[key]
    old_digests = base.answered_digests
    if span.digests_kept == len(old_digests):  # (usually: digests only grow)
        if consume_base:
            old_digests.update(cp.answered_digests)
            digests = old_digests
        else:
            digests = {**old_digests, **cp.answered_digests}
    else:
        digests = dict(list(old_digests.items())[: span.digests_kept])
        digests.update(cp.answered_digests)
    messages = cp.messages
    if span.messages_kept:
        messages = _grown_messages(messages, base.messages, span.messages_kept)
    pending = cp.pending_requests
    if span.pending_kept:
        dropped = set(span.pending_dropped)
        left = [r for r in base.pending_requests.items() if r[0] not in dropped]
        if len(left) < span.pending_kept:
            raise ValueError(
                f"a span keeps {span.pending_kept} pending requests of a base that has {len(left)}"
            )
        pending = dict(left[: span.pending_kept])
        pending.update(cp.pending_requests)
    return cp.model_copy(
        update={
            "pending_requests": pending,
            "messages": messages,
            "executor_states": states,
            "shared_state": shared,
            "outputs": grown(base.outputs, span.outputs_kept, cp.outputs),
            "cancelled_requests": grown(
                base.cancelled_requests, span.cancelled_kept, cp.cancelled_requests
            ),
            "answered_digests": digests,
        }
    )
