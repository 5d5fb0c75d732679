"""Hostile input against a real ``workflow-engine serve``: other web pages, other threads, bad
bytes and damaged records. Each case is one issue of the hostile-input report.

Every refusal is checked twice: the answer (HTTP status and error code, or a stream that is
exactly RUN_STARTED + RUN_ERROR with a code) and the store, read through the Runtime API before
and after (``store_state``), which must not have changed. No server log may hold a traceback.
"""

from __future__ import annotations

import gzip
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from ag_ui.core import EventType

from tests.integration.agui_harness import (
    Client,
    Server,
    Stream,
    in_process,
    resolved,
    run_input,
    user,
)
from tests.integration.cli_harness import Cli
from tests.integration.hostile_harness import (
    BAD_VALUES,
    EVIL,
    browser_headers,
    corrupt_checkpoint_body,
    corrupt_pending_data,
    corrupt_request_data,
    default_server,
    server_log_clean,
    store_state,
)
from workflow_engine.storage import SqliteStore
from workflow_engine_agui._interrupts import INTERRUPT_KEY, interrupt_id_for

# Subprocesses of the CLI or a server: `make test` runs these, `make test-fast` does not.
pytestmark = pytest.mark.slow

REFUND = "I want a refund for order 12345"
APP = "http://app.example"
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The default server: loopback, no token, no CORS origins."""
    with default_server(tmp_path_factory.mktemp("hostile")) as running:
        yield running


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    yield Client(server.url)
    server_log_clean(server)


def thread() -> str:
    return f"thread-{uuid.uuid4().hex[:12]}"


def ledger(server: Server, thread_id: str) -> list[dict[str, Any]]:
    """What reached the demo's outside system from the support runs of exactly ``thread_id``
    (an entry's key is ``<run id>:<call id>``, a run id ``support:<thread>/<n>``)."""
    path = Path(server.env["WORKFLOW_ENGINE_DEMO_LEDGER"])
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    mine = f"support:{thread_id}"
    return [e for e in lines if str(e["key"]).rpartition(":")[0].rpartition("/")[0] == mine]


def pause(client: Client, thread_id: str, path: str = "/support") -> Any:
    """Start the support demo on ``thread_id``; its submit_refund approval interrupt."""
    text = REFUND if path == "/support" else "Please transfer 300 to savings"
    [interrupt] = client.start(path, thread_id, text).interrupts
    assert interrupt.reason == "tool_call"
    return interrupt


def post_raw(server: Server, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{server.url}/support", content=body, headers=headers, timeout=30)


def refused_http(response: httpx.Response | Stream, status: int, code: str) -> None:
    if isinstance(response, Stream):
        assert response.status == status and not response.events, response.describe()
        assert response.body["error"] == code, response.body
        return
    assert response.status_code == status, response.text
    assert response.json()["error"] == code, response.text
    assert "text/event-stream" not in response.headers.get("content-type", "")


def refused_stream(stream: Stream, code: str) -> None:
    assert [e.type for e in stream.events] == [EventType.RUN_STARTED, EventType.RUN_ERROR], (
        stream.describe()
    )
    assert stream.error_code == code, stream.describe()


# --- 1. any web page could start a run and approve its tool calls -------------------------------


def test_a_cross_site_text_plain_post_is_refused_and_changes_nothing(
    client: Client, server: Server
) -> None:
    """Exactly what a page on another site sends: no preflight, text/plain, its Origin."""
    before = store_state(server.db)
    thread_id = thread()
    body = json.dumps(run_input(thread_id, [user(REFUND)])).encode()
    for content_type in (
        "text/plain;charset=UTF-8",  # fetch(..., {mode: "no-cors", body: string})
        "text/plain",  # <form enctype="text/plain">
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json",  # would need a preflight, which CORS refuses; refused anyway
    ):
        answer = post_raw(server, body, browser_headers(content_type=content_type))
        refused_http(answer, 403, "origin_not_allowed")
        assert "access-control-allow-origin" not in answer.headers
    for origin in ("null", "http://127.0.0.1.evil.example", f"{EVIL}:443/", "file://"):
        answer = post_raw(server, body, browser_headers(origin, "application/json"))
        refused_http(answer, 403, "origin_not_allowed")
    assert store_state(server.db) == before
    assert ledger(server, thread_id) == []


def test_two_blind_posts_cannot_start_a_run_and_approve_submit_refund(
    client: Client, server: Server
) -> None:
    """The attack of the report: start a run, then approve its refund by a predictable id."""
    thread_id = thread()
    interrupt = pause(client, thread_id)  # the user's own run, paused at submit_refund
    request_id = interrupt.id.rpartition(".")[0]  # what an outsider could derive
    before = store_state(server.db)

    page = browser_headers()
    start = json.dumps(run_input(thread(), [user(REFUND)])).encode()
    refused_http(post_raw(server, start, page), 403, "origin_not_allowed")
    for guess in (request_id, interrupt.id):  # even knowing the real id, a page is refused
        approve = json.dumps(run_input(thread_id, [], resume=resolved(guess, True))).encode()
        refused_http(post_raw(server, approve, page), 403, "origin_not_allowed")
    # Without a browser (no Origin), the derivable id is not an interrupt id either.
    for guess in (request_id, f"{request_id}.{'0' * 32}", interrupt.id[:-1] + "x"):
        refused_stream(
            client.resume("/support", thread_id, resolved(guess, True)), "unknown_interrupt"
        )
    assert store_state(server.db) == before
    assert ledger(server, thread_id) == []

    done = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
    assert "submitted" in done.results()[interrupt.tool_call_id]
    assert len(ledger(server, thread_id)) == 1


def test_json_endpoints_accept_only_application_json(client: Client, server: Server) -> None:
    before = store_state(server.db)
    body = json.dumps(run_input(thread(), [user("Hello")])).encode()
    for content_type in (None, "text/plain", "application/json; charset=latin-1", "text/json"):
        headers = {} if content_type is None else {"content-type": content_type}
        refused_http(post_raw(server, body, headers), 415, "unsupported_media_type")
    assert store_state(server.db) == before
    for content_type in ("application/json; charset=utf-8", "Application/JSON"):
        stream = client.post(
            "/support",
            run_input(thread(), [user("Hello")]),
            headers={"content-type": content_type, "accept": "text/event-stream"},
        )
        assert stream.finished.outcome.type == "interrupt"


def test_only_allowed_origins_may_call_even_with_a_token(tmp_path: Path) -> None:
    args = ["--token", "secret", "--cors-origin", APP]
    with Server(db=tmp_path / "runs.db", log=tmp_path / "server.log", args=args) as server:
        client = Client(server.url, token="secret")
        for origin in (APP, "HTTP://APP.EXAMPLE:80", server.url):
            stream = client.post(
                "/support",
                run_input(thread(), [user("Hello")]),
                headers={**client.headers(), "origin": origin},
            )
            assert stream.finished.outcome.type == "interrupt", origin
        before = store_state(server.db)
        for origin in (EVIL, "http://app.example:8080", "https://app.example", "null"):
            refused = client.post(
                "/support",
                run_input(thread(), [user("Hello")]),
                headers={**client.headers(), "origin": origin},
            )
            refused_http(refused, 403, "origin_not_allowed")
        assert store_state(server.db) == before
        # A token set: any Host name may be used (behind a proxy, say).
        named = client.post(
            "/support",
            run_input(thread(), [user("Hello")]),
            headers={**client.headers(), "host": "agents.internal"},
        )
        assert named.finished.outcome.type == "interrupt"
        server_log_clean(server)


def test_a_dns_name_rebound_to_loopback_is_refused(client: Client, server: Server) -> None:
    """A page on evil.example whose name now resolves to 127.0.0.1 is "same-origin" with the
    server; without a token only loopback host names are answered."""
    before = store_state(server.db)
    rebound = f"evil.example:{server.port}"
    for origin in (f"http://{rebound}", None):
        headers = {"host": rebound, "content-type": "application/json"}
        if origin:
            headers["origin"] = origin
        body = json.dumps(run_input(thread(), [user(REFUND)])).encode()
        refused_http(post_raw(server, body, headers), 403, "host_not_allowed")
    assert store_state(server.db) == before
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}"):
        stream = client.post(
            "/support",
            run_input(thread(), [user("Hello")]),
            headers={**client.headers(), "host": host, "origin": f"http://{host}"},
        )
        assert stream.finished.outcome.type == "interrupt"


def test_doubled_origins_bad_ports_compressed_bodies_long_and_doubled_ids_are_refused(
    client: Client, server: Server
) -> None:
    """What outside tester 107 still got through: a second Origin (only the first was
    checked), a Host with an impossible port or two trailing dots, a gzip body (said to be bad
    UTF-8), a 100,000-character runId. Each refused by name, nothing stored; a stream tells
    proxies not to buffer it."""
    before = store_state(server.db)
    body = json.dumps(run_input(thread(), [user(REFUND)])).encode()
    own = f"http://127.0.0.1:{server.port}"
    json_type = ("content-type", "application/json")
    for origins in ((own, EVIL), (EVIL, own)):
        sent = httpx.post(
            f"{server.url}/support",
            content=body,
            headers=[json_type, ("origin", origins[0]), ("origin", origins[1])],
            timeout=30,
        )
        refused_http(sent, 403, "origin_not_allowed")
    for host in (
        "127.0.0.1:99999",
        "localhost..",
        "127.0.0.1:0",
        "evil.example@localhost",  # (tester 111: a URL parser read past these)
        f"evil.example:80@127.0.0.1:{server.port}",
        "localhost/evil.example",
        "localhost?evil",
        "a..localhost",
        "-.localhost",
    ):
        refused_http(
            post_raw(server, body, {"host": host, "content-type": "application/json"}),
            403,
            "host_not_allowed",
        )
    gzipped = {"content-type": "application/json", "content-encoding": "gzip"}
    refused_http(
        post_raw(server, gzip.compress(body), gzipped), 415, "unsupported_content_encoding"
    )
    two = [json_type, ("content-encoding", "identity"), ("content-encoding", "gzip")]
    sent = httpx.post(f"{server.url}/support", content=gzip.compress(body), headers=two)
    refused_http(sent, 415, "unsupported_content_encoding")
    # two Content-Types: the first was read, so JSON then text/plain went through (tester 171)
    for other in ("text/plain", "application/x-www-form-urlencoded", "application/json"):
        types = [json_type, ("content-type", other)]
        sent = httpx.post(f"{server.url}/support", content=body, headers=types, timeout=30)
        refused_http(sent, 415, "unsupported_media_type")
    long_ids = run_input(thread(), [user(REFUND)])
    for field, value in (
        ("runId", "r" * 100_000),
        ("messages", [{**user(REFUND), "id": "m" * 300}]),
    ):
        sent = client.post("/support", {**long_ids, field: value})
        refused_http(sent, 422, "invalid_run_input")
    too_long = [{"interruptId": "i" * 5_000, "status": "resolved", "payload": {}}]
    refused_http(client.resume("/support", thread(), too_long), 422, "invalid_run_input")
    said = user(REFUND)  # (tester 136: a run kept the second, then refused the first)
    one_id = [said, {**said, "content": "Transfer 100 to Bob"}]
    refused = client.post("/support", run_input(thread(), one_id))
    refused_http(refused, 422, "invalid_run_input")
    assert "messages[1] and messages[0] have the same id" in str(refused.body), refused.body
    assert store_state(server.db) == before
    # the same words twice -- as they are, spaced otherwise, in parts -- are taken
    parts = {**said, "content": [{"type": "text", "text": part} for part in REFUND.split(" ")]}
    for again in (said, {**said, "content": f"  {REFUND} "}, parts):
        twice = client.post("/support", run_input(thread(), [said, again]))
        assert twice.status == 200 and twice.last.type == EventType.RUN_FINISHED, again
    # a user's message and its reply by one id: taken (tester 141); a reply between two
    # user messages by one id that differ hides nothing
    reply = {"id": said["id"], "role": "assistant", "content": "Let me look."}
    taken = client.post("/support", run_input(thread(), [said, reply]))
    assert taken.status == 200 and taken.last.type == EventType.RUN_FINISHED, taken.describe()
    refused = client.post("/support", run_input(thread(), [reply, *one_id]))
    refused_http(refused, 422, "invalid_run_input")
    assert "messages[2] and messages[1] have the same id" in str(refused.body), refused.body
    stream = client.start("/support", thread(), "Hello")
    assert stream.headers["cache-control"] == "no-cache", stream.headers
    assert stream.headers["x-accel-buffering"] == "no", stream.headers


def test_interrupt_ids_are_unguessable_and_derived_from_stored_state(
    client: Client, server: Server
) -> None:
    first, second = thread(), thread()
    one, two = pause(client, first), pause(client, second)
    for interrupt in (one, two):
        request_id, dot, mac = interrupt.id.rpartition(".")
        assert dot and re.fullmatch(r"[0-9a-f]{32}", mac), interrupt.id  # 128 bits
    assert one.id.rpartition(".")[2] != two.id.rpartition(".")[2]

    # The id is a function of what the store holds (the run's key and the request id), so it
    # is the same after a restart or a re-execution; test_a_thread_survives_a_server_restart
    # answers one across a restart.
    async def recompute(run_id: str, request_id: str) -> str:
        async with SqliteStore(server.db) as store:
            _, checkpoint = await store.get_run_and_latest(run_id)
        assert checkpoint is not None
        key = checkpoint.shared_state[INTERRUPT_KEY]
        assert re.fullmatch(r"[0-9a-f]{32}", key)
        return interrupt_id_for(request_id, key)

    request_id = one.id.rpartition(".")[0]
    assert anyio.run(recompute, f"support:{first}/0", request_id) == one.id

    # A new message on the paused thread is refused without telling the interrupt ids.
    busy = client.start("/support", first, "Hello?")
    refused_stream(busy, "interrupts_pending")
    assert one.id not in busy.last.message and request_id not in busy.last.message
    # request_info events carry the interrupt id too, never the bare request id
    again = client.start("/support", thread(), REFUND)
    [info] = again.custom("request_info")
    assert info.value["request_id"] == again.interrupts[0].id


# --- 2. one thread could answer another thread's interrupt --------------------------------------


def test_a_thread_cannot_answer_the_interrupt_of_a_thread_it_prefixes(
    client: Client, server: Server
) -> None:
    """Runs of thread ``p`` are ``support:p/<n>``, of thread ``p/0`` ``support:p/0/<n>``."""
    parent = thread()
    child = f"{parent}/0"
    mine, theirs = pause(client, parent), pause(client, child)
    before = store_state(server.db)
    for on_thread, interrupt in ((parent, theirs), (child, mine)):
        for payload in ({"accepted": True}, {"accepted": False}):
            stream = client.resume("/support", on_thread, resolved(interrupt.id, payload))
            refused_stream(stream, "interrupt_thread_mismatch")
    batch = [*resolved(mine.id, {"accepted": False}), *resolved(theirs.id, {"accepted": True})]
    refused_stream(client.resume("/support", parent, batch), "interrupt_thread_mismatch")
    assert store_state(server.db) == before
    assert ledger(server, parent) == ledger(server, child) == []

    done = client.resume("/support", child, resolved(theirs.id, {"accepted": True}))
    assert "submitted" in done.results()[theirs.tool_call_id]
    rejected = client.resume("/support", parent, resolved(mine.id, {"accepted": False}))
    assert rejected.results()[mine.tool_call_id].startswith("Error:")


def test_an_endpoint_cannot_answer_another_endpoints_interrupt(
    client: Client, server: Server
) -> None:
    thread_id = thread()
    support = pause(client, thread_id, "/support")
    banking = pause(client, thread_id, "/banking")  # same thread id, other endpoint
    before = store_state(server.db)
    stream = client.resume("/banking", thread_id, resolved(support.id, {"accepted": True}))
    refused_stream(stream, "interrupt_thread_mismatch")
    stream = client.resume("/support", thread_id, resolved(banking.id, {"accepted": True}))
    refused_stream(stream, "interrupt_thread_mismatch")
    assert store_state(server.db) == before


def test_an_endpoint_at_the_root_cannot_reach_another_endpoints_thread(tmp_path: Path) -> None:
    """At ``/`` run ids have no namespace: its thread ``support:T`` named the runs of thread
    ``T`` of ``/support`` on the same store, so a client of ``/`` could approve that thread's
    refund and start runs inside it (outside tester 63). Such a thread is kept apart now."""
    from fastapi import FastAPI

    from workflow_engine_agui import add_agui_endpoint
    from workflow_engine_cli.demos.support_handoff import build_support_workflow

    app = FastAPI()
    store = SqliteStore(tmp_path / "runs.db")
    add_agui_endpoint(app, build_support_workflow(), "/support", store=store)
    add_agui_endpoint(app, build_support_workflow(), store=store)  # at "/"
    with pytest.raises(ValueError, match="may not hold ':'"):
        add_agui_endpoint(app, build_support_workflow(), "/a:b", store=store)
    with in_process(app) as port:
        client = Client(f"http://127.0.0.1:{port}")
        thread_id = thread()
        theirs = pause(client, thread_id, "/support")
        alias = f"support:{thread_id}"
        stream = client.resume("/", alias, resolved(theirs.id, {"accepted": True}))
        refused_stream(stream, "interrupt_thread_mismatch")
        # a thread of its own, not one waiting on theirs (it was "interrupts_pending")
        [mine] = client.start("/", alias, REFUND).interrupts
        assert mine.id != theirs.id
        done = client.resume("/support", thread_id, resolved(theirs.id, {"accepted": True}))
        assert "submitted" in done.results()[theirs.tool_call_id]
    anyio.run(store.close)
    runs = sorted(r.run_id for r in anyio.run(_runs, tmp_path / "runs.db"))
    assert runs == sorted([f"support:{thread_id}/0", f":support:{thread_id}/0"])


async def _runs(db: Path) -> list[Any]:
    async with SqliteStore(db) as store:
        return list(await store.list_runs())


def test_a_client_gone_before_its_body_is_whole_leaves_no_traceback(server: Server) -> None:
    """``Content-Length: 500``, part of the body, then the connection closed: starlette's
    ClientDisconnect reached the log as a traceback (outside tester 63)."""
    import socket

    for _ in range(2):
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            head = (
                "POST /support HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: application/json\r\nContent-Length: 500\r\n\r\n"
            )
            sock.sendall(head.encode() + b'{"threadId": "t')
    deadline = time.monotonic() + 5
    while "client closed the connection" not in server_log_clean(server):
        assert time.monotonic() < deadline, server_log_clean(server)[-2000:]
        time.sleep(0.05)


def test_what_the_client_sent_is_not_echoed_whole(client: Client, server: Server) -> None:
    """A 990 KB interrupt id came back whole in ``RUN_ERROR`` and in a one-line warning of the
    log: twenty such requests grew the log by 20 MB (outside tester 63). An interrupt id past
    256 characters is now refused before anything is read of it (422, said by its length);
    one under that, unknown, is said whole."""
    huge = "x" * 500_000
    refused = client.resume("/support", thread(), resolved(huge, {"accepted": True}))
    refused_http(refused, 422, "invalid_run_input")
    assert "has 500000 characters; the limit is 256" in refused.body["message"], refused.body
    assert len(refused.body["message"]) < 300
    stream = client.resume("/support", thread(), resolved("y" * 250, {"accepted": True}))
    assert stream.error_code == "unknown_interrupt"
    assert len(server_log_clean(server).splitlines()[-1]) < 3_000


def test_an_interrupt_left_pending_by_an_earlier_run_is_not_answered(
    client: Client, server: Server
) -> None:
    """Thread T's run 0 still waits, but run 1 has taken over (admitted by another process):
    an answer to run 0's interrupt is neither a repeat nor a fresh answer."""
    from workflow_engine_cli.demos.support_handoff import build_support_workflow

    thread_id = thread()
    old = pause(client, thread_id)

    async def admit_next() -> None:
        checkpoint = build_support_workflow().admit("Hello", run_id=f"support:{thread_id}/1")
        async with SqliteStore(server.db) as store:
            await store.admit(checkpoint)

    anyio.run(admit_next)
    before = store_state(server.db)
    stream = client.resume("/support", thread_id, resolved(old.id, {"accepted": True}))
    refused_stream(stream, "interrupt_not_current")
    assert store_state(server.db) == before
    assert ledger(server, thread_id) == []


def test_a_resume_answering_one_interrupt_twice_is_refused(client: Client, server: Server) -> None:
    thread_id = thread()
    interrupt = pause(client, thread_id)
    before = store_state(server.db)
    twice = [*resolved(interrupt.id, {"accepted": True}), *resolved(interrupt.id, False)]
    refused_http(client.resume("/support", thread_id, twice), 422, "invalid_resume")
    assert store_state(server.db) == before


def test_a_refused_resume_entry_is_named_where_the_client_wrote_it(
    client: Client, server: Server
) -> None:
    """ "each resume entry needs interruptId and status resolved|cancelled" said neither which
    entry nor what of it; an over-long id sent in ``forwardedProps.command.resume`` was
    refused as ``resume[0].interruptId``, a field the client did not send (outside tester
    190)."""
    thread_id = thread()
    interrupt = pause(client, thread_id)
    before = store_state(server.db)
    good = resolved(interrupt.id, {"accepted": True})[0]
    cases = [
        (client.resume("/support", thread_id, [good, {**good, "interruptId": 5}]),
         "resume[1].interruptId must be an interrupt's id (a string), not a number"),
        (client.resume("/support", thread_id, [{**good, "status": "approved"}]),
         "resume[0].status must be resolved or cancelled, not 'approved'"),
        (client.resume_forwarded("/support", thread_id, [{**good, "interruptId": "x" * 300}]),
         "forwardedProps.command.resume[0].interruptId"),
    ]  # fmt: skip
    for stream, said in cases:
        assert stream.status == 422, stream.describe()
        assert said in stream.body["message"], stream.body
    assert store_state(server.db) == before


# --- 3. deeply nested JSON ----------------------------------------------------------------------

DEPTH = 50_000


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("where", ["body", "forwardedProps", "resume payload", "message"])
def test_deeply_nested_json_is_a_400(client: Client, server: Server, where: str) -> None:
    thread_id = thread()
    before = store_state(server.db)
    template = {
        "body": "@",
        "forwardedProps": json.dumps(run_input(thread_id, [user("Hi")], forwardedProps="@")),
        "resume payload": json.dumps(run_input(thread_id, [], resume=resolved("x", "@"))),
        "message": json.dumps(run_input(thread_id, [{"id": "m", "role": "user", "content": "@"}])),
    }[where]
    body = template.replace('"@"', nested(DEPTH)) if where != "body" else nested(DEPTH)
    answer = post_raw(server, body.encode(), JSON)
    refused_http(answer, 400, "json_too_deep")
    assert "levels deep; the limit is 64" in answer.json()["message"]
    # just past the limit is refused the same way; a reasonable depth is fine
    shallow = json.dumps(run_input(thread_id, [user("Hi")], forwardedProps="@"))
    too_deep = shallow.replace('"@"', nested(65)).encode()
    refused_http(post_raw(server, too_deep, JSON), 400, "json_too_deep")
    assert store_state(server.db) == before
    ok = client.post("/support", json.loads(shallow.replace('"@"', nested(40))))
    assert ok.status == 200 and ok.last.type == EventType.RUN_FINISHED


def _while_answering(server: Server, attack: Any) -> Any:
    """``attack()``'s answer, with ``/health`` asked while the server handles it: answered in
    seconds, not after the attack."""
    answers: list[Any] = []
    worker = threading.Thread(target=lambda: answers.append(attack()), daemon=True)
    worker.start()
    time.sleep(0.2)  # (the attack's bytes are in)
    health = httpx.get(f"{server.url}/health", timeout=5)
    assert health.status_code == 200, health.text
    worker.join(timeout=30)
    assert answers, "the attack was not answered in 30 s"
    return answers[0]


def test_text_a_pattern_could_read_again_and_again_holds_no_one_up(
    client: Client, server: Server
) -> None:
    """Bodies under the size limit whose reading took time growing with the square of their
    length, on the server's one loop: a JSON string left open (120 KB of ``\\"`` held every
    client 45 s), and a resume payload's unexpected key that the RUN_ERROR quotes (300 KB of
    ``a:,a:`` read 46 s for URLs to clean: outside tester 207). Each is answered at once, and
    ``/health`` meanwhile."""
    before = store_state(server.db)
    open_string = b'"' + b'\\"' * 300_000
    answer = _while_answering(server, lambda: post_raw(server, open_string, JSON))
    refused_http(answer, 422, "malformed_json")
    assert store_state(server.db) == before
    thread_id = thread()
    interrupt = pause(client, thread_id)
    key = "a:" + ",a:" * 150_000
    payload = {"accepted": True, key: 1}
    stream = _while_answering(
        server, lambda: client.resume("/support", thread_id, resolved(interrupt.id, payload))
    )
    refused_stream(stream, "invalid_resume_payload")
    message = stream.events[-1].message
    # (a word past 16 KB is said by its length: not read, outside tester 210)
    assert "unexpected key [450,005 characters without a space]" in message, message[-200:]
    assert len(message) < 2_100, len(message)
    done = client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": True}))
    assert done.last.type == EventType.RUN_FINISHED, done.describe()


# --- 4. lone surrogates and bytes that are not UTF-8 --------------------------------------------


@pytest.mark.parametrize("field", ["message", "threadId", "interruptId", "runId", "props key"])
def test_lone_surrogates_are_a_400_before_the_stream(
    client: Client, server: Server, field: str
) -> None:
    thread_id = thread()
    interrupt = pause(client, thread_id)
    before = store_state(server.db)
    body: dict[str, Any] = {
        "message": run_input(thread(), [user("refund \ud800 please")]),
        "threadId": run_input("\udfff" + thread_id, [user("Hi")]),
        "interruptId": run_input(thread_id, [], resume=resolved(interrupt.id + "\ud83d", True)),
        "runId": {**run_input(thread(), [user("Hi")]), "runId": "\udc80"},
        "props key": run_input(thread(), [user("Hi")], forwardedProps={"\ud800": 1}),
    }[field]
    raw = json.dumps(body).encode()  # ensure_ascii: "\ud800" travels as valid JSON
    answer = post_raw(server, raw, {"content-type": "application/json"})
    refused_http(answer, 400, "invalid_text")
    assert "surrogate" in answer.json()["message"]
    assert store_state(server.db) == before


def test_bytes_that_are_not_utf8_are_a_400(client: Client, server: Server) -> None:
    before = store_state(server.db)
    good = json.dumps(run_input(thread(), [user("café")]), ensure_ascii=False).encode()
    for bad in (good.replace("é".encode(), b"\xe9"), b"\xff\xfe" + good, b'"\xed\xa0\x80"'):
        refused_http(
            post_raw(server, bad, {"content-type": "application/json"}), 400, "invalid_text"
        )
    assert store_state(server.db) == before
    assert client.post("/support", json.loads(good)).status == 200


# --- 5. corrupt stored data ---------------------------------------------------------------------


@dataclass
class Damaged:
    """A server started on a database whose records were damaged while it was down."""

    server: Server
    threads: dict[str, str]  # kind of damage -> thread id (its run is support:<thread>/0)
    answered: dict[str, str]  # kind -> an interrupt that was answered before the damage

    def stream(self, kind: str) -> Stream:
        client = Client(self.server.url)
        if kind in self.answered:  # a repeated resume reads the answered request back
            return client.resume(
                "/support", self.threads[kind], resolved(self.answered[kind], {"accepted": False})
            )
        return client.start("/support", self.threads[kind], "Hello again")


@pytest.fixture(scope="module")
def damaged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Damaged]:
    """Threads paused at their approval, then damaged on disk while no server runs (a running
    server keeps the latest checkpoint of a run it touched in memory)."""
    base = tmp_path_factory.mktemp("corrupt")
    server = Server(db=base / "runs.db", log=base / "server.log")
    kinds = ["checkpoint-body", "repeat-request-data", *BAD_VALUES]
    damaged = Damaged(server, {kind: thread() for kind in kinds}, {})
    with server:
        client = Client(server.url)
        for kind, thread_id in damaged.threads.items():
            interrupt = pause(client, thread_id)
            if kind == "repeat-request-data":
                client.resume("/support", thread_id, resolved(interrupt.id, {"accepted": False}))
                damaged.answered[kind] = interrupt.id
    for kind, thread_id in damaged.threads.items():
        run_id = f"support:{thread_id}/0"
        if kind == "checkpoint-body":
            corrupt_checkpoint_body(server.db, run_id)
        elif kind == "repeat-request-data":
            request_id = damaged.answered[kind].rpartition(".")[0]
            corrupt_request_data(server.db, request_id, json.dumps({"$float": "x"}))
        else:
            corrupt_pending_data(server.db, run_id, BAD_VALUES[kind])
    with server:
        yield damaged


def log_tail(server: Server) -> int:
    return server.log.stat().st_size


@pytest.mark.parametrize("kind", ["checkpoint-body", "repeat-request-data"])
def test_a_corrupt_record_is_a_run_error_with_a_code(damaged: Damaged, kind: str) -> None:
    before = store_state(damaged.server.db) if kind != "checkpoint-body" else None
    log_from = log_tail(damaged.server)
    stream = damaged.stream(kind)
    assert b"Traceback" not in damaged.server.log.read_bytes()[log_from:]
    assert stream.error_code == "store_corrupt", stream.describe()
    assert f"support:{damaged.threads[kind]}/0" in stream.last.message  # names the run
    if before is not None:
        assert store_state(damaged.server.db) == before


DAMAGED_VALUES = [kind for kind in BAD_VALUES if kind != "type"]
"""(``type``, a class the code does not register, is a code change: see below)"""


@pytest.mark.parametrize("kind", DAMAGED_VALUES)
def test_a_malformed_stored_value_is_a_run_error_store_corrupt(damaged: Damaged, kind: str) -> None:
    stream = damaged.stream(kind)
    assert stream.error_code == "store_corrupt", stream.describe()
    assert f"support:{damaged.threads[kind]}/0" in stream.last.message


def test_a_stored_value_naming_a_class_the_code_lacks_strands_its_run(
    damaged: Damaged, tmp_path: Path
) -> None:
    """A stored value names a class the workflow does not register (renamed or removed since,
    or damage): the run is stranded, as by a changed graph, not refused as damaged (outside
    tester 96). A new message on its thread starts a new run; the command line shows the
    stranded run as stored."""
    stream = damaged.stream("type")
    assert stream.last.type == EventType.RUN_FINISHED, stream.describe()
    run_id = f"support:{damaged.threads['type']}/0"
    result = Cli(tmp_path).run("runs", "show", run_id, "--db", str(damaged.server.db), db=False)
    assert result.code == 0, str(result)
    assert "its graph or classes changed): values are shown as stored" in result.out
    result = Cli(tmp_path).run("resume", run_id, "--db", str(damaged.server.db), db=False)
    assert result.code == 5, str(result)
    line = result.error_line()
    assert run_id in line and "no.such.Type" in line and "code changed" in line


def test_the_cli_reports_a_corrupt_checkpoint_in_one_line_exit_6(
    damaged: Damaged, tmp_path: Path
) -> None:
    run_id = f"support:{damaged.threads['checkpoint-body']}/0"
    for args in (["runs", "show", run_id], ["resume", run_id]):
        result = Cli(tmp_path).run(*args, "--db", str(damaged.server.db), db=False)
        assert result.code == 6, str(result)
        line = result.error_line()
        assert run_id in line and "corrupt" in line


@pytest.mark.parametrize("kind", DAMAGED_VALUES)
def test_the_cli_reports_a_malformed_stored_value_in_one_line_exit_6(
    damaged: Damaged, tmp_path: Path, kind: str
) -> None:
    run_id = f"support:{damaged.threads[kind]}/0"
    result = Cli(tmp_path).run("runs", "show", run_id, "--db", str(damaged.server.db), db=False)
    assert result.code == 6, str(result)
    assert run_id in result.error_line()


def test_two_endpoints_of_one_app_cannot_share_run_ids(tmp_path: Path) -> None:
    """``/a/b`` and ``/a_b`` would both name their runs ``a_b:<thread>/<n>``: one thread's
    interrupts would then be answerable through the other endpoint."""
    from fastapi import FastAPI

    from workflow_engine_agui import add_agui_endpoint
    from workflow_engine_cli.demos.banking_assistant import banking_agent

    app = FastAPI()
    store = SqliteStore(tmp_path / "runs.db")
    add_agui_endpoint(app, banking_agent(), "/a/b", store=store)
    with pytest.raises(ValueError, match="already uses run ids 'a_b'"):
        add_agui_endpoint(app, banking_agent(), "/a_b", store=store)
    anyio.run(store.close)
