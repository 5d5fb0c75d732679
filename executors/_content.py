"""Chat messages and their contents: text, function calls and results, tool approvals.

All pydantic, all JSON: a conversation is checkpointed as it is, and a
``ToolApprovalRequestContent`` travels to a human as the data of a ``RequestInfoEvent``.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_core import to_jsonable_python

from workflow_engine._events import valid_text

Role = Literal["system", "user", "assistant", "tool"]


class _Content(BaseModel):
    model_config = ConfigDict(frozen=True)


class TextContent(_Content):
    type: Literal["text"] = "text"
    text: str


class FunctionCallContent(_Content):
    """The model asks to call tool ``name`` with ``arguments`` (a JSON object)."""

    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, sort_keys=True)


MAX_NESTING = 64
"""How deep the arrays and objects of a tool's result, or of a model's call's arguments, may
nest to be kept as they are (a checkpoint nests them a few levels deeper still, and refuses
past 180): deeper, a result is kept as its ``repr``, arguments as their text."""


def nests_within(value: Any, limit: int = MAX_NESTING) -> bool:
    """Whether the lists and dicts of ``value`` (JSON's form) nest at most ``limit`` deep."""
    level: list[Any] = [value]
    for _ in range(limit + 1):
        inner: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                inner.extend(item.values())
            elif isinstance(item, list):
                inner.extend(item)
        if not inner:
            return True
        level = inner
    return False


def plain_result(value: Any) -> Any:
    """What a tool returned, as the model reads it and a checkpoint stores it: its JSON form (a
    model, a set, a ``Decimal``, a datetime as JSON), else its ``repr`` -- never an error. A
    result JSON cannot hold (bytes that are not UTF-8, a dict that holds itself) failed the
    turn after the tool ran, and a resume ran the tool again (outside tester 109); so did one
    nesting deeper than a checkpoint holds (outside tester 184)."""
    try:
        plain = to_jsonable_python(value)
        if not nests_within(plain):
            raise ValueError("nests too deep")
        # (what ``text`` does with it; as UTF-8, as it is stored: a file name decoded with
        # surrogateescape failed the run after the tool ran, left in doubt -- tester 167)
        json.dumps(plain, ensure_ascii=False).encode("utf-8")
        return plain
    except Exception:
        try:
            # (repr escapes a lone surrogate; a class's own __repr__ may not: tester 173)
            return valid_text(repr(value))
        except Exception:
            kind = type(value).__name__
            return f"<{'an' if kind[:1].lower() in 'aeiou' else 'a'} {kind} that cannot be shown>"


class FunctionResultContent(_Content):
    """What a tool returned (or why it did not run) for the call ``call_id``."""

    type: Literal["function_result"] = "function_result"
    call_id: str
    name: str = ""
    result: Any = None
    error: str | None = None

    @property
    def text(self) -> str:
        if self.error is not None:
            return f"Error: {self.error}"
        return self.result if isinstance(self.result, str) else json.dumps(self.result)


class ToolApprovalResponseContent(_Content):
    """A human's decision on a held tool call. ``arguments`` replaces the call's arguments
    (validated against the tool's schema) when the human edited them."""

    type: Literal["tool_approval_response"] = "tool_approval_response"
    approved: bool
    arguments: dict[str, Any] | None = None
    id: str | None = None
    function_call: FunctionCallContent | None = None
    reason: str | None = None


class ToolApprovalRequestContent(_Content):
    """A tool call held for human approval; answer it with :meth:`create_response`."""

    type: Literal["tool_approval_request"] = "tool_approval_request"
    id: str
    function_call: FunctionCallContent

    def create_response(
        self, approved: bool, arguments: dict[str, Any] | None = None, reason: str | None = None
    ) -> ToolApprovalResponseContent:
        return ToolApprovalResponseContent(
            approved=approved,
            arguments=arguments,
            id=self.id,
            function_call=self.function_call,
            reason=reason,
        )


Content = Annotated[
    TextContent
    | FunctionCallContent
    | FunctionResultContent
    | ToolApprovalRequestContent
    | ToolApprovalResponseContent,
    Field(discriminator="type"),
]


class ChatMessage(BaseModel):
    """One message of a conversation."""

    model_config = ConfigDict(frozen=True)

    role: Role
    contents: list[Content] = Field(default_factory=list)
    author_name: str | None = None
    message_id: str | None = None

    def __init__(self, role: Role, text: str | None = None, **fields: Any) -> None:
        """``ChatMessage("user", text="hi")``, as in MAF (the role may be given by position;
        ``text``: see ``_text_as_content``)."""
        if text is not None:
            fields["text"] = text
        super().__init__(role=role, **fields)

    # validation (a checkpoint read back, a model's JSON) sets the fields directly, as for a
    # model without an ``__init__`` of its own: pydantic otherwise calls it for every message
    # decoded, which doubled the cost of reading a conversation back
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    @model_validator(mode="before")
    @classmethod
    def _text_as_content(cls, data: Any) -> Any:
        """``text`` is a text content, after any ``contents`` given: it was ignored, so the
        message was sent empty -- built as ``ChatMessage("user", text="hi")`` or validated
        from ``{"role": "user", "text": "hi"}`` (outside testers 158, 176)."""
        if type(data) is dict and "text" in data:
            data = dict(data)
            text = data.pop("text")
            if text is None:  # (as ``ChatMessage("user", text=None)``: no text)
                return data
            if not isinstance(text, str):
                raise ValueError(f"ChatMessage text takes text, not {type(text).__name__}")
            data["contents"] = [*(data.get("contents") or ()), TextContent(text=text)]
        return data

    __workflow_input_keys__: ClassVar[tuple[str, ...]] = ("text",)
    """Keys its data may hold beside its fields (``_text_as_content`` reads them): an answer
    ``{"role": "user", "text": ...}`` is not refused as naming no field."""

    @classmethod
    def user(cls, text: str) -> ChatMessage:
        return cls(role="user", contents=[TextContent(text=text)])

    @classmethod
    def assistant(cls, text: str, author_name: str | None = None) -> ChatMessage:
        return cls(role="assistant", contents=[TextContent(text=text)], author_name=author_name)

    @property
    def text(self) -> str:
        return "".join(c.text for c in self.contents if isinstance(c, TextContent))

    @property
    def function_calls(self) -> list[FunctionCallContent]:
        return [c for c in self.contents if isinstance(c, FunctionCallContent)]

    @property
    def function_results(self) -> list[FunctionResultContent]:
        return [c for c in self.contents if isinstance(c, FunctionResultContent)]

    @property
    def approval_requests(self) -> list[ToolApprovalRequestContent]:
        return [c for c in self.contents if isinstance(c, ToolApprovalRequestContent)]

    @property
    def approval_responses(self) -> list[ToolApprovalResponseContent]:
        return [c for c in self.contents if isinstance(c, ToolApprovalResponseContent)]


def same_argument(a: Any, b: Any) -> bool:
    """Whether two values of a call's argument are the same: numbers by value (``10`` is
    ``10.0``, as JSON tells them apart no more than a tool does), a boolean only as a boolean,
    lists and dicts item by item, anything else by type and ``==``. Not through the codec's
    canonical JSON, which reads a client's ``{"$tuple": ...}`` as a tuple (outside tester
    104)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same_argument, a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_argument(a[k], b[k]) for k in a)
    return type(a) is type(b) and bool(a == b)


def approval_id(call_id: str) -> str:
    """The id of the approval request (and of its answer) that holds the call ``call_id``."""
    return f"approval_{call_id}"


def edited_arguments(
    call: FunctionCallContent, answer: ToolApprovalResponseContent | None
) -> dict[str, Any]:
    """The call's arguments with a reviewer's edits applied (edits override, the rest stays)."""
    if answer is None or answer.arguments is None:
        return dict(call.arguments)
    return {**call.arguments, **answer.arguments}


_MODEL_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")
"""A tool call id every model's API takes: OpenAI's at most 40 characters, Anthropic's only
letters, digits, ``_`` and ``-``."""


def model_call_id(call_id: str) -> str:
    """``call_id`` as every model's API takes it: kept when it is one, else ``call_<digest>``
    -- the same for a call and its result, at every turn. The AG-UI stream names a call by its
    run and the model's id (``support:<thread>/<n>:call_1``, 60 characters), a client sends
    those back, and a model's API refused them: every later turn of the thread failed
    (outside tester 157)."""
    if _MODEL_CALL_ID.fullmatch(call_id):
        return call_id
    return "call_" + hashlib.sha256(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]
