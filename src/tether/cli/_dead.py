"""``tether dead``: list, show, retry and purge a queue's dead letters.

Entries are named by entry id (as ``list`` shows them) or by task id (as applications keep
them); a task id names its queue, so ``--queue`` may be left out."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource
from rich.table import Table

from ._app_argument import APP_HELP, app_argument
from ._common import F, connection_options, console, open_app, run

if TYPE_CHECKING:
    from .._app import Tether
    from ..dead import DeadLetter, DeadLetters

# `dead show` prints payloads up to this many characters unless --full is given: a 10 MB
# payload would bury the reason and the traceback.
SHOWN_PAYLOAD = 2000


def queue_options(fn: F) -> F:
    fn = click.option(
        "-q",
        "--queue",
        default="default",
        show_default=True,
        help="The queue (a task id names its own).",
    )(fn)
    return connection_options(fn)


def id_table(ids: dict[str, list[str]], columns: tuple[str, ...]) -> Table:
    """A table whose id columns never fold: an id must stay copyable whole."""
    table = Table()
    for column in columns:
        if column in ids:
            width = max((len(v) for v in ids[column]), default=0)
            table.add_column(column, no_wrap=True, min_width=max(width, len(column)))
        else:
            table.add_column(column, overflow="fold")
    return table


def describe_where(app: Tether) -> str:
    return f"namespace {app.namespace!r} on {app.target.redacted}"


@click.group()
def dead() -> None:
    """List, show, retry and purge a queue's dead-letter stream."""


@dead.command("list", epilog=APP_HELP)
@app_argument()
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
    click.echo(f"dead letters of queue {queue!r} ({describe_where(app)}): {total} in all")
    rows = [
        (
            d.entry_id,
            d.at.strftime("%Y-%m-%d %H:%M:%S") if d.at else "",
            d.status,
            d.task,
            d.task_id,
            d.reason,
        )
        for d in entries
    ]
    columns = ("entry", "at (UTC)", "status", "task", "task id", "reason")
    # The ids are kept whole (they are copied into other commands); the rest may fold.
    table = id_table({"entry": [r[0] for r in rows], "task id": [r[4] for r in rows]}, columns)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _queue_of(ctx: click.Context, queue: str, refs: tuple[str, ...]) -> str:
    """The queue the references live in: ``--queue`` when typed, else the one the task ids
    name (all the same), else the default."""
    from ..dead import check_reference, is_task_id
    from ..protocol._keys import queue_of_task_id

    for ref in refs:
        check_reference(ref)
    named = {queue_of_task_id(r) for r in refs if is_task_id(r)}
    if ctx.get_parameter_source("queue") == ParameterSource.COMMANDLINE or not named:
        return queue
    if len(named) > 1:
        raise click.UsageError(
            f"the task ids name several queues ({', '.join(sorted(named))}): one at a time"
        )
    return named.pop()


@dead.command("show", epilog=APP_HELP)
@app_argument(then="ref", then_metavar="ENTRY_OR_TASK_ID")
@queue_options
@click.argument("ref", metavar="ENTRY_OR_TASK_ID", required=False)
@click.option("--full", is_flag=True, help=f"Print the whole payload (else {SHOWN_PAYLOAD} chars).")
@click.option("--json", "as_json", is_flag=True, help="Print the entry as one JSON document.")
@click.pass_context
def dead_show(
    ctx: click.Context,
    /,
    app_spec: str | None,
    queue: str,
    url: str | None,
    namespace: str | None,
    ref: str,
    full: bool,
    as_json: bool,
) -> None:
    """Show one entry (by entry id, or the newest of a task id): reason, error, the
    traceback as it was printed, and the original payload."""
    queue = _queue_of(ctx, queue, (ref,))
    app = open_app(app_spec, url, namespace)
    letter = run(app, lambda a: a.dead_letters(queue).show(ref))
    shown = letter.to_dict()
    payload = shown["payload"]
    if not full and len(payload) > SHOWN_PAYLOAD:
        shown["payload"] = payload[:SHOWN_PAYLOAD]
        shown["payload_truncated"] = f"{len(payload)} characters in all; --full prints them"
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    _print_letter(letter, shown)


def _print_letter(letter: DeadLetter, shown: dict[str, Any]) -> None:
    error = dict(letter.error)
    trace = error.pop("traceback", "") or ""
    rows = [
        ("entry", letter.entry_id),
        ("task id", letter.task_id),
        ("task", letter.task),
        ("status", letter.status),
        ("reason", letter.reason),
        ("at", f"{letter.at:%Y-%m-%d %H:%M:%S} UTC" if letter.at else ""),
        ("deliveries", str(letter.deliveries)),
        ("stream", letter.stream),
    ]
    if error.get("type") or error.get("message"):
        rows.append(("error", f"{error.pop('type', '')}: {error.pop('message', '')}"))
    rows += [(key, json.dumps(value)) for key, value in error.items()]
    for key, value in rows:
        click.echo(f"{key + ':':<12}{value}")
    if trace:
        click.echo("traceback:")
        click.echo(trace.rstrip("\n"))
    note = shown.get("payload_truncated")
    click.echo(f"payload{f' ({note})' if note else ''}:")
    click.echo(shown["payload"])


@dead.command("retry", epilog=APP_HELP)
@app_argument(then="refs")
@queue_options
@click.argument("refs", nargs=-1, metavar="[ENTRY_OR_TASK_ID]...")
@click.option("--all", "retry_all", is_flag=True, help="Retry every entry of the queue.")
@click.pass_context
def dead_retry(
    ctx: click.Context,
    /,
    app_spec: str | None,
    queue: str,
    url: str | None,
    namespace: str | None,
    refs: tuple[str, ...],
    retry_all: bool,
) -> None:
    """Enqueue entries again as fresh attempts (same task id) and remove them from here.
    --all takes the entries present when it starts (one that fails again meanwhile stays),
    a page at a time, and prints each it could not retry. Exit status 1 when any of them
    could not be retried."""
    if not refs and not retry_all:
        raise click.UsageError("name entry ids or task ids, or give --all")
    if refs and retry_all:
        raise click.UsageError("name entry ids or task ids, or give --all, not both")
    queue = _queue_of(ctx, queue, refs)
    app = open_app(app_spec, url, namespace)

    async def work(a: Tether) -> int:
        letters = a.dead_letters(queue)
        if retry_all:
            return await _retry_every_entry(letters)
        return await _retry_each(letters, refs)

    if run(app, work):
        sys.exit(1)


async def _retry_every_entry(letters: DeadLetters) -> int:
    """Retry every entry by cursor, a line on stderr for each that failed, then the count:
    a page of entries at a time, so any number of them runs in the same memory. Returns
    how many failed."""
    from ..dead import Bulk, total_of

    def report(bulk: Bulk) -> None:
        for entry_id, why in bulk.failed.items():
            click.echo(f"{entry_id}: {why}", err=True)

    total = await total_of(letters.retry_all(), report)
    failed = f"; {total.failed} could not be retried" if total.failed else ""
    click.echo(f"retried {_entries(total.done)} of queue {letters.queue!r}{failed}")
    return total.failed


async def _retry_each(letters: DeadLetters, refs: tuple[str, ...]) -> int:
    """Retry the named entries, a line for each (on stderr for a failure): how many failed."""
    from ..base._errors import TetherError

    failed = 0
    for ref in refs:
        try:
            handle = await letters.retry(ref)
        except TetherError as exc:
            click.echo(f"{ref}: {exc}", err=True)
            failed += 1
        else:
            click.echo(f"{ref}: queued again as {handle.id}")
    return failed


def _entries(n: int) -> str:
    return f"{n} {'entry' if n == 1 else 'entries'}"


@dead.command("purge", epilog=APP_HELP)
@app_argument(then="refs")
@queue_options
@click.argument("refs", nargs=-1, metavar="[ENTRY_OR_TASK_ID]...")
@click.option("--yes", is_flag=True, help="Do not ask before deleting every entry.")
@click.pass_context
def dead_purge(
    ctx: click.Context,
    /,
    app_spec: str | None,
    queue: str,
    url: str | None,
    namespace: str | None,
    refs: tuple[str, ...],
    yes: bool,
) -> None:
    """Delete the named entries (a task id: all of its entries), or all of them: those
    present when it starts, a page at a time. Exit status 1 when a named one was not
    found."""
    queue = _queue_of(ctx, queue, refs)
    if not refs and not yes:
        click.confirm(f"delete every dead-letter entry of queue {queue!r}?", abort=True)
    app = open_app(app_spec, url, namespace)

    async def work(a: Tether) -> tuple[int, list[str]]:
        from ..dead import total_of

        letters = a.dead_letters(queue)
        if not refs:
            return (await total_of(letters.purge_all())).done, []
        deleted, missing = 0, []
        for ref in refs:
            n = await letters.purge([ref])
            deleted += n
            if not n:
                missing.append(ref)
        return deleted, missing

    deleted, missing = run(app, work)
    click.echo(f"deleted {_entries(deleted)}")
    for ref in missing:
        click.echo(f"{ref}: no such dead-letter entry in queue {queue!r}", err=True)
    if missing:
        sys.exit(1)
