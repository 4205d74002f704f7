"""``tether dead``: list, show, retry and purge a queue's dead letters."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from ._common import F, connection_options, console, open_app, run

if TYPE_CHECKING:
    from .._app import Tether

# `dead show` prints payloads up to this many characters unless --full is given: a 10 MB
# payload would bury the reason and the traceback.
SHOWN_PAYLOAD = 2000


def queue_options(fn: F) -> F:
    fn = click.option("-q", "--queue", default="default", show_default=True, help="The queue.")(fn)
    return app_option(fn)


def app_option(fn: F) -> F:
    fn = click.option(
        "--app",
        "app_spec",
        default=None,
        metavar="APP",
        help="module:attribute of your app (for its serializer and URL); optional.",
    )(fn)
    return connection_options(fn)


@click.group()
def dead() -> None:
    """List, show, retry and purge a queue's dead-letter stream."""


@dead.command("list")
@queue_options
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
    app = open_app(app_spec, url, namespace)

    async def work(a: Tether) -> tuple[int, list[Any]]:
        letters = a.dead_letters(queue)
        return await letters.count(), await letters.list(count)

    total, entries = run(app, work)
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
@queue_options
@click.argument("entry_id")
@click.option("--full", is_flag=True, help=f"Print the whole payload (else {SHOWN_PAYLOAD} chars).")
def dead_show(
    app_spec: str | None,
    queue: str,
    url: str | None,
    namespace: str | None,
    entry_id: str,
    full: bool,
) -> None:
    """Show one entry: reason, error, traceback and the original payload."""
    app = open_app(app_spec, url, namespace)
    letter = run(app, lambda a: a.dead_letters(queue).show(entry_id)).to_dict()
    payload = letter["payload"]
    if not full and len(payload) > SHOWN_PAYLOAD:
        letter["payload"] = payload[:SHOWN_PAYLOAD]
        letter["payload_truncated"] = f"{len(payload)} characters in all; --full prints them"
    click.echo(json.dumps(letter, indent=2))


def _report(
    entry_ids: tuple[str, ...], work: Callable[[Tether, str], Any]
) -> Callable[[Tether], Any]:
    async def each(a: Tether) -> list[str]:
        from .._errors import TetherError

        out = []
        for entry_id in entry_ids:
            try:
                out.append(f"{entry_id}: {await work(a, entry_id)}")
            except TetherError as exc:
                out.append(f"{entry_id}: {exc}")
        return out

    return each


@dead.command("retry")
@queue_options
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
    if not entry_ids and not retry_all:
        raise click.UsageError("name entry ids, or give --all")
    app = open_app(app_spec, url, namespace)

    async def work(a: Tether) -> list[str]:
        letters = a.dead_letters(queue)
        ids = entry_ids
        if retry_all:
            listed = await letters.list(count=1_000_000, newest_first=False)
            ids = tuple(d.entry_id for d in listed)

        async def retry(_: Tether, entry_id: str) -> str:
            handle = await letters.retry(entry_id)
            return f"queued again as {handle.id}"

        lines: list[str] = await _report(ids, retry)(a)
        return lines

    for line in run(app, work):
        click.echo(line)


@dead.command("purge")
@queue_options
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
    app = open_app(app_spec, url, namespace)
    n = run(app, lambda a: a.dead_letters(queue).purge(list(entry_ids) or None))
    click.echo(f"deleted {n} entries")
