"""Which workflows the command line (and the AG-UI server) know, and how to open the runtime."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from storage import SqliteStore
from workflow_engine import Runtime, Workflow

DEMO_ALIASES = {"handoff": "support", "support": "support", "banking": "banking"}
DEMO_ALIASES |= {"transfer": "bank_transfer", "review": "review_loop"}


def workflow_factories(model: str | None = None) -> dict[str, Callable[[], Workflow]]:
    """Name → builder for every workflow this installation serves."""
    from examples.bank_transfer import build_request_port_workflow
    from examples.banking_assistant import build_workflow as build_banking
    from examples.review_loop import build_workflow as build_review
    from examples.support_handoff import build_support_workflow

    return {
        "support": lambda: build_support_workflow(model),
        "banking": build_banking,
        "bank_transfer": build_request_port_workflow,
        "review_loop": build_review,
    }


def open_runtime(db: Path | None, model: str | None = None) -> Runtime:
    runtime = Runtime(SqliteStore(db))
    for name, factory in workflow_factories(model).items():
        runtime.register(factory, name=name)
    return runtime


def apply_model_flags(model: str | None, base_url: str | None, api_key: str | None) -> None:
    """Flags win over the environment; the OpenAI client reads the environment."""
    if base_url:
        os.environ["OPENAI_BASE_URL"] = base_url
    if api_key:
        os.environ["OPENAI_API_KEY"] = api_key
    if model:
        os.environ["OPENAI_MODEL"] = model
