"""Admin commands: dead letters (``tether dead``), schedules, the standalone scheduler."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console
from rich.table import Table

from .cli import _apply_connection, connection_options, load_app

if TYPE_CHECKING:
    from ._app import Tether

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")
console = Console()


def app_options(fn: F) -> F:
    fn = click.option("-q", "--queue", default="default", show_default=True, help="The queue.")(fn)
    fn = click.option(
        "--app",
        "app_spec",
        default=None,
        metavar="APP",
        help="module:attribute of your app (for its serializer); optional.",
    )(fn)
    return connection_options(fn)


def task_options(fn: F) -> F:
    fn = click.option(
        "--app", "app_spec", default=None, metavar="APP",
        help="module:attribute of your app (for its serializer); optional.",
    )(fn)  # fmt: skip
    return connection_options(fn)


def _make_app(app_spec: str | None, url: str | None, namespace: str | None) -> Tether:
    from ._app import Tether

    _apply_connection(url, namespace)
    return load_app(app_spec) if app_spec else Tether()


def _run(app: Tether, work: Callable[[Tether], Awaitable[T]]) -> T:
    async def main() -> T:
        async with app:
            return await work(app)

    return asyncio.run(main())


@click.group()
def dead() -> None:
    """List, show, retry and purge a queue's dead-letter stream."""


@dead.command("list")
@app_options
@click.option("-n", "--count", default=50, show_default=True, help="Entries to show, newest first.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def dead_list(
    app_spec: str | None,
    queue: str,
    url: str | None,
    namespace: str | None,
    count: int,
    as_json: bool,
) -> None:
    """List the newest dead-letter entries of a queue."""
    app = _make_app(app_spec, url, namespace)

    async def work(a: Tether) -> tuple[int, list[Any]]:
        letters = a.dead_letters(queue)
        return await letters.count(), await letters.list(count)

    total, entries = _run(app, work)
    if as_json:
        for letter in entries:
            click.echo(json.dumps(letter.to_dict()))
        return
    table = Table(title=f"dead letters of queue {queue!r}: {total} in all")
    for column in ("entry", "at (UTC)", "status", "task", "task id", "reason"):
        table.add_column(column, overflow="fold")
    for letter in entries:
        at = letter.at.strftime("%Y-%m-%d %H:%M:%S") if letter.at else ""
        table.add_row(
            letter.entry_id, at, letter.status, letter.task, letter.task_id, letter.reason
        )
    console.print(table)


@dead.command("show")
@app_options
@click.argument("entry_id")
def dead_show(
    app_spec: str | None, queue: str, url: str | None, namespace: str | None, entry_id: str
) -> None:
    """Show one entry: reason, error, traceback and the original payload."""
    from ._errors import TaskNotFound

    app = _make_app(app_spec, url, namespace)
    try:
        letter = _run(app, lambda a: a.dead_letters(queue).show(entry_id))
    except TaskNotFound as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(letter.to_dict(), indent=2))


@dead.command("retry")
@app_options
@click.argument("entry_ids", nargs=-1)
@click.option("--all", "retry_all", is_flag=True, help="Retry every entry of the queue.")
def dead_retry(
    app_spec: str | None,
    queue: str,
    url: str | None,
    namespace: str | None,
    entry_ids: tuple[str, ...],
    retry_all: bool,
) -> None:
    """Enqueue entries again as fresh attempts (same task id) and remove them from here."""
    from ._errors import TetherError

    if not entry_ids and not retry_all:
        raise click.UsageError("name entry ids, or give --all")
    app = _make_app(app_spec, url, namespace)

    async def work(a: Tether) -> list[str]:
        letters = a.dead_letters(queue)
        ids = list(entry_ids)
        if retry_all:
            ids = [d.entry_id for d in await letters.list(count=1_000_000, newest_first=False)]
        out = []
        for entry_id in ids:
            try:
                handle = await letters.retry(entry_id)
                out.append(f"{entry_id}: queued again as {handle.id}")
            except TetherError as exc:
                out.append(f"{entry_id}: {exc}")
        return out

    for line in _run(app, work):
        click.echo(line)


@dead.command("purge")
@app_options
@click.argument("entry_ids", nargs=-1)
@click.option("--yes", is_flag=True, help="Do not ask before deleting every entry.")
def dead_purge(
    app_spec: str | None,
    queue: str,
    url: str | None,
    namespace: str | None,
    entry_ids: tuple[str, ...],
    yes: bool,
) -> None:
    """Delete the named entries, or all of them."""
    if not entry_ids and not yes:
        click.confirm(f"delete every dead-letter entry of queue {queue!r}?", abort=True)
    app = _make_app(app_spec, url, namespace)
    n = _run(app, lambda a: a.dead_letters(queue).purge(list(entry_ids) or None))
    click.echo(f"deleted {n} entries")


@click.command()
@click.argument("app_spec", metavar="APP")
@connection_options
@click.option("--pause", "to_pause", multiple=True, metavar="NAME", help="Pause a schedule.")
@click.option("--resume", "to_resume", multiple=True, metavar="NAME", help="Resume a schedule.")
@click.option("--trigger", "to_trigger", multiple=True, metavar="NAME", help="Enqueue a run now.")
@click.option(
    "--remove", "to_remove", multiple=True, metavar="NAME", help="Remove a runtime schedule."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def schedules(
    app_spec: str,
    url: str | None,
    namespace: str | None,
    to_pause: tuple[str, ...],
    to_resume: tuple[str, ...],
    to_trigger: tuple[str, ...],
    to_remove: tuple[str, ...],
    as_json: bool,
) -> None:
    """List APP's schedules with their next run, last run and last outcome, and the leader;
    pause, resume, trigger or remove schedules."""
    from ._errors import ConfigError
    from .scheduler._control import describe

    app = _make_app(app_spec, url, namespace)

    async def work(a: Tether) -> tuple[list[str], str | None, list[Any]]:
        done: list[str] = []
        control = a.schedules
        for name in to_pause:
            await control.pause(name)
            done.append(f"paused {name}")
        for name in to_resume:
            await control.resume(name)
            done.append(f"resumed {name}")
        for name in to_trigger:
            handle = await control.trigger(name)
            done.append(f"triggered {name}: {handle.id}")
        for name in to_remove:
            done.append(
                f"removed {name}" if await control.remove(name) else f"no runtime schedule {name}"
            )
        return done, await control.leader(), await control.list()

    try:
        done, leader, infos = _run(app, work)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    for line in done:
        click.echo(line)
    if as_json:
        for info in infos:
            click.echo(json.dumps(describe(info)))
        return
    table = Table(title=f"schedules (leader: {leader or 'none'})")
    for column in (
        "name",
        "task",
        "when",
        "source",
        "state",
        "next run (UTC)",
        "last run (UTC)",
        "last outcome",
    ):
        table.add_column(column, overflow="fold")
    for info in infos:
        row = describe(info)
        table.add_row(
            row["name"], row["task"], row["spec"], row["source"],
            "paused" if info.paused else "active",
            _short(info.next_run), _short(info.last_run), row["last_outcome"] or "",
        )  # fmt: skip
    console.print(table)


def _short(moment: Any) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else ""


@click.command()
@click.argument("app_spec", metavar="APP")
@connection_options
@click.option(
    "--loop-interval", type=float, default=0.5, show_default=True, help="Seconds between passes."
)
@click.option("--leader-ttl", type=float, default=10.0, show_default=True, help="Leadership lease.")
@click.option("--log-level", default="INFO", show_default=True)
def scheduler(
    app_spec: str,
    url: str | None,
    namespace: str | None,
    loop_interval: float,
    leader_ttl: float,
    log_level: str,
) -> None:
    """Run APP's periodic scheduler alone (workers run one too, unless --no-scheduler)."""
    import signal

    from .cli import _setup_logging
    from .scheduler import Scheduler

    _setup_logging(log_level)
    app = _make_app(app_spec, url, namespace)
    try:
        runner = Scheduler(app, loop_interval=loop_interval, leader_ttl=leader_ttl)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with app:
            click.echo(
                f"scheduler {runner.holder}: {len(app.declared_schedules)} declared schedules",
                err=True,
            )
            await runner.run(stop)

    asyncio.run(main())


@click.group()
def task() -> None:
    """Follow one task by its id: status, result, cancel."""


def _task_app(url: str | None, namespace: str | None, app_spec: str | None) -> Tether:
    return _make_app(app_spec, url, namespace)


@task.command("status")
@click.argument("task_id")
@task_options
def task_status(task_id: str, app_spec: str | None, url: str | None, namespace: str | None) -> None:
    """Print the task's status (queued, scheduled, running, succeeded, ...)."""
    from ._errors import TetherError

    app = _task_app(url, namespace, app_spec)
    try:
        status = _run(app, lambda a: a.handle(task_id).status())
    except TetherError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(status.value)


@task.command("result")
@click.argument("task_id")
@task_options
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
    from ._errors import ResultTimeout, TaskFailed, TetherError

    app = _task_app(url, namespace, app_spec)
    try:
        value = _run(app, lambda a: a.handle(task_id).result(timeout=timeout or 0.001))
    except TaskFailed as failed:
        click.echo(f"{failed.status}: {failed.error_type}: {failed.error_message}", err=True)
        if failed.traceback:
            click.echo(failed.traceback, err=True)
        sys.exit(1)
    except ResultTimeout:
        raise click.ClickException(f"task {task_id} has no result yet") from None
    except TetherError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(value))


@task.command("cancel")
@click.argument("task_id")
@task_options
def task_cancel(task_id: str, app_spec: str | None, url: str | None, namespace: str | None) -> None:
    """Cancel a queued, scheduled or running task."""
    from ._errors import TetherError

    app = _task_app(url, namespace, app_spec)
    try:
        done = _run(app, lambda a: a.handle(task_id).cancel())
    except TetherError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo("cancelled" if done else "already finished")
