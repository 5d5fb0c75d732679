"""``read_span`` reads a stored span as ``CheckpointSpan.model_validate_json`` would -- the
same span, or the same refusal -- with a validator it assembles itself (the model's costs a
new process ~0.6 ms to build). Bodies are a real span's, damaged in every field."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from workflow_engine import Checkpoint, WorkflowRunState
from workflow_engine._checkpoint import (
    CHECKPOINT_SCHEMA_VERSION,
    CheckpointSpan,
    MessageRecord,
    read_span,
    span_of,
)
from workflow_engine._errors import CheckpointVersionError

EXAMPLES = 150 if os.environ.get("PROPERTY_EXAMPLES") == "half" else 400


def _checkpoint(cid: str, grown: int) -> Checkpoint:
    log = list(range(3 + grown))
    conversation = [{"role": "user", "text": str(n)} for n in range(2 + grown)]
    return Checkpoint(
        codec="tagged-json/1",
        checkpoint_id=cid,
        run_id="run",
        workflow_name="w",
        workflow_signature="s",
        superstep=3 + grown,
        status=WorkflowRunState.IN_PROGRESS,
        messages=[MessageRecord(source_id="a", target_id="b", data={"log": conversation})],
        executor_states={"a": {"log": log, "big": "x" * 80}},
        shared_state={"xs": log, "same": ["kept"] * 3},
        outputs=log,
        cancelled_requests=["c1", "c2", *(["c3"] * grown)],
        answered_digests={f"r{n}": "d" for n in range(2 + grown)},
    )


SPAN = span_of(_checkpoint("later", 3), _checkpoint("base", 0))
assert SPAN is not None
GOOD = json.loads(SPAN.model_dump_json())
assert GOOD["messages_kept"] and GOOD["executor_state_same"]  # every field has a value

odd = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([2**70, 1.0, 1.5, -0.0, "1", "", "x", CHECKPOINT_SCHEMA_VERSION + 1]),
    st.lists(st.integers(0, 2), max_size=4),
    st.builds(lambda: [1, "k", 2, 3]),  # (new each time: changes go into it)
    st.dictionaries(st.sampled_from(["a", "log", "x"]), st.integers(0, 2), max_size=2),
    st.builds(lambda: {"a": ["log"]}),
)


def _paths(value: Any, path: tuple = ()) -> list[tuple]:
    """Every place in a JSON value (the value itself included)."""
    places = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            places += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            places += _paths(item, (*path, index))
    return places


PLACES = _paths(GOOD)


@st.composite
def damaged(draw: st.DrawFn) -> str:
    """The good span with a few places replaced, removed or added to."""
    body = json.loads(json.dumps(GOOD))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PLACES))
        how = draw(st.sampled_from(["replace", "remove", "add"]))
        if not path:
            if how == "replace":
                return json.dumps(draw(odd))
            continue
        parent = body
        try:
            for part in path[:-1]:
                parent = parent[part]
            last = path[-1]
            if how == "replace":
                parent[last] = draw(odd)
            elif how == "remove":
                del parent[last]
            elif isinstance(parent, dict):
                parent[draw(st.sampled_from(["extra", "base_id", "outputs_kept"]))] = draw(odd)
            elif isinstance(parent, list):
                parent.append(draw(odd))
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change moved it
    return json.dumps(body)


def _outcome(read: Any, body: str) -> Any:
    try:
        span = read(body)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
        # (the root's own type error names the model, or a dict: the same refusal)
        return "refused", [(e["loc"], e["type"]) for e in errors if e["loc"]]
    except CheckpointVersionError as exc:
        return "too new", str(exc)
    # (a damaged body without its checkpoint's time gets the time it is read at)
    return "read", type(span), span.model_dump(exclude={"checkpoint": {"created_at"}})


def test_a_stored_span_reads_as_the_model_reads_it() -> None:
    body = SPAN.model_dump_json()
    assert read_span(body) == CheckpointSpan.model_validate_json(body)
    assert read_span(body).model_dump_json() == body


@settings(max_examples=EXAMPLES, deadline=None)
@given(body=damaged())
def test_a_damaged_span_is_read_or_refused_as_the_model_would(body: str) -> None:
    assert _outcome(read_span, body) == _outcome(CheckpointSpan.model_validate_json, body)


@pytest.mark.parametrize("where", ["span", "its checkpoint"])
def test_a_span_from_a_newer_engine_is_refused_by_name(where: str) -> None:
    body = json.loads(SPAN.model_dump_json())
    (body if where == "span" else body["checkpoint"])["schema_version"] = 99
    with pytest.raises(CheckpointVersionError) as refused:
        read_span(json.dumps(body))
    assert "later" in str(refused.value) and "run" in str(refused.value), refused.value
    assert _outcome(read_span, json.dumps(body)) == _outcome(
        CheckpointSpan.model_validate_json, json.dumps(body)
    )
