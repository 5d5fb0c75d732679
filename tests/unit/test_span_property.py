"""``apply_span(base, span_of(cp, base))`` rebuilds ``cp`` exactly -- as JSON, where True and 1,
-0.0 and 0.0, and the order of a dict's keys differ -- whatever grew, shrank or was retyped."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.unit.retyping import retyped
from workflow_engine import Checkpoint, WorkflowRunState
from workflow_engine._checkpoint import (
    CheckpointSpan,
    MessageRecord,
    RequestRecord,
    apply_span,
    read_span,
    span_of,
)

leaf = st.one_of(
    st.integers(-2, 2),
    st.booleans(),
    st.sampled_from([0.0, -0.0, 1.0, 0.5]),
    st.text(max_size=3),
    st.none(),
)
value = st.recursive(
    leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abc"), inner, max_size=3)
    ),
    max_leaves=6,
)
items = st.lists(value, max_size=6)


@st.composite
def grown(draw: st.DrawFn, old: list[Any], more: st.SearchStrategy = items) -> list[Any]:
    """``old`` grown, replaced, shrunk, or with equal items of another type."""
    how = draw(st.sampled_from(["grow", "replace", "shrink", "retype", "same"]))
    if how == "grow":
        return [*old, *draw(more)]
    if how == "replace":
        return draw(more)
    if how == "shrink":
        return old[: len(old) // 2]
    if how == "retype":
        return [retyped(x) for x in old] + draw(more)
    return list(old)


def in_flight(fields: list[dict[str, Any]]) -> list[MessageRecord]:
    """Messages in flight: a registered class's payload (``$type``), then plain dicts."""
    return [
        MessageRecord(
            source_id="e",
            target_id="f",
            data={"$type": "Turn", "data": f} if n % 2 == 0 else f,
        )
        for n, f in enumerate(fields)
    ]


def checkpoint(
    cid: str, states: dict, shared: dict, lists: tuple, messages: list[MessageRecord] = ()
) -> Checkpoint:
    outputs, cancelled, digests = lists
    return Checkpoint(
        messages=list(messages),
        codec="tagged-json/1",
        checkpoint_id=cid,
        run_id="run",
        workflow_name="w",
        workflow_signature="s",
        superstep=len(cid),
        status=WorkflowRunState.IN_PROGRESS,
        executor_states=states,
        shared_state=shared,
        outputs=outputs,
        cancelled_requests=cancelled,
        answered_digests=digests,
    )


@pytest.mark.slow  # 300 examples, ~5 s; the fast tier meets spans in integration/test_spans
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_span_rebuilds_its_checkpoint_exactly(data: st.DataObject) -> None:
    keys = ["log", "last", "other"]
    old_states = {"e": {k: data.draw(items) for k in keys}}
    old_shared = {k: data.draw(items) for k in keys}
    old_lists = (
        data.draw(items),
        data.draw(st.lists(st.text(max_size=2), max_size=5)),
        data.draw(st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=5)),
    )
    old_fields = [{"log": data.draw(items), "n": data.draw(leaf)} for _ in range(2)]
    base = checkpoint("base", old_states, old_shared, old_lists, in_flight(old_fields))
    new_states = {"e": {k: data.draw(grown(v)) for k, v in old_states["e"].items()}}
    new_states["f"] = {"x": data.draw(items)}
    new_shared = {k: data.draw(grown(v)) for k, v in old_shared.items()}
    digests = dict(old_lists[2])
    digests.update(data.draw(st.dictionaries(st.text(max_size=3), st.text(max_size=2))))
    new_lists = (
        data.draw(grown(old_lists[0])),
        data.draw(grown(old_lists[1], st.lists(st.text(max_size=2), max_size=3))),
        digests,
    )
    # a message passes on a list of one of the base's messages grown (or not), or a new one
    new_fields = [
        {"log": data.draw(grown(data.draw(st.sampled_from(old_fields))["log"])), "n": 0}
        for _ in range(data.draw(st.integers(0, 3)))
    ]
    cp = checkpoint("later", new_states, new_shared, new_lists, in_flight(new_fields))
    span = span_of(cp, base)
    assert span is not None
    event(f"messages kept: {len(span.messages_kept)}")
    stored = CheckpointSpan.model_validate_json(span.model_dump_json())
    assert read_span(span.model_dump_json()) == stored  # as a store's fold reads it
    assert apply_span(base, stored).model_dump_json() == cp.model_dump_json()
    # as a fold applies it: to a base of its own (parsed), extended in place
    parsed_base = Checkpoint.model_validate_json(base.model_dump_json())
    consumed = apply_span(parsed_base, stored, consume_base=True)
    assert consumed.model_dump_json() == cp.model_dump_json()


def request(request_id: str, data: Any) -> RequestRecord:
    return RequestRecord(
        request_id=request_id,
        port_id="review",
        source_executor_id="e",
        kind="port",
        data=data,
        response_type="bool",
        superstep=1,
    )


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_span_keeps_the_pending_requests_of_its_base_exactly(data: st.DataObject) -> None:
    """A span leaves out the pending requests it keeps of its base (a run waiting on 2,000
    stored them all in every span while they were answered one at a time: outside tester
    215) -- whatever was answered, added, changed or reordered since."""
    ids = [f"r{n}" for n in range(data.draw(st.integers(0, 8)))]
    base = checkpoint("base", {}, {}, ([], [], {}))
    base = base.model_copy(
        update={"pending_requests": {r: request(r, data.draw(leaf)) for r in ids}}
    )
    kept = [r for r in ids if data.draw(st.booleans())]  # the others were answered
    if data.draw(st.booleans()):
        kept = data.draw(st.permutations(kept))
    pending = {r: base.pending_requests[r] for r in kept}
    for r in kept:
        how = data.draw(st.sampled_from(["same", "same", "same", "copy", "retyped", "changed"]))
        if how == "copy":  # (an equal record read back: not the same object)
            pending[r] = request(r, base.pending_requests[r].data)
        elif how == "retyped":  # (equal by ==, not as JSON: True for 1)
            pending[r] = request(r, retyped(base.pending_requests[r].data))
        elif how == "changed":
            pending[r] = request(r, ["changed"])
    for n in range(data.draw(st.integers(0, 3))):
        pending[f"new{n}"] = request(f"new{n}", data.draw(leaf))
    cp = checkpoint("later", {}, {}, ([], [], {})).model_copy(update={"pending_requests": pending})
    span = span_of(cp, base)
    assert span is not None
    event(f"pending kept: {span.pending_kept > 0}")
    stored = read_span(span.model_dump_json())
    assert len(stored.checkpoint.pending_requests) == len(pending) - stored.pending_kept
    parsed_base = Checkpoint.model_validate_json(base.model_dump_json())
    for rebuilt in (apply_span(base, stored), apply_span(parsed_base, stored, consume_base=True)):
        assert rebuilt.model_dump_json() == cp.model_dump_json()
        assert list(rebuilt.pending_requests) == list(pending)
