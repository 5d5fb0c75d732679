"""The wheel as a user installs it: no extras, a fresh venv, outside the repository.

Every module of the distribution imports, except the ones that need an extra, which say which
one to install; nothing lands under a generic top-level name (``executors``, ``storage``,
``examples``); the console script runs.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

# Modules that need an extra, and the extra their error must name.
NEEDS_EXTRA = {
    "workflow_engine_agui": "workflow-engine[server]",
    "workflow_engine_cli._server": "workflow-engine[server]",
}

PROBE = r"""
import importlib, json, pkgutil, sys

report = {"imported": [], "refused": {}, "generic": {}}
for top in ("workflow_engine", "workflow_engine_cli", "workflow_engine_agui"):
    names = [top]
    try:
        package = importlib.import_module(top)
        names += [m.name for m in pkgutil.walk_packages(package.__path__, top + ".")]
    except ImportError:
        pass
    for name in names:
        try:
            importlib.import_module(name)
            report["imported"].append(name)
        except ImportError as exc:
            report["refused"][name] = str(exc)
for name in ("executors", "storage", "examples"):
    try:
        module = importlib.import_module(name)
        report["generic"][name] = getattr(module, "__file__", None)
    except ImportError:
        pass
try:
    from workflow_engine.executors import OpenAIChatClient
    OpenAIChatClient()
    report["openai"] = "constructed"
except ImportError as exc:
    report["openai"] = str(exc)
json.dump(report, sys.stdout)
"""


def _run(argv: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed from PyPI dependencies, without extras."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    # Build from a copy of what git tracks, so the build leaves nothing in the checkout.
    tracked = _run(["git", "ls-files", "-z"], ROOT).stdout.split("\0")
    for name in filter(None, tracked):
        src, dst = ROOT / name, source / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            dst.symlink_to(os.readlink(src))
        elif src.exists():
            shutil.copy2(src, dst)
    wheels = work / "dist"
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(source)],
        work,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    [wheel] = wheels.glob("workflow_engine-*.whl")
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    done = _run([str(python), "-m", "pip", "install", "-q", str(wheel)], work, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    return env_dir


def test_every_module_imports_or_names_its_extra(installed: Path, tmp_path: Path) -> None:
    probe = _run([str(installed / "bin" / "python"), "-c", PROBE], tmp_path)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    report = json.loads(probe.stdout)
    assert report["generic"] == {}, "the wheel installed a generic top-level package"
    refused = report["refused"]
    assert set(refused) <= set(NEEDS_EXTRA), refused
    for name, extra in NEEDS_EXTRA.items():
        assert extra in refused.get(name, extra), (name, refused.get(name))
    assert "workflow_engine_agui" in refused  # fastapi is not there without the extra
    imported = set(report["imported"])
    for name in (
        "workflow_engine",
        "workflow_engine.executors",
        "workflow_engine.storage",
        "workflow_engine.storage._sql",
        "workflow_engine_cli",
        "workflow_engine_cli.demos.support_handoff",
    ):
        assert name in imported, name
    assert "workflow-engine[openai]" in report["openai"]


def test_console_script_runs_without_extras(installed: Path, tmp_path: Path) -> None:
    cli = str(installed / "bin" / "workflow-engine")
    version = _run([cli, "--version"], tmp_path)
    assert version.returncode == 0 and "0.1.0" in version.stdout, version.stderr
    db = str(tmp_path / "runs.db")
    demo = _run([cli, "demo", "handoff", "--approve", "--end", "--db", db], tmp_path)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    listed = _run([cli, "runs", "list", "--db", db, "--json"], tmp_path)
    assert listed.returncode == 0 and json.loads(listed.stdout), listed.stderr
    serve = _run([cli, "serve", "--db", db], tmp_path)
    assert serve.returncode == 2, serve.stdout + serve.stderr
    assert "pip install 'workflow-engine[server]'" in serve.stderr
    assert "Traceback" not in serve.stderr
    model = _run([cli, "demo", "handoff", "--model", "gpt-4o", "--db", db], tmp_path)
    assert model.returncode == 2, model.stdout + model.stderr
    assert "pip install 'workflow-engine[openai]'" in model.stderr
    assert "Traceback" not in model.stderr and "internal error" not in model.stderr
