"""Fuzzing every door input comes in by: AG-UI bodies, resume payloads, headers, CLI arguments
and stored records. Hypothesis draws the input; the properties are the same everywhere:

* nothing answers 5xx, prints a traceback or cuts a stream short (every stream obeys AG-UI's
  sequence rules and ends in RUN_FINISHED or RUN_ERROR, never ``internal_error``);
* a refusal (4xx, a refusing RUN_ERROR code, a non-zero CLI exit) changes nothing in the store,
  read through the Runtime API before and after;
* what the parser lets through is plain JSON of bounded depth whose strings are real text.

One server and one CLI database serve the whole module; example counts are bounded so the file
runs in well under a minute (``EXAMPLES`` sums them, for the record).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from ag_ui.core import EventType
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from tests.integration.agui_harness import Client, Server
from tests.integration.cli_harness import Cli
from tests.integration.hostile_harness import (
    corrupt_checkpoint_body,
    corrupt_pending_data,
    store_state,
)
from tests.integration.test_cli_hostile import run_bytes
from workflow_engine import StoreCorruptError, StoredRequest, Workflow, WorkflowError
from workflow_engine._input import InputError, json_depth, parse_json
from workflow_engine_agui import AGUIService
from workflow_engine_cli._registry import open_runtime, workflow_factories

# Subprocesses of the CLI or a server: `make test` runs these, `make test-fast` does not.
pytestmark = pytest.mark.slow

MAX_BODY = 200_000
EXAMPLES = {  # hypothesis examples per test: 1,072 in all
    "run_agent_input": 100,
    "resume_on_a_paused_thread": 70,
    "raw_bodies_and_headers": 40,
    "parse_json_roundtrip": 200,
    "parse_json_anything": 200,
    "json_depth": 200,
    "decode_stored_request": 200,
    "checkpoint_body": 25,
    "cli_arguments": 12,
}
FAST = settings(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def examples(name: str) -> settings:
    return settings(FAST, max_examples=EXAMPLES[name])


# --- strategies ---------------------------------------------------------------------------------
# Mostly well-formed input with a hostile part here and there: input that is wrong everywhere
# only ever meets the parser, and the interesting refusals are further in.


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``good`` nine times in ten, else ``bad``."""
    return st.integers(0, 9).flatmap(lambda i: good if i else bad)


lone_surrogate = st.integers(0xD800, 0xDFFF).map(chr)
clean_texts = st.text(max_size=12)
surrogate_texts = st.tuples(clean_texts, lone_surrogate, clean_texts).map("".join)
huge_texts = st.integers(10_000, 300_000).map(lambda n: "x" * n)
texts = mostly(clean_texts, st.one_of(surrogate_texts, huge_texts))

RAW = re.compile(r'"\\u0000raw:([^"\\]*)\\u0000"')


def raw(text: str) -> str:
    """A placeholder that :func:`dump` replaces by ``text`` verbatim (not valid as a string)."""
    return f"\x00raw:{text}\x00"


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


raw_json = st.one_of(
    st.integers(60, 50_000).map(lambda n: raw(nested(n))),  # deep
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-1e400"]).map(raw),
    st.integers(4_301, 6_000).map(lambda n: raw("9" * n)),  # past int_max_str_digits
)
plain_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    clean_texts,
)
json_values = st.recursive(
    mostly(plain_leaves, st.one_of(texts, raw_json)),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(texts, c, max_size=3),
    max_leaves=8,
)
wrong_types = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.lists(json_values, max_size=2),
    st.dictionaries(clean_texts, json_values, max_size=2),
)


def dump(value: Any) -> bytes:
    """JSON text of ``value`` (lone surrogates as ``\\udXXX`` escapes, which is valid JSON),
    with every :func:`raw` placeholder spliced in verbatim."""
    return RAW.sub(lambda m: m.group(1), json.dumps(value)).encode()


messages = st.fixed_dictionaries(
    {
        "id": texts,
        "role": mostly(st.sampled_from(["user", "assistant", "system"]), wrong_types | texts),
        "content": mostly(st.sampled_from(["Hello", "I want a refund", "?"]), json_values),
    },
    optional={"toolCallId": texts, "name": texts},
)
fresh_threads = st.uuids().map(lambda u: f"fuzz-{u.hex[:16]}")
approval_payloads = st.fixed_dictionaries(
    {"accepted": mostly(st.booleans(), json_values)},
    optional={"arguments": mostly(st.dictionaries(clean_texts, plain_leaves), json_values)},
)
payloads = mostly(st.one_of(approval_payloads, json_values), wrong_types)


def resume_field(ids: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    entry = st.fixed_dictionaries(
        {
            "interruptId": ids,
            "status": mostly(st.sampled_from(["resolved", "cancelled"]), texts | wrong_types),
        },
        optional={"payload": payloads},
    )
    answers = st.fixed_dictionaries({"id": ids}, optional={"value": payloads})
    dict_form = st.fixed_dictionaries(
        {
            "interrupts": mostly(st.lists(answers, min_size=1, max_size=2), wrong_types),
        }
    )
    return mostly(st.one_of(st.lists(entry, min_size=1, max_size=2), dict_form), wrong_types)


def run_agent_inputs(
    threads: st.SearchStrategy[Any], ids: st.SearchStrategy[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "threadId": mostly(threads, wrong_types),
            "runId": mostly(clean_texts, texts | wrong_types),
            "messages": mostly(st.lists(messages, max_size=3), wrong_types),
        },
        optional={
            "resume": resume_field(ids),
            "forwardedProps": json_values,
            "state": json_values,
            "tools": mostly(st.just([]), wrong_types),
            "context": mostly(st.just([]), wrong_types),
        },
    )


# --- the server ---------------------------------------------------------------------------------

REFUSALS = {
    "interrupts_pending",
    "unknown_interrupt",
    "interrupt_thread_mismatch",
    "interrupt_not_pending",
    "interrupt_not_current",
    "invalid_resume_payload",
    "request_conflict",
    "no_user_message",
    "response_type_mismatch",
}
HTTP_REFUSALS = {
    400: {"json_too_deep", "invalid_text", "invalid_input"},
    403: {"origin_not_allowed", "host_not_allowed"},
    413: {"request_too_large"},
    415: {"unsupported_media_type"},
    422: {"malformed_json", "invalid_run_input", "invalid_resume"},
}


class Target:
    """The module's server, with one thread paused at its approval (and one on another thread)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.client = Client(server.url)
        self.thread = "fuzz-paused"
        self.interrupt = self._pause(self.thread)
        self.other = self._pause("fuzz-other")
        self.request_id = self.interrupt.rpartition(".")[0]

    def _pause(self, thread_id: str) -> str:
        stream = self.client.start("/support", thread_id, "I want a refund for order 12345")
        return stream.interrupts[0].id

    def ids(self) -> st.SearchStrategy[Any]:
        known = [
            self.interrupt,
            self.request_id,  # what an outsider could derive
            f"{self.request_id}.{'0' * 32}",
            self.interrupt.upper(),
            self.interrupt + "\ud800",
            self.other,
        ]
        return mostly(st.sampled_from(known), st.one_of(texts, huge_texts, wrong_types))

    def acts_on_the_paused_thread(self, body: dict[str, Any]) -> bool:
        """A valid answer or cancel for a paused interrupt on its own thread (either of the
        two): legitimate, but it would end a pause the other examples and the last test need.
        Such inputs are left out."""
        thread = body.get("threadId")
        paused = {self.thread: self.interrupt, "fuzz-other": self.other}
        if not isinstance(thread, str) or thread not in paused:
            return False
        resume = body.get("resume")
        entries: list[Any] = []
        if isinstance(resume, list):
            entries = [
                (e.get("interruptId"), e.get("status", "resolved"), e.get("payload"))
                for e in resume
                if isinstance(e, dict)
            ]
        elif isinstance(resume, dict) and isinstance(resume.get("interrupts"), list):
            entries = [
                (e.get("id"), "resolved", e.get("value"))
                for e in resume["interrupts"]
                if isinstance(e, dict)
            ]
        for interrupt_id, status, payload in entries:
            if interrupt_id != paused[thread]:
                continue
            if status == "cancelled" or isinstance(payload, bool):
                return True
            if isinstance(payload, dict) and any(
                isinstance(payload.get(k), bool) for k in ("accepted", "approved")
            ):
                return True
        return False

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        """POST, then check the properties of the module docstring."""
        db, log = self.server.db, self.server.log
        before, log_from = store_state(db), log.stat().st_size
        request_headers = {"content-type": "application/json", "accept": "text/event-stream"}
        stream = self.client.post(path, body, headers={**request_headers, **(headers or {})})
        assert b"Traceback" not in log.read_bytes()[log_from:], log.read_text()[-3000:]
        assert stream.status < 500, stream.describe()
        if stream.status != 200:
            event(f"HTTP {stream.status}")  # see --hypothesis-show-statistics
            assert isinstance(stream.body, dict), stream.describe()
            assert stream.body["error"] in HTTP_REFUSALS[stream.status], stream.describe()
            assert store_state(db) == before, stream.describe()
            return
        last = stream.last  # check_sequence held: the stream ended properly
        event(f"HTTP 200, {last.type.value} {getattr(last, 'code', '') or ''}")
        if last.type == EventType.RUN_ERROR:
            assert last.code != "internal_error", stream.describe()
            if last.code in REFUSALS:
                assert len(stream.events) == 2, stream.describe()
                assert store_state(db) == before, stream.describe()


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    base = tmp_path_factory.mktemp("fuzz")
    server = Server(
        db=base / "runs.db",
        log=base / "server.log",
        args=["--max-body-bytes", str(MAX_BODY)],
        env={"WORKFLOW_ENGINE_DEMO_LEDGER": str(base / "ledger.jsonl")},
    )
    with server:
        yield Target(server)


@given(data=st.data())
@examples("run_agent_input")
def test_fuzz_run_agent_input(target: Target, data: st.DataObject) -> None:
    threads = mostly(st.one_of(fresh_threads, st.just(target.thread)), st.one_of(texts, huge_texts))
    body = data.draw(run_agent_inputs(threads, target.ids()))
    assume(not target.acts_on_the_paused_thread(body))
    path = data.draw(st.sampled_from(["/support", "/banking"]))
    target.post(path, dump(body))


@given(data=st.data())
@examples("resume_on_a_paused_thread")
def test_fuzz_resume_payloads_on_a_paused_thread(target: Target, data: st.DataObject) -> None:
    """Every answer here is refused: wrong id, wrong thread or a payload failing the schema."""
    thread = st.sampled_from([target.thread, "fuzz-other", "fuzz-paused/0", "fuzz"])
    body = {
        "threadId": data.draw(thread),
        "runId": "fuzz",
        "messages": [],
        "resume": data.draw(resume_field(target.ids())),
    }
    assume(not target.acts_on_the_paused_thread(body))
    target.post("/support", dump(body))


# header values as an HTTP client can send them (h11 refuses surrounding whitespace)
headers = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40).map(str.strip)


@given(
    body=st.one_of(
        st.binary(max_size=200), texts.map(lambda t: t.encode("utf-8", "surrogatepass"))
    ),
    content_type=st.one_of(
        st.sampled_from(["application/json", "text/plain", "application/json; charset=latin-1"]),
        headers,
    ),
    origin=st.one_of(st.none(), st.sampled_from(["null", "https://evil.example"]), headers),
)
@examples("raw_bodies_and_headers")
def test_fuzz_raw_bodies_and_headers(
    target: Target, body: bytes, content_type: str, origin: str | None
) -> None:
    extra = {"content-type": content_type}
    if origin is not None:
        extra["origin"] = origin
    target.post("/support", body, extra)


def test_the_paused_threads_are_untouched_after_the_fuzzing(target: Target) -> None:
    """Runs after the server fuzz tests above: both interrupts still wait for their answers."""
    client = target.client
    for thread_id, interrupt in (("fuzz-other", target.other), (target.thread, target.interrupt)):
        stream = client.resume(
            "/support",
            thread_id,
            [{"interruptId": interrupt, "status": "resolved", "payload": {"accepted": False}}],
        )
        assert "did not submit the refund" in stream.text(), stream.describe()


# --- the bounded parser (in process) ------------------------------------------------------------

plain_json = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(),
    ),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(), c, max_size=4),
    max_leaves=30,
)


def reference_depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(reference_depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(reference_depth, value.values()), default=0)
    return 0


@given(value=plain_json)
@examples("parse_json_roundtrip")
def test_fuzz_parse_json_keeps_every_plain_json_value(value: Any) -> None:
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
        assert parse_json(text.encode()) == value
        assert parse_json(text) == value


@given(data=st.one_of(st.binary(max_size=300), texts.map(str), st.builds(dump, json_values)))
@examples("parse_json_anything")
def test_fuzz_parse_json_refuses_cleanly_or_returns_plain_json(data: bytes | str) -> None:
    try:
        value = parse_json(data, max_bytes=MAX_BODY)
    except InputError as exc:
        assert exc.status in (400, 413, 422) and exc.code and "\n" not in str(exc)
        return
    assert reference_depth(value) <= 64
    json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")


@given(value=plain_json, depth=st.integers(0, 200))
@examples("json_depth")
def test_fuzz_json_depth_matches_the_structure(value: Any, depth: int) -> None:
    text = json.dumps(value)
    assert json_depth(text) == reference_depth(value)
    wrapped = "[" * depth + text + "]" * depth
    assert json_depth(wrapped) == depth + reference_depth(value)
    if depth + reference_depth(value) > 64:
        with pytest.raises(InputError, match="levels deep"):
            parse_json(wrapped)


# --- stored records -----------------------------------------------------------------------------

APPROVAL_REQUEST = "executors._content.ToolApprovalRequestContent"
APPROVAL_ANSWER = "executors._content.ToolApprovalResponseContent"
MARKERS = ["$float", "$bytes", "$items", "$tuple", "$dict", "$type"]
tagged_garbage = st.one_of(
    st.builds(lambda m, body: {m: body}, st.sampled_from(MARKERS), plain_json),
    st.builds(
        lambda body: {"$type": APPROVAL_REQUEST, "data": body},
        plain_json,
    ),
    st.builds(lambda body: {"$unknown": body}, plain_json),
)


@pytest.fixture(scope="module")
def support() -> Workflow:
    return workflow_factories()["support"]()


@given(
    data=st.one_of(tagged_garbage, plain_json),
    response_type=st.one_of(
        st.just(APPROVAL_ANSWER), st.just("no.such.Answer"), st.text(max_size=5)
    ),
)
@examples("decode_stored_request")
def test_fuzz_a_stored_request_decodes_or_is_store_corrupt(
    support: Workflow, data: Any, response_type: str
) -> None:
    """What the server reads back for a repeated resume: a damaged row is StoreCorruptError
    naming the run and the request, never a raw exception."""
    stored = StoredRequest(
        request_id="req-1",
        run_id="support:t/0",
        port_id="refund_agent",
        source_executor_id="refund_agent",
        kind="executor",
        data=data,
        response_type=response_type,
        superstep=1,
        status="applied",
    )
    try:
        request = AGUIService._decode_request(support, stored)
    except StoreCorruptError as exc:
        assert "support:t/0" in str(exc) and "req-1" in str(exc)
    else:
        # a name the workflow knows decodes: its answer type, or a builtin such as "Any"/"int"
        # (which hypothesis finds among short texts)
        assert request.request_id == "req-1"
        assert request.response_type is support.resolve_type(response_type)
        assert response_type == APPROVAL_ANSWER or "." not in response_type


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cli, str, str]]:
    """A CLI database with a demo run paused at its approval: (cli, run id, request id)."""
    cli = Cli(tmp_path_factory.mktemp("fuzz-cli"))
    run_id, request_id = cli.start_paused()
    yield cli, run_id, request_id


def read_run(db: Path, run_id: str) -> None:
    async def read() -> None:
        runtime = open_runtime(db)
        try:
            await runtime.get_run(run_id)
        finally:
            await runtime.close()

    anyio.run(read)


@given(body=st.one_of(st.text(max_size=200), st.builds(json.dumps, plain_json)))
@examples("checkpoint_body")
def test_fuzz_a_damaged_checkpoint_row_is_store_corrupt(
    cli: tuple[Cli, str, str], tmp_path_factory: pytest.TempPathFactory, body: str
) -> None:
    source, run_id, _ = cli
    db = tmp_path_factory.mktemp("damaged") / "runs.db"
    shutil.copy(source.db, db)
    checkpoint_id = corrupt_checkpoint_body(db, run_id, body)
    try:
        read_run(db, run_id)  # a body that happens to be a valid delta is just read
    except StoreCorruptError as exc:
        assert run_id in str(exc) and checkpoint_id in str(exc)


@given(value=tagged_garbage)
@settings(FAST, max_examples=25)
def test_fuzz_a_malformed_stored_value_is_store_corrupt(
    cli: tuple[Cli, str, str], tmp_path_factory: pytest.TempPathFactory, value: Any
) -> None:
    source, run_id, _ = cli
    db = tmp_path_factory.mktemp("damaged") / "runs.db"
    shutil.copy(source.db, db)
    corrupt_pending_data(db, run_id, value)
    try:
        read_run(db, run_id)
    except StoreCorruptError as exc:
        assert run_id in str(exc)
    except WorkflowError:
        raise AssertionError("not a StoreCorruptError") from None


# --- the command line ---------------------------------------------------------------------------

arg_bytes = st.one_of(
    clean_texts.map(str.encode),
    st.binary(min_size=1, max_size=12),
    st.builds(dump, json_values).filter(lambda b: len(b) < 120_000),
    st.sampled_from([b"-x", b"--", b"--help", b"\xff", b'"\\ud800"', b"[" * 70 + b"]" * 70]),
).map(lambda b: b.replace(b"\x00", b""))
COMMANDS: list[list[bytes | str]] = [
    ["runs", "show", "@"],
    ["runs", "list", "--status", "@"],
    ["respond", "@", "--approve"],
    ["respond", "{request}", "--data", "@"],
    ["respond", "{request}", "--approve", "--arguments", "@"],
    ["respond", "{request}", "--message", "@"],
    ["cancel", "@"],
    ["resume", "@", "--end"],
    ["graph", "@", "--format", "@"],
]


@given(command=st.sampled_from(COMMANDS), args=st.lists(arg_bytes, min_size=2, max_size=2))
@examples("cli_arguments")
def test_fuzz_cli_arguments(
    cli: tuple[Cli, str, str], command: list[bytes | str], args: list[bytes]
) -> None:
    fuzz, _, request_id = cli
    values = iter(args)
    argv = [
        next(values) if part == "@" else str(part).replace("{request}", request_id)
        for part in command
    ]
    before = store_state(fuzz.db)
    result = run_bytes(fuzz, argv)
    assert "Traceback" not in result.out + result.err, str(result)
    assert result.code in (0, 2, 3, 4, 5), str(result)
    if result.code != 0:
        result.error_line()  # a malformed command line too: one line, not typer's box
        assert store_state(fuzz.db) == before, str(result)
