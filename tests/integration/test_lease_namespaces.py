"""A worker's lease is taken over at once only when its process is seen to have exited -- on
this host *and in this process-id namespace*. Containers that share a host name and a database
file (``--network host``, Kubernetes' ``hostNetwork``) number their processes apart: a live
worker whose pid is no process here was taken for dead, its run taken over and its effect made
twice (outside tester 112). Reproduced with ``unshare``: the worker runs in a new pid namespace,
under a pid that no process has in ours."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.workflows import stepper_workflow
from workflow_engine import RunBusyError, Runtime, default_owner
from workflow_engine.storage import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

HOLDER = textwrap.dedent(
    """
    import sys, time, anyio
    from workflow_engine import default_owner
    from workflow_engine.storage import SqliteStore

    async def main() -> None:
        store = SqliteStore(sys.argv[1])
        owner = default_owner()
        await store.acquire(sys.argv[2], owner, 60)
        print(owner, flush=True)
        time.sleep(60)  # a long step: the lease is live, the worker too

    anyio.run(main)
    """
)


def free_pid() -> int:
    """A pid no process has here (the worker gets it in its own namespace)."""
    for pid in range(54321, 60000):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("no free pid")


def namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0


async def paused_run(tmp_path: Path) -> tuple[Path, str]:
    """A database with one paused run (skipped where no pid namespace can be made: CI runs
    as root on Linux, where this is not expected)."""
    if not namespaces_work():
        pytest.skip("unshare --pid cannot make a pid namespace here")
    db = tmp_path / "runs.db"
    rt = Runtime(SqliteStore(db))
    rt.register(stepper_workflow)
    paused = await rt.run("stepper", 1)
    await rt.close()
    return db, paused.run_id


async def test_a_live_worker_in_another_pid_namespace_keeps_its_run(tmp_path: Path) -> None:
    db, run_id = await paused_run(tmp_path)
    pid = free_pid()
    script = tmp_path / "holder.py"
    script.write_text(HOLDER)
    # (bash is the namespace's pid 1; the worker its child, given the pid after the last one)
    inner = (
        f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid && "
        f"{sys.executable} {script} {db} {run_id}; exit $?"  # (not exec'd by bash)
    )
    holder = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "bash", "-c", inner],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert holder.stdout is not None
        owner = holder.stdout.readline().strip()
        assert owner.partition(":")[2].startswith(f"{pid}:"), owner  # its pid: none here
        store = SqliteStore(db)
        with pytest.raises(RunBusyError, match="another worker"):
            await store.acquire(run_id, default_owner(), 30)
        resumer = Runtime(store)
        resumer.register(stepper_workflow)
        with pytest.raises(RunBusyError):
            await resumer.resume(run_id)
        await resumer.close()
        assert owner.partition(":")[0] != default_owner().partition(":")[0]  # (its namespace)
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()


TRY = textwrap.dedent(
    """
    import sys, anyio
    from workflow_engine import RunBusyError, default_owner
    from workflow_engine.storage import SqliteStore

    async def main() -> None:
        store = SqliteStore(sys.argv[1])
        try:
            await store.acquire(sys.argv[2], default_owner(), 30)
        except RunBusyError:
            print("busy", flush=True)
        else:
            print("taken", flush=True)
        await store.close()

    anyio.run(main)
    """
)


async def test_namespaces_without_a_proc_of_their_own_never_judge_each_other(
    tmp_path: Path,
) -> None:
    """Two containers sharing a host name, each with a /proc that is not a view of its pid
    namespace (a tmpfs over it): the token had no namespace in it, and the second took the
    live first's run over at once (outside tester 114). A namespace that cannot be told is
    named by a token no other process has: its lease runs out instead."""
    db, run_id = await paused_run(tmp_path)
    holder_py, try_py = tmp_path / "holder.py", tmp_path / "try.py"
    holder_py.write_text(HOLDER)
    try_py.write_text(TRY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    unshare = ["unshare", "--pid", "--fork", "--kill-child", "--mount", "sh", "-c"]
    hidden = "mount -t tmpfs none /proc && "
    holder = subprocess.Popen(
        [*unshare, f"{hidden}{sys.executable} {holder_py} {db} {run_id}; exit $?"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout is not None
        owner = holder.stdout.readline().strip()
        # the other container's worker: a pid of its own, the same host name
        tried = subprocess.run(
            [*unshare, f"{hidden}true; true; {sys.executable} {try_py} {db} {run_id}"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert tried.stdout.strip() == "busy", (tried.stdout, tried.stderr[-2000:])
        assert "#?" in owner.partition(":")[0], owner  # a namespace no one else can match
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
