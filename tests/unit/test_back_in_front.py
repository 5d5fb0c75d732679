"""A job sent to the background while agents work (Ctrl-Z, ``bg``) and brought back (``fg``)
gets no signal when it is back: the shell had turned echo on, and keys typed landed in the
agents' text (outside tester 211). ``BackInFront`` notices, turns echo off again and says the
shell wrote on the screen. Played in a child process whose controlling terminal is a new
pseudo-terminal, moving its foreground between process groups as a shell does."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import os, signal, subprocess, termios, threading, time
    from workflow_engine_cli import _console, _term

    master, slave = os.openpty()
    os.setsid()
    import fcntl
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # (moving the foreground, as a shell does)
    quiet = termios.tcgetattr(slave)
    quiet[3] &= ~termios.ECHO
    termios.tcsetattr(slave, termios.TCSANOW, quiet)
    done = threading.Event()
    front = _console.BackInFront(slave, quiet)
    watcher = threading.Thread(target=front.watch, args=(done,))
    watcher.start()
    other = subprocess.Popen(["sleep", "30"], process_group=0)  # ("bg": another job in front)
    os.tcsetpgrp(slave, other.pid)
    time.sleep(0.4)
    echoing = termios.tcgetattr(slave)
    echoing[3] |= termios.ECHO  # (the shell's settings, while it has the terminal)
    termios.tcsetattr(slave, termios.TCSANOW, echoing)
    seen = _term._CONTINUED[0]
    os.tcsetpgrp(slave, os.getpgrp())  # ("fg": no signal says so)
    time.sleep(0.5)
    echo = bool(termios.tcgetattr(slave)[3] & termios.ECHO)
    done.set()
    watcher.join()
    other.kill()
    print("echo", echo, "noted", _term._CONTINUED[0] - seen, "mid_line", _term._CONTINUED[1])
    """
)


def test_a_job_brought_back_without_a_signal_turns_echo_off_again() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["echo", "False", "noted", "1", "mid_line", "True"], done
