"""The AG-UI conformance validator ``ag-ui-validate`` over what the server sends.

``ag-ui-validate`` (PyPI; rule ids ``AGUI###``, e.g. AGUI207: a ``TOOL_CALL_RESULT`` whose tool
call this stream never started) checks a recorded stream, or a live endpoint, against AG-UI's
rules. The test installs the pinned wheel (by hash) into a folder of its own -- pytest's cache,
never the project's environment, where its pytest plugin would load into every test run -- and
runs its command line in a subprocess, with every rule at its own severity: none switched off.
It skips only when the package registry cannot be reached.

Recorded: a fresh run up to its approval, an approved, a rejected, an answered and a cancelled
resume, a mixed batch and its resume, a resume sent in ``forwardedProps``, a refusal and a
repeated resume. Live: both endpoints, which adds the transport rules (framing, content type,
keep-alives, incremental flushing). The one finding allowed is AGUI903 (information: a CUSTOM
name without a vendor prefix) for the three names Agent Framework's AG-UI events use.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.agui_harness import Client, Server, Stream, resolved, run_input, user

# Subprocesses of the CLI or a server: `make test` runs these, `make test-fast` does not.
pytestmark = pytest.mark.slow

VALIDATOR = "ag-ui-validate==0.4.0"
WHEEL_SHA256 = "d4d27d2e66b8ce604448fae7ef7b6f396a0f93b4a86c079029650321c5eb08fb"
AGENT_FRAMEWORK_NAMES = ("status", "request_info", "workflow_output")
# What pip prints when it cannot reach the index (the only reason to skip).
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name "
    r"resolution|Name or service not known|Network is unreachable|Connection refused|"
    r"ConnectTimeout|Read timed out|ProxyError|Could not fetch URL"
)
REFUND = "I want a refund for order 12345"


@pytest.fixture(scope="module")
def validator(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder ``ag_ui_validate`` is installed in (reused while it holds the pinned wheel)."""
    cache = getattr(request.config, "cache", None)
    folder = (
        Path(cache.mkdir("ag-ui-validate"))
        if cache is not None
        else tmp_path_factory.mktemp("ag-ui-validate")
    )
    site, marker = folder / "site", folder / "installed"
    if (
        marker.exists()
        and marker.read_text() == WHEEL_SHA256
        and (site / "ag_ui_validate").is_dir()
    ):
        return site
    shutil.rmtree(site, ignore_errors=True)
    requirements = folder / "requirements.txt"
    requirements.write_text(f"{VALIDATOR} --hash=sha256:{WHEEL_SHA256}\n")
    command = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-deps",
        "--only-binary=:all:",
        "--require-hashes",
        "--retries=1",
        "--timeout=20",
        f"--target={site}",
        f"--requirement={requirements}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode != 0:
        output = done.stdout + done.stderr
        if UNREACHABLE.search(output):
            pytest.skip(f"the package registry is unreachable, cannot install {VALIDATOR}")
        pytest.fail(f"installing {VALIDATOR} failed:\n{output}")
    marker.write_text(WHEEL_SHA256)
    return site


def validate(site: Path, target: str) -> dict[str, Any]:
    """``ag-ui-validate <target> --json --max-warnings 0``'s report (no rule switched off)."""
    done = subprocess.run(
        [sys.executable, "-m", "ag_ui_validate.cli", target, "--json", "--max-warnings", "0"],
        env={**os.environ, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 1), f"ag-ui-validate failed to run:\n{done.stderr}"
    report = json.loads(done.stdout)
    report["exit_code"] = done.returncode
    return report


def assert_conformant(report: dict[str, Any], what: str) -> None:
    """No error, no warning, and no information but AGUI903 for Agent Framework's names."""
    other = [
        d
        for d in report["diagnostics"]
        if not (
            d["rule"] == "AGUI903"
            and d["severity"] == "info"
            and any(f"'{name}'" in d["message"] for name in AGENT_FRAMEWORK_NAMES)
        )
    ]
    assert not other, f"{what}:\n{json.dumps(other, indent=2)}"
    assert report["summary"]["errors"] == report["summary"]["warnings"] == 0, report["summary"]
    assert report["exit_code"] == 0, what


# --- the recordings -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("agui-validator")
    with Server(
        db=base / "runs.db",
        log=base / "server.log",
        env={"WORKFLOW_ENGINE_DEMO_LEDGER": str(base / "ledger.jsonl")},
    ) as server:
        yield server


def thread() -> str:
    return f"valid-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="module")
def recordings(server: Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each scenario's stream as the server sent it, in a file of its own."""
    client = Client(server.url)
    streams: dict[str, Stream] = {}

    def approval(name: str) -> tuple[str, Any]:
        thread_id = thread()
        streams[name] = stream = client.start("/support", thread_id, REFUND)
        return thread_id, stream.interrupts[0]

    thread_id, interrupt = approval("fresh")
    approve = resolved(interrupt.id, {"accepted": True})
    streams["approved"] = client.resume("/support", thread_id, approve)
    streams["repeated"] = client.resume("/support", thread_id, approve)

    thread_id, interrupt = approval("fresh, to be rejected")
    rejection = {"interrupts": [{"id": interrupt.id, "value": {"accepted": False}}]}
    streams["rejected"] = rejected = client.resume("/support", thread_id, rejection)
    streams["refused"] = client.start("/support", thread_id, "Hello?")
    answer = resolved(rejected.interrupts[0].id, "No, thanks")
    streams["answered"] = client.resume("/support", thread_id, answer)

    thread_id, interrupt = approval("fresh, to be cancelled")
    cancel = [{"interruptId": interrupt.id, "status": "cancelled"}]
    streams["cancelled"] = client.resume("/support", thread_id, cancel)

    thread_id, interrupt = approval("fresh, resumed in forwardedProps")
    props = {"command": {"resume": resolved(interrupt.id, {"accepted": True})}}
    forwarded = run_input(thread_id, [user(REFUND)], forwardedProps=props)
    streams["resumed in forwardedProps"] = client.post("/support", forwarded)

    thread_id = thread()
    batch = client.start(
        "/banking", thread_id, "Please transfer 300 to savings and show my balance"
    )
    streams["mixed batch"] = batch
    approve = resolved(batch.interrupts[0].id, {"accepted": True})
    streams["mixed batch approved"] = client.resume("/banking", thread_id, approve)

    folder = tmp_path_factory.mktemp("recordings")
    files = {}
    for index, (name, stream) in enumerate(streams.items()):
        assert stream.status == 200 and stream.raw, name
        files[name] = folder / f"{index:02}.sse"
        files[name].write_bytes(stream.raw)
    return files


SCENARIOS = [
    "fresh",
    "approved",
    "repeated",
    "rejected",
    "refused",
    "answered",
    "cancelled",
    "resumed in forwardedProps",
    "mixed batch",
    "mixed batch approved",
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_a_recorded_stream_passes_ag_ui_validate(
    validator: Path, recordings: dict[str, Path], scenario: str
) -> None:
    report = validate(validator, str(recordings[scenario]))
    assert_conformant(report, scenario)


@pytest.mark.parametrize("path", ["/support", "/banking"])
def test_a_live_endpoint_passes_ag_ui_validate(validator: Path, server: Server, path: str) -> None:
    """The validator POSTs its own RunAgentInput, so the transport rules are checked too."""
    report = validate(validator, f"{server.url}{path}")
    assert_conformant(report, path)
    skipped = {s["rule"] for s in report["skipped"]}
    assert not skipped & {"AGUI501", "AGUI505", "AGUI506", "AGUI507", "AGUI508"}, skipped


def test_the_validator_catches_what_the_server_used_to_send(
    validator: Path, recordings: dict[str, Path], tmp_path: Path
) -> None:
    """The approved stream without its replayed call is AGUI207 -- the issue's report -- so
    a clean report above means the validator looked."""
    lines = recordings["approved"].read_bytes().decode().split("\n\n")
    kept = [
        frame for frame in lines if not re.search(r'"type":"TOOL_CALL_(START|ARGS|END)"', frame)
    ]
    broken = tmp_path / "approved-without-replay.sse"
    broken.write_text("\n\n".join(kept))
    report = validate(validator, str(broken))
    assert "AGUI207" in {d["rule"] for d in report["diagnostics"]}
    assert report["exit_code"] == 1
