"""The AG-UI server: the support demo at ``/support`` and the banking assistant at ``/banking``.

Binds 127.0.0.1 by default. A bearer token is optional on loopback and required on any other
address; CORS is off unless origins are configured; request bodies are capped. Whatever the
token, a state-changing request from a browser page whose origin is not allowed is refused, and
without a token only loopback host names are answered (see ``_http``: the threat model).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

# First: without the server extra this names the extra to install (fastapi would not).
import workflow_engine_agui  # noqa: F401

# isort: split
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse

from workflow_engine.storage import SqliteStore
from workflow_engine_agui import add_agui_endpoint
from workflow_engine_agui._http import BrowserGuard, is_loopback, unmapped

__all__ = ["authorization", "create_app", "is_loopback", "token_problem", "unmapped"]


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a bearer token (None: it can). Clients send it in an HTTP
    header, so it must be printable ASCII -- no spaces around it (a header loses them) and no
    control characters -- and it must not be empty."""
    if not token.strip():
        return "is empty or only whitespace"
    if not token.isascii():
        return "has a character that is not ASCII (an HTTP header carries ASCII only)"
    if not token.isprintable():
        return "has a control character"
    if token != token.strip():
        return "starts or ends with whitespace"
    return None


def authorization(request: Request) -> bytes:
    """The request's ``Authorization`` header as the bytes that came (b"" if none; any bytes
    at all, so that a comparison never fails on text it cannot encode). Several such headers
    are no credential."""
    found = [value for name, value in request.scope["headers"] if name.lower() == b"authorization"]
    return found[0] if len(found) == 1 else b""


def bearer_token(request: Request) -> bytes:
    """The credential of an ``Authorization: Bearer <token>`` header (b"" if there is none).
    The scheme's name is matched in any case (RFC 7235): ``bearer`` and ``BEARER`` work."""
    scheme, _, credential = authorization(request).partition(b" ")
    # (RFC 9110: one or more spaces after the scheme -- two were refused, outside tester 179)
    return credential.lstrip(b" ") if scheme.lower() == b"bearer" else b""


def create_app(
    db: Path | None = None,
    *,
    token: str | None = None,
    cors_origins: list[str] | None = None,
    max_body_bytes: int = 1_000_000,
) -> FastAPI:
    """The FastAPI app with both demo endpoints over one durable store."""
    from workflow_engine_cli.demos.banking_assistant import banking_agent

    from ._registry import MODEL_STATE_KEY, ModelFlags, model_for_start, workflow_factory

    store = SqliteStore(db)
    # the model comes from the environment once, at start; each run records it, so a resume
    # from the command line continues on the same model (or refuses)
    model = model_for_start(ModelFlags(), os.environ)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await store.open()  # a database that cannot be used fails the start-up, not each request
        try:
            yield
        finally:
            await store.close()

    app = FastAPI(title="workflow-engine AG-UI", docs_url=None, redoc_url=None, lifespan=lifespan)

    if token:
        problem = token_problem(token)
        if problem is not None:
            raise ValueError(f"the token {problem}")
        expected = token.encode("ascii")

        @app.middleware("http")
        async def require_token(request: Request, call_next):  # type: ignore[no-untyped-def]
            guarded = request.method != "OPTIONS" and request.url.path != "/health"
            if guarded and not secrets.compare_digest(bearer_token(request), expected):
                said = "this server needs its token: Authorization: Bearer <token>"
                # (RFC 9110: a 401 names the scheme it wants)
                return JSONResponse(
                    {"error": "unauthorized", "message": said},
                    status_code=401,
                    headers={"WWW-Authenticate": 'Bearer realm="workflow-engine"'},
                )
            return await call_next(request)

    # added after the token check, so it wraps it: a 401 still carries CORS headers
    if cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=cors_origins,
            allow_methods=["POST", "GET", "OPTIONS"],
            allow_headers=["*"],
        )
    # added last, so it runs first: a page of another site is refused whatever it sends
    app.add_middleware(
        BrowserGuard, allowed_origins=cors_origins or (), loopback_hosts_only=not token
    )

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    support = add_agui_endpoint(
        app,
        workflow_factory("support", model)(),
        "/support",
        store=store,
        max_body_bytes=max_body_bytes,
        run_state={MODEL_STATE_KEY: model.config.record()},
    )
    banking = add_agui_endpoint(
        app, banking_agent(), "/banking", store=store, max_body_bytes=max_body_bytes
    )
    app.state.agui_services = [support, banking]  # (what a forced stop interrupts)
    return app
