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


@pytest.mark.parametrize(
    "package", ["workflow_engine.executors", "workflow_engine.storage", "workflow_engine_agui"]
)
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


LAZY_PACKAGES = ("workflow_engine", "workflow_engine.executors", "workflow_engine.storage")


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_lazy_names_match_what_type_checkers_see(package: str) -> None:
    """Each package imports its public names on first use from the submodule ``_EXPORTS`` names;
    the ``if TYPE_CHECKING:`` imports (what mypy and IDEs see) must say the same."""
    module = importlib.import_module(package)
    source = ast.parse(pathlib.Path(str(module.__file__)).read_text())
    seen: dict[str, str] = {}
    for node in ast.walk(source):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            seen.update((alias.asname or alias.name, node.module) for alias in node.names)
    lazy = {name: sub for sub, names in module._EXPORTS.items() for name in names}
    assert lazy == seen
    assert set(lazy) == set(module.__all__) - {"__version__"}
    assert set(module.__all__) <= set(dir(module))
    with pytest.raises(AttributeError, match="no attribute 'Missing'"):
        _ = module.Missing


FOLDERS = ("workflow_engine", "executors", "storage", "workflow_engine_cli", "workflow_engine_agui")
ABOVE_THE_KERNEL = ("workflow_engine.executors", "workflow_engine.storage", "workflow_engine_cli")


def imported_modules(path: pathlib.Path) -> list[str]:
    """Absolute module names ``path`` imports (relative imports resolved against its folder)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names.append(("." * node.level) + (node.module or ""))
    return names


def source_files(folder: str) -> list[pathlib.Path]:
    """The folder's own modules; ``workflow_engine/executors`` and ``workflow_engine/storage``
    are links to the top-level folders, which are checked on their own."""
    top = ROOT / folder
    return [p for p in top.rglob("*.py") if p.relative_to(top).parts[0] not in LINKS]


LINKS = ("executors", "storage")


def test_kernel_imports_nothing_from_executors_or_storage() -> None:
    offenders = []
    for path in source_files("workflow_engine"):
        for mod in imported_modules(path):
            above = mod.startswith(ABOVE_THE_KERNEL) or mod.startswith("workflow_engine_agui")
            if above or (mod.lstrip(".").split(".")[0] in LINKS and mod.startswith(".")):
                offenders.append(f"{path.name}: {mod}")
    assert offenders == []


@pytest.mark.slow  # (about 2 s of the fast tier's minute; `make test` runs it)
def test_packages_install_under_the_project_name_only() -> None:
    """``executors``/``storage`` are ``workflow_engine.executors``/``workflow_engine.storage``:
    nothing imports them (or the examples) under a generic top-level name."""
    for link in LINKS:
        assert (ROOT / "workflow_engine" / link).resolve() == ROOT / link
    offenders = [
        f"{path.relative_to(ROOT)}: {mod}"
        for folder in (*FOLDERS, "tests", "benchmarks")
        for path in source_files(folder)
        for mod in imported_modules(path)
        if mod.split(".")[0] in {"executors", "storage", "examples"}
    ]
    assert offenders == []


def test_nothing_imports_pickle() -> None:
    for package in FOLDERS:
        for path in source_files(package):
            text = path.read_text()
            assert "import pickle" not in text and "cloudpickle" not in text, path
