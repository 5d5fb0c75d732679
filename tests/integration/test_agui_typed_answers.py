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
def client(tmp_path_factory: pytest.TempPathFactory) -> Any:
    db = tmp_path_factory.mktemp("typed-answers") / "runs.db"
    app = FastAPI()
    store = SqliteStore(db)
    for path, answer_type in ANSWER_TYPES.items():
        add_agui_endpoint(app, asker_workflow(f"ask-{path}", answer_type), f"/{path}", store=store)
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


BOTH_PLACES = [  # (endpoint, payload in resume, in forwardedProps, the same answer?)
    ("user-turn", "hello", {"message": "hello"}, True),
    ("user-turn", {"message": "hello", "end": False}, "hello", True),
    ("bytes", "AGhp/w==", "AGhp_w==", True),  # (standard and URL-safe base64: both are read)
    ("user-turn", "hello", {"message": "bye"}, False),
    ("bytes", "AGhp/w==", "AGhp", False),
]


@pytest.mark.parametrize(("path", "top", "nested", "same"), BOTH_PLACES)
def test_an_answer_in_both_places_is_compared_as_its_type_reads_it(
    client: Client, path: str, top: Any, nested: Any, same: bool
) -> None:
    """``resume`` and ``forwardedProps.command.resume`` were compared as written, before the
    answer's type was known: a chat turn as the bare text in one and ``{"message": ...}`` in
    the other was refused as two different answers (outside tester 101). Different answers
    still are, before anything is stored: the right one is taken afterwards."""
    thread_id = f"typed-{uuid.uuid4().hex[:12]}"
    [interrupt] = client.start(f"/{path}", thread_id, "may I?").interrupts
    props = {"command": {"resume": resolved(interrupt.id, nested)}}
    both = client.resume(f"/{path}", thread_id, resolved(interrupt.id, top), forwardedProps=props)
    if same:
        assert both.last.type == EventType.RUN_FINISHED, both.describe()
        return
    assert both.error_code == "invalid_resume", both.describe()
    assert interrupt.id in both.last.message and "different answers" in both.last.message
    done = client.resume(f"/{path}", thread_id, resolved(interrupt.id, nested))
    assert done.last.type == EventType.RUN_FINISHED, done.describe()  # (nothing was stored)
