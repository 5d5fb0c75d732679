"""Every benchmark script runs, at its smallest size, so none rots between measurements.

Figures are not asserted (timing belongs in ``benchmarks/``, not in tests): only that each
script runs to the end and prints its figure.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

SMALLEST = {
    "bench_w1_chain.py": ["-n", "10", "-r", "1"],
    "bench_w2_fan.py": ["-n", "10", "-r", "1"],
    "bench_w3_durable_chain.py": ["-n", "100", "--no-full", "-r", "1"],  # bytes need N>=100
    "bench_w4_pause_resume.py": ["-r", "1"],
    "bench_w5_throughput.py": ["--runs", "5", "-r", "1", "-c", "5"],
    "bench_w6_conversation.py": ["-n", "10", "-r", "1"],
    "bench_floor.py": ["-n", "10", "-r", "1"],
    "bench_cli_read.py": ["-n", "3", "-r", "1", "--busy", "3"],
    "bench_agui_thread.py": ["-n", "5"],
    "bench_many_pending.py": ["-n", "5"],
    "profile_kernel.py": ["w1", "-n", "10", "--limit", "3"],
    "profile_durable.py": ["w5", "--runs", "5", "--no-profile"],
}


def test_every_script_is_covered() -> None:
    scripts = {p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(SMALLEST), "add the new benchmark script to SMALLEST"


@pytest.mark.parametrize("script", sorted(SMALLEST))
def test_benchmark_script_runs(script: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *SMALLEST[script]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip(), "printed no figure"
    assert "Traceback" not in done.stderr
