"""``governor submit``: enqueue a batch of calls under its caps, each booked before it is sent.

::

    $ governor -A proj submit proj.tasks.sync_account calls.jsonl
    $ governor -A proj submit proj.tasks.sync_account calls.jsonl --json | jq .last_due_iso

``CALLS`` is a JSON Lines file (``-`` for stdin): one call per line, either a list of
positional arguments (``["acme", 42]``) or an object ``{"args": [...], "kwargs": {...}}``.
Every call books the earliest moment its limits admit it and runs then, never denied (see
:func:`governor.celery.submit_batch`); a progress bar shows how far the booking has come and
when the last booked call will run.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import click

from .common import EXIT_FAILED, CliError, State, echo_json, format_time, pass_state

__all__ = ["submit"]


CallLine = tuple[int, list[Any], dict[str, Any]]


def read_calls(stream: IO[str]) -> Iterator[CallLine]:
    """(line number, args, kwargs) for each call in a JSON Lines stream."""
    for number, line in enumerate(stream, 1):
        line = line.strip()
        if not line:
            continue
        try:
            call = json.loads(line)
        except ValueError as exc:
            raise CliError(f"line {number} of CALLS is not JSON: {exc}") from None
        if isinstance(call, list):
            yield number, call, {}
        elif isinstance(call, dict) and set(call) <= {"args", "kwargs"}:
            args, kwargs = call.get("args", []), call.get("kwargs", {})
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise CliError(f"line {number} of CALLS: args must be a list, kwargs an object")
            yield number, args, kwargs
        else:
            raise CliError(
                f'line {number} of CALLS: expected [args...] or {{"args": [...], '
                f'"kwargs": {{...}}}}, got {line[:80]!r}'
            )


@click.command()
@click.argument("task_name", metavar="TASK")
@click.argument("calls", type=click.File("r"))
@click.option(
    "--start-in",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds before the first call may start.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
@pass_state
def submit(state: State, task_name: str, calls: IO[str], start_in: float, as_json: bool) -> None:
    """Book and enqueue every call in CALLS (JSON Lines) for TASK. Needs a Celery app (-A)."""
    if state.app is None:
        raise CliError(
            "submit needs the Celery app: governor -A proj submit ... "
            "(or celery -A proj governor submit ...)"
        )
    app = state.app
    if task_name not in app.tasks:
        raise CliError(
            f"unknown task {task_name!r}; the app has: "
            f"{', '.join(sorted(t for t in app.tasks if not t.startswith('celery.')))}"
        )
    task = app.tasks[task_name]
    items = list(read_calls(calls))
    for call in items:  # every call is checked before the first is sent
        check_call(app, task, call)
    signatures = (task.s(*args, **kwargs) for _, args, kwargs in items)
    last: list[float] = []
    sent = [0]

    def note(done: int, due: float | None) -> None:
        sent[0] = done
        if due is not None:
            last.append(due)

    started = time.time()
    try:
        _submit_all(items, signatures, start_in, as_json, note)
    except Exception as exc:
        if not sent[0]:  # nothing went out: the usual error, and exit code
            raise
        line = items[sent[0]][0] if sent[0] < len(items) else items[-1][0]
        raise CliError(
            f"{sent[0]} of {len(items)} calls were sent; the call on line {line} failed: "
            f"{exc}. Submit the lines from {line} on again once it is fixed",
            EXIT_FAILED,
        ) from None
    summary = {
        "task": task_name,
        "calls": len(items),
        "booked": len(last),
        "seconds_to_submit": round(time.time() - started, 3),
        "last_due": max(last) if last else None,
        "last_due_iso": format_time(max(last)) if last else None,
    }
    if as_json:
        echo_json(summary)
    else:
        click.echo(
            f"{len(items)} calls of {task_name} enqueued in "
            f"{summary['seconds_to_submit']}s; the last one runs at "
            f"{summary['last_due_iso'] or 'once admitted'}"
        )


def check_call(app: Any, task: Any, call: CallLine) -> None:
    """Fail on a call the task cannot take (its signature, its key or cost function), naming
    the line: before anything is sent."""
    from ..celery import registry
    from ..celery.config.task_limits import key_spec

    number, args, kwargs = call
    try:
        header = getattr(task, "__header__", None)  # what apply_async checks (Task.typing)
        if getattr(task, "typing", True) and header is not None:
            header(*args, **kwargs)
        gate = registry.of(app).gate
        config = gate.options(task).key_config
        if config is not None:
            key_spec(task, config, tuple(args), kwargs)
        gate.cost(task, tuple(args), kwargs)
    except Exception as exc:
        raise CliError(
            f"line {number} of CALLS: {task.name} cannot take {json.dumps(args)[:60]} "
            f"{json.dumps(kwargs)[:60] if kwargs else ''}: {exc}. Nothing was sent"
        ) from None


def _submit_all(
    items: list[CallLine],
    signatures: Iterator[Any],
    start_in: float,
    quiet: bool,
    note: Callable[[int, float | None], None],
) -> None:
    from ..celery import submit_batch

    if quiet or not items:
        submit_batch(signatures, start_in=start_in, progress=note)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(
        TextColumn("[bold]booking"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[due]}"),
        transient=False,
    ) as bar:
        job = bar.add_task("submit", total=len(items), due="")

        def show(done: int, due: float | None) -> None:
            note(done, due)
            label = f"last due {format_time(due)}" if due is not None else ""
            bar.update(job, completed=done, due=label)

        submit_batch(signatures, start_in=start_in, progress=show)
