"""The ``workflow-engine`` command line (composition root)."""

from ._app import main

__all__ = ["main"]
