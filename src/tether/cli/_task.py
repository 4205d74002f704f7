"""``tether task``: follow one task by its id."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import click

from ._app_argument import APP_HELP, app_argument
from ._common import connection_options, open_app, run
from ._dead import describe_where

if TYPE_CHECKING:
    from .._app import Tether

T = TypeVar("T")


def _where_not_found(work: Callable[[Tether], Awaitable[T]]) -> Callable[[Tether], Awaitable[T]]:
    """A task not found is looked for in a namespace on a server: the message says which, so
    a forgotten --app or --namespace shows at once."""

    async def wrapped(app: Tether) -> T:
        from ..base._errors import TaskNotFound

        try:
            return await work(app)
        except TaskNotFound as exc:
            raise TaskNotFound(f"{exc} (looked in {describe_where(app)})") from None

    return wrapped


@click.group()
def task() -> None:
    """Follow one task by its id: status, result, cancel."""


@task.command("status", epilog=APP_HELP)
@app_argument(then="task_id", then_metavar="TASK_ID")
@click.argument("task_id", metavar="TASK_ID", required=False)
@connection_options
def task_status(task_id: str, app_spec: str | None, url: str | None, namespace: str | None) -> None:
    """Print the task's status (queued, scheduled, running, succeeded, ...)."""
    app = open_app(app_spec, url, namespace)
    click.echo(run(app, _where_not_found(lambda a: a.handle(task_id).status())).value)


@task.command("result", epilog=APP_HELP)
@app_argument(then="task_id", then_metavar="TASK_ID")
@click.argument("task_id", metavar="TASK_ID", required=False)
@connection_options
@click.option(
    "--timeout",
    type=float,
    default=0.0,
    show_default=True,
    help="Seconds to wait (0: do not wait).",
)
def task_result(
    task_id: str,
    app_spec: str | None,
    url: str | None,
    namespace: str | None,
    timeout: float,
) -> None:
    """Print the task's result as JSON, or its error (exit status 1)."""
    from ..base._errors import ResultTimeout, TaskFailed

    app = open_app(app_spec, url, namespace)
    try:
        value = run(
            app, _where_not_found(lambda a: a.handle(task_id).result(timeout=timeout or 0.001))
        )
    except TaskFailed as failed:
        click.echo(f"{failed.status}: {failed.error_type}: {failed.error_message}", err=True)
        if failed.traceback:
            click.echo(failed.traceback, err=True)
        sys.exit(1)
    except ResultTimeout:
        raise click.ClickException(f"task {task_id} has no result yet") from None
    click.echo(json.dumps(value))


@task.command("cancel", epilog=APP_HELP)
@app_argument(then="task_id", then_metavar="TASK_ID")
@click.argument("task_id", metavar="TASK_ID", required=False)
@connection_options
def task_cancel(task_id: str, app_spec: str | None, url: str | None, namespace: str | None) -> None:
    """Cancel a queued, scheduled or running task."""
    app = open_app(app_spec, url, namespace)
    from ..base._status import CancelResult

    result = run(app, _where_not_found(lambda a: a.handle(task_id).cancel()))
    click.echo(_CANCEL_MESSAGES[result])
    if result is CancelResult.NOT_CANCELLABLE:
        sys.exit(1)


_CANCEL_MESSAGES = {
    "cancelled": "cancelled",
    "requested": "cancel requested: the task stops at its next await",
    "not_cancellable": "not cancellable: it runs in a worker thread and will run to its end",
    "finished": "already finished",
}
