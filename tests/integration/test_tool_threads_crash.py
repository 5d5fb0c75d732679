"""A blocking tool's call waits for its worker thread before it counts as started: a crash while
calls queue for threads leaves only the running one in doubt (outside tester 50: a server killed
with 300 approvals in flight asked a person about 42 refunds, of which 23 had never run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

APP = Path(__file__).parent / "thread_slots_app.py"

pytestmark = pytest.mark.slow  # a real process, SIGKILLed


def _ledger(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_calls_waiting_for_a_thread_when_the_process_dies_are_not_in_doubt(
    tmp_path: Path,
) -> None:
    db, ledger = tmp_path / "runs.db", tmp_path / "ledger.jsonl"
    env = {**os.environ, "HOLD_BOOKINGS": "1"}
    started = subprocess.Popen(
        [sys.executable, str(APP), str(db), str(ledger), "start", "3"], env=env
    )
    try:
        deadline = time.monotonic() + 30
        while not _ledger(ledger):  # the first booking runs (and holds the one thread)
            assert started.poll() is None, "the process ended before its first booking"
            assert time.monotonic() < deadline, "no booking started"
            time.sleep(0.02)
        time.sleep(0.5)  # the other two calls reach the thread they wait for
    finally:
        started.send_signal(signal.SIGKILL)
        started.wait()
    assert len(_ledger(ledger)) == 1
    env.pop("HOLD_BOOKINGS")
    resumed = subprocess.run(
        [sys.executable, str(APP), str(db), str(ledger), "resume"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr
    outcomes = json.loads(resumed.stdout.strip().splitlines()[-1])
    # the call that ran asks whether it happened; the two that waited for its thread never
    # started: they simply run now, no question asked
    asked = [o for o in outcomes.values() if o != "done"]
    assert sorted(outcomes.values()) == sorted(
        ["done", "done", "idle_with_pending_requests: ['InDoubtEffect']"]
    ), outcomes
    assert len(asked) == 1
    booked = _ledger(ledger)
    assert len(booked) == 3 and len({b["key"] for b in booked}) == 3, booked
