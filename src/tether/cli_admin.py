"""Admin commands: the dead-letter stream (``tether dead``)."""

from __future__ import annotations

import asyncio
import json
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
def schedules() -> None:
    """List periodic schedules."""


@click.command()
def scheduler() -> None:
    """Run the scheduler alone."""
