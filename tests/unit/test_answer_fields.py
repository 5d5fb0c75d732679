"""An answer given as JSON-shaped data may name only keys its type's fields take.

Pydantic drops an unknown key by default, so a person's typo would vanish while the run goes
on. Every model or dataclass in the answer that does not declare its own ``extra`` refuses
them, at any depth; one that declares it gets what it declares. Python values inside the data
(a model, bytes, an enum, a set) are taken as themselves (they used to be their ``str()``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import date
from typing import Any, ClassVar, Never

import anyio
import pytest
from pydantic import AliasPath, BaseModel, ConfigDict, Field, RootModel, model_validator
from pydantic.alias_generators import to_camel
from typing_extensions import TypedDict

from workflow_engine import (
    Executor,
    ResponseTypeError,
    WorkflowBuilder,
    WorkflowContext,
    handler,
    response_handler,
)


class Inner(BaseModel):
    score: int


class InnerAllow(BaseModel):
    model_config = ConfigDict(extra="allow")
    score: int


class InnerIgnore(BaseModel):
    model_config = ConfigDict(extra="ignore")
    score: int


class Outer(BaseModel):
    note: str = ""
    inner: Inner | None = None


class OuterAllow(BaseModel):
    model_config = ConfigDict(extra="allow")
    inner: Inner


class OuterWithAllowInner(BaseModel):
    inner: InnerAllow


class Aliased(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    full_name: str = Field(alias="fullName")


class Inners(RootModel[list[Inner]]):
    pass


class Color(enum.Enum):
    RED = 1


class Misc(BaseModel):
    blob: bytes
    color: Color
    tags: set[str]
    inner: Inner


@dataclass
class Decision:
    approved: bool
    reviewer: str = ""


class Prefs(BaseModel):
    """Reads its camelCase aliases only (no ``populate_by_name``)."""

    model_config = ConfigDict(alias_generator=to_camel)
    user_name: str = "anon"
    notify_me: bool = False


class Renamed(BaseModel):
    level: int = Field(0, alias="a", validation_alias="b")


class Pathed(BaseModel):
    deep: int = Field(0, validation_alias=AliasPath("a", "b"))


class ByDay(BaseModel):
    days: dict[date, Inner]


class Scores(RootModel[dict[str, Inner]]):
    pass


class Settings(TypedDict):
    retries: int


class WithSettings(BaseModel):
    settings: Settings


class Sub(Inner):
    more: int = 0


class Holder(BaseModel):
    item: Inner


class Blob(BaseModel):
    model_config = ConfigDict(val_json_bytes="base64")
    blob: bytes


class Pair(enum.Enum):
    ONE_TWO = (1, 2)


class WithPair(BaseModel):
    pair: Pair


class Forbids(BaseModel):
    model_config = ConfigDict(extra="forbid")
    message: str = ""


class Note(BaseModel):
    """Reads ``text`` beside its field, as ``ChatMessage`` does, and says so."""

    lines: list[str] = []
    __workflow_input_keys__: ClassVar[tuple[str, ...]] = ("text",)

    @model_validator(mode="before")
    @classmethod
    def _text(cls, data: Any) -> Any:
        if isinstance(data, dict) and "text" in data:
            data = {**data, "lines": [*data.get("lines", []), data["text"]]}
            del data["text"]
        return data


class Priced(BaseModel):
    amount: float


ANSWER_TYPES = (
    Priced,
    Note,
    Forbids,
    Inner,
    InnerAllow,
    InnerIgnore,
    Outer,
    OuterAllow,
    OuterWithAllowInner,
    Aliased,
    Color,
    Misc,
    Decision,
    Inners,
    Prefs,
    Renamed,
    Pathed,
    ByDay,
    Scores,
    WithSettings,
    Sub,
    Holder,
    Blob,
    WithPair,
)


class Ask(Executor):
    """Asks once for an answer of ``answer_type`` and yields what it got."""

    def __init__(self, answer_type: Any) -> None:
        super().__init__("ask")
        self.answer_type = answer_type

    @handler
    async def ask(self, question: str, ctx: WorkflowContext[Never, Any]) -> None:
        await ctx.request_info(question, self.answer_type)

    @response_handler
    async def answered(self, question: str, answer: Any, ctx: WorkflowContext[Never, Any]) -> Any:
        await ctx.yield_output(answer)


# a type expression (not a class) must be the annotation of the handler its answer goes to


def asker_of(answer_type: Any) -> type[Ask]:
    """An ``Ask`` whose response handler is annotated with ``answer_type``."""

    async def answered(
        self: Ask, question: str, answer: Any, ctx: WorkflowContext[Never, Any]
    ) -> Any:
        await ctx.yield_output(answer)

    answered.__annotations__["answer"] = answer_type
    return type(f"AskFor{len(ASKERS)}", (Ask,), {"answered": response_handler(answered)})


ASKERS: dict[Any, type[Ask]] = {}
for _expression in (
    dict[str, int],
    list[Inner],
    dict[str, Inner],
    list[InnerAllow],
    InnerAllow | Inner,
    float,
    list[float],
    float | None,
):
    ASKERS[_expression] = asker_of(_expression)


def answer(answer_type: Any, data: Any) -> Any:
    """What a run asking for ``answer_type`` gets from ``data`` (or the refusal)."""

    async def go() -> Any:
        workflow = (
            WorkflowBuilder("ask", start=ASKERS.get(answer_type, Ask)(answer_type))
            .register_types(*ANSWER_TYPES)
            .build()
        )
        paused = await workflow.run("?")
        (request,) = paused.pending_requests
        done = await workflow.run(
            checkpoint=paused.checkpoint, responses={request.request_id: data}
        )
        (given,) = done.outputs
        return given

    return anyio.run(go)


@pytest.mark.parametrize(
    ("answer_type", "data", "refused"),
    [
        (Inner, {"score": 1, "scor": 2}, "scor: Inner has no such field"),
        (Outer, {"inner": {"score": 1, "scroe": 2}}, "inner.scroe: Inner has no such field"),
        (list[Inner], [{"score": 1}, {"scor": 1, "score": 2}], "1.scor: Inner has no such"),
        (dict[str, Inner], {"k": {"score": 1, "x": 0}}, "k.x: Inner has no such field"),
        (Decision, {"approved": True, "reviwer": "ann"}, "reviwer: Decision has no such"),
        # a model that declares extra="allow" does not make the models inside it lax
        (OuterAllow, {"inner": {"score": 1, "scroe": 2}}, "inner.scroe: Inner has no such"),
        (Aliased, {"fullName": "Ann", "full_nam": "x"}, "full_nam: Aliased has no such"),
        (Inners, [{"score": 1, "scor": 2}], "0.scor: Inner has no such field"),
        # a field's Python name where the model reads only its alias (tester 46: dropped)
        (Prefs, {"user_name": "bob", "notifyMe": True}, "user_name: Prefs has no such field"),
        (Renamed, {"a": 5}, "a: Renamed has no such field"),
        (Pathed, {"a": {"b": 1}, "yy": 2}, "yy: Pathed has no such field"),
        # keys converted by validation (dates), a TypedDict inside a model
        (ByDay, {"days": {"2024-01-01": {"nmae": "x", "score": 1}}}, "nmae: Inner has no such"),
        (WithSettings, {"settings": {"retries": 1, "retires": 2}}, "retires: Settings has no"),
    ],
)
def test_a_key_no_field_takes_is_refused(answer_type: Any, data: Any, refused: str) -> None:
    with pytest.raises(ResponseTypeError, match=refused):
        answer(answer_type, data)


def test_a_key_a_model_forbids_is_said_once_with_the_field_meant() -> None:
    """pydantic's "Extra inputs are not permitted" and the engine's own line both named it
    (outside tester 153)."""
    with pytest.raises(ResponseTypeError) as refused:
        answer(Forbids, {"mesage": "hi"})
    said = str(refused.value)
    assert said.count("mesage") == 1 and "did you mean 'message'" in said, said


def test_a_typo_of_a_required_field_is_named_with_the_field_meant() -> None:
    """It was said only as the required field missing, the key typed not named (outside
    tester 149); a model reading aliases is left to say only what it says."""
    said = "approved: Field required; aproved: Decision has no such field .did you mean 'approved'"
    with pytest.raises(ResponseTypeError, match=said):
        answer(Decision, {"aproved": True})
    with pytest.raises(ResponseTypeError) as refused:
        answer(Aliased, {"fullName": 5})
    assert "no such field" not in str(refused.value)
    # the hint after a model's answer validated too, by the keys it reads (tester 151)
    with pytest.raises(ResponseTypeError, match="reviwer: Decision has no such field .did you"):
        answer(Decision, {"approved": True, "reviwer": "ann"})
    with pytest.raises(ResponseTypeError, match="fulName: Aliased has no such field .did you"):
        answer(Aliased, {"fullName": "Ann", "fulName": "x"})


@pytest.mark.parametrize(
    ("answer_type", "data", "expected"),
    [
        (list[InnerAllow], [{"score": 1, "x": 1}], [InnerAllow(score=1, x=1)]),
        (InnerAllow | Inner, {"score": 1, "x": 1}, InnerAllow(score=1, x=1)),
        (OuterWithAllowInner, {"inner": {"score": 1, "x": 2}}, None),
        (InnerIgnore, {"score": 1, "okk": 2}, InnerIgnore(score=1)),  # it says so itself
        (OuterAllow, {"inner": {"score": 1}, "why": "fine"}, None),
        (Aliased, {"fullName": "Ann"}, Aliased(full_name="Ann")),
        (Aliased, {"full_name": "Ann"}, Aliased(full_name="Ann")),
        (Prefs, {"userName": "bob", "notifyMe": True}, Prefs(userName="bob", notifyMe=True)),
        (Renamed, {"b": 5}, Renamed(b=5)),
        (Pathed, {"a": {"b": 3}}, Pathed(a={"b": 3})),
        (Scores, {"alice": {"score": 1}}, Scores({"alice": Inner(score=1)})),
    ],
)
def test_what_a_model_declares_it_takes_is_taken(
    answer_type: Any, data: Any, expected: Any
) -> None:
    given = answer(answer_type, data)
    if expected is not None:
        assert given == expected
    else:
        assert isinstance(given, answer_type)


def test_python_values_inside_the_data_are_taken_as_themselves() -> None:
    """A model instance, bytes, an enum member and a set inside a dict: each validates as what
    it is (bytes used to be stored as the text "b'hi'", the others refused)."""
    given = answer(
        Misc, {"blob": b"hi", "color": Color.RED, "tags": {"a"}, "inner": Inner(score=1)}
    )
    assert given == Misc(blob=b"hi", color=Color.RED, tags={"a"}, inner=Inner(score=1))


def test_python_values_are_validated_as_the_type_would_validate_them() -> None:
    """Data holding Python values is validated as Python (what the type's ``model_validate``
    takes), not first turned into JSON: an instance of a subclass stays one, bytes need not be
    UTF-8 (nor base64 where the model reads JSON bytes as base64), an enum member whose value
    is a tuple is itself (tester 46)."""
    held = answer(Holder, {"item": Sub(score=1, more=2)})
    assert type(held.item) is Sub and held.item.more == 2
    assert answer(Blob, {"blob": b"\xff\xfe"}) == Blob(blob=b"\xff\xfe")
    assert answer(WithPair, {"pair": Pair.ONE_TWO}) == WithPair(pair=Pair.ONE_TWO)
    with pytest.raises(ResponseTypeError, match="expected dict"):
        answer(dict[str, int], {1: 2})  # a key that is not text is refused, not made one


@pytest.mark.parametrize("text", ["a\ud800b", "caf\udce9.txt"])
def test_an_answer_holding_a_lone_surrogate_is_refused_by_name(text: str) -> None:
    """It was refused as "Invalid JSON: unexpected end of hex escape", JSON the caller never
    wrote (outside tester 166)."""
    with pytest.raises(ResponseTypeError, match="holds text with a lone surrogate") as refused:
        answer(Decision, {"approved": True, "reviewer": text})
    assert "Invalid JSON" not in str(refused.value)


@pytest.mark.parametrize(
    ("answer_type", "data", "given"),
    [(float, 2, 2.0), (list[float], [1, 2.5], [1.0, 2.5]), (float | None, 3, 3.0)],
)
def test_a_whole_number_answered_for_a_float_is_a_float(
    answer_type: Any, data: Any, given: Any
) -> None:
    """A web page sends 2.0 as 2: the handler's ``price: float`` got the int, and failed on
    what a float has (outside tester 176)."""
    got = answer(answer_type, data)
    assert got == given
    assert {type(v) for v in (got if isinstance(got, list) else [got])} == {float}


def test_a_key_a_class_declares_it_reads_is_not_refused() -> None:
    """``{"role": "user", "text": "hi"}`` answered for a ``ChatMessage`` was refused as
    naming no field, though the class reads it (outside tester 179); a typo still is."""
    assert answer(Note, {"text": "hi"}) == Note(lines=["hi"])
    meant = r"txet: Note has no such field \(did you mean 'text'"
    with pytest.raises(ResponseTypeError, match=meant):
        answer(Note, {"txet": "hi"})


def test_a_whole_number_too_large_for_a_float_is_refused() -> None:
    """It became infinity (outside testers 179, 180): at the top, in a model's field, and
    just past the largest float (which is below 2**1024)."""
    past = 2**1024 - 2**970  # (the smallest whole number that rounds past the largest float)
    for answer_type, data in ((float, 10**400), (Priced, {"amount": 10**400}), (float, past)):
        with pytest.raises(ResponseTypeError, match="a number too large for a float"):
            answer(answer_type, data)
    assert answer(float, past - 1) == float(past - 1)
    assert answer(Priced, {"amount": 2**1023}) == Priced(amount=float(2**1023))
