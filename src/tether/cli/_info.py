"""``tether info``: every known queue's figures and the fleet, in one command."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click
from rich.table import Table

from ._app_argument import APP_HELP, app_argument
from ._common import connection_options, console, open_app, run

if TYPE_CHECKING:
    from .._app import Tether
    from ..admin import Overview


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


@click.command(epilog=APP_HELP)
@app_argument()
@connection_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def info(app_spec: str | None, url: str | None, namespace: str | None, as_json: bool) -> None:
    """Per queue: waiting per priority, running, delayed, dead, the age of the oldest
    waiting entry, paused, live workers; and the fleet's live workers and scheduler leader.

    Queues are those the workers serve (and have served lately), those paused, and those
    the app's tasks name."""
    app = open_app(app_spec, url, namespace)

    async def work(a: Tether) -> Overview:
        return await a.stats.overview()

    overview = run(app, work)
    if as_json:
        click.echo(json.dumps(overview.to_dict()))
        return
    table = Table(title=f"namespace {app.namespace!r} at {app.target.redacted}")
    columns = ("queue", "high", "normal", "low", "running", "delayed", "dead", "oldest waiting")
    for column in (*columns, "paused", "workers"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    for q in overview.queues:
        table.add_row(
            q.name, str(q.waiting["high"]), str(q.waiting["normal"]), str(q.waiting["low"]),
            str(q.running), str(q.delayed), str(q.dead), _age(q.oldest_waiting_s),
            "yes" if q.paused else "", str(q.workers),
        )  # fmt: skip
    if overview.queues:
        console.print(table)
    else:
        click.echo(f"no known queues in namespace {app.namespace!r}")
    leader = overview.scheduler_leader or "none"
    click.echo(f"live workers: {overview.workers}; scheduler leader: {leader}")
