"""Tools: typed Python functions an agent's model may call, some only with a human's approval.

``@tool`` reads the function's signature: parameter annotations (with
``Annotated[..., Field(description=...)]``) and the docstring become the JSON schema sent to the
model, and the same pydantic model validates every call's arguments before the function runs.
A parameter named ``idempotency_key`` (or annotated :data:`IdempotencyKey`) is not shown to the
model; it receives the call's stable key (run id + call id), to pass to outside services.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import math
import threading
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import (
    Annotated,
    Any,
    Literal,
    NewType,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

import anyio
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from workflow_engine._codec import is_text
from workflow_engine._errors import UsageError
from workflow_engine._input import is_blank

from ._content import MAX_NESTING, nests_within

log = logging.getLogger(__name__)

IdempotencyKey = NewType("IdempotencyKey", str)
"""Annotate a tool parameter with this to receive the call's idempotency key."""

ApprovalMode = Literal["always_require", "never_require"] | Callable[[dict[str, Any]], bool]


class ToolSpec(BaseModel):
    """What the model sees of a tool."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    parameters: dict[str, Any]


class ToolArgumentsError(ValueError):
    """Arguments that fail the tool's schema; the message is pydantic's, naming each field."""


UNPARSED = "__unparsed__"
"""The one key of the arguments a chat client read from a model's call that were not a JSON
object (malformed, a list, a string): the text as it came, for the tool's refusal to quote."""


def call_arguments(raw: str | None) -> dict[str, Any]:
    """A model's call's arguments (JSON text) as the object they are -- or ``{UNPARSED: raw}``
    when they are none a run can keep and send back: malformed, a list or a string, nesting
    deeper than ``MAX_NESTING`` (the model's step failed at every resume: tester 184), a ``NaN``
    or a number past a float (JSON has neither: the model was sent ``NaN`` back at every later
    turn), a lone surrogate (the model's step could not be stored, and a person was asked
    whether the model call had happened: outside tester 159). The tool then says so to the
    model, quoting the text (a lone surrogate in it written as its escape)."""
    text = raw or "{}"
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # (also a number past Python's digit limit)
        value = None
    if isinstance(value, dict) and nests_within(value) and _keepable(value):
        return value
    return {UNPARSED: text.encode("utf-8", "backslashreplace").decode("utf-8")}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _keepable(value: Any) -> bool:
    """No float that is not finite and no text with a lone surrogate, at any depth."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, str):
        return not any("\ud800" <= c <= "\udfff" for c in value)
    if isinstance(value, dict):
        return all(_keepable(k) and _keepable(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_keepable(item) for item in value)
    return True


class Tool:
    """A callable tool with a schema and an approval mode."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        approval_mode: ApprovalMode = "never_require",
        idempotent: bool = False,
    ) -> None:
        _check_options(func, name, description, approval_mode, idempotent)
        self.func = func
        self.name = name or _name_of(func)
        doc = inspect.getdoc(func) or ""
        self.description = description or doc.split("\n\n")[0].strip() or self.name
        self.approval_mode = approval_mode
        self.idempotent = idempotent
        """Safe to call again with the same idempotency key: if a crash leaves a call in doubt,
        it is retried; otherwise the run asks a person whether it happened."""
        call = getattr(func, "__call__", None)  # noqa: B004 (an object's ``async def __call__``)
        self.is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(call)
        self.idempotency_param: str | None = None
        self.accepts_invocation_kwargs = False
        self.positional: tuple[str, ...] = ()  # positional-only parameters, passed so
        hints = _hints_of(func, self.name)
        fields: dict[str, Any] = {}
        # (a partial's keywords are given: not the model's to pass, nor to see)
        given = func.keywords if isinstance(func, functools.partial) else {}
        for param in inspect.signature(func).parameters.values():
            if param.name in given:
                continue
            if param.kind is inspect.Parameter.VAR_KEYWORD:
                self.accepts_invocation_kwargs = True  # receives function_invocation_kwargs
                continue
            if param.kind is inspect.Parameter.VAR_POSITIONAL:
                # (its schema was a required property, and what a model put in it went to
                # ``**kwargs``: outside tester 167)
                raise UsageError(
                    f"tool {self.name!r}: *{param.name} cannot be filled by a model, which names "
                    f"every argument it passes; take a list instead ({param.name}: list[...])"
                )
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                self.positional += (param.name,)  # (the key's too: tester 173)
            annotation = hints.get(param.name, Any)
            if param.name == "idempotency_key" or annotation is IdempotencyKey:
                if self.idempotency_param is not None:  # (one was never filled in)
                    raise UsageError(
                        f"tool {self.name!r}: two parameters take the idempotency key "
                        f"({self.idempotency_param!r} and {param.name!r}); keep one"
                    )
                if not _takes_text(annotation):
                    raise UsageError(
                        f"tool {self.name!r}: parameter {param.name!r} receives the idempotency "
                        f"key, which is text: annotate it str or IdempotencyKey, not "
                        f"{getattr(annotation, '__name__', annotation)!r}"
                    )
                self.idempotency_param = param.name
                continue
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (annotation, default)
        # No infinity nor NaN: JSON, the format of every call a model or a person makes, has
        # neither, yet pydantic reads the text "Infinity" as one (an approval edited to
        # "Infinity" moved inf EUR: outside tester 113)
        self.arguments_model, self._parameters = _arguments_model(self.name, fields)

    @property
    def spec(self) -> ToolSpec:
        """What the model is shown (its schema made once, when the tool was defined: it was
        made again for every tool at every model call, 0.13 ms each)."""
        return ToolSpec(name=self.name, description=self.description, parameters=self._parameters)

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments as the function will receive them, or ``ToolArgumentsError``."""
        if set(arguments) == {UNPARSED}:  # (the model is told what was wrong with them: it was
            # told "order_id: Field required; __unparsed__: Extra inputs are not permitted")
            raise ToolArgumentsError(
                f"invalid arguments for tool {self.name!r}: not a JSON object of arguments "
                "this engine keeps (malformed, not an object, a NaN, a number past a float or "
                f"past 4,300 digits, a lone surrogate, or nesting past {MAX_NESTING} levels): "
                f"{str(arguments[UNPARSED])[:200]!r}"
            )
        try:
            model = self.arguments_model.model_validate(arguments)
            problems = self._bools_for_numbers(arguments, model) if _holds_bool(arguments) else []
        except ValidationError as exc:
            problems = exc.errors()
        if problems:
            said = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}" for e in problems
            )
            raise ToolArgumentsError(f"invalid arguments for tool {self.name!r}: {said}")
        return {name: getattr(model, name) for name in type(model).model_fields}

    def _bools_for_numbers(self, arguments: dict[str, Any], model: BaseModel) -> list[Any]:
        """Each ``true`` or ``false`` the arguments' model read as something else -- a number,
        a number's ``Literal``, an ``IntEnum`` member -- which it is not (pydantic reads it
        as 1: a reviewer's edit ``"amount": true`` moved 1.00 EUR -- outside testers 176,
        179, 180), as errors in pydantic's shape (``loc``, ``msg``). Two readings find them:
        the arguments walked beside what they became (a ``Literal``, an ``IntEnum``), and
        JSON's strict reading, which takes no boolean for a number wherever it stands (an
        aliased field, a dict's number keys, a set); its other refusals (``"250"`` for a
        number, which a tool takes) are not this check's."""
        found: dict[tuple, Any] = {
            place: {"loc": place, "msg": "Input should be a valid number, not a boolean"}
            for place in _bools_read_otherwise(arguments, model, ())
        }
        try:  # (a value JSON cannot hold, from Python -- bytes -- as its repr, a set as a
            # list: only where the booleans stand matters here)
            text = json.dumps(arguments, default=_json_shaped)
            self.arguments_model.model_validate_json(text, strict=True)
        except (TypeError, ValueError) as exc:  # (ValidationError is a ValueError)
            if isinstance(exc, ValidationError):
                for e in exc.errors():
                    place = tuple(e["loc"])  # (a union's say each branch: one is enough)
                    said = any(place[:i] in found for i in range(1, len(place) + 1))
                    if type(e.get("input")) is bool and not said:
                        found[place] = {"loc": place, "msg": e["msg"]}
        return list(found.values())

    def needs_approval(self, arguments: dict[str, Any]) -> bool:
        """Whether the call waits for a person. A predicate that raises asks one: it failed
        the run, and every resume replayed the model's call into the same failure (outside
        tester 176) -- a call that cannot be told safe is not run unasked."""
        mode = self.approval_mode
        if mode == "always_require":
            return True
        if mode == "never_require":
            return False
        assert callable(mode)
        try:
            return bool(mode(arguments))
        except Exception:
            log.warning(
                "tool %r: its approval_mode predicate raised; the call waits for approval",
                self.name,
                exc_info=True,
            )
            return True

    async def invoke(
        self,
        arguments: dict[str, Any],
        *,
        idempotency_key: str,
        invocation_kwargs: dict[str, Any] | None = None,
        thread_limiter: anyio.CapacityLimiter | None = None,
    ) -> Any:
        """Validate and call. Raises ``ToolArgumentsError`` or whatever the function raises.

        ``invocation_kwargs`` (e.g. an AG-UI client's forwarded props) reach only tools that
        declare ``**kwargs``; they are never shown to the model. ``thread_limiter``: what a
        sync function's worker thread is taken under (default: anyio's; see
        :func:`thread_slot`).
        """
        kwargs = self.validate(arguments)
        if invocation_kwargs and self.accepts_invocation_kwargs:
            kwargs = {**invocation_kwargs, **kwargs}
        if self.idempotency_param is not None:
            kwargs[self.idempotency_param] = idempotency_key
        args = [kwargs.pop(name) for name in self.positional]
        if not self.is_async:
            # a sync tool (blocking I/O, a slow computation) runs in a worker thread, so the
            # event loop keeps streaming, renewing leases and serving other runs meanwhile
            call = functools.partial(_counted, functools.partial(self.func, *args, **kwargs))
            (result,) = await anyio.to_thread.run_sync(call, limiter=thread_limiter)
            if inspect.isawaitable(result):  # a plain function handing back a coroutine
                # (it was the model's result, never awaited: the effect never happened)
                result = await result
            return result
        result = self.func(*args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.func(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, approval_mode={self.approval_mode!r})"


_IN_THREADS = [0]
_IN_THREADS_LOCK = threading.Lock()


def _counted(call: Callable[[], Any]) -> tuple[Any]:
    """``call()`` in its worker thread, counted while it runs (whatever became of its caller:
    a command stopped meanwhile does not end it). Its result comes back in a tuple: trio
    refuses a thread's coroutine result, which a plain function may hand back."""
    with _IN_THREADS_LOCK:
        _IN_THREADS[0] += 1
    try:
        return (call(),)
    finally:
        with _IN_THREADS_LOCK:
            _IN_THREADS[0] -= 1


def calls_in_threads() -> int:
    """How many sync tool calls run in worker threads now. Nothing can cut those off: a
    command stopped meanwhile leaves each one running, and its step in doubt. (Idle worker
    threads linger too, so counting threads would not tell.)"""
    return _IN_THREADS[0]


@contextlib.asynccontextmanager
async def thread_slot(t: Tool | None) -> AsyncIterator[anyio.CapacityLimiter | None]:
    """For a call of a sync tool that is not ``idempotent``: wait for one of anyio's worker
    threads (40 by default) *before* the call is journaled as started, and hold it for the
    call, which then runs under the limiter yielded.

    A call journaled first and then queued for a thread (more such calls at once than
    threads: 300 approvals answered together, say) was left in doubt by a crash although it
    never ran, and a person was asked whether it had happened. Now only a call that had its
    thread can be in doubt. Other calls (async, idempotent) yield None: nothing to wait for.
    """
    if t is None or t.is_async or t.idempotent:
        yield None
        return
    threads = anyio.to_thread.current_default_thread_limiter()
    borrower = object()  # (not the task: the same task may already hold one of its tokens)
    await threads.acquire_on_behalf_of(borrower)
    try:
        yield anyio.CapacityLimiter(1)  # the call's own: its thread is the token taken here
    finally:
        threads.release_on_behalf_of(borrower)


def _arguments_model(name: str, fields: dict[str, Any]) -> tuple[type[BaseModel], dict[str, Any]]:
    """The model that validates a tool's arguments, and its JSON schema (what the model is
    shown). A parameter it cannot hold as a field is refused: one starting with ``_`` (pydantic
    keeps it private) or named as a model's own attribute (``model_config``) was left out of
    the schema, so no call could pass it (outside testers 176, 179); one pydantic refuses
    outright, or one with no JSON schema (a ``Callable``), is said by name."""
    # No infinity nor NaN: JSON, the format of every call a model or a person makes, has
    # neither, yet pydantic reads the text "Infinity" as one (an approval edited to
    # "Infinity" moved inf EUR: outside tester 113)
    config = ConfigDict(extra="forbid", allow_inf_nan=False)
    try:
        model = create_model(f"{name}_arguments", __config__=config, **fields)
    except Exception as exc:  # (a name in pydantic's protected namespace, ``model_validate``)
        raise UsageError(f"tool {name!r}: its parameters cannot be a schema: {exc}") from None
    left_out = [field for field in fields if field not in model.model_fields]
    if left_out:
        raise UsageError(
            f"tool {name!r}: parameter {left_out[0]!r} cannot be one of a model's arguments "
            "(a name starting with '_', or one of pydantic's own, is left out of the schema); "
            "rename it"
        )
    try:  # (a Callable parameter has none: it failed the run at its first turn)
        schema = model.model_json_schema()
    except Exception as exc:
        raise UsageError(
            f"tool {name!r}: its parameters have no JSON schema to show a model: {exc}"
        ) from None
    schema.pop("title", None)
    return model, schema


_MISSING: Any = object()


def _bools_read_otherwise(given: Any, got: Any, place: tuple) -> list[tuple]:
    """The places where a boolean in ``given`` (arguments as sent) became a number in ``got``
    (as validated) -- an int, a float, a ``Decimal``, an ``IntEnum`` member; walked side by
    side through dicts (their keys too), a model's or dataclass's fields, lists, tuples and
    sets. A boolean a type reads as something else of its own (an enum whose values are
    booleans, a validator's shorthand) is that type's business (outside tester 181)."""
    if type(given) is bool:
        return [place] if _a_number(got) else []
    found: list[tuple] = []
    if isinstance(given, dict):
        pairs: Any = None
        if isinstance(got, dict) and len(got) == len(given):  # (in order: keys may be read
            pairs = zip(given.items(), got.items(), strict=True)  # as numbers, "7" -> 7)
        for key, value in given.items():
            if pairs is not None:
                (_, _), (read_key, inner) = next(pairs)
                if type(key) is bool and _a_number(read_key):
                    found.append((*place, key))
            elif isinstance(got, dict):
                inner = got.get(key, _MISSING)
            else:  # a model's or a dataclass's field (by its name)
                inner = getattr(got, key, _MISSING) if isinstance(key, str) else _MISSING
            if inner is not _MISSING:
                found += _bools_read_otherwise(value, inner, (*place, key))
    elif isinstance(given, list | tuple) and isinstance(got, list | tuple):
        if len(given) == len(got):
            for index, (value, inner) in enumerate(zip(given, got, strict=True)):
                found += _bools_read_otherwise(value, inner, (*place, index))
    elif (
        isinstance(given, set | frozenset)
        and isinstance(got, set | frozenset)
        and any(type(item) is bool for item in given)
        and not any(type(item) is bool for item in got)
        and _a_number(next(iter(got), None))
    ):
        found.append(place)  # ({True, 2} -> {1, 2})
    return found


def _json_shaped(value: Any) -> Any:
    """What ``json.dumps`` writes for a value it does not know (see ``_bools_for_numbers``)."""
    return list(value) if isinstance(value, set | frozenset) else repr(value)


def _a_number(value: Any) -> bool:
    """Whether ``value`` is a number (an int, a float, a ``Decimal``), not a boolean."""
    return isinstance(value, int | float | Decimal) and type(value) is not bool


def _holds_bool(value: Any) -> bool:
    """Whether ``value`` (a call's arguments) holds a ``True`` or ``False`` at any depth: in
    a dict (a key too), a list, a tuple or a set (an edit made in Python holds any of them)."""
    if type(value) is bool:
        return True
    if isinstance(value, dict):
        return any(map(_holds_bool, value)) or any(map(_holds_bool, value.values()))
    if isinstance(value, list | tuple | set | frozenset):
        return any(map(_holds_bool, value))
    return False


def _name_of(func: Any) -> str:
    """A tool's name when none is given: its function's (a ``functools.partial``'s
    function's; a callable object's class's)."""
    if isinstance(func, functools.partial):
        return _name_of(func.func)
    return getattr(func, "__name__", None) or type(func).__name__


def _hints_of(func: Any, name: str) -> dict[str, Any]:
    """The annotations of what the tool calls: a function, a ``functools.partial`` of one, or
    an object's ``__call__`` (``get_type_hints`` refused the last two with a bare
    ``TypeError``: outside tester 176)."""
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    if not inspect.isroutine(target):
        target = getattr(target, "__call__", target)  # noqa: B004
    try:
        return get_type_hints(target, include_extras=True)
    except Exception as exc:  # (a name an annotation uses that does not exist, say)
        raise UsageError(f"tool {name!r}: its annotations cannot be read: {exc}") from None


def _takes_text(annotation: Any) -> bool:
    """Whether a parameter so annotated takes a ``str`` (the idempotency key): ``str``,
    ``IdempotencyKey``, ``Any``, or a union or ``Annotated`` of one (``str | None = None``)."""
    if annotation in (IdempotencyKey, str, Any):
        return True
    if get_origin(annotation) is Annotated:
        return _takes_text(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        return any(_takes_text(arg) for arg in get_args(annotation))
    return False


def _check_options(
    func: Any, name: Any, description: Any, approval_mode: Any, idempotent: Any
) -> None:
    """``@tool``'s options, checked when the tool is defined: ``approval_mode=5`` failed the
    run at its first call with an empty ``AssertionError``, ``name=5`` with pydantic's error,
    an async predicate was never awaited (every call held), a blank name was a tool's
    (outside tester 167)."""
    if not callable(func):
        raise UsageError(f"@tool decorates a function, not {func!r}")
    shown = name if name is not None else getattr(func, "__name__", func)
    if name is not None and (not isinstance(name, str) or not is_text(name) or is_blank(name)):
        raise UsageError(f"@tool: name must be non-blank text, not {name!r}")
    if description is not None and not isinstance(description, str):
        raise UsageError(f"tool {shown!r}: description must be text, not {description!r}")
    if type(idempotent) is not bool:
        raise UsageError(f"tool {shown!r}: idempotent must be True or False, not {idempotent!r}")
    if isinstance(approval_mode, str):
        if approval_mode in ("always_require", "never_require"):
            return
    elif callable(approval_mode):
        call = getattr(approval_mode, "__call__", None)  # noqa: B004 (an object's method too)
        if inspect.iscoroutinefunction(approval_mode) or inspect.iscoroutinefunction(call):
            raise UsageError(
                f"tool {shown!r}: approval_mode's predicate must be a plain function (it is "
                "asked before the call, not awaited), not an async one"
            )
        return
    raise UsageError(
        f"tool {shown!r}: approval_mode must be 'always_require', 'never_require' or a "
        f"predicate, not {approval_mode!r}"
    )


def tool(
    func: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    approval_mode: ApprovalMode = "never_require",
    idempotent: bool = False,
) -> Any:
    """Make a :class:`Tool` from a typed function (sync or async).

    ``idempotent=True``: calling it twice with the same ``idempotency_key`` does no harm, so a
    call cut off by a crash is simply retried; otherwise such a call pauses the run and asks a
    person whether it happened.
    """

    def wrap(f: Callable[..., Any] | Callable[..., Awaitable[Any]]) -> Tool:
        return Tool(
            f,
            name=name,
            description=description,
            approval_mode=approval_mode,
            idempotent=idempotent,
        )

    return wrap(func) if func is not None else wrap
