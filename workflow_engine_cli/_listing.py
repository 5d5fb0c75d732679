"""What ``runs list``, ``requests list`` and ``runs show`` print, and how a run's status reads
to a person.

The records come from either of two readers: the runtime (``_app``: the commands as typer
parses them) or a read-only snapshot of the file (``_quick``: the same commands started
without the runtime, the event loop or pydantic). Both print through this module, so the two
can differ in where they read, never in what a person sees. Importing it loads nothing of the
engine (``--help`` loads this module, and no more).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ._hints import resume_command
from ._ids import short_ids
from ._registry import workflow_names
from ._term import (
    Terminal,
    format_table,
    is_live,
    terminal_columns,
    visible,
    visible_word,
)
from ._views import answer_data, describe_answer, describe_output, describe_request

if TYPE_CHECKING:
    from workflow_engine import WorkflowRunState

MAX_SHOWN_CHARACTERS = 600
"""The most of a request's or an output's text a line of ``requests list`` or ``runs show``
shows (``--json`` has it all)."""

EXTRA_STATUSES = ("interrupted", "not_started")
"""Statuses the list shows for runs in progress that no live process executes; ``--status``
takes them as well as the stored ones."""


@dataclass(frozen=True)
class Pending:
    """A pending request as the inbox lists it: its data as stored (tagged JSON)."""

    request_id: str
    run_id: str
    workflow_name: str
    port_id: str
    data: Any


def when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


def at_most(text: str, limit: int) -> str:
    """``text``, or its first ``limit`` characters and how many more there are."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit:,} more characters: --json shows all)"


def print_table(headers: list[str], rows: list[list[str]], wrap: Sequence[str] = ()) -> None:
    """Aligned columns, ids and statuses whole; only ``wrap`` columns fold at the terminal's
    width (none when the output is not a terminal, so pipes get one line per row)."""
    width = terminal_columns(sys.stdout) - 1 if sys.stdout.isatty() else 0
    for line in format_table(headers, rows, width=width, wrap=wrap, live=is_live(sys.stdout)):
        print(line)


# --- a run's status, as a person reads it ----------------------------------------------------


def live_worker(record: Any) -> str | None:
    """The process holding the run's lease now, or None (a run left ``in_progress`` by a
    process that was stopped shows as ``interrupted``: `resume` continues it). A lease whose
    holder on this host has exited is not live, however long it still runs: ``resume`` takes
    it over at once too."""
    return record.live_owner(datetime.now(UTC).timestamp())


def not_started(record: Any) -> bool:
    """Whether the run was admitted (``Runtime.start``, ``fork``) and no worker ever took it:
    its lease version is still the admission's."""
    return record.version == 0 and str(record.status.value) == "in_progress"


def person_status(record: Any) -> str:
    """The run's status as a person reads it: ``interrupted`` for one in progress that no
    live process executes, ``not_started`` for one no process ever executed (a fork)."""
    status = str(record.status.value)
    if status == "in_progress" and not live_worker(record):
        return "not_started" if not_started(record) else "interrupted"
    return status


def shown_status(record: Any, answered: bool = False) -> str:
    """``person_status``, and what is under way: ``answered`` (answers are stored that the
    run has not applied yet), ``cancelling`` (a stored cancel its worker has not honoured)."""
    shown = person_status(record)
    if answered and shown == "idle_with_pending_requests":
        shown += ", answered"  # it looked stuck, resting (tester 74): `resume` applies them
    return f"{shown}, cancelling" if record.cancel_requested else shown


def status_filter(status: str | None) -> tuple[WorkflowRunState | None, str | None]:
    """``--status`` as (the stored state to read, the shown status to keep of those runs: one
    of ``EXTRA_STATUSES``, which are runs stored ``in_progress``). ``ValueError`` saying which
    statuses there are, for one that is none of them."""
    from workflow_engine._events import WorkflowRunState

    if status is None:
        return None, None
    status = status.strip().lower()  # (``IDLE`` as ids are taken in capitals: tester 113)
    if status in EXTRA_STATUSES:
        return WorkflowRunState.IN_PROGRESS, status
    try:
        return WorkflowRunState(status), None
    except ValueError:
        known = [s.value for s in WorkflowRunState] + list(EXTRA_STATUSES)
        raise ValueError(f"unknown status {status!r} (one of: {', '.join(known)})") from None


def may_be_in_doubt(record: Any) -> bool:
    """Whether the run could have a step in doubt: in progress, no live worker executes it
    and no cancel waits (its journal then tells; its checkpoints, folded, say for sure)."""
    return (
        str(record.status.value) == "in_progress"
        and live_worker(record) is None
        and not record.cancel_requested
    )


def answered_to_apply(record: Any) -> bool:
    """Whether answers stored for the run wait for a ``resume`` (no live worker applies them
    and the run has not finished)."""
    return not record.status.is_terminal and live_worker(record) is None


# --- the lists ---------------------------------------------------------------------------------
#
# Each list is worked out whole first, and printed by the call returned: whatever fails in the
# working out (a damaged record) fails before a byte is printed, so the quick path can still
# leave the command to the command line proper.

Output = Callable[[], None]
"""Prints a list that has been worked out."""


def runs_output(
    runs: Sequence[Any],
    answered: dict[str, int],
    every: Sequence[str] | None,
    *,
    filtered: bool,
    json_mode: bool,
    left_out: int = 0,
) -> Output:
    """``runs list``: ``runs`` (``RunRecord``), with ``answered`` (run → answers waiting);
    ``every``: every run's id, for the shortest unique prefixes (None: ``runs`` are all);
    ``left_out``: how many runs updated earlier ``--limit`` left out (said under the
    table)."""
    if json_mode:
        rows = [
            {
                "run_id": r.run_id,
                "workflow": r.workflow_name,
                "status": r.status.value,
                "worker": live_worker(r),
                "started": not not_started(r),
                "answers_waiting": r.run_id in answered,
                "cancel_requested": r.cancel_requested,
                "superstep": r.superstep,
                "created_at": r.created_at,
                "updated_at": r.updated_at,
            }
            for r in runs
        ]
        return _printing(json.dumps(rows))
    if not runs:
        return _printing("No matching runs." if filtered else "No runs.")
    short = short_ids(every if every is not None else [r.run_id for r in runs])
    table = [
        [
            short[r.run_id],
            r.workflow_name,
            shown_status(r, r.run_id in answered),
            str(r.superstep),
            when(r.updated_at),
        ]
        for r in runs
    ]
    headers = ["RUN", "WORKFLOW", "STATUS", "STEP", "UPDATED (UTC)"]

    def show() -> None:
        print_table(headers, table, wrap=["UPDATED (UTC)"])
        if left_out:
            _footer(f"({left_out:,} updated earlier not shown: --limit 0 lists them all)")

    return show


def limited(rows: Sequence[Any], limit: int | None, newest: bool) -> tuple[list[Any], int]:
    """``rows`` cut to ``limit`` (None or 0: all) -- the last ones if ``newest``, else the
    first -- and how many were left out: at 21,000 runs a listing took half a second and as
    many lines (outside tester 147)."""
    if not limit or len(rows) <= limit:
        return list(rows), 0
    kept = rows[-limit:] if newest else rows[:limit]
    return list(kept), len(rows) - limit


def requests_json_output(pending: Sequence[Pending]) -> Output:
    """``requests list --json``: with each request itself, as stored (a tool call's
    arguments too)."""
    rows = [
        {
            "request_id": r.request_id,
            "run_id": r.run_id,
            "workflow": r.workflow_name,
            "what": describe_request(r.data, r.port_id),
            "port_id": r.port_id,
            "data": r.data,
        }
        for r in pending
    ]
    return _printing(json.dumps(rows))


def requests_output(
    pending: Sequence[Pending],
    in_doubt: Sequence[Any],
    waiting: Sequence[tuple[Any, int]],
    request_ids: Sequence[str],
    run_ids: Sequence[str],
    damaged: bool = False,
    left_out: int = 0,
    runs_left_out: tuple[int, int] = (0, 0),
) -> Output:
    """``requests list``: the inbox; then the interrupted runs with a step in doubt
    (``RunInfo``), and the resting runs with answers to apply (``(RunRecord, count)``).
    ``request_ids`` and ``run_ids``: every one stored, for the shortest unique prefixes.
    ``damaged``: some requests could not be read (said on stderr): an empty inbox is not
    said to be empty. ``left_out``: the requests ``--limit`` left out; ``runs_left_out``:
    the runs it left out of the two lists after."""
    table: list[list[str]] = []
    if pending:
        short_request, short_run = short_ids(request_ids), short_ids(run_ids)
        table = [
            [
                short_request[r.request_id],
                short_run.get(r.run_id, r.run_id),
                r.workflow_name,
                at_most(describe_request(r.data, r.port_id), MAX_SHOWN_CHARACTERS),
            ]
            for r in pending
        ]

    def show() -> None:
        if table:
            print_table(["REQUEST", "RUN", "WORKFLOW", "WAITING FOR"], table, wrap=["WAITING FOR"])
            if left_out:
                _footer(f"({left_out:,} newer not shown: {_ALL})")
        elif not damaged:
            print("No pending requests.")
        say_in_doubt(in_doubt)
        if runs_left_out[0]:
            _footer(f"({_more(runs_left_out[0], 'interrupted run')} not shown: {_ALL})")
        say_answered(waiting)
        if runs_left_out[1]:
            # (counted, not read: a live worker may be applying some -- outside tester 186)
            left = _more(runs_left_out[1], "run")
            _footer(f"({left} with answers stored not read: --limit 0 lists those waiting)")

    return show


_ALL = "--limit 0 lists them all"


def _footer(text: str) -> None:
    """A note under a listing, wrapped between its words on a terminal (the terminal folded
    it mid-word: outside tester 208)."""
    Terminal().line(text, indent=1)


def _more(count: int, what: str) -> str:
    return f"{count:,} more {what}{'' if count == 1 else 's'}"


def _stored_in_doubt(data: Any) -> Any:
    """A stored request's question as an ``InDoubtEffect`` (the engine's own question, which
    reads back without the workflow that asked it: an application's run showed it as
    ``(at PORT)``, tester 94); ``data`` as it is when it is something else."""
    from pydantic import ValidationError

    from workflow_engine._registry import default_tag, legacy_tags
    from workflow_engine._requests import InDoubtEffect

    from ._views import DamagedValueError, plain

    tags = (default_tag(InDoubtEffect), *legacy_tags(InDoubtEffect))
    if not isinstance(data, dict) or data.get("$type") not in tags:
        return data
    try:
        return InDoubtEffect.model_validate(plain(data))
    except (DamagedValueError, ValidationError):
        return data


def run_output(
    info: Any, record: Any, history: Sequence[Any], answered: Sequence[Any], *, json_mode: bool
) -> Output:
    """``runs show``: the run as ``Runtime.get_run`` sees it (``RunInfo``), its record
    (``RunRecord``), its checkpoints (``CheckpointInfo``) and its answers not applied yet
    (``StoredRequest``)."""
    from workflow_engine._requests import InDoubtEffect

    if json_mode:
        return _printing(
            json.dumps(
                {
                    "run_id": info.run_id,
                    "workflow": info.workflow_name,
                    "status": info.status.value,
                    "worker": live_worker(record),
                    "cancel_requested": info.cancel_requested,
                    "superstep": info.superstep,
                    "parent_run_id": record.parent_run_id,
                    "started": not not_started(record),
                    "outputs": [describe_output(o) for o in info.outputs],
                    "pending_requests": [r.request_id for r in info.pending_requests],
                    "answered_requests": [r.request_id for r in answered],
                    # what each was answered (an approval's edits too), as the text view says
                    "answers": {r.request_id: answer_data(r) for r in answered},
                    "decoded": info.decoded,
                    "error": info.error,
                    "effects_in_doubt": [e.model_dump(mode="json") for e in info.effects_in_doubt],
                    "history": [
                        {"seq": h.seq, "superstep": h.superstep, "status": h.status.value}
                        for h in history
                    ],
                }
            )
        )
    full = info.run_id
    title = f" · {info.workflow_name} · {shown_status(record, bool(answered))} · "
    rows = [
        [str(h.seq), str(h.superstep), h.status.value, h.kind, when(h.created_at)] for h in history
    ]
    outputs = [at_most(describe_output(o), MAX_SHOWN_CHARACTERS) for o in info.outputs]
    waiting = []
    for request in info.pending_requests:
        data = request.data if info.decoded else _stored_in_doubt(request.data)
        in_doubt = data if isinstance(data, InDoubtEffect) else None  # (tester 67)
        if info.decoded or in_doubt is not None:
            asks = type(data).__name__
        else:
            asks = f"at {request.port_id}"
        if in_doubt is None:  # what it waits for, as the inbox says (outside tester 153)
            said = at_most(describe_request(data, request.port_id), MAX_SHOWN_CHARACTERS)
            asks = f"{asks}: {said}"
        waiting.append((request.request_id, asks, in_doubt))
    said = None
    where: list[str] = []  # the recorded traceback's lines
    if info.error is not None:
        message = info.error.get("message") if isinstance(info.error, dict) else None
        if not isinstance(message, str):  # a store that does not check what it reads
            message = "(the recorded error is damaged and cannot be shown)"
        code = info.error.get("code") if isinstance(info.error, dict) else None
        said = f"{message} ({code})" if isinstance(code, str) and code else message
        raised = info.error.get("traceback") if isinstance(info.error, dict) else None
        if isinstance(raised, str) and raised.strip():
            where = raised.rstrip("\n").splitlines()
    status = person_status(record)
    worker = live_worker(record)

    def show() -> None:
        term = Terminal()
        term.line((f"Run {visible_word(full)}", "bold"), f"{title}superstep {info.superstep}")
        print_table(["#", "SUPERSTEP", "STATUS", "KIND", "AT (UTC)"], rows, wrap=["AT (UTC)"])
        if record.parent_run_id is not None:
            first = f" at superstep {history[0].superstep}" if history else ""
            term.line(("forked from: ", "dim"), f"{visible(record.parent_run_id)}{first}")
        if status in ("not_started", "interrupted") and not info.effects_in_doubt:
            does = "run it" if status == "not_started" else "continue it"
            label = (f"{status.replace('_', ' ')}: ", "yellow")
            say_resume(term, label, "", does, full, info.workflow_name)
        if not info.decoded and (info.outputs or info.pending_requests):
            term.line(
                ("note: ", "dim"),
                f"workflow {info.workflow_name!r} is not built here (or its graph or classes "
                "changed): "
                "values are shown as stored",
            )
        for output in outputs:
            term.line(("output: ", "green"), output)
        for request_id, asks, in_doubt in waiting:
            term.line(("waiting: ", "yellow"), f"{request_id} ({asks})")
            if in_doubt is not None:  # what it asks
                from ._console import show_in_doubt

                show_in_doubt(term, in_doubt)
        for request in answered:
            given = visible(describe_answer(request))
            term.line(("answered: ", "green"), f"{request.request_id} ({given}; not applied yet)")
        if answered and not worker:
            does = "apply it" if len(answered) == 1 else "apply them"
            say_resume(term, ("then: ", "dim"), "", does, full, info.workflow_name)
        if said is not None:
            # not "error:", which is how this command would say that it failed itself
            term.line((f"{info.status.value} with: ", "red"), said)
            for line in where:  # (where the error was raised: the handler's line)
                if line == _TRACEBACK_HEADER:  # (the run's, not this command's own failure)
                    line = "raised at (most recent call last):"
                term.line((visible(line), "dim"))
        if info.effects_in_doubt:
            from ._console import CANCELLED_WITHOUT_ASKING, RESUME_ASKS, show_in_doubt

            cancelled = info.status.value == "cancelled"
            then = CANCELLED_WITHOUT_ASKING if cancelled else RESUME_ASKS
            if info.cancel_requested:  # (tester 67: resume would not ask, but cancel)
                then = "a cancel waits: `resume` ends the run cancelled without asking"
            for effect in info.effects_in_doubt:
                show_in_doubt(term, effect, then=then)

    return show


_TRACEBACK_HEADER = "Traceback (most recent call last):"


def _printing(text: str) -> Output:
    return lambda: print(text)


def say_in_doubt(runs: Sequence[Any]) -> None:
    """After the inbox: each interrupted run's steps in doubt, and how to be asked about them."""
    if not runs:
        return
    from ._console import RESUME_ASKS, show_in_doubt

    term = Terminal()
    for info in runs:
        label = ("interrupted: ", "yellow")
        said = f"run {visible(info.run_id)} ({info.workflow_name});"
        say_resume(term, label, said, "continue it", info.run_id, info.workflow_name)
        for effect in info.effects_in_doubt:
            show_in_doubt(term, effect, then=RESUME_ASKS)


def say_answered(runs: Sequence[tuple[Any, int]]) -> None:
    """After the inbox: each resting run with answers stored that a ``resume`` applies."""
    if not runs:
        return
    term = Terminal()
    for record, count in runs:
        answers = "an answer" if count == 1 else f"{count} answers"
        said = f"run {visible(record.run_id)} ({record.workflow_name}) has {answers} to apply;"
        does = "apply it" if count == 1 else "apply them"
        say_resume(term, ("answered: ", "green"), said, does, record.run_id, record.workflow_name)


def say_resume(
    term: Terminal, label: tuple[str, str], said: str, does: str, run_id: str, workflow_name: str
) -> None:
    """``label`` (styled) and ``said``, then how to ``does`` (continue the run, apply its
    answers): the command whole on a line of its own, to paste (a wrapped one ran as two,
    tester 76) -- or, for a workflow this command line does not build, its application."""
    text = f"{said} " if said else ""
    if workflow_name not in workflow_names():
        term.line(label, f"{text}its application can {does} (`Runtime.resume`)")
        return
    term.line(label, f"{text}{does} with:")
    term.whole(f"  {resume_command(run_id)}")
