"""Which workflows the command line (and the AG-UI server) know, how to open the runtime, and
which model a run's agents talk to.

Workflows are imported and built only when a command needs one: listing runs needs none, and
building a graph costs a large share of a command's start-up time.

A run remembers its model. When the command line starts a run of a workflow whose agents talk
to a model, the run's first checkpoint records how that model was configured (provider, model
name, endpoint, and the *name* of the environment variable holding the key -- never the key)
under :data:`MODEL_STATE_KEY` in its shared state, so every process that resumes it sees the
same record. ``resume`` continues on that model or refuses with one line saying why; only
``--model``/``--base-url``/``--offline`` given to ``resume`` itself choose another. Which model
answers never changes the graph, so the run's signature holds either way.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._term import visible

if TYPE_CHECKING:
    from workflow_engine import Checkpoint, Runtime, Workflow
    from workflow_engine.executors import ChatClient

DEMO_ALIASES = {"handoff": "support", "support": "support", "banking": "banking"}
DEMO_ALIASES |= {"transfer": "bank_transfer", "review": "review_loop"}

# name → (module, function building the workflow, whether its agents take a model)
_BUILDERS = {
    "support": ("workflow_engine_cli.demos.support_handoff", "build_support_workflow", True),
    "banking": ("workflow_engine_cli.demos.banking_assistant", "build_workflow", False),
    # (serve's /banking: the agent as served, so the command line continues its runs)
    "banking_assistant": (
        "workflow_engine_cli.demos.banking_assistant",
        "build_served_workflow",
        False,
    ),
    "bank_transfer": (
        "workflow_engine_cli.demos.bank_transfer",
        "build_request_port_workflow",
        False,
    ),
    "review_loop": ("workflow_engine_cli.demos.review_loop", "build_workflow", False),
}

MODEL_STATE_KEY = "workflow_engine_cli.model"
"""Shared-state key of a run's model record (see :class:`ModelConfig`)."""
KEY_ENV = "OPENAI_API_KEY"
DEFAULT_BASE_URL = "https://api.openai.com/v1"  # the openai package's own default
_RECORD_FIELDS = ("provider", "model", "base_url", "api_key_env")
_URL_ENV = "OPENAI_BASE_URL"


class ModelConfigError(Exception):
    """The model a run needs cannot be had as asked (the command line exits 2)."""


@dataclass(frozen=True)
class ModelConfig:
    """How a run's agents reach their model -- what a run records, so nothing secret: a key is
    named by the environment variable that holds it (``api_key_env``; None: no key)."""

    provider: str = "scripted"  # "scripted" (offline rules) or "openai" (any compatible endpoint)
    model: str | None = None
    base_url: str | None = None
    """The endpoint without a user, password, query string or fragment written into it."""
    api_key_env: str | None = None
    base_url_env: str | None = None
    """Where a later command finds the endpoint whole when ``base_url`` left parts of it out
    (a password in the URL was stored with the run, and said in every error: outside tester
    200): ``OPENAI_BASE_URL``, or ``--base-url`` given again. None: ``base_url`` is whole."""

    def record(self) -> dict[str, str | None]:
        fields = (*_RECORD_FIELDS, "base_url_env") if self.base_url_env else _RECORD_FIELDS
        return {name: getattr(self, name) for name in fields}

    @classmethod
    def from_record(cls, value: Any) -> ModelConfig | None:
        """The config ``value`` records, or None when it is not a well-formed record."""
        known = (set(_RECORD_FIELDS), {*_RECORD_FIELDS, "base_url_env"})
        if not isinstance(value, dict) or set(value) not in known:
            return None
        if not all(v is None or isinstance(v, str) for v in value.values()):
            return None
        config = cls(**value)
        if config.provider == "scripted":
            return config if config == SCRIPTED else None
        if config.provider == "openai" and config.model and config.base_url:
            return config
        return None

    def describe(self) -> str:
        if self.provider == "scripted":
            return "the offline scripted model"
        # a run records only that it needs a key (never the key, nor where it was typed): a
        # later command takes it from --api-key or from this variable
        key = f"a key: --api-key or ${self.api_key_env}" if self.api_key_env else "no key"
        if self.base_url_env:
            key += f"; the URL's credentials: --base-url or ${self.base_url_env}"
        return f"model {self.model} at {self.base_url} ({key})"

    @classmethod
    def of_endpoint(cls, model: str, endpoint: str, key: str | None) -> ModelConfig:
        """The record of a real model at ``endpoint`` (whole: with any credentials in it)."""
        public = public_url(endpoint)
        hidden = _URL_ENV if public != endpoint else None
        return cls("openai", model, public, KEY_ENV if key else None, hidden)


def public_url(url: str) -> str:
    """``url`` without its user and password (and any query string or fragment: only in one
    ``_check_endpoint`` refuses, which must not show them either)."""
    from workflow_engine._redaction import without_credentials

    return without_credentials(url)


SCRIPTED = ModelConfig()


@dataclass(frozen=True)
class ModelFlags:
    """What the user said on the command line (``--model``, ``--base-url``, ``--api-key``,
    ``--offline``)."""

    model: str | None = None
    base_url: str | None = None
    api_key: str | None = None
    offline: bool = False

    def check(self) -> None:
        if self.offline and (self.model or self.base_url):
            raise ModelConfigError("--offline cannot be combined with --model or --base-url")


@dataclass(frozen=True)
class ChatModel:
    """A model configuration and the key to use with it this time (the key is never stored)."""

    config: ModelConfig = SCRIPTED
    api_key: str | None = field(default=None, repr=False)
    endpoint: str | None = field(default=None, repr=False)
    """The endpoint whole, when the record leaves parts of it out (never stored)."""

    def __post_init__(self) -> None:
        import importlib.util

        if self.endpoint == self.config.base_url:  # (whole in the record: nothing apart)
            object.__setattr__(self, "endpoint", None)
        if self.config.provider != "scripted":
            _check_endpoint(self.endpoint or self.config.base_url)
        if self.config.provider != "scripted" and importlib.util.find_spec("openai") is None:
            raise ModelConfigError(
                f"model {self.config.model!r} needs the openai extra (the 'openai' package is "
                "not installed): pip install 'workflow-engine[openai]', or use --offline"
            )

    def client(self) -> ChatClient | None:
        """A chat client for every agent, or None: each agent keeps its scripted rules."""
        if self.config.provider == "scripted":
            return None
        from workflow_engine.executors import OpenAIChatClient

        # everything explicit: the client must not fill a gap from the environment
        return OpenAIChatClient(
            self.config.model,
            api_key=self.api_key or "not-needed",
            base_url=self.endpoint or self.config.base_url,
        )


def _shown_endpoint(url: str) -> str:
    """An endpoint that is no address, as a refusal says it: without anything before its last
    ``@`` either, where no URL's user and password could be told apart (``http:/bob:pw@h``,
    ``http:///bob:pw@h``: outside tester 205)."""
    shown = public_url(url)
    if "@" not in shown:
        return shown
    head, colon, _ = shown.partition(":")
    scheme = head + colon if colon else ""
    return f"{scheme}…@{shown.rpartition('@')[2]}"


def _check_endpoint(url: str | None) -> None:
    """An endpoint a client can reach: ``http://[::1`` was an internal error (exit 1), and
    ``notaurl`` or ``http://x:99999`` a run stored as failed (outside tester 167)."""
    from urllib.parse import urlsplit

    why = ""
    try:
        parts = urlsplit(url or "")
        parts.port  # noqa: B018 (it raises for a port that is not one)
    except ValueError as exc:
        # (urllib quotes what it could not read as a port: with a password holding an
        # unencoded "#", "?" or "/", that is the password -- printed: outside tester 204)
        why = re.sub(r" as '.*'", "", str(exc))
        if "could not be cast" in why:
            why += " (a password holding '#', '?' or '/' is written percent-encoded)"
    else:
        if parts.scheme not in ("http", "https"):
            why = "it does not start with http:// or https://"
        elif not parts.hostname:
            why = "it names no host"
        elif parts.query or parts.fragment or url.endswith(("?", "#")):
            # (the client adds its paths to the endpoint: .../v1?api-version=x/chat/completions,
            # a run stored that failed at its first call -- outside tester 203)
            why = "it holds a query string or fragment, which the client's paths would follow"
        elif any(c.isspace() for c in parts.netloc) or ".." in parts.hostname:
            # (a run was stored, and failed at its first call: outside tester 205)
            why = "its host is not a name: it holds a space or an empty label"
        elif parts.port == 0:
            why = "port 0 is no port a server listens on"
    if why:
        raise ModelConfigError(
            f"the model endpoint {visible(_shown_endpoint(url or ''))} (--base-url or "
            f"OPENAI_BASE_URL) is not an address: {why}; e.g. http://localhost:8000/v1"
        )


def model_for_start(flags: ModelFlags, env: Mapping[str, str]) -> ChatModel:
    """The model a new run gets: flags win over ``OPENAI_*`` variables; a model name, an
    endpoint or a key means a real model, nothing (or ``--offline``) the scripted one."""
    from workflow_engine.executors._openai import DEFAULT_MODEL

    flags.check()
    base_url = flags.base_url or env.get("OPENAI_BASE_URL")
    key = flags.api_key or env.get(KEY_ENV) or None
    if flags.offline or not (flags.model or base_url or key):
        return ChatModel()
    model = flags.model or env.get("OPENAI_MODEL") or DEFAULT_MODEL
    endpoint = base_url or DEFAULT_BASE_URL
    return ChatModel(ModelConfig.of_endpoint(model, endpoint, key), key, endpoint)


def model_for_resume(
    run_id: str, recorded: ModelConfig | None, flags: ModelFlags, env: Mapping[str, str]
) -> tuple[ChatModel, str | None]:
    """The model to continue run ``run_id`` on, and a note to show when it is not simply the
    recorded one. Raises :class:`ModelConfigError` when the recorded model cannot be had.

    The ``OPENAI_*`` variables describe the model for *new* runs: they never switch a run that
    recorded its own (an endpoint they name that differs from the record is refused, since the
    key they hold is likely for that endpoint). The flags choose explicitly; fields they leave
    out come from the record."""
    from workflow_engine.executors._openai import DEFAULT_MODEL

    if recorded is None:
        chosen = model_for_start(flags, env)
        return chosen, (
            f"run {visible(run_id)} does not record its model (started elsewhere or by an older "
            "version); "
            f"continuing on {chosen.config.describe()}"
        )
    flags.check()
    started = f"run {visible(run_id)} was started with {recorded.describe()}"
    if flags.offline:
        note = None if recorded == SCRIPTED else f"{started}; continuing on the scripted model"
        return ChatModel(), note
    if flags.model or flags.base_url:
        real = recorded if recorded.provider == "openai" else None
        model = flags.model or (real.model if real else env.get("OPENAI_MODEL") or DEFAULT_MODEL)
        endpoint = flags.base_url or (
            _recorded_endpoint(real, env, started)
            if real
            else env.get(_URL_ENV) or DEFAULT_BASE_URL
        )
        key = flags.api_key or env.get(KEY_ENV) or None
        config = ModelConfig.of_endpoint(model, endpoint, key)
        note = None if config == recorded else f"{started}; continuing on {config.describe()}"
        return ChatModel(config, key, endpoint), note
    if recorded.provider == "scripted":
        return ChatModel(), None
    env_url = env.get(_URL_ENV)
    if env_url and public_url(env_url).rstrip("/") != (recorded.base_url or "").rstrip("/"):
        raise ModelConfigError(
            f"{started}, but OPENAI_BASE_URL is {visible(public_url(env_url))}; resume with "
            "--base-url (and --model) to choose the endpoint, or with --offline for the "
            "scripted model"
        )
    endpoint = _recorded_endpoint(recorded, env, started)
    key = flags.api_key
    if recorded.api_key_env and not key:
        key = env.get(recorded.api_key_env) or None
        if not key:
            raise ModelConfigError(
                f"{started}, but ${recorded.api_key_env} is not set; set it or pass --api-key, "
                "or resume with --model/--base-url (another model) or --offline (the scripted one)"
            )
    return ChatModel(recorded, key, endpoint), None


def _recorded_endpoint(recorded: ModelConfig, env: Mapping[str, str], started: str) -> str:
    """The endpoint a run recorded, whole: from ``$OPENAI_BASE_URL`` when the record left
    its credentials out (it must be that endpoint)."""
    base_url = recorded.base_url or DEFAULT_BASE_URL
    if not recorded.base_url_env:
        return base_url
    whole = env.get(recorded.base_url_env)
    if whole:
        public = public_url(whole)
        same = public.rstrip("/") == base_url.rstrip("/")
        if same and whole != public:
            return whole
        # (the endpoint without its credentials was taken, and the run went on without them:
        # outside tester 203)
        said = "names that endpoint without them" if same else "names another endpoint"
    else:
        said = "is not set"
    raise ModelConfigError(
        f"{started}, but its URL's credentials are not stored with it, and "
        f"${recorded.base_url_env} {said}; set it to the endpoint with them, or pass --base-url"
    )


def recorded_model(run_id: str, checkpoint: Checkpoint | None) -> ModelConfig | None:
    """The model run ``run_id`` recorded (None: it recorded none)."""
    from workflow_engine import StoreCorruptError

    if checkpoint is None or MODEL_STATE_KEY not in checkpoint.shared_state:
        return None
    config = ModelConfig.from_record(checkpoint.shared_state[MODEL_STATE_KEY])
    if config is None:
        raise StoreCorruptError(
            f"run {run_id!r}: checkpoint {checkpoint.checkpoint_id} holds a malformed "
            f"{MODEL_STATE_KEY!r} record"
        )
    return config


def takes_model(name: str) -> bool:
    """Whether workflow ``name``'s agents talk to a configurable model."""
    return name in _BUILDERS and _BUILDERS[name][2]


async def start_run(runtime: Runtime, name: str, message: Any, model: ChatModel) -> str:
    """Admit a run of ``name`` durably (nothing executes yet), recording its model."""
    workflow = runtime.workflow(name)
    shared = {MODEL_STATE_KEY: model.config.record()} if takes_model(name) else None
    checkpoint = workflow.admit(message, shared_state=shared)
    await runtime.store.admit(checkpoint)
    return checkpoint.run_id


def workflow_names() -> list[str]:
    return sorted(_BUILDERS)


def workflow_factory(name: str, model: ChatModel | None = None) -> Callable[[], Workflow]:
    """A function building workflow ``name`` (its module is imported when it is called), its
    agents on ``model`` (default: the scripted one -- enough for any command that runs no
    agent, and it never reads the environment)."""
    module_name, attr, configurable = _BUILDERS[name]

    def build() -> Workflow:
        builder = getattr(importlib.import_module(module_name), attr)
        if not configurable:
            return builder()
        client = (model or ChatModel()).client()
        return builder(offline=True) if client is None else builder(client=client)

    return build


def workflow_factories(model: ChatModel | None = None) -> dict[str, Callable[[], Workflow]]:
    """Name → builder for every workflow this installation serves."""
    return {name: workflow_factory(name, model) for name in _BUILDERS}


def open_runtime(
    db: Path | None,
    model: ChatModel | None = None,
    workflows: Iterable[str] | None = None,
    *,
    read_only: bool = False,
) -> Runtime:
    """A runtime over the SQLite file ``db`` with ``workflows`` registered (default: all);
    ``read_only``: for a command that only reads (the file left as it was)."""
    from workflow_engine import Runtime
    from workflow_engine.storage import SqliteStore

    runtime = Runtime(SqliteStore(db, read_only=read_only))
    register(runtime, _BUILDERS if workflows is None else workflows, model)
    return runtime


def register(runtime: Runtime, names: Iterable[str], model: ChatModel | None = None) -> None:
    """Register the named workflows this installation knows (others are left out: using them
    reports ``WorkflowNotRegisteredError``); already registered ones are kept."""
    for name in names:
        if name in _BUILDERS and name not in runtime.workflow_names:
            runtime.register(workflow_factory(name, model), name=name)
