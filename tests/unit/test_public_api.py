"""The public surface is explicit, sorted and pinned; the kernel depends on nothing above it."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import workflow_engine

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_all_is_complete_and_has_no_duplicates() -> None:
    names = workflow_engine.__all__  # ordering is pinned by ruff's RUF022
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(workflow_engine, name), name
    public = {n for n in vars(workflow_engine) if not n.startswith("_")} | {"__version__"}
    modules = {n for n in public if isinstance(getattr(workflow_engine, n), type(ast))}
    assert public - modules == set(names)


@pytest.mark.parametrize("package", ["executors", "storage"])
def test_other_packages_export_exactly_their_all(package: str) -> None:
    module = importlib.import_module(package)
    names = module.__all__
    assert len(names) == len(set(names))
    for name in names:  # resolves the names a package imports on first use (PEP 562)
        assert getattr(module, name) is not None, name
    public = {
        n for n, v in vars(module).items() if not n.startswith("_") and not isinstance(v, type(ast))
    }
    assert public == set(names)


def test_kernel_imports_nothing_from_executors_or_storage() -> None:
    offenders = []
    for path in (ROOT / "workflow_engine").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module or ""]
            else:
                continue
            for mod in mods:
                if mod.split(".")[0] in {"executors", "storage", "workflow_engine_cli"}:
                    offenders.append(f"{path.name}: {mod}")
    assert offenders == []


def test_nothing_imports_pickle() -> None:
    for package in ("workflow_engine", "executors", "storage", "workflow_engine_cli"):
        for path in (ROOT / package).rglob("*.py"):
            text = path.read_text()
            assert "import pickle" not in text and "cloudpickle" not in text, path
