"""A run remembers its model: ``resume`` continues on it, or refuses, or switches only when told.

The issue this pins: a run started on an OpenAI-compatible endpoint failed, and ``resume``
continued it on the offline scripted model -- whose tool call was then approved and executed.
Scenarios run the real ``workflow-engine`` executable against a fake OpenAI-compatible server on
loopback (``fake_openai``) or an endpoint that refuses every request; the rules themselves are
checked as plain functions first.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli_harness import ENGINE, Cli, Result, base_env
from tests.integration.fake_openai import FakeOpenAIServer
from workflow_engine import Checkpoint, StoreCorruptError
from workflow_engine.executors import OpenAIChatClient
from workflow_engine_cli._registry import (
    KEY_ENV,
    MODEL_STATE_KEY,
    SCRIPTED,
    ChatModel,
    ModelConfig,
    ModelConfigError,
    ModelFlags,
    model_for_resume,
    model_for_start,
    recorded_model,
)
from workflow_engine_cli.demos.support_handoff import build_support_workflow

# Subprocesses of the CLI or a server: `make test` runs these, `make test-fast` does not.
pytestmark = pytest.mark.slow

SECRET = "sk-test-0123456789abcdef"
REFUND = "I want a refund for order 12345"
URL = "http://models.example/v1"
OTHER_URL = "http://elsewhere.example/v1"


# --- the rules, as plain functions ----------------------------------------------------------------


def openai(model: str = "m", url: str = URL, key_env: str | None = KEY_ENV) -> ModelConfig:
    return ModelConfig("openai", model, url, key_env)


def test_which_model_a_new_run_gets() -> None:
    assert model_for_start(ModelFlags(), {}) == ChatModel()
    assert model_for_start(ModelFlags(), {"OPENAI_MODEL": "m"}) == ChatModel()  # a name alone
    chosen = model_for_start(ModelFlags(api_key=SECRET), {"OPENAI_BASE_URL": URL})
    assert chosen.config == ModelConfig("openai", "gpt-4o-mini", URL, KEY_ENV)
    assert chosen.api_key == SECRET
    local = model_for_start(ModelFlags(model="llama", base_url=URL), {KEY_ENV: ""})
    assert local == ChatModel(ModelConfig("openai", "llama", URL, None))  # no key: none named
    default = model_for_start(ModelFlags(), {KEY_ENV: SECRET, "OPENAI_MODEL": "m"})
    assert default.config == openai(url="https://api.openai.com/v1")
    assert model_for_start(ModelFlags(offline=True), {KEY_ENV: SECRET}) == ChatModel()


def test_the_record_names_the_key_and_never_holds_it() -> None:
    chosen = model_for_start(ModelFlags(model="m", base_url=URL, api_key=SECRET), {})
    record = chosen.config.record()
    assert record == {"provider": "openai", "model": "m", "base_url": URL, "api_key_env": KEY_ENV}
    assert SECRET not in json.dumps(record)
    assert ModelConfig.from_record(record) == chosen.config
    assert ModelConfig.from_record(SCRIPTED.record()) == SCRIPTED


def test_the_record_leaves_an_endpoints_credentials_out() -> None:
    """An endpoint written with a user, password or query string (``OPENAI_BASE_URL``) was
    recorded whole -- stored with the run, the README saying the record holds nothing
    secret (outside tester 200). The record keeps the endpoint without them, and says where
    a later command finds it whole; the client still gets it whole."""
    whole = "https://alice:it's-hunter2@models.example/v1"
    chosen = model_for_start(ModelFlags(model="m"), {"OPENAI_BASE_URL": whole, KEY_ENV: "k"})
    record = chosen.config.record()
    assert record["base_url"] == "https://models.example/v1", record
    assert record["base_url_env"] == "OPENAI_BASE_URL"
    for secret in ("alice", "hunter2"):
        assert secret not in json.dumps(record) and secret not in chosen.config.describe()
    client = chosen.client()
    assert client is not None and "hunter2" in str(client._client.base_url)  # type: ignore[attr-defined]
    recorded = ModelConfig.from_record(record)
    assert recorded == chosen.config
    # resumed: whole again from the environment, if it names that endpoint
    again, note = model_for_resume(
        "r1", recorded, ModelFlags(), {"OPENAI_BASE_URL": whole, KEY_ENV: "k"}
    )
    assert note is None and again.endpoint == whole
    switched, _ = model_for_resume(
        "r1", recorded, ModelFlags(model="m2"), {"OPENAI_BASE_URL": whole, KEY_ENV: "k"}
    )
    assert switched.endpoint == whole and switched.config.model == "m2"
    # the variable unset, naming another endpoint, or this one without its credentials (it
    # was taken, and the run went on without them: outside tester 203)
    for url, said in (
        (None, "is not set"),
        ("https://u:p@models.example/v2", "OPENAI_BASE_URL is https://models.example/v2;"),
        ("https://models.example/v1", "names that endpoint without them"),
    ):
        env = {KEY_ENV: "k", **({"OPENAI_BASE_URL": url} if url else {})}
        with pytest.raises(ModelConfigError) as refused:
            model_for_resume("r1", recorded, ModelFlags(), env)
        assert "p@" not in str(refused.value) and "hunter2" not in str(refused.value)
        assert said in str(refused.value) and "--base-url" in str(refused.value)
    given, _ = model_for_resume("r1", recorded, ModelFlags(base_url=whole), {KEY_ENV: "k"})
    assert given.endpoint == whole and given.config == recorded


@pytest.mark.parametrize(
    ("recorded", "flags", "env", "expected"),
    [
        # the record wins over whatever the environment says for new runs
        (SCRIPTED, ModelFlags(), {KEY_ENV: SECRET, "OPENAI_BASE_URL": URL}, ChatModel()),
        (SCRIPTED, ModelFlags(api_key=SECRET), {}, ChatModel()),
        (openai(), ModelFlags(), {KEY_ENV: "k", "OPENAI_MODEL": "x"}, ChatModel(openai(), "k")),
        (openai(), ModelFlags(api_key="k2"), {}, ChatModel(openai(), "k2")),
        (
            openai(),
            ModelFlags(),
            {"OPENAI_BASE_URL": URL + "/", KEY_ENV: "k"},
            ChatModel(openai(), "k"),
        ),
        # a run started without a key is not sent the environment's key
        (openai(key_env=None), ModelFlags(), {KEY_ENV: SECRET}, ChatModel(openai(key_env=None))),
        # flags choose explicitly; what they leave out comes from the record
        (openai(), ModelFlags(model="m2"), {KEY_ENV: "k"}, ChatModel(openai("m2"), "k")),
        (SCRIPTED, ModelFlags(base_url=URL), {}, ChatModel(openai("gpt-4o-mini", key_env=None))),
        (openai(), ModelFlags(offline=True), {}, ChatModel()),
    ],
)
def test_which_model_a_resumed_run_gets(
    recorded: ModelConfig, flags: ModelFlags, env: dict[str, str], expected: ChatModel
) -> None:
    chosen, _ = model_for_resume("r1", recorded, flags, env)
    assert chosen == expected


@pytest.mark.parametrize(
    ("recorded", "flags", "env", "message"),
    [
        (openai(), ModelFlags(), {}, "run r1 was started with model m at " + URL),
        (openai(), ModelFlags(), {}, "$OPENAI_API_KEY is not set; set it or pass --api-key"),
        (openai(), ModelFlags(), {"OPENAI_BASE_URL": OTHER_URL, KEY_ENV: "k"}, "--base-url"),
        (openai(), ModelFlags(offline=True, model="m"), {}, "--offline cannot be combined"),
    ],
)
def test_what_a_resume_refuses(
    recorded: ModelConfig, flags: ModelFlags, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ModelConfigError) as refused:
        model_for_resume("r1", recorded, flags, env)
    assert message in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_switch_is_said_and_a_run_without_a_record_is_named() -> None:
    _, note = model_for_resume("r1", openai(), ModelFlags(offline=True), {})
    assert note == (
        f"run r1 was started with model m at {URL} (a key: --api-key or $OPENAI_API_KEY); "
        "continuing on the scripted model"
    )
    _, same = model_for_resume("r1", openai(), ModelFlags(model="m"), {KEY_ENV: "k"})
    assert same is None
    _, legacy = model_for_resume("r1", None, ModelFlags(), {})
    assert legacy is not None and "run r1 does not record its model" in legacy


def test_the_graph_is_the_same_whichever_model_answers() -> None:
    real = OpenAIChatClient("m", api_key="k", base_url=URL)
    assert build_support_workflow(client=real).signature == (
        build_support_workflow(offline=True).signature
    )


def test_a_malformed_record_is_a_damaged_store() -> None:
    checkpoint = build_support_workflow(offline=True).admit(
        "hi", shared_state={MODEL_STATE_KEY: {"provider": "openai", "key": SECRET}}
    )
    with pytest.raises(StoreCorruptError, match=MODEL_STATE_KEY):
        recorded_model(checkpoint.run_id, Checkpoint.from_json(checkpoint.to_json()))


# --- the command line -----------------------------------------------------------------------------


class RefusingEndpoint(ThreadingHTTPServer):
    """An OpenAI-compatible endpoint that answers every request 400 (not retried)."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length", "0")))
                body = json.dumps({"error": {"message": "no such model", "type": "invalid"}})
                self.send_response(400)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

        super().__init__(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.serve_forever, args=(0.01,), daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(tmp_path)


@pytest.fixture
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as server:
        yield server


def env(cli: Cli, **extra: str) -> None:
    """The environment of the next commands: the harness's (no OPENAI_*), plus ``extra``."""
    cli.env = {**base_env(cli.ledger_path), **extra}


def only_run(cli: Cli) -> dict[str, Any]:
    (run,) = cli.json("runs", "list")
    return run


def status(cli: Cli, run_id: str) -> str:
    return cli.json("runs", "show", run_id)["status"]


def scripted_text(result: Result) -> bool:
    """Whether the offline scripted agents spoke (their lines are known word for word)."""
    return "Let me look up order 12345." in result.out or "refunds specialist" in result.out


def test_a_failed_run_is_not_resumed_on_the_scripted_model(cli: Cli) -> None:
    endpoint = RefusingEndpoint()
    try:
        failed = cli.expect(1, "demo", "handoff", "-m", REFUND, "--base-url", endpoint.base_url)
        run_id = only_run(cli)["run_id"]
        assert status(cli, run_id) == "failed", str(failed)
        assert (failed.out + failed.err).count("✗") == 1, str(failed)  # said once

        again = cli.expect(1, "resume", run_id, "--approve")  # the same endpoint, failing again
        assert not scripted_text(again), str(again)
        assert cli.ledger() == []  # no tool call was approved, nothing was refunded
    finally:
        endpoint.close()

    # switching is possible, but only by saying so
    switched = cli.expect(0, "resume", run_id, "--approve", "--offline")
    assert f"run {run_id} was started with model gpt-4o-mini at {endpoint.base_url}" in (
        switched.out
    )
    assert "continuing on the scripted model" in switched.out
    assert [entry["kind"] for entry in cli.ledger()] == ["refund"]


def test_an_unreachable_endpoint_is_named_once(cli: Cli) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    failed = cli.expect(1, "demo", "handoff", "-m", REFUND, "--base-url", url)
    said = failed.out + failed.err
    assert said.count("✗") == 1 and f"cannot reach {url}" in said, str(failed)


def test_an_unreachable_endpoint_is_named_without_its_credentials(cli: Cli) -> None:
    """The error of an endpoint written with a user, password and query string named it
    whole: stored with the run, and sent in every AG-UI client's ``RUN_ERROR`` -- a
    password holding ``'`` passed the server's scrubbing (outside tester 200)."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        where = f"127.0.0.1:{probe.getsockname()[1]}/v1"
    url = f"http://alice:it's-hunter2@{where}"
    failed = cli.expect(1, "demo", "handoff", "-m", REFUND, "--base-url", url, "--api-key", "k")
    [run] = cli.json("runs", "list", "--json")
    shown = cli.expect(0, "runs", "show", run["run_id"])
    stored = b"".join(p.read_bytes() for p in cli.db.parent.glob(cli.db.name + "*"))
    for said in (failed.out + failed.err, shown.out, stored.decode("utf-8", "replace")):
        assert f"cannot reach http://{where}" in said, said
        for secret in ("alice", "hunter2"):
            assert secret not in said, (secret, said)
    # an endpoint with a query string: refused before anything is stored (the client adds
    # its paths after the query: every call failed), and said without the secrets
    for odd in (
        f"{url}?api-version=SECRETKEY",
        f"{url}#FRAGX",
        "http://al:PASSWD@127.0.0.1:99999/v1",
        # (a password with an unencoded "#" or "/": urllib quoted it as the port: tester 204)
        "https://bob:PASSWD#x@api.example.com/v1",
        "https://bob:PASSWD/x@api.example.com/v1",
        # (an empty user, a slash too few or too many: tester 205)
        "http://:PASSWD@127.0.0.1:99999",
        "http:/bob:PASSWD@host",
        "http:///bob:PASSWD@host",
    ):
        refused = cli.expect(2, "demo", "handoff", "-m", REFUND, "--base-url", odd)
        for secret in ("alice", "hunter2", "SECRETKEY", "FRAGX", "PASSWD"):
            assert secret not in refused.out + refused.err, (secret, str(refused))
    assert len(cli.json("runs", "list", "--json")) == 1


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://[::1", "Invalid IPv6 URL"),  # (an internal error, exit 1: tester 167)
        ("notaurl", "does not start with http"),  # (each a run stored as failed)
        pytest.param("ftp://x/v1", "does not start with http", marks=pytest.mark.slow),
        pytest.param("http://x:99999/v1", "Port out of range", marks=pytest.mark.slow),
        pytest.param("http:///v1", "names no host", marks=pytest.mark.slow),
        # (each was stored as a run that failed at its first call: outside tester 205)
        pytest.param("http://ho st/v1", "holds a space", marks=pytest.mark.slow),
        pytest.param("http://exa_mple..com/v1", "an empty label", marks=pytest.mark.slow),
        pytest.param("http://host:0/v1", "port 0 is no port", marks=pytest.mark.slow),
    ],
)
def test_an_endpoint_that_is_not_an_address_is_refused_before_any_run(
    cli: Cli, url: str, why: str
) -> None:
    refused = cli.expect(2, "demo", "handoff", "-m", REFUND, "--base-url", url, "--api-key", "k")
    said = refused.out + refused.err
    assert "is not an address" in said and why in said and "Traceback" not in said, said
    assert "no database" in cli.expect(4, "runs", "list").err  # nothing stored, not even that
    cli.env["OPENAI_BASE_URL"] = url
    refused = cli.expect(2, "demo", "handoff", "-m", REFUND, "--api-key", "k")
    assert why in refused.out + refused.err


@pytest.mark.slow  # several processes in turn
def test_a_run_whose_key_is_missing_is_refused_and_its_key_never_stored(
    cli: Cli, fake: FakeOpenAIServer
) -> None:
    env(cli)
    cli.expect(
        3, "demo", "handoff", "-m", REFUND, "--detach",
        "--model", "fakemodel", "--base-url", fake.base_url, "--api-key", SECRET,
    )  # fmt: skip
    run_id = only_run(cli)["run_id"]
    asked = len(fake.requests)
    assert asked > 0 and {r["model"] for r in fake.requests} == {"fakemodel"}
    for path in cli.db.parent.glob("runs.db*"):  # the database, its WAL and shared memory
        assert SECRET.encode() not in path.read_bytes(), path

    (request,) = cli.json("requests", "list")  # answering runs no agent: no key needed
    cli.expect(0, "respond", request["request_id"], "--message", "order 12345 please")
    refused = cli.expect(2, "resume", run_id, "--end")
    line = refused.error_line()
    assert f"run {run_id} was started with model fakemodel at {fake.base_url}" in line
    assert "$OPENAI_API_KEY is not set; set it or pass --api-key" in line
    assert "--offline" in line
    assert len(fake.requests) == asked  # nothing ran
    assert status(cli, run_id) == "idle_with_pending_requests"

    env(cli, OPENAI_API_KEY=SECRET)  # with the key, the run continues where it was started
    done = cli.expect(0, "resume", run_id, "--end")
    assert len(fake.requests) > asked and {r["model"] for r in fake.requests} == {"fakemodel"}
    assert not scripted_text(done), str(done)


@pytest.mark.slow  # several processes in turn: `make test` runs it, `make test-fast` not
def test_a_scripted_run_stays_scripted_whatever_the_environment_says(
    cli: Cli, fake: FakeOpenAIServer
) -> None:
    env(cli)
    paused_id, _ = cli.start_paused(REFUND)
    env(cli, OPENAI_API_KEY=SECRET, OPENAI_BASE_URL=fake.base_url, OPENAI_MODEL="fakemodel")
    done = cli.expect(0, "resume", paused_id, "--approve")
    assert scripted_text(done) or "case complete" in done.out, str(done)
    assert fake.requests == []
    assert [entry["kind"] for entry in cli.ledger()] == ["refund"]


@pytest.mark.slow
def test_only_flags_on_resume_switch_the_model(cli: Cli, fake: FakeOpenAIServer) -> None:
    env(cli, OPENAI_API_KEY=SECRET)
    cli.expect(
        3, "demo", "handoff", "-m", REFUND, "--detach",
        "--model", "fakemodel", "--base-url", fake.base_url,
    )  # fmt: skip
    run_id = only_run(cli)["run_id"]
    (request,) = cli.json("requests", "list")
    cli.expect(0, "respond", request["request_id"], "--message", "order 12345 please")

    env(cli, OPENAI_API_KEY=SECRET, OPENAI_BASE_URL="http://127.0.0.1:9/v1")
    refused = cli.expect(2, "resume", run_id, "--end").error_line()
    assert "but OPENAI_BASE_URL is http://127.0.0.1:9/v1; resume with --base-url" in refused

    asked = len(fake.requests)
    switched = cli.expect(
        0, "resume", run_id, "--end", "--model", "other", "--base-url", fake.base_url
    )
    assert f"continuing on model other at {fake.base_url}" in switched.out
    assert {r["model"] for r in fake.requests[asked:]} == {"other"}

    finished = cli.expect(5, "resume", run_id)  # no agent runs: the model is not asked for
    assert "nothing to resume" in finished.error_line()
    mixed = cli.expect(2, "resume", run_id, "--offline", "--model", "x")
    assert "--offline cannot be combined with --model" in mixed.error_line()


def test_runs_started_by_the_server_record_their_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``serve`` takes its model from the environment once; each run it starts records it, so
    a resume from the command line continues on the same model."""
    import sqlite3

    from fastapi.testclient import TestClient

    from workflow_engine_cli._registry import MODEL_STATE_KEY
    from workflow_engine_cli._server import create_app

    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_MODEL"):
        monkeypatch.delenv(name, raising=False)
    db = tmp_path / "runs.db"
    body = {
        "threadId": "t1",
        "runId": "r1",
        "state": {},
        "messages": [{"id": "m1", "role": "user", "content": "Where is order 12345?"}],
        "tools": [],
        "context": [],
        "forwardedProps": {},
    }
    with TestClient(create_app(db), base_url="http://127.0.0.1") as http:
        reply = http.post("/support", json=body, headers={"accept": "text/event-stream"})
        assert reply.status_code == 200
    with sqlite3.connect(db) as raw:
        bodies = [row[0] for row in raw.execute("SELECT body FROM checkpoints WHERE seq = 0")]
    assert bodies and all(MODEL_STATE_KEY in b and '"scripted"' in b for b in bodies)


def test_the_server_log_names_each_model_call_without_the_endpoint_credentials(
    tmp_path: Path, fake: FakeOpenAIServer
) -> None:
    """``serve`` logs httpx's line for each call to the model endpoint at ``info``: with the
    user and password written into ``OPENAI_BASE_URL``, once a call (outside tester 203)."""
    import subprocess
    import time

    import httpx

    from tests.integration.agui_harness import free_port

    port = free_port()
    url = fake.base_url.replace("http://", "http://alice:SECRETPW@")
    env = {**base_env(tmp_path / "ledger.jsonl"), "OPENAI_BASE_URL": url, "OPENAI_API_KEY": "k"}
    serve = [str(ENGINE), "serve", "--port", str(port), "--db", str(tmp_path / "db")]
    server = subprocess.Popen(serve, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        said = {"id": "m1", "role": "user", "content": "Where is order 12345?"}
        body = {"threadId": "t1", "runId": "r1", "messages": [said]}
        reply = httpx.post(f"http://127.0.0.1:{port}/support", json=body, timeout=30)
        assert reply.status_code == 200 and "RUN_FINISHED" in reply.text, reply.text[-500:]
    finally:
        server.terminate()
        _, log = server.communicate(timeout=30)
    assert "HTTP Request: POST http://127.0.0.1:" in log, log
    assert "SECRETPW" not in log and "alice" not in log, log
