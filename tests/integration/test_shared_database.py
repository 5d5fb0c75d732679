"""A database two users share through its group (mode 0660): what one user's process leaves
beside it must not lock the other out.

SQLite makes a database's -wal and -shm files with the database's permissions but the group of
the user whose process made them. A member of the database's group who opened it (and was
killed, or is still running) left files the owner could not open when the owner was not in
that member's own group: every command, reads included, failed with "unable to open database
file" until someone removed them (outside tester 95). The store now gives them the database's
group.

The tests run as root, for whom every file is open; these run the command line as two real
users (``setpriv``) with the system's Python 3.11 and this checkout's packages.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = next(Path(sys.prefix).glob("lib/python3.*/site-packages"))
SYSTEM_PYTHON = Path("/usr/bin/python3.11")
CLI = (
    "import site, sys; site.addsitedir(sys.argv.pop(1)); "
    "sys.argv[0] = 'workflow-engine'; from workflow_engine_cli import main; main()"
)
pytestmark = pytest.mark.slow


def _user(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


OWNER, MEMBER = _user("cloudsdk"), _user("postgres")
GROUP = next((g for g in grp.getgrall() if MEMBER and MEMBER.pw_name in g.gr_mem), None)


def as_user(user: pwd.struct_passwd, *args: str, wait: bool = True, shared: bool = True) -> Any:
    """The command line as ``user`` (with the shared group among its groups, if ``shared``)."""
    assert GROUP is not None
    groups = sorted({user.pw_gid, GROUP.gr_gid} if shared else {user.pw_gid})
    argv = [
        "setpriv",
        f"--reuid={user.pw_uid}",
        f"--regid={user.pw_gid}",
        f"--groups={','.join(map(str, groups))}",
        "--reset-env",
        str(SYSTEM_PYTHON),
        "-c",
        CLI,
        str(SITE),
        *args,
    ]
    if not wait:
        return subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd="/"
        )
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")


def _usable() -> str | None:
    """Why these tests cannot run here (None: they can)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return "needs root and setpriv to act as two users"
    if OWNER is None or MEMBER is None or GROUP is None or not SYSTEM_PYTHON.exists():
        return "needs the users cloudsdk and postgres, a group of postgres's, and python3.11"
    probe = as_user(MEMBER, "--version")
    if probe.returncode != 0:
        return f"this checkout is not readable by another user: {probe.stderr[-300:]}"
    return None


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user may write (as /tmp is; pytest's own is root's alone)."""
    folder = Path(tempfile.mkdtemp(prefix="we-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_member_s_files_beside_a_group_database_leave_its_owner_able_to_use_it(
    shared: Path,
) -> None:
    why = _usable()
    if why is not None:
        pytest.skip(why)
    assert OWNER is not None and MEMBER is not None and GROUP is not None
    db = shared / "team.db"
    made = as_user(OWNER, "--db", str(db), "demo", "handoff", "--detach")
    assert made.returncode == 3, made.stdout + made.stderr
    os.chown(db, OWNER.pw_uid, GROUP.gr_gid)
    db.chmod(0o660)

    # the member serves it, and is killed: its -wal and -shm stay beside the file
    server = as_user(MEMBER, "--db", str(db), "serve", "--port", "0", wait=False)
    try:
        said = []
        assert server.stdout is not None
        for line in server.stdout:  # (until it listens, or stops)
            said.append(line)
            if "http://" in line:
                break
        for _ in range(200):  # (the store opens as the server starts up)
            if (shared / "team.db-shm").exists():
                break
            time.sleep(0.05)
        assert (shared / "team.db-shm").exists(), "".join(said)
    finally:
        server.send_signal(signal.SIGKILL)
        server.communicate(timeout=30)
    for side in ("team.db-wal", "team.db-shm"):
        info = (shared / side).stat()
        assert (info.st_uid, info.st_gid) == (MEMBER.pw_uid, GROUP.gr_gid), side

    # the owner, not in the member's own group, reads and writes it
    listed = as_user(OWNER, "--db", str(db), "runs", "list")
    assert listed.returncode == 0 and "support" in listed.stdout, listed.stderr
    again = as_user(OWNER, "--db", str(db), "demo", "handoff", "--detach")
    assert again.returncode == 3, again.stdout + again.stderr

    # an owner outside the group the files now have is told which file stops it, and whose
    # (SQLite's own "unable to open database file" said neither: outside tester 97)
    refused = as_user(OWNER, "--db", str(db), "demo", "handoff", "--detach", shared=False)
    assert refused.returncode == 6, refused.stdout + refused.stderr
    said = refused.stderr.strip()
    assert said.count("\n") == 0 and "Traceback" not in said, said
    assert f"{shared}/team.db-" in said and f"belongs to {MEMBER.pw_name}" in said, said
