"""Shared lists of JSON primitives take a fast path (set_shared remembers the encoding is flat,
get_shared then copies it without a type scan; a list that only grew is stored as its new items).
The fast path must be invisible: the same reads, outputs and checkpoints as the codec's general
path, which a ``TaggedJsonCodec`` subclass always takes."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.retyping import retyped
from workflow_engine import (
    Checkpoint,
    CheckpointDelta,
    Executor,
    InMemoryCheckpointStore,
    WorkflowBuilder,
    WorkflowContext,
    apply_delta,
    delta_of,
    handler,
)
from workflow_engine._codec import TaggedJsonCodec

pytestmark = [pytest.mark.anyio, pytest.mark.trio_too]


class GeneralPathCodec(TaggedJsonCodec):
    """The same codec (same name, same encodings), but not the exact type the fast path needs."""


scalars = st.one_of(st.integers(-3, 3), st.text(max_size=2), st.none(), st.booleans())
steps = st.lists(
    st.tuples(
        st.sampled_from(
            ["append", "prepend", "set_item", "float", "dict", "mutate_read", "twice", "retype"]
        ),
        scalars,
    ),
    max_size=12,
)


class Mutator(Executor):
    @handler
    async def step(self, ops: list[Any], ctx: WorkflowContext[list[Any], Any]) -> None:
        if not ops:
            return
        (kind, value), rest = ops[0], ops[1:]
        xs = await ctx.get_shared("xs", [])
        if not isinstance(xs, list):
            xs = []
        if kind == "append":
            xs.append(value)
        elif kind == "prepend":
            xs.insert(0, value)
        elif kind == "set_item" and xs:
            xs[0] = value
        elif kind == "float":
            xs.append(0.5)  # a float: encoded by the general path
        elif kind == "dict":
            xs = {"v": value}
        elif kind == "mutate_read":
            xs.append("not written")  # read, changed, never written back
            xs = await ctx.get_shared("xs", [])
        elif kind == "retype":  # equal, other type: True == 1, 0 == False, 0.0 == -0.0
            xs = [retyped(x) for x in xs] + [value]
        elif kind == "twice":  # write, read back own write, write again
            await ctx.set_shared("xs", [*xs, value])
            xs = await ctx.get_shared("xs")
            xs.append(value)
        await ctx.set_shared("xs", xs)
        await ctx.set_state("mirror", xs)  # the same list through executor state
        if isinstance(xs, list):
            xs.append("changed after the write")  # must not reach the stored value
        await ctx.yield_output(await ctx.get_shared("xs"))
        await ctx.send_message(rest)


async def run(ops: list[Any], codec_type: type[TaggedJsonCodec]) -> tuple[Any, list[Checkpoint]]:
    mutator = Mutator("m")
    wf = WorkflowBuilder(name="shared-fast-path", start=mutator).add_edge(mutator, mutator).build()
    wf.codec = codec_type(wf.registry)
    store = InMemoryCheckpointStore()
    result = await wf.run(ops, checkpoint_store=store)
    return result.outputs, list(await store.list(result.run_id))


def comparable(cp: Checkpoint) -> str:
    return cp.model_dump_json(
        exclude={"checkpoint_id", "parent_id", "run_id", "created_at", "step_secret", "messages"}
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=steps)
async def test_fast_path_matches_the_general_path(ops: list[tuple[str, Any]]) -> None:
    plan = [list(op) for op in ops]
    fast_outputs, fast = await run(plan, TaggedJsonCodec)
    slow_outputs, slow = await run(plan, GeneralPathCodec)
    assert fast_outputs == slow_outputs
    assert [comparable(c) for c in fast] == [comparable(c) for c in slow]
    by_id = {c.checkpoint_id: c for c in fast}
    for cp in fast:  # every delta (appends stored as their new items) rebuilds its checkpoint
        if cp.parent_id is not None:  # exactly: as JSON, where True and 1 differ
            delta = CheckpointDelta.model_validate_json(delta_of(cp).model_dump_json())
            rebuilt = apply_delta(by_id[cp.parent_id], delta)
            assert rebuilt.model_dump_json() == cp.model_dump_json()


async def test_a_growing_shared_list_is_stored_as_its_new_items() -> None:
    outputs, checkpoints = await run([["append", i] for i in range(5)], TaggedJsonCodec)
    assert outputs[-1] == [0, 1, 2, 3, 4]
    last = checkpoints[-2]  # the last one wrote nothing
    assert last.changes.shared_state_appends == {"xs": 4}
    assert delta_of(last).shared_state == {"xs": [4]}


async def test_a_delta_without_shared_appends_is_written_as_before() -> None:
    """The new field is left out of the JSON when empty: runs that never grow a shared list
    write the same bytes as before it existed (and snapshot spacing, which counts bytes, too)."""
    outputs, checkpoints = await run(
        [["append", 1], ["append", 2], ["dict", 1], ["append", 3]], TaggedJsonCodec
    )
    assert outputs == [[1], [1, 2], {"v": 1}, [3]]
    texts = [delta_of(c).model_dump_json() for c in checkpoints if c.parent_id is not None]
    assert [t.count('"shared_state_keys":["xs"]') for t in texts] == [1, 1, 1, 1, 0]
    assert '"shared_state_appends":{"xs":1}' in texts[1]  # [1] -> [1, 2]: the new item only
    assert all("shared_state_appends" not in t for i, t in enumerate(texts) if i != 1)
