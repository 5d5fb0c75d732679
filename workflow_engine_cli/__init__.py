"""The ``workflow-engine`` command line (composition root)."""

from __future__ import annotations


def main() -> None:
    """The console script. ``runs list`` and ``requests list`` in their common forms print
    without loading the rest (``_quick``); everything else goes to the commands (``_app``).
    A Ctrl-C while the command line is still loading ends it quietly (exit 130), as a shell's
    command would; it printed a traceback from inside an import."""
    import os
    import sys

    try:
        from ._output import prepare_output
        from ._quick import quick_read

        prepare_output()

        code = quick_read(sys.argv[1:])
        if code is not None:
            raise SystemExit(code)
        if os.environ.get("NO_COLOR") and "TYPER_USE_RICH" not in os.environ:
            # typer's help through rich kept bold and dim under NO_COLOR; click's is plain
            # text, as every other output is then (outside tester 208)
            os.environ["TYPER_USE_RICH"] = "0"
        from ._app import main as run_command
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # (EXIT_QUIT: _exits is not loaded yet)
    run_command()


__all__ = ["main"]
