"""Which workflows the command line (and the AG-UI server) know, and how to open the runtime.

Workflows are imported and built only when a command needs one: listing runs needs none, and
building a graph costs a large share of a command's start-up time.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workflow_engine import Runtime, Workflow

DEMO_ALIASES = {"handoff": "support", "support": "support", "banking": "banking"}
DEMO_ALIASES |= {"transfer": "bank_transfer", "review": "review_loop"}

# name → (module, function building the workflow); the support demo also takes the model
_BUILDERS = {
    "support": ("examples.support_handoff", "build_support_workflow"),
    "banking": ("examples.banking_assistant", "build_workflow"),
    "bank_transfer": ("examples.bank_transfer", "build_request_port_workflow"),
    "review_loop": ("examples.review_loop", "build_workflow"),
}


def workflow_names() -> list[str]:
    return sorted(_BUILDERS)


def workflow_factory(name: str, model: str | None = None) -> Callable[[], Workflow]:
    """A function building workflow ``name`` (its module is imported when it is called)."""
    module_name, attr = _BUILDERS[name]

    def build() -> Workflow:
        builder = getattr(importlib.import_module(module_name), attr)
        return builder(model) if name == "support" else builder()

    return build


def workflow_factories(model: str | None = None) -> dict[str, Callable[[], Workflow]]:
    """Name → builder for every workflow this installation serves."""
    return {name: workflow_factory(name, model) for name in _BUILDERS}


def open_runtime(
    db: Path | None, model: str | None = None, workflows: Iterable[str] | None = None
) -> Runtime:
    """A runtime over the SQLite file ``db`` with ``workflows`` registered (default: all)."""
    from storage import SqliteStore
    from workflow_engine import Runtime

    runtime = Runtime(SqliteStore(db))
    register(runtime, _BUILDERS if workflows is None else workflows, model)
    return runtime


def register(runtime: Runtime, names: Iterable[str], model: str | None = None) -> None:
    """Register the named workflows this installation knows (others are left out: using them
    reports ``WorkflowNotRegisteredError``); already registered ones are kept."""
    for name in names:
        if name in _BUILDERS and name not in runtime.workflow_names:
            runtime.register(workflow_factory(name, model), name=name)


def apply_model_flags(model: str | None, base_url: str | None, api_key: str | None) -> None:
    """Flags win over the environment; the OpenAI client reads the environment."""
    if base_url:
        os.environ["OPENAI_BASE_URL"] = base_url
    if api_key:
        os.environ["OPENAI_API_KEY"] = api_key
    if model:
        os.environ["OPENAI_MODEL"] = model
