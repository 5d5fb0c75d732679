"""Serve workflows and agents to AG-UI clients, mounted in your own FastAPI app.

``add_agui_endpoint(app, workflow_or_agent, "/path", store=...)`` adds one endpoint; see
``_endpoint`` for the protocol and ``_http`` for the wire form and the browser guard. Needs the
``server`` extra (FastAPI, ``ag-ui-protocol``): ``pip install 'workflow-engine[server]'``.
"""

try:
    import ag_ui.core  # noqa: F401
    import fastapi  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised by the fresh-venv wheel test
    raise ImportError(
        f"workflow_engine_agui needs the server extra ({exc.name} is not installed): "
        "pip install 'workflow-engine[server]'"
    ) from exc

from ._endpoint import AGUIError, AGUIService, AGUIWorkflow, add_agui_endpoint
from ._http import BrowserGuard

__all__ = ["AGUIError", "AGUIService", "AGUIWorkflow", "BrowserGuard", "add_agui_endpoint"]
