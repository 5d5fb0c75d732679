"""Every Python block in the README runs as written.

Each ```python block is a whole program: it is compiled at its own line numbers in README.md (so
a traceback points into the README), run as a module of its own in a fresh working directory,
offline (no ``OPENAI_*`` variables; a connection attempt fails), and a failure names the
block's line. A block may end with ``anyio.run(main)`` or use top-level ``await``.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import socket
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from workflow_engine import MessageNotHandledError
from workflow_engine_cli.demos.review_loop import ReviewDecision, build_workflow

README = Path(__file__).resolve().parents[2] / "README.md"


@dataclass(frozen=True)
class Block:
    line: int  # of the opening ```python fence, counted from 1
    code: str


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of ``text``, in order."""
    blocks: list[Block] = []
    opened: int | None = None
    body: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if opened is None:
            if line.strip() == "```python":
                opened, body = number, []
        elif line.strip() == "```":
            blocks.append(Block(opened, "\n".join(body) + "\n"))
            opened = None
        else:
            body.append(line)
    assert opened is None, f"README.md:{opened}: a ```python block is never closed"
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def _offline(*args: object) -> None:
    raise OSError("a README block must run offline: it tried to connect somewhere")


def run_block(block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("OPENAI_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("WORKFLOW_ENGINE_DB", str(tmp_path / "default.db"))
    monkeypatch.setattr(socket.socket, "connect", _offline)
    monkeypatch.setattr(socket.socket, "connect_ex", _offline)
    module = types.ModuleType(f"readme_line_{block.line}")
    module.__file__ = str(README)
    # classes defined by the block resolve their annotations through sys.modules
    monkeypatch.setitem(sys.modules, module.__name__, module)
    source = "\n" * block.line + block.code  # its first line is the line after the fence
    try:
        code = compile(
            source, str(README), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
        )
        result = eval(code, module.__dict__)  # with top-level await: a coroutine to run
        if inspect.iscoroutine(result):
            asyncio.run(result)
    except Exception as exc:
        raise AssertionError(
            f"README.md:{block.line}: the Python block there does not run as written: "
            f"{type(exc).__name__}: {exc}"
        ) from exc


def test_the_readme_has_its_python_blocks() -> None:
    assert len(BLOCKS) >= 5, [b.line for b in BLOCKS]


@pytest.mark.parametrize("block", BLOCKS, ids=[f"line-{b.line}" for b in BLOCKS])
def test_the_block_runs_as_written(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_block(block, tmp_path, monkeypatch)


def test_the_readme_review_cannot_be_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (first,) = [b for b in BLOCKS if "ReviewDecision(approved=True)" in b.code]
    run_block(first, tmp_path, monkeypatch)
    assert "the start executor 'writer' cannot take" in capsys.readouterr().out


@pytest.mark.anyio
@pytest.mark.parametrize("start", [True, ReviewDecision(approved=True), {"approved": True}])
async def test_the_review_loop_cannot_be_skipped(start: object) -> None:
    with pytest.raises(MessageNotHandledError, match="start executor 'writer' cannot take"):
        await build_workflow().run(start)


def test_python_blocks_are_found_with_their_lines() -> None:
    text = "intro\n```python\nx = 1\n```\n```bash\nls\n```\n```python\ny = 2\nz = 3\n```\n"
    assert python_blocks(text) == [Block(2, "x = 1\n"), Block(8, "y = 2\nz = 3\n")]
