"""Executors: the nodes that do work.

Subclass :class:`Executor` and mark ``async def`` methods with ``@handler``; the message
parameter's annotation says which messages the handler takes, and the ``WorkflowContext[TOut,
TWorkflowOut]`` annotation says what it may send and yield. ``@executor`` does the same for a plain
async function. ``@response_handler`` methods receive answers to ``ctx.request_info``.

Executors hold no per-run state: one instance serves many runs at once; durable state lives in the
context (``get_state``/``set_state``).
"""

from __future__ import annotations

import contextlib
import inspect
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast, get_args, get_origin

from ._errors import DefinitionError, MessageNotHandledError, UsageError
from ._types import Matcher, build_matcher, type_name, union_members

_HANDLER_MARK = "__workflow_handler__"
_RESPONSE_MARK = "__workflow_response_handler__"


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """One resolved handler: what it takes, what it may send and yield."""

    name: str
    message_type: Any
    output_types: tuple[Any, ...]
    workflow_output_types: tuple[Any, ...]
    func: Callable[..., Awaitable[Any]]
    matches: Matcher
    sends: Matcher
    yields: Matcher
    takes_context: bool = True
    bound: bool = True


@dataclass(frozen=True, slots=True)
class ResponseHandlerSpec:
    """A resolved ``@response_handler``: (original request type, response type) → method."""

    name: str
    request_type: Any
    response_type: Any
    output_types: tuple[Any, ...]
    workflow_output_types: tuple[Any, ...]
    func: Callable[..., Awaitable[Any]]
    matches_request: Matcher
    sends: Matcher
    yields: Matcher
    matches_response: Matcher


def handler(
    func: Callable[..., Awaitable[Any]] | None = None,
    *,
    input: Any = None,
    output: Any = None,
    workflow_output: Any = None,
) -> Any:
    """Mark an ``async def`` method as a message handler.

    Types come from the annotations; ``input``/``output``/``workflow_output`` override them when a
    method cannot be annotated precisely.
    """

    def mark(f: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        if not inspect.iscoroutinefunction(f):
            raise DefinitionError(f"@handler {f.__qualname__} must be an async def")
        setattr(f, _HANDLER_MARK, (input, output, workflow_output))
        return f

    return mark(func) if func is not None else mark


def response_handler(func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Mark ``async def on_answer(self, original_request: Req, response: Resp, ctx)``."""
    if not inspect.iscoroutinefunction(func):
        raise DefinitionError(f"@response_handler {func.__qualname__} must be an async def")
    setattr(func, _RESPONSE_MARK, True)
    return func


def context_types(annotation: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """``WorkflowContext[A | B, C]`` → ((A, B), (C,)); a bare ``WorkflowContext`` → ((), ())."""
    from ._context import WorkflowContext

    if annotation is inspect.Parameter.empty or annotation is WorkflowContext:
        return (), ()
    if get_origin(annotation) is not WorkflowContext:
        raise DefinitionError(f"expected a WorkflowContext[...] annotation, got {annotation!r}")
    args = get_args(annotation)
    out = union_members(args[0]) if args else ()
    wf_out = union_members(args[1]) if len(args) > 1 else ()
    return tuple(a for a in out if a is not None), tuple(wf_out)


def any_of(types: tuple[Any, ...]) -> Matcher:
    """A matcher accepting a value of any of ``types`` (none: accepts nothing)."""
    matchers = [build_matcher(t) for t in types]
    if len(matchers) == 1:
        return matchers[0]
    return lambda value: any(m(value) for m in matchers)


def _hints(func: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(func)
    except NameError as exc:
        raise DefinitionError(
            f"cannot resolve the annotations of {func.__qualname__}: {exc}; define the types at "
            "module level"
        ) from exc


def _explicit(value: Any) -> tuple[Any, ...] | None:
    if value is None:
        return None
    return tuple(value) if isinstance(value, list | tuple) else union_members(value)


def resolve_handler(func: Callable[..., Awaitable[Any]], *, bound: bool) -> HandlerSpec:
    """Read a handler's types from its signature (``bound``: first parameter is ``self``)."""
    params = list(inspect.signature(func).parameters.values())
    if bound:
        params = params[1:]
    if not params:
        raise DefinitionError(f"handler {func.__qualname__} needs a message parameter")
    extra = [
        p.name
        for p in params[2:]
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if extra:  # (it built, and every message failed it with a bare TypeError: tester 151)
        raise DefinitionError(
            f"handler {func.__qualname__} takes (message, ctx); its parameter(s) "
            f"{', '.join(extra)} would never be given: give them defaults, or drop them"
        )
    hints = _hints(func)
    explicit_in, explicit_out, explicit_wf = getattr(func, _HANDLER_MARK, (None, None, None))
    message_type = explicit_in if explicit_in is not None else hints.get(params[0].name, Any)
    takes_context = len(params) > 1
    out: tuple[Any, ...] = ()
    wf_out: tuple[Any, ...] = ()
    if takes_context and params[1].name in hints:  # (not annotated: a bare context)
        try:
            out, wf_out = context_types(hints[params[1].name])
        except DefinitionError as exc:  # (it named no handler: outside tester 149)
            raise DefinitionError(f"handler {func.__qualname__}: {exc}") from None
    out = _explicit(explicit_out) or out
    wf_out = _explicit(explicit_wf) or wf_out
    return HandlerSpec(
        name=func.__qualname__,
        message_type=message_type,
        output_types=out,
        workflow_output_types=wf_out,
        func=func,
        matches=build_matcher(message_type),
        sends=any_of(out),
        yields=any_of(wf_out),
        takes_context=takes_context,
        bound=bound,
    )


def _resolve_response_handler(func: Callable[..., Awaitable[Any]]) -> ResponseHandlerSpec:
    params = list(inspect.signature(func).parameters.values())[1:]
    given = [  # (more with defaults, or *args / **kwargs, are the handler's own)
        p
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(params) < 3 or len(given) > 3 or any(p.kind not in positional for p in params[:3]):
        raise DefinitionError(
            f"@response_handler {func.__qualname__} must take (original_request, response, ctx)"
        )
    hints = _hints(func)
    req_t = hints.get(params[0].name, Any)
    resp_t = hints.get(params[1].name, Any)
    if params[1].name in getattr(func, "__annotations__", {}):  # (hints drop Annotated's
        # metadata: a constraint on an answer went unchecked -- refused below instead)
        with contextlib.suppress(Exception):
            resp_t = typing.get_type_hints(func, include_extras=True).get(params[1].name, resp_t)
    out, wf_out = context_types(hints.get(params[2].name, inspect.Parameter.empty))
    try:  # (read now: an answer type no answer can have failed only once a person answered)
        matches_response = build_matcher(resp_t)
    except DefinitionError as exc:
        raise DefinitionError(
            f"@response_handler {func.__qualname__}: its answer type cannot be checked: {exc}"
        ) from None
    return ResponseHandlerSpec(
        func.__qualname__,
        req_t,
        resp_t,
        out,
        wf_out,
        func,
        build_matcher(req_t),
        any_of(out),
        any_of(wf_out),
        matches_response,
    )


def _handler_members(cls: type) -> tuple[Any, ...]:
    """The ``@handler`` and ``@response_handler`` methods ``cls`` has now, nearest class first
    (one a subclass declares under the same name hides its base's)."""
    found: list[Any] = []
    seen: dict[str, type] = {}  # name → the nearest class that defines it
    for klass in cls.__mro__:
        for name, member in vars(klass).items():
            if _is_handler(member):
                if name not in seen:
                    seen[name] = klass
                    if not any(member is other for other in found):  # (an alias of one)
                        found.append(member)
                elif not _is_handler(vars(seen[name])[name]):
                    # a subclass's plain method over a handler: the base's ran, the override
                    # never did, and nothing said so (outside tester 151)
                    raise DefinitionError(
                        f"{seen[name].__qualname__}.{name} overrides the handler "
                        f"{klass.__qualname__}.{name} without @handler (or "
                        "@response_handler), so it would never run: decorate it as its base is"
                    )
            else:
                seen.setdefault(name, klass)
    return tuple(found)


def _is_handler(member: Any) -> bool:
    return hasattr(member, _HANDLER_MARK) or hasattr(member, _RESPONSE_MARK)


def _refuse_twice_handled(specs: list[HandlerSpec]) -> None:
    """Two handlers one class declares for the very same message type: the first would take
    every such message, the second never run (outside tester 149). (A subclass's handler for
    its base's type takes the base's place.)"""
    for i, spec in enumerate(specs):
        for other in specs[:i]:
            if _one_class(other.name, spec.name) and _same_type(
                other.message_type, spec.message_type
            ):
                raise DefinitionError(
                    f"handlers {other.name} and {spec.name} both take "
                    f"{type_name(spec.message_type)}: the first would take every such message "
                    "and the second never run; keep one"
                )


def _refuse_twice_answered(specs: list[ResponseHandlerSpec]) -> None:
    """Two response handlers for the same request and answer types: the second never ran."""
    for i, spec in enumerate(specs):
        for other in specs[:i]:
            if (
                _one_class(other.name, spec.name)
                and _same_type(other.request_type, spec.request_type)
                and _same_type(other.response_type, spec.response_type)
            ):
                raise DefinitionError(
                    f"response handlers {other.name} and {spec.name} both take requests of "
                    f"{type_name(spec.request_type)} answered with "
                    f"{type_name(spec.response_type)}: the second would never run; keep one"
                )


def _one_class(a: str, b: str) -> bool:
    """Whether two handlers (by qualified name) are declared by one class: a subclass's
    handler for its base's type, under another name, takes the base's place (an override)."""
    return a.rpartition(".")[0] == b.rpartition(".")[0]


def _same_type(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # (an annotation whose == fails is no duplicate of another)
        return False


class Executor:
    """A node of the workflow graph. Subclass it and declare ``@handler`` methods."""

    _handler_specs: tuple[HandlerSpec, ...] | None = None
    _response_specs: tuple[ResponseHandlerSpec, ...] | None = None
    _handler_members: tuple[Any, ...] | None = None

    def __init__(self, id: str) -> None:
        if not id or not isinstance(id, str):
            raise UsageError("an executor needs a non-empty string id")
        self.id = id
        self._dispatch: dict[type, HandlerSpec | None] = {}

    # --- handler resolution (per class, lazily, so annotations may name later classes) -----------

    @property
    def handlers(self) -> tuple[HandlerSpec, ...]:
        cls = type(self)
        if "_handler_specs" not in cls.__dict__ or cls._handler_specs is None:
            specs: list[HandlerSpec] = []
            responses: list[ResponseHandlerSpec] = []
            members = _handler_members(cls)
            for member in members:
                if hasattr(member, _HANDLER_MARK):
                    specs.append(resolve_handler(member, bound=True))
                else:
                    responses.append(_resolve_response_handler(member))
            _refuse_twice_handled(specs)
            _refuse_twice_answered(responses)
            cls._handler_specs = tuple(specs)
            cls._response_specs = tuple(responses)
            cls._handler_members = members
        return cls._handler_specs

    def _renew_handlers(self) -> None:
        """Read the handlers from the class as it is now, if a handler was replaced since they
        were read (a build calls this): a method patched after an earlier build -- a test's
        ``mock.patch.object`` -- was not seen, and the one it replaced still ran, on a graph
        validated for it (outside tester 147)."""
        cls = type(self)
        known = cls.__dict__.get("_handler_members")
        if known is not None and cls._handler_specs is not None:
            members = _handler_members(cls)
            if len(members) != len(known) or any(
                a is not b for a, b in zip(members, known, strict=True)
            ):
                cls._handler_specs = None
        self._dispatch.clear()
        self.__dict__.pop("_by_value", None)

    @property
    def response_handlers(self) -> tuple[ResponseHandlerSpec, ...]:
        self.handlers  # noqa: B018 - resolves both tuples
        return type(self)._response_specs or ()

    @property
    def input_types(self) -> tuple[Any, ...]:
        return tuple(h.message_type for h in self.handlers)

    @property
    def output_types(self) -> tuple[Any, ...]:
        seen: dict[str, Any] = {}
        specs: tuple[HandlerSpec | ResponseHandlerSpec, ...] = (
            *self.handlers,
            *self.response_handlers,
        )
        for spec in specs:
            for t in spec.output_types:
                seen.setdefault(type_name(t), t)
        return tuple(seen.values())

    @property
    def workflow_output_types(self) -> tuple[Any, ...]:
        seen: dict[str, Any] = {}
        specs: tuple[HandlerSpec | ResponseHandlerSpec, ...] = (
            *self.handlers,
            *self.response_handlers,
        )
        for spec in specs:
            for t in spec.workflow_output_types:
                seen.setdefault(type_name(t), t)
        return tuple(seen.values())

    def find_handler(self, message: Any) -> HandlerSpec | None:
        """The handler for ``message``: one whose annotation names this very value
        (``Literal["yes"]``) first, then an exact-type match, else the first that accepts."""
        t = type(message)
        try:
            cached = self._dispatch[t]
        except KeyError:
            cached = None
        else:
            if cached is None or (t is not list and t is not dict):
                return cached
        handlers = self.handlers
        spec = None
        if self._value_dependent():  # the most specific handler wins, whatever the order
            spec = next(
                (h for h in handlers if _looks_at_value(h.message_type) and h.matches(message)),
                None,
            )
        if spec is None:
            spec = next((h for h in handlers if h.message_type is t), None)
        if spec is None:
            spec = next((h for h in handlers if h.matches(message)), None)
        # Only the type decides for most annotations, so the answer is cached per type. Not when
        # any handler's annotation looks at the value (Literal["yes"], list[int], ...): then
        # "no" must not reach the handler that "yes" found, nor stay refused once "yes" comes.
        if t is not list and t is not dict and not self._value_dependent():
            self._dispatch[t] = spec
        return spec

    def _value_dependent(self) -> bool:
        known = self.__dict__.get("_by_value")
        if known is None:
            known = self.__dict__["_by_value"] = any(
                _looks_at_value(h.message_type) for h in self.handlers
            )
        return known

    def can_handle(self, message: Any) -> bool:
        return self.find_handler(message) is not None

    def find_response_handler(self, request: Any, response: Any) -> ResponseHandlerSpec:
        for spec in self.response_handlers:
            if spec.matches_request(request) and spec.matches_response(response):
                return spec
        raise MessageNotHandledError(
            f"executor {self.id!r} has no @response_handler for request {type_name(type(request))}"
            f" with response {type_name(type(response))}"
        )

    def require_handler(self, message: Any) -> HandlerSpec:
        spec = self.find_handler(message)
        if spec is None:
            accepted = ", ".join(type_name(t) for t in self.input_types) or "nothing"
            raise MessageNotHandledError(
                f"executor {self.id!r} has no handler for {type_name(type(message))} "
                f"(it accepts {accepted})"
            )
        return spec

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r})"


class FunctionExecutor(Executor):
    """An executor made from one ``async def f(message: T, ctx: WorkflowContext[...])``."""

    def __init__(self, func: Callable[..., Awaitable[Any]], id: str | None = None) -> None:
        if not inspect.iscoroutinefunction(func):
            raise DefinitionError(f"@executor {func.__qualname__} must be an async def")
        super().__init__(id or func.__name__)
        self.func = func
        self._spec = _function_spec(func)

    @property
    def handlers(self) -> tuple[HandlerSpec, ...]:
        return (self._spec,)

    @property
    def response_handlers(self) -> tuple[ResponseHandlerSpec, ...]:
        return ()

    @property
    def class_name(self) -> str:
        return f"FunctionExecutor[{self.func.__module__}.{self.func.__qualname__}]"


_SPEC_ATTR = "__workflow_spec__"


def _function_spec(func: Callable[..., Awaitable[Any]]) -> HandlerSpec:
    """``resolve_handler`` for a plain function, kept on the function itself: a factory that
    wraps the same function in a new executor for every build reads its type hints once. (On
    the function, not in a module cache: the spec refers to the function, so a cache would keep
    every closure alive.) Reused only for the very function, annotations and ``@handler``
    overrides it was read from."""
    annotations = getattr(func, "__annotations__", None)
    mark = getattr(func, _HANDLER_MARK, None)
    known = getattr(func, "__dict__", {}).get(_SPEC_ATTR)
    if type(known) is tuple:  # (annotations, mark, spec); functools.wraps copies it over
        kept_annotations, kept_mark, spec = known
        if spec.func is func and kept_annotations is annotations and kept_mark == mark:
            return cast(HandlerSpec, spec)
    spec = resolve_handler(func, bound=False)
    with contextlib.suppress(AttributeError, TypeError):  # e.g. a bound method
        setattr(func, _SPEC_ATTR, (annotations, mark, spec))
    return spec


def executor(func: Callable[..., Awaitable[Any]] | None = None, *, id: str | None = None) -> Any:
    """Turn an async function into a :class:`FunctionExecutor` (id defaults to its name)."""

    def wrap(f: Callable[..., Awaitable[Any]]) -> FunctionExecutor:
        return FunctionExecutor(f, id=id)

    return wrap(func) if func is not None else wrap


def _looks_at_value(annotation: Any) -> bool:
    """Whether matching ``annotation`` depends on a value beyond its type."""
    origin = get_origin(annotation)
    if origin is typing.Literal:
        return True
    if origin is typing.Annotated:
        return True
    if origin is not None:
        return origin in (list, dict, tuple, set, frozenset) or any(
            _looks_at_value(a) for a in get_args(annotation)
        )
    return False
