"""CLI start-up: read-only commands in a fresh process, against a small and a large database.

Each command (``workflow-engine --version``, ``runs list``, ``requests list``, and ``runs show``
of the paused run and of a demo run paused at its approval -- one the command line builds, to
decode its values) runs as a subprocess, timed from spawn to exit (interpreter start included:
what a person waits for), with its bytecode cached as for an installed package. The commands
run interleaved, so a busy minute slows all of them alike; the figure is the median of ``-r``
rounds.

Three databases: one paused run with its request (the inbox of a quiet day), the same plus
``-n`` runs cut off before their first superstep committed (``Runtime.start`` only: as many
runs as a crashed server leaves interrupted), which ``requests list`` checks for steps in
doubt, and ``--busy`` runs each paused at its request (a busy inbox), listed with
``--limit 20`` (which reads only what it shows: at 100,000 runs it read every one, outside
tester 175). And the small one plus a run killed (SIGKILL) in the middle of a step, which
``requests list`` and ``runs show`` then tell is in doubt, reading its checkpoints and journal
(outside tester 208: 0.37 s, the command line proper's runtime loaded for it), and ``runs show``
of an id that names no run. The floor beside them is the bare interpreter (``python -c pass``).

Target (issue 12): a read-only command in at most 300 ms.
"""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

import anyio
from _durable import temp_dir
from bench_w4_pause_resume import ROOT, START_MESSAGE, build_review, import_env

from workflow_engine import Runtime
from workflow_engine.storage import SqliteStore

COMMANDS: dict[str, list[str]] = {
    "--version": ["--version"],
    "runs list": ["runs", "list"],
    "requests list": ["requests", "list"],
}
CLI = "import sys; from workflow_engine_cli import main; sys.argv[0] = 'workflow-engine'; main()"


async def fill(path: Path, interrupted: int) -> str:
    """One paused run (a pending request), and ``interrupted`` runs admitted and never run;
    the paused run's id."""
    runtime = Runtime(SqliteStore(path))
    name = runtime.register(build_review())
    try:
        paused = (await runtime.run(name, START_MESSAGE)).run_id
        for _ in range(interrupted):
            await runtime.start(name, START_MESSAGE)
    finally:
        await runtime.close()
    return paused


async def fill_busy(path: Path, paused: int) -> None:
    """``paused`` runs, each waiting at its request."""
    runtime = Runtime(SqliteStore(path))
    name = runtime.register(build_review())
    try:
        for _ in range(paused):
            await runtime.run(name, START_MESSAGE)
    finally:
        await runtime.close()


CUT_OFF = """
import sys, anyio
from workflow_engine import Executor, Runtime, WorkflowBuilder, WorkflowContext, handler
from workflow_engine.storage import SqliteStore

class Charges(Executor):
    @handler
    async def charge(self, text: str, ctx: WorkflowContext[str]) -> None:
        await ctx.run_once("charge", lambda: anyio.sleep_forever(), description="charge 10")

async def main():
    runtime = Runtime(SqliteStore(sys.argv[1]))
    runtime.register(WorkflowBuilder("charges", start=Charges("charges")).build())
    await runtime.run("charges", "go")

anyio.run(main)
"""


def cut_off_run(db: Path, env: dict[str, str]) -> str:
    """The id of a run killed (SIGKILL) while a step's effect was under way, in ``db``."""
    child = subprocess.Popen([sys.executable, "-c", CUT_OFF, str(db)], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(0.05)
            with contextlib.suppress(sqlite3.OperationalError):  # (not made yet)
                with contextlib.closing(sqlite3.connect(db)) as conn:
                    row = conn.execute("SELECT run_id FROM journal").fetchone()
                if row is not None:
                    return str(row[0])
        raise SystemExit("the effect never started")
    finally:
        child.kill()
        child.wait()


def demo_run(db: Path, env: dict[str, str]) -> str:
    """The id of a support-demo run started in ``db``, paused at its approval."""
    argv = [sys.executable, "-c", CLI, "--db", str(db), "demo", "handoff", "--detach"]
    out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    paused = [line for line in out.stdout.splitlines() if line.startswith("Run ")]
    assert out.returncode == 3 and paused, out.stdout + out.stderr
    return paused[0].split()[1]


def wall(argv: list[str], env: dict[str, str], refused: bool = False) -> float:
    """Seconds from spawning ``argv`` to its exit (it must succeed, or exit 4: ``refused``)."""
    t = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, check=False)
    seconds = time.perf_counter() - t
    assert done.returncode == (4 if refused else 0), (argv, done.stderr)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=1000, help="interrupted runs in the large database")
    parser.add_argument("-r", "--repeats", type=int, default=7)
    parser.add_argument("--busy", type=int, default=20_000, help="paused runs in the busy database")
    args = parser.parse_args()
    with temp_dir("bench-cli") as tmp:
        small, large, busy = tmp / "small.db", tmp / "large.db", tmp / "busy.db"
        paused = {small: anyio.run(fill, small, 0), large: anyio.run(fill, large, args.n)}
        anyio.run(fill_busy, busy, args.busy)
        env = import_env(tmp / "pycache")
        cases: dict[str, list[str]] = {"bare interpreter": [sys.executable, "-c", "pass"]}
        for label, argv in COMMANDS.items():
            if label == "--version":  # reads no database
                cases[label] = [sys.executable, "-c", CLI, *argv]
                continue
            for db in (small, large):
                cases[f"{label} @ {db.stem}"] = [sys.executable, "-c", CLI, *argv, "--db", str(db)]
        for label in ("runs list", "requests list"):
            argv = [*COMMANDS[label], "--limit", "20", "--db", str(busy)]
            cases[f"{label} --limit 20 @ busy"] = [sys.executable, "-c", CLI, *argv]
        for db in (small, large):  # (the paused run's timeline)
            show = ["runs", "show", paused[db], "--db", str(db)]
            cases[f"runs show @ {db.stem}"] = [sys.executable, "-c", CLI, *show]
        demo = ["runs", "show", demo_run(small, env), "--db", str(small)]
        cases["runs show (demo run) @ small"] = [sys.executable, "-c", CLI, *demo]
        doubt = tmp / "doubt.db"  # (small's paused run, and one cut off)
        anyio.run(fill, doubt, 0)
        cut_off = cut_off_run(doubt, env)
        for label, argv in (
            ("requests list @ small + a run in doubt", ["requests", "list"]),
            ("runs show (the run in doubt) @ small + it", ["runs", "show", cut_off]),
        ):
            cases[label] = [sys.executable, "-c", CLI, *argv, "--db", str(doubt)]
        no_run = [sys.executable, "-c", CLI, "runs", "show", "nosuch", "--db", str(small)]
        cases["runs show (no such run) @ small"] = no_run
        for argv in cases.values():  # warm-up: bytecode written, files in the page cache
            wall(argv, env, argv is no_run)
        samples: dict[str, list[float]] = {label: [] for label in cases}
        for _ in range(args.repeats):
            for label, argv in cases.items():
                samples[label].append(wall(argv, env, argv is no_run))
    median = {label: statistics.median(s) * 1e3 for label, s in samples.items()}
    print(
        f"CLI read-only commands, fresh process, spawn to exit (median of {args.repeats}, "
        f"interleaved; bytecode cached): small = 1 paused run, large = + {args.n:,} "
        f"interrupted runs, busy = {args.busy:,} runs paused at their requests"
    )
    for label, figure in median.items():
        print(f"  {label}: {figure:.0f} ms")
    print("  target: a read-only command ≤ 300 ms")


if __name__ == "__main__":
    main()
