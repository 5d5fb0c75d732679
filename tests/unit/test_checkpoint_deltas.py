"""A checkpoint's ``changes`` must be complete: parent + delta rebuilds it exactly.

Durable stores persist deltas between snapshots, so if the runner ever forgot to list a change,
a restored run would silently differ. This property drives random state writes, shared writes,
outputs, requests, answers and cancellation, and checks every consecutive pair.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from workflow_engine import (
    Checkpoint,
    CheckpointDelta,
    Executor,
    InMemoryCheckpointStore,
    RequestPort,
    WorkflowBuilder,
    WorkflowContext,
    apply_delta,
    delta_of,
    handler,
)
from workflow_engine._checkpoint import apply_deltas

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


class Op(BaseModel):
    kind: str  # state | shared | grow | output | ask | next
    key: str = "k"
    value: int = 0


class Plan(BaseModel):
    ops: list[Op]
    trail: list[int | bool] = []
    """Grows by a value at every step (a bool for a negative one, so that ``True == 1`` must
    not pass for a kept item): a message passing on a list grown, as an agent passes on its
    conversation (a delta stores the new items only)."""


class Question(BaseModel):
    remaining: list[Op]
    trail: list[int | bool] = []


class Scripted(Executor):
    @handler
    async def run(self, plan: Plan, ctx: WorkflowContext[Plan | Question, int]) -> None:
        ops = list(plan.ops)
        trail = list(plan.trail)
        while ops:
            op = ops.pop(0)
            if op.kind == "state":
                await ctx.set_state(op.key, [op.value, await ctx.get_state(op.key)])
            elif op.kind == "shared":
                await ctx.set_shared(op.key, op.value)
            elif op.kind == "grow":  # a shared list that grows (a delta stores the new items)
                xs = await ctx.get_shared(op.key, [])
                xs = xs if isinstance(xs, list) else []
                # a negative value prepends: the list changed, but did not only grow
                await ctx.set_shared(op.key, [op.value, *xs] if op.value < 0 else [*xs, op.value])
            elif op.kind == "output":
                await ctx.yield_output(op.value)
            elif op.kind == "ask":
                await ctx.send_message(Question(remaining=ops, trail=trail))
                return
            else:  # next superstep
                grown = [*trail, op.value if op.value >= 0 else op.value < -2]
                await ctx.send_message(Plan(ops=ops, trail=grown if op.key != "$c" else grown[1:]))
                return


class Resumer(Executor):
    @handler
    async def resume(self, answer: Question, ctx: WorkflowContext[Plan]) -> None:
        await ctx.send_message(Plan(ops=answer.remaining, trail=answer.trail))


def build():
    scripted = Scripted("scripted")
    port = RequestPort("ask", request_type=Question, response_type=Question)
    resumer = Resumer("resumer")
    return (
        WorkflowBuilder(name="deltas", start=scripted)
        .add_edge(scripted, scripted)
        .add_edge(scripted, port)
        .add_edge(port, resumer)
        .add_edge(resumer, scripted)
        .build()
    )


ops = st.lists(
    st.builds(
        Op,
        kind=st.sampled_from(["state", "shared", "grow", "grow", "output", "ask", "next", "next"]),
        key=st.sampled_from(["a", "b", "$c"]),
        value=st.integers(-5, 5),
    ),
    max_size=14,
)


def check_chain(checkpoints: list[Checkpoint]) -> int:
    by_id = {c.checkpoint_id: c for c in checkpoints}
    checked = 0
    for cp in checkpoints:
        if cp.parent_id is None:
            continue
        delta = CheckpointDelta.model_validate_json(delta_of(cp).model_dump_json())
        event(f"messages kept from the parent's: {len(delta.changes.message_appends)}")
        rebuilt = apply_delta(by_id[cp.parent_id], delta)
        assert rebuilt == cp
        assert Checkpoint.from_json(rebuilt.to_json()) == cp
        checked += 1
    # a store folds a whole chain at once: the same checkpoints
    deltas = [delta_of(c) for c in checkpoints[1:]]
    if all(d.parent_id == c.checkpoint_id for d, c in zip(deltas, checkpoints, strict=False)):
        for i in range(1, len(deltas) + 1):
            assert apply_deltas(checkpoints[0], deltas[:i]) == checkpoints[i]
    return checked


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(plan=ops, cancel_at_pause=st.booleans())
async def test_parent_plus_delta_rebuilds_every_checkpoint(plan, cancel_at_pause) -> None:
    wf = build()
    store = InMemoryCheckpointStore()
    result = await wf.run(Plan(ops=plan), checkpoint_store=store)
    rounds = 0
    while result.pending_requests and rounds < 20:
        rounds += 1
        if cancel_at_pause and rounds == 2:
            await wf.cancel(checkpoint=result.checkpoint, checkpoint_store=store)
            break
        answers = {r.request_id: r.data for r in result.pending_requests}
        result = await wf.run(
            checkpoint=result.checkpoint, responses=answers, checkpoint_store=store
        )
    checkpoints = list(await store.list(result.run_id))
    assert check_chain(checkpoints) == len(checkpoints) - 1


@pytest.mark.parametrize("version", [99, 2**63])
@pytest.mark.parametrize("model", ["checkpoint", "delta", "span"])
def test_a_body_from_a_newer_engine_is_refused_before_its_fields_are_read(model, version) -> None:
    """A newer layout is refused by name even when its other fields would not validate here (a
    field renamed, one added as required): the version is checked first, not after them."""
    from workflow_engine import CheckpointVersionError
    from workflow_engine._checkpoint import CheckpointSpan

    newer = {"schema_version": version, "checkpoint_id": "c-new", "run_id": "r-new", "x": [1]}
    body = {"checkpoint": newer, "base_id": "b"} if model == "span" else newer
    if model == "span":
        body["schema_version"] = 4
    reader = {"checkpoint": Checkpoint, "delta": CheckpointDelta, "span": CheckpointSpan}[model]
    text = json.dumps(body)
    with pytest.raises(
        CheckpointVersionError, match=f"schema version {version}, written by a newer"
    ):
        reader.model_validate_json(text)
    named = f"checkpoint 'c-new' of run 'r-new' has schema version {version}"
    for read in (lambda: reader.model_validate_json(text), lambda: reader.model_validate(body)):
        with pytest.raises(CheckpointVersionError) as info:
            read()
        assert named in str(info.value), str(info.value)
    if model == "checkpoint":
        with pytest.raises(CheckpointVersionError) as info:
            Checkpoint.from_json(text)
        assert named in str(info.value)


@pytest.mark.parametrize("version", [True, False, 0, -1, "4", " 4 ", 4.0, "99", None])
def test_a_version_no_engine_writes_is_not_read_as_one(version) -> None:
    """Every engine writes a JSON integer from 1 up: anything else is damage, not a version."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="schema_version"):
        Checkpoint.model_validate_json(json.dumps({"schema_version": version}))
