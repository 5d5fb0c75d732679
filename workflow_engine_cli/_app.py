"""workflow-engine: run the demos, inspect runs, answer requests, resume after restarts.

Exit codes (also in ``--help`` and the README):

    0  done (the run finished, or the command succeeded)
    1  the run failed
    2  bad usage or invalid input (malformed JSON, an answer of the wrong type)
    3  paused: the run waits for input (answer with ``respond``, continue with ``resume``)
    4  not found: unknown run, request or workflow
    5  conflict: already answered differently, cancelled, finished, or run by another worker
    6  storage problem: the database is unusable, damaged or locked (or a record is corrupt)

Errors are one line on stderr. Arguments that are not UTF-8 text, and JSON that is malformed,
too large or too deeply nested, are refused before anything runs (exit 2).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar

import anyio
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from storage import default_db_path
from workflow_engine import (
    CheckpointNotFoundError,
    GraphValidationError,
    RequestAlreadyAnsweredError,
    RequestCancelledError,
    ResponseTypeError,
    RunBusyError,
    RunNotFoundError,
    RunNotResumableError,
    Runtime,
    SerializationError,
    SignatureMismatchError,
    StorageError,
    UnknownRequestError,
    WorkflowError,
    WorkflowNotRegisteredError,
    WorkflowRunState,
)

from ._console import AnswerPolicy, EventPrinter, describe_output, stdin_is_tty
from ._input import InputError, check_text, parse_json
from ._registry import DEMO_ALIASES, apply_model_flags, open_runtime, workflow_factories

EXIT_DONE, EXIT_FAILED, EXIT_USAGE, EXIT_PAUSED = 0, 1, 2, 3
EXIT_NOT_FOUND, EXIT_CONFLICT, EXIT_STORAGE = 4, 5, 6

HELP = __doc__ or ""
app = typer.Typer(
    help=HELP.split("\n\n")[0],
    epilog="Exit codes: 0 done · 1 run failed · 2 bad input · 3 paused (waiting for input) · "
    "4 not found · 5 conflict · 6 storage problem",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
runs_app = typer.Typer(help="List and inspect runs.", no_args_is_help=True)
requests_app = typer.Typer(help="The inbox of pending requests.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
app.add_typer(requests_app, name="requests")

DbOption = Annotated[
    Path | None,
    typer.Option("--db", envvar="WORKFLOW_ENGINE_DB", help="SQLite file holding the runs."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]

T = TypeVar("T")


class Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


def err_console() -> Console:
    return Console(stderr=True, soft_wrap=True)


def exit_code_for(exc: WorkflowError) -> int:
    if isinstance(exc, RunNotFoundError | UnknownRequestError | WorkflowNotRegisteredError):
        return EXIT_NOT_FOUND
    if isinstance(exc, CheckpointNotFoundError):
        return EXIT_NOT_FOUND
    if isinstance(
        exc,
        RequestAlreadyAnsweredError
        | RequestCancelledError
        | RunBusyError
        | RunNotResumableError
        | SignatureMismatchError,
    ):
        return EXIT_CONFLICT
    if isinstance(exc, StorageError | SerializationError):
        # a value the CLI reads back that does not decode is a damaged (or foreign) record
        return EXIT_STORAGE
    if isinstance(exc, ResponseTypeError | GraphValidationError):
        return EXIT_USAGE
    return EXIT_FAILED


def print_error(message: str) -> None:
    """The one line on stderr every failure ends with."""
    first = message.strip().splitlines()[0] if message.strip() else "unknown error"
    err_console().print(f"[red]error:[/] {escape(first)}", highlight=False)


def run_async(func: Callable[[], Awaitable[int]]) -> None:
    """Run a command body; turn engine errors into one clear line and an exit code."""
    try:
        code = anyio.run(func)
    except Exit as stop:
        code = stop.code
    except WorkflowError as exc:
        print_error(str(exc))
        code = exit_code_for(exc)
    except (typer.Exit, typer.Abort):  # click's own control flow (RuntimeErrors)
        raise
    except Exception as exc:  # a bug: still one line (WORKFLOW_ENGINE_DEBUG=1 shows where)
        if os.environ.get("WORKFLOW_ENGINE_DEBUG"):
            raise
        print_error(
            f"internal error: {type(exc).__name__}: {exc} "
            "(set WORKFLOW_ENGINE_DEBUG=1 for the traceback)"
        )
        code = EXIT_FAILED
    raise typer.Exit(code)


async def _with_runtime(db: Path | None, body: Callable[[Runtime], Awaitable[T]]) -> T:
    """Open the runtime for a command that needs an existing database (it never creates one,
    so a mistyped ``--db`` is reported instead of silently starting an empty file)."""
    path = db if db is not None else default_db_path()
    if not Path(path).exists():
        err_console().print(
            f"[red]error:[/] no database at {path} (nothing has run there yet; check --db)"
        )
        raise Exit(EXIT_NOT_FOUND)
    runtime = open_runtime(db)
    try:
        return await body(runtime)
    finally:
        await runtime.close()


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


# --- running ----------------------------------------------------------------------------------


async def drive(
    runtime: Runtime,
    run_id: str,
    policy: AnswerPolicy,
    *,
    json_mode: bool,
    detach: bool,
    console: Console,
) -> int:
    """Resume, stream, answer what the policy can, repeat; returns the exit code."""
    while True:
        run = await runtime.store.get_run(run_id)
        printer = EventPrinter(
            console, json_mode=json_mode, codec=runtime.workflow(run.workflow_name).codec
        )
        stream = runtime.resume_stream(run_id)
        try:
            async with aclosing(stream):
                if not json_mode and console.is_terminal:
                    with console.status("working…", spinner="dots"):
                        async for event in stream:
                            printer.show(event)
                else:
                    async for event in stream:
                        printer.show(event)
        finally:
            printer.finish()
        result = stream.result
        assert result is not None
        if result.status is WorkflowRunState.IDLE:
            if not json_mode:
                for output in result.outputs:
                    console.print(f"[bold green]✓ {escape(describe_output(output))}[/]")
                console.print(f"Run {run_id} finished.")
            return EXIT_DONE
        if result.status is not WorkflowRunState.IDLE_WITH_PENDING_REQUESTS:
            if not json_mode:
                console.print(f"[red]Run {run_id} ended {result.status.value}.[/]")
            return EXIT_FAILED
        answers: list[tuple[str, Any]] = []
        for request in result.pending_requests:
            answer = None if detach else policy.answer(request)
            if answer is None:
                _print_paused(console, run_id, result.pending_requests, json_mode)
                return EXIT_PAUSED
            answers.append((request.request_id, answer))
        for request_id, answer in answers:
            await runtime.respond(request_id, answer)


def _print_paused(console: Console, run_id: str, pending: list[Any], json_mode: bool) -> None:
    if json_mode:
        print(json.dumps({"paused": run_id, "requests": [r.request_id for r in pending]}))
        return
    console.print(f"[bold]Run {run_id} is paused, waiting for input.[/]")
    for request in pending:
        console.print(f"  request {request.request_id} ({type(request.data).__name__})")
    console.print(
        "Answer with `workflow-engine respond REQUEST_ID --approve|--reject|--message TEXT`, "
        f"then `workflow-engine resume {run_id}`."
    )


def _policy(
    approve: bool | None, replies: list[str], end: bool, interactive: bool | None, console: Console
) -> AnswerPolicy:
    tty = stdin_is_tty() if interactive is None else interactive
    approvals = "ask" if approve is None else ("approve" if approve else "reject")
    return AnswerPolicy(
        interactive=tty,
        approvals=approvals,
        replies=list(replies),
        end_when_out_of_replies=end,
        console=console,
    )


ApproveOption = Annotated[
    bool | None,
    typer.Option("--approve/--reject", help="Answer every tool approval yes/no instead of asking."),
]
ReplyOption = Annotated[
    list[str] | None,
    typer.Option("--reply", help="Answer the next 'your turn' prompt (repeatable)."),
]
EndOption = Annotated[
    bool, typer.Option("--end", help="End the conversation when no --reply is left.")
]
InteractiveOption = Annotated[
    bool | None,
    typer.Option("--interactive/--no-interactive", help="Prompt on the terminal (default: TTY)."),
]


@app.command()
def demo(
    name: Annotated[str, typer.Argument(help="handoff (support), banking or transfer")] = "handoff",
    message: Annotated[
        str | None, typer.Option("--message", "-m", help="The first user message.")
    ] = None,
    approve: ApproveOption = None,
    reply: ReplyOption = None,
    end: EndOption = False,
    detach: Annotated[
        bool, typer.Option("--detach", help="Stop at the first pause and print how to continue.")
    ] = False,
    interactive: InteractiveOption = None,
    model: Annotated[str | None, typer.Option(help="Use a real model (OpenAI-compatible).")] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible endpoint.")] = None,
    api_key: Annotated[str | None, typer.Option(help="API key for the endpoint.")] = None,
    db: DbOption = None,
    json_mode: JsonOption = False,
) -> None:
    """Run a demo workflow durably: streams agents, asks for approvals and input."""
    console = Console()
    workflow = DEMO_ALIASES.get(name)
    if workflow is None:
        err_console().print(
            f"[red]error:[/] no demo named {name!r} (choose from: {', '.join(DEMO_ALIASES)})"
        )
        raise typer.Exit(EXIT_USAGE)
    apply_model_flags(model, base_url, api_key)
    policy = _policy(approve, reply or [], end, interactive, console)
    if not policy.interactive and not detach and approve is None:
        # No one to ask: a demo should still run to the end (say so; --reject/--detach exist).
        console.print("[dim]no terminal: approving tool calls and ending at the next prompt[/]")
        policy.approvals = "approve"
        policy.end_when_out_of_replies = True
    if message is None:
        if policy.interactive:
            message = policy.read("You: ").strip() or _DEFAULT_MESSAGES[workflow]
        else:
            message = _DEFAULT_MESSAGES[workflow]
    first = message

    async def body() -> int:
        runtime = open_runtime(db, model)
        try:
            run_id = await runtime.start(workflow, first)
            if not json_mode:
                console.print(
                    f"[dim]run {run_id} · workflow {workflow} · db {runtime.store.path}[/]"
                )
                console.print(f"[bold]You:[/] {escape(first)}")
            return await drive(
                runtime, run_id, policy, json_mode=json_mode, detach=detach, console=console
            )
        finally:
            await runtime.close()

    _interruptible(body)


_DEFAULT_MESSAGES = {
    "support": "Hi! My headphones from order 12345 arrived broken. I'd like a refund.",
    "banking": "Please transfer 300 to savings and show my balance",
    "bank_transfer": "Please transfer 1000 from account 123456 to account 654321.",
    "review_loop": "durable workflows",
}


def _interruptible(body: Callable[[], Awaitable[int]]) -> None:
    try:
        run_async(body)
    except KeyboardInterrupt:
        err_console().print(
            "\nInterrupted: the run keeps its last checkpoint. "
            "See `workflow-engine runs list` and continue with `workflow-engine resume RUN_ID`."
        )
        raise typer.Exit(EXIT_PAUSED) from None


@app.command()
def resume(
    run_id: str,
    approve: ApproveOption = None,
    reply: ReplyOption = None,
    end: EndOption = False,
    interactive: InteractiveOption = None,
    db: DbOption = None,
    json_mode: JsonOption = False,
) -> None:
    """Continue a run (after answers, a restart or a crash), streaming like the demo."""
    console = Console()
    policy = _policy(approve, reply or [], end, interactive, console)

    async def body() -> int:
        runtime = open_runtime(db)
        try:
            return await drive(
                runtime, run_id, policy, json_mode=json_mode, detach=False, console=console
            )
        finally:
            await runtime.close()

    _interruptible(body)


@app.command()
def respond(
    request_id: str,
    approve: Annotated[
        bool | None, typer.Option("--approve/--reject", help="Approve or reject a tool call.")
    ] = None,
    arguments: Annotated[
        str | None, typer.Option(help="With --approve: JSON object of edited arguments.")
    ] = None,
    message: Annotated[str | None, typer.Option("--message", help="Your next message.")] = None,
    end: Annotated[bool, typer.Option("--end", help="End the conversation.")] = False,
    data: Annotated[str | None, typer.Option("--data", help="The answer as raw JSON.")] = None,
    db: DbOption = None,
) -> None:
    """Answer a pending request (stored durably; run `resume` to continue the run)."""
    chosen = [x for x in (approve is not None, message is not None, end, data is not None) if x]
    if len(chosen) != 1:
        err_console().print(
            "[red]error:[/] give exactly one of --approve/--reject, --message, --end, --data"
        )
        raise typer.Exit(EXIT_USAGE)
    try:
        if data is not None:
            answer: Any = parse_json(data, what="--data", max_bytes=MAX_ANSWER_BYTES)
        elif approve is not None:
            answer = {"approved": approve}
            if arguments is not None:
                answer["arguments"] = parse_json(
                    arguments, what="--arguments", max_bytes=MAX_ANSWER_BYTES
                )
        elif message is not None:
            answer = {"message": check_text(message, "--message")}
        else:
            answer = {"end": True}
    except InputError as exc:
        print_error(str(exc))
        raise typer.Exit(EXIT_USAGE) from None

    async def body() -> int:
        async def go(runtime: Runtime) -> int:
            outcome = await runtime.respond(request_id, answer)
            request = await runtime.get_request(request_id)
            note = "already had this answer" if outcome.value == "duplicate" else "answer stored"
            Console().print(f"{note}; continue with `workflow-engine resume {request.run_id}`")
            return EXIT_DONE

        return await _with_runtime(db, go)

    run_async(body)


@app.command()
def cancel(run_id: str, db: DbOption = None) -> None:
    """Cancel a run: it ends CANCELLED and its pending requests can no longer be answered."""

    async def body() -> int:
        async def go(runtime: Runtime) -> int:
            info = await runtime.cancel(run_id)
            Console().print(f"Run {run_id} {info.status.value}.")
            return EXIT_DONE

        return await _with_runtime(db, go)

    run_async(body)


@app.command()
def graph(
    name: Annotated[str, typer.Argument(help="A workflow name (see `runs list`) or demo alias.")],
    format: Annotated[str, typer.Option("--format", help="mermaid or dot")] = "mermaid",
) -> None:
    """Print a workflow's graph as Mermaid or Graphviz DOT."""
    factories = workflow_factories()
    key = DEMO_ALIASES.get(name, name)
    if key not in factories:
        err_console().print(
            f"[red]error:[/] no workflow named {name!r} (known: {', '.join(sorted(factories))})"
        )
        raise typer.Exit(EXIT_NOT_FOUND)
    if format not in ("mermaid", "dot"):
        err_console().print(f"[red]error:[/] --format must be mermaid or dot, not {format!r}")
        raise typer.Exit(EXIT_USAGE)
    wf = factories[key]()
    sys.stdout.write(wf.to_mermaid() if format == "mermaid" else wf.to_dot())


# --- inspecting -------------------------------------------------------------------------------


@runs_app.command("list")
def runs_list(
    status: Annotated[str | None, typer.Option(help="e.g. idle_with_pending_requests")] = None,
    workflow: Annotated[str | None, typer.Option(help="Only this workflow.")] = None,
    db: DbOption = None,
    json_mode: JsonOption = False,
) -> None:
    """List runs, oldest first."""
    try:
        state = WorkflowRunState(status) if status else None
    except ValueError:
        err_console().print(
            f"[red]error:[/] unknown status {status!r} "
            f"(one of: {', '.join(s.value for s in WorkflowRunState)})"
        )
        raise typer.Exit(EXIT_USAGE) from None

    async def body() -> int:
        async def go(runtime: Runtime) -> int:
            runs = await runtime.list_runs(status=state, workflow=workflow)
            if json_mode:
                print(
                    json.dumps(
                        [
                            {
                                "run_id": r.run_id,
                                "workflow": r.workflow_name,
                                "status": r.status.value,
                                "superstep": r.superstep,
                                "created_at": r.created_at,
                                "updated_at": r.updated_at,
                            }
                            for r in runs
                        ]
                    )
                )
                return EXIT_DONE
            table = Table("run", "workflow", "status", "superstep", "updated (UTC)")
            for r in runs:
                table.add_row(
                    r.run_id, r.workflow_name, r.status.value, str(r.superstep), _when(r.updated_at)
                )
            Console().print(table)
            return EXIT_DONE

        return await _with_runtime(db, go)

    run_async(body)


@runs_app.command("show")
def runs_show(run_id: str, db: DbOption = None, json_mode: JsonOption = False) -> None:
    """A run's timeline (checkpoints per superstep), outputs and pending requests."""

    async def body() -> int:
        async def go(runtime: Runtime) -> int:
            info = await runtime.get_run(run_id)
            history = await runtime.history(run_id)
            if json_mode:
                print(
                    json.dumps(
                        {
                            "run_id": info.run_id,
                            "workflow": info.workflow_name,
                            "status": info.status.value,
                            "superstep": info.superstep,
                            "outputs": [describe_output(o) for o in info.outputs],
                            "pending_requests": [r.request_id for r in info.pending_requests],
                            "error": info.error,
                            "history": [
                                {"seq": h.seq, "superstep": h.superstep, "status": h.status.value}
                                for h in history
                            ],
                        }
                    )
                )
                return EXIT_DONE
            console = Console()
            console.print(
                f"[bold]Run {info.run_id}[/] · {info.workflow_name} · {info.status.value} · "
                f"superstep {info.superstep}"
            )
            table = Table("#", "superstep", "status", "kind", "at (UTC)", title="timeline")
            for h in history:
                table.add_row(
                    str(h.seq), str(h.superstep), h.status.value, h.kind, _when(h.created_at)
                )
            console.print(table)
            for output in info.outputs:
                console.print(f"[green]output:[/] {escape(describe_output(output))}")
            for request in info.pending_requests:
                console.print(
                    f"[yellow]waiting:[/] {request.request_id} ({type(request.data).__name__})"
                )
            if info.error:
                console.print(f"[red]error:[/] {escape(str(info.error.get('message')))}")
            return EXIT_DONE

        return await _with_runtime(db, go)

    run_async(body)


@requests_app.command("list")
def requests_list(db: DbOption = None, json_mode: JsonOption = False) -> None:
    """Pending requests across all runs (approvals show the tool and its arguments)."""

    async def body() -> int:
        async def go(runtime: Runtime) -> int:
            pending = await runtime.pending_requests()
            rows = []
            for r in pending:
                call = getattr(r.data, "function_call", None)
                if call is not None:
                    what = f"approve {call.name}({json.dumps(call.arguments)})"
                elif hasattr(r.data, "message"):
                    what = f"reply to {getattr(r.data, 'agent', '')}: {r.data.message}"
                else:
                    what = str(r.data)
                rows.append(
                    {
                        "request_id": r.request_id,
                        "run_id": r.run_id,
                        "workflow": r.workflow_name,
                        "what": what,
                    }
                )
            if json_mode:
                print(json.dumps(rows))
                return EXIT_DONE
            table = Table("request", "run", "workflow", "what")
            for row in rows:
                table.add_row(
                    row["request_id"], row["run_id"], row["workflow"], escape(row["what"])
                )
            Console().print(table)
            return EXIT_DONE

        return await _with_runtime(db, go)

    run_async(body)


MAX_ANSWER_BYTES = 1_000_000


def main() -> None:
    """The console script: refuse what cannot be text before click parses it, then run."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:  # never die printing a character the terminal lacks
            reconfigure(errors="backslashreplace")
    try:
        for position, argument in enumerate(sys.argv[1:], start=1):
            check_text(argument, f"argument {position}")
        for name, value in os.environ.items():
            if name.startswith("WORKFLOW_ENGINE_"):
                check_text(value, f"environment variable {name}")
    except InputError as exc:
        # argv arrives decoded with surrogateescape: a byte that was not UTF-8 becomes a lone
        # surrogate, which no file name, SQLite query or terminal can take. Say so once.
        print_error(str(exc))
        raise SystemExit(EXIT_USAGE) from None
    app()


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    token: Annotated[
        str | None,
        typer.Option(envvar="WORKFLOW_ENGINE_TOKEN", help="Bearer token clients must send."),
    ] = None,
    cors_origin: Annotated[
        list[str] | None, typer.Option("--cors-origin", help="Allow this browser origin.")
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body accepted.")] = 1_000_000,
    db: DbOption = None,
) -> None:
    """Serve the support demo (/support) and the banking agent (/banking) over AG-UI."""
    import uvicorn

    from ._http import normalize_origin
    from ._server import create_app, is_loopback

    if not is_loopback(host) and not token:
        err_console().print(
            f"[red]error:[/] binding {host} exposes the server beyond this machine; "
            "set --token (or WORKFLOW_ENGINE_TOKEN)"
        )
        raise typer.Exit(EXIT_USAGE)
    for origin in cors_origin or []:
        if origin == "*" and not token:
            print_error("--cors-origin '*' lets every web page call the server; set --token too")
            raise typer.Exit(EXIT_USAGE)
        if origin != "*" and normalize_origin(origin) != origin:
            print_error(
                f"--cors-origin {origin!r} is not an origin as browsers send it: "
                "scheme://host[:port], lower case, no path or default port"
            )
            raise typer.Exit(EXIT_USAGE)
    if max_body_bytes < 1:
        print_error("--max-body-bytes must be at least 1")
        raise typer.Exit(EXIT_USAGE)
    app_ = create_app(db, token=token, cors_origins=cors_origin, max_body_bytes=max_body_bytes)
    Console(stderr=True).print(f"AG-UI endpoints: http://{host}:{port}/support and /banking")
    uvicorn.run(app_, host=host, port=port, log_level="warning")
