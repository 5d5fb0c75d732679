"""Answers of every shape over AG-UI, to a workflow an application mounts: a resume payload is
the answer itself, as its ``responseSchema`` describes -- a string included.

A real uvicorn server in this process (``in_process``), a real HTTP client.
"""

import base64
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
from ag_ui.core import EventType
from fastapi import FastAPI

from tests.integration.agui_harness import Client, in_process, resolved
from tests.integration.askers import asker_workflow
from workflow_engine.executors import HandoffUserResponse
from workflow_engine.storage import SqliteStore
from workflow_engine_agui import add_agui_endpoint

pytestmark = pytest.mark.slow


@dataclass
class Upload:
    name: str
    body: bytes


ANSWER_TYPES: dict[str, Any] = {
    "bytes": bytes,
    "optional-bytes": bytes | None,
    "text": str,
    "anything": Any,
    "upload": Upload,
    "user-turn": HandoffUserResponse,
}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("typed-answers") / "runs.db"


@pytest.fixture(scope="module")
def client(db: Path) -> Any:
    app = FastAPI()
    store = SqliteStore(db)
    for path, answer_type in ANSWER_TYPES.items():
        add_agui_endpoint(app, asker_workflow(f"ask-{path}", answer_type), f"/{path}", store=store)
    add_agui_endpoint(app, asker_workflow("ask-dict", dict[str, Any]), "/dict", store=store)
    two = asker_workflow("ask-two", int, questions=2)
    add_agui_endpoint(app, two, "/two", store=store)
    with in_process(app) as port:
        yield Client(f"http://127.0.0.1:{port}")
    anyio.run(store.close)


CASES = [  # (endpoint, payload, the output's type as the wire names it)
    ("bytes", "AGhp/w==", "bytes"),
    ("optional-bytes", "AGhp/w==", "bytes"),
    ("text", "hello", "str"),
    ("anything", "hello", "str"),  # (it got {"message": "hello"})
    ("upload", {"name": "a", "body": "AGhp/w=="}, "Upload"),
]


@pytest.mark.parametrize(("path", "payload", "kind"), CASES)
def test_a_payload_is_the_answer_itself(client: Client, path: str, payload: Any, kind: str) -> None:
    """A string payload was wrapped as ``{"message": ...}`` whatever the answer's type: a
    ``str`` or ``bytes`` answer was refused, an ``Any`` one received the wrapper (outside
    tester 99). Bytes are the base64 the wire shows them as, in a plain dataclass too."""
    thread_id = f"typed-{uuid.uuid4().hex[:12]}"
    [interrupt] = client.start(f"/{path}", thread_id, "may I?").interrupts
    done = client.resume(f"/{path}", thread_id, resolved(interrupt.id, payload))
    assert done.last.type == EventType.RUN_FINISHED, done.describe()
    [output] = done.last.result["outputs"]  # (the answer, yielded: as the wire shows it)
    assert output == {"type": kind, "data": payload}, done.describe()
    again = client.resume(f"/{path}", thread_id, resolved(interrupt.id, payload))
    assert again.last.type == EventType.RUN_FINISHED, again.describe()  # the same answer


@pytest.mark.parametrize("path", ["bytes", "upload"])
def test_text_that_is_not_base64_is_refused_for_bytes(client: Client, path: str) -> None:
    thread_id = f"typed-{uuid.uuid4().hex[:12]}"
    [interrupt] = client.start(f"/{path}", thread_id, "may I?").interrupts
    bad = "not base64!" if path == "bytes" else {"name": "a", "body": "!!"}
    refused = client.resume(f"/{path}", thread_id, resolved(interrupt.id, bad))
    assert refused.error_code == "invalid_resume_payload", refused.describe()
    assert "base64" in refused.last.message
    if path == "upload":
        assert "body: " in refused.last.message and "0.body" not in refused.last.message
    good = base64.b64encode(b"ok").decode()
    payload = good if path == "bytes" else {"name": "a", "body": good}
    done = client.resume(f"/{path}", thread_id, resolved(interrupt.id, payload))
    assert done.last.type == EventType.RUN_FINISHED, done.describe()


def test_the_response_schema_says_bytes_are_base64(client: Client) -> None:
    """It said ``format: binary``, which tells a client nothing of base64 (tester 100)."""
    base64_text = {"type": "string", "contentEncoding": "base64"}
    for path in ("bytes", "optional-bytes", "upload"):
        [interrupt] = client.start(f"/{path}", f"typed-{uuid.uuid4().hex[:12]}", "?").interrupts
        schema = interrupt.response_schema
        if path == "bytes":
            assert schema == base64_text
        elif path == "optional-bytes":
            assert schema == {"anyOf": [base64_text, {"type": "null"}]}
        else:
            assert schema["$defs"]["Upload"]["properties"]["body"] == base64_text, schema


def test_the_handoff_s_user_turn_still_takes_a_bare_string(tmp_path: Path) -> None:
    """The one answer a bare string is wrapped for: a model whose field is ``message``."""
    from workflow_engine_agui._interrupts import _answered_with_a_message

    assert _answered_with_a_message(HandoffUserResponse)
    others = [t for path, t in ANSWER_TYPES.items() if path != "user-turn"]
    assert not any(_answered_with_a_message(t) for t in others)


SAME, DIFFERENT, INVALID = None, "invalid_resume", "invalid_resume_payload"
BOTH_PLACES = [  # (endpoint, payload in resume, in forwardedProps, what is said)
    ("user-turn", "hello", {"message": "hello"}, SAME),
    ("user-turn", {"message": "hello", "end": False}, "hello", SAME),
    ("bytes", "AGhp/w==", "AGhp_w==", SAME),  # (standard and URL-safe base64: both are read)
    ("dict", {"a": 10, "b": [1]}, {"b": [1.0], "a": 10.0}, SAME),
    ("user-turn", "hello", {"message": "bye"}, DIFFERENT),
    ("bytes", "AGhp/w==", "AGhp", DIFFERENT),
    # the codec's markers and an approval's words are the answer's own here, not stored data
    # read back: each was taken as the same answer as the one beside it (outside tester 102)
    ("anything", [1, 2], {"$tuple": [1, 2]}, DIFFERENT),
    ("anything", "aGk=", {"$bytes": "aGk="}, DIFFERENT),
    ("dict", {"approved": True}, {"accepted": True}, DIFFERENT),
    ("text", "hi", {"$bytes": "hi"}, INVALID),
    ("user-turn", {"message": "thanks"}, {"message": {"$bytes": "thanks"}}, INVALID),
]


@pytest.mark.parametrize(("path", "top", "nested", "said"), BOTH_PLACES)
def test_an_answer_in_both_places_is_compared_as_its_type_reads_it(
    client: Client, path: str, top: Any, nested: Any, said: str | None
) -> None:
    """``resume`` and ``forwardedProps.command.resume`` were compared as written, before the
    answer's type was known: a chat turn as the bare text in one and ``{"message": ...}`` in
    the other was refused as two different answers (outside tester 101), and a payload refused
    on its own was taken beside a valid one (tester 102). Different answers are refused before
    anything is stored: the right one is taken afterwards."""
    thread_id = f"typed-{uuid.uuid4().hex[:12]}"
    [interrupt] = client.start(f"/{path}", thread_id, "may I?").interrupts
    props = {"command": {"resume": resolved(interrupt.id, nested)}}
    both = client.resume(f"/{path}", thread_id, resolved(interrupt.id, top), forwardedProps=props)
    if said is SAME:
        assert both.last.type == EventType.RUN_FINISHED, both.describe()
        return
    assert both.error_code == said, both.describe()
    if said == DIFFERENT:
        assert interrupt.id in both.last.message and "different answers" in both.last.message
    done = client.resume(f"/{path}", thread_id, resolved(interrupt.id, top))
    assert done.last.type == EventType.RUN_FINISHED, done.describe()  # (nothing was stored)
    [output] = done.last.result["outputs"]
    assert output["data"] == top or path == "user-turn", done.describe()


def test_a_cancel_beside_answers_that_differ_is_refused_too(client: Client) -> None:
    """A cancel in both places cancelled the run without a look at the other answers, which
    differed (outside tester 102)."""
    thread_id = f"typed-{uuid.uuid4().hex[:12]}"
    first, second = client.start("/two", thread_id, "how many?").interrupts
    cancel = {"interruptId": first.id, "status": "cancelled"}

    def answers(value: Any) -> list[dict[str, Any]]:
        return [cancel, *resolved(second.id, value)]

    for nested, said in ((2, "invalid_resume"), ("not an int", "invalid_resume_payload")):
        props = {"command": {"resume": answers(nested)}}
        refused = client.resume("/two", thread_id, answers(1), forwardedProps=props)
        assert refused.error_code == said, refused.describe()
    props = {"command": {"resume": answers(1)}}
    done = client.resume("/two", thread_id, answers(1), forwardedProps=props)
    assert done.finished.outcome.type == "cancelled", done.describe()


def test_each_place_is_held_to_the_same_rules(client: Client) -> None:
    """Beside a ``resume``, a ``forwardedProps.command.resume`` answering an interrupt twice,
    or with an entry without a ``status``, was taken; alone, each was refused (tester 102)."""
    thread_id = f"typed-{uuid.uuid4().hex[:12]}"
    [interrupt] = client.start("/text", thread_id, "may I?").interrupts
    top = resolved(interrupt.id, "thanks")
    twice = [{"interruptId": interrupt.id, "status": "cancelled"}, *top]
    no_status = [{"interruptId": interrupt.id, "payload": "thanks"}]
    for nested, said in ((twice, "is answered twice"), (no_status, "status")):
        for where in ("alone", "beside"):
            extra = {"forwardedProps": {"command": {"resume": nested}}}
            answer = client.resume("/text", thread_id, top if where == "beside" else [], **extra)
            assert answer.status == 422, (where, answer.body)
            assert said in answer.body["message"], (where, answer.body)
    done = client.resume("/text", thread_id, top)
    assert done.last.type == EventType.RUN_FINISHED, done.describe()


def test_an_answer_given_before_is_compared_with_each_place(client: Client) -> None:
    """A resume sent again whose other place differs from the stored answer was taken as the
    same, read as stored data (``{"$tuple": [1, 2]}`` for ``[1, 2]``: outside tester 102)."""
    thread_id = f"typed-{uuid.uuid4().hex[:12]}"
    [interrupt] = client.start("/anything", thread_id, "may I?").interrupts
    done = client.resume("/anything", thread_id, resolved(interrupt.id, [1, 2]))
    assert done.last.type == EventType.RUN_FINISHED, done.describe()
    for nested, said in (({"$tuple": [1, 2]}, "invalid_resume"), ([1.0, 2], None)):
        props = {"command": {"resume": resolved(interrupt.id, nested)}}
        again = client.resume(
            "/anything", thread_id, resolved(interrupt.id, [1, 2]), forwardedProps=props
        )
        if said is None:
            assert again.last.type == EventType.RUN_FINISHED, again.describe()
        else:
            assert again.error_code == said, again.describe()


def test_a_cancel_beside_a_conflict_or_an_invalid_answer_cancels_nothing(client: Client) -> None:
    """A cancel cancelled the run before the answers beside it were looked at: a different
    answer to an interrupt answered before, or one no type takes, went unsaid, and the run was
    cancelled (outside tester 103)."""
    thread_id = f"typed-{uuid.uuid4().hex[:12]}"
    first, second = client.start("/two", thread_id, "how many?").interrupts
    paused = client.resume("/two", thread_id, resolved(first.id, 1))
    assert paused.finished.outcome.type == "interrupt", paused.describe()
    cancel = {"interruptId": second.id, "status": "cancelled"}
    for answer, said in ((99, "request_conflict"), ("not an int", "request_conflict")):
        refused = client.resume("/two", thread_id, [cancel, *resolved(first.id, answer)])
        assert refused.error_code == said, refused.describe()
    thread_id = f"typed-{uuid.uuid4().hex[:12]}"
    first, second = client.start("/two", thread_id, "how many?").interrupts
    cancel = {"interruptId": first.id, "status": "cancelled"}
    refused = client.resume("/two", thread_id, [cancel, *resolved(second.id, "not an int")])
    assert refused.error_code == "invalid_resume_payload", refused.describe()
    done = client.resume("/two", thread_id, [cancel, *resolved(second.id, 2)])
    assert done.finished.outcome.type == "cancelled", done.describe()


def test_two_batches_at_once_never_mix(client: Client, db: Path) -> None:
    """Two resumes at once answering the same two questions differently: each was checked,
    then stored answer by answer, so both could be refused with half of each stored -- a run
    finishing on one answer of each (outside tester 103). A batch is stored whole or not."""
    import threading

    for _ in range(30):  # (a run of 40 without the fix showed a mix)
        thread_id = f"typed-{uuid.uuid4().hex[:12]}"
        first, second = client.start("/two", thread_id, "how many?").interrupts
        batches = {
            "x": [*resolved(first.id, 1), *resolved(second.id, 2)],
            "y": [*resolved(second.id, 3), *resolved(first.id, 9)],
        }
        codes: dict[str, Any] = {}
        gate = threading.Barrier(2)
        sends = [(client, thread_id, name, batch, codes, gate) for name, batch in batches.items()]
        threads = [threading.Thread(target=_resume_into, args=send) for send in sends]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stored = anyio.run(_answers_of, db, [first.id, second.id])
        assert stored in ([1, 2], [9, 3]), (stored, codes)
        assert sorted(str(code) for code in codes.values()) in (
            ["None", "request_conflict"],
            ["None", "run_busy"],
            ["request_conflict", "run_busy"],
        ), codes


def _resume_into(
    client: Client,
    thread_id: str,
    name: str,
    batch: list[dict[str, Any]],
    codes: dict[str, Any],
    gate: Any,
) -> None:
    """Send ``batch`` as a resume once both senders are ready; its error code into ``codes``."""
    gate.wait()
    stream = client.resume("/two", thread_id, batch)
    codes[name] = stream.last.code if stream.last.type == EventType.RUN_ERROR else None


async def _answers_of(db: Path, interrupt_ids: list[str]) -> list[Any]:
    """The stored answers of these interrupts' requests (read through a store of its own)."""
    async with SqliteStore(db) as store:
        got = [await store.get_request(i.split(".")[0]) for i in interrupt_ids]
    return [request.answer for request in got]


def test_a_cancel_in_the_interrupts_form_cancels(client: Client) -> None:
    """``{interrupts: [{id, status: "cancelled"}]}`` was read as the answer ``null`` (an
    ``int | None`` question took it: outside tester 103); a status neither resolved nor
    cancelled is refused."""
    thread_id = f"typed-{uuid.uuid4().hex[:12]}"
    [interrupt] = client.start("/optional-bytes", thread_id, "may I?").interrupts
    odd = client.resume(
        "/optional-bytes", thread_id, {"interrupts": [{"id": interrupt.id, "status": "maybe"}]}
    )
    assert odd.status == 422 and odd.body["error"] == "invalid_resume", odd.body
    cancel = {"interrupts": [{"id": interrupt.id, "status": "cancelled"}]}
    done = client.resume("/optional-bytes", thread_id, cancel)
    assert done.finished.outcome.type == "cancelled", done.describe()
