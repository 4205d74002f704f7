"""``tether schedules`` (list and control) and ``tether scheduler`` (run one alone)."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table

from ._app_argument import app_argument
from ._common import connection_options, console, log_level_option, open_app, run, setup_logging

if TYPE_CHECKING:
    from .._app import Tether
    from ..scheduler._control import ScheduleInfo, Schedules, TickRecord


@click.command()
@app_argument(required=True)
@connection_options
@click.option("--pause", "to_pause", multiple=True, metavar="NAME", help="Pause a schedule.")
@click.option("--resume", "to_resume", multiple=True, metavar="NAME", help="Resume a schedule.")
@click.option("--trigger", "to_trigger", multiple=True, metavar="NAME", help="Enqueue a run now.")
@click.option(
    "--remove", "to_remove", multiple=True, metavar="NAME", help="Remove a runtime schedule."
)
@click.option(
    "--reset-backoff",
    "to_reset",
    multiple=True,
    metavar="NAME",
    help="End a schedule's failure backoff: its next tick runs.",
)
@click.option(
    "--ticks",
    "ticks_of",
    metavar="NAME",
    help="Show a schedule's latest ticks and run outcomes (its tick log) instead of the list.",
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
    to_reset: tuple[str, ...],
    ticks_of: str | None,
    as_json: bool,
) -> None:
    """List APP's schedules with their next run, last run, last outcome, failure backoff and
    last error, and the leader; pause, resume, trigger, reset a backoff or remove
    schedules."""
    from ..scheduler._control import describe

    app = open_app(app_spec, url, namespace)
    if ticks_of is not None:
        _print_ticks(app, ticks_of, as_json)
        return

    async def work(
        a: Tether,
    ) -> tuple[list[str], str | None, list[ScheduleInfo], dict[str, str]]:
        control = a.schedules
        done = await _apply(control, to_pause, to_resume, to_trigger, to_remove, to_reset)
        return done, await control.leader(), await control.list(), await control.invalid()

    done, leader, infos, invalid = run(app, work)
    for line in done:
        click.echo(line)
    if as_json:
        for info in infos:
            click.echo(json.dumps(describe(info)))
        for name, reason in invalid.items():
            click.echo(json.dumps({"name": name, "invalid": reason}))
        return
    table = Table(title=f"schedules (leader: {leader or 'none'})")
    columns = ("name", "task", "when", "source", "state", "next run (UTC)", "last run (UTC)")
    for column in (*columns, "last outcome", "backoff", "last error"):
        table.add_column(column, overflow="fold")
    for info in infos:
        row = describe(info)
        table.add_row(
            row["name"], row["task"], row["spec"], row["source"],
            "paused" if info.paused else "active",
            _short(info.next_run), _short(info.last_run), row["last_outcome"] or "",
            _backoff_text(info), info.error or "",
        )  # fmt: skip
    for name, reason in invalid.items():
        table.add_row(name, "", "", "runtime", "invalid", "", "", "", "", reason)
    console.print(table)


async def _apply(
    control: Schedules,
    to_pause: tuple[str, ...],
    to_resume: tuple[str, ...],
    to_trigger: tuple[str, ...],
    to_remove: tuple[str, ...],
    to_reset: tuple[str, ...] = (),
) -> list[str]:
    done: list[str] = []
    for name in to_pause:
        await control.pause(name)
        done.append(f"paused {name}")
    for name in to_resume:
        await control.resume(name)
        done.append(f"resumed {name}")
    for name in to_trigger:
        handle, rest = await control.trigger_run(name)
        line = f"triggered {name}: {handle.id}"
        if rest is not None:
            line += (
                f" (through its backoff: {rest.failures} failed in a row, resting until "
                f"{_short(rest.until)} UTC)"
            )
        done.append(line)
    for name in to_reset:
        reset = await control.reset_backoff(name)
        done.append(
            f"backoff of {name} ended: its next tick runs"
            if reset
            else f"{name} was not in backoff"
        )
    for name in to_remove:
        removed = await control.remove(name)
        done.append(f"removed {name}" if removed else f"no runtime schedule {name}")
    return done


def _short(moment: Any) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else ""


def _backoff_text(info: ScheduleInfo) -> str:
    state = info.backoff
    if state is None:
        return ""
    runs = f"{state.failures} failed in a row"
    if state.resting():
        return f"{runs}; skipped until {_short(state.until)}"
    return runs


def _print_ticks(app: Tether, name: str, as_json: bool) -> None:
    async def read(a: Tether) -> list[TickRecord]:
        return await a.schedules.ticks(name, 100)

    records = run(app, read)
    if as_json:
        for r in records:
            click.echo(json.dumps({
                "at": r.at.isoformat(), "tick": r.tick.isoformat() if r.tick else None,
                "outcome": r.outcome, "task_id": r.task_id, "failures": r.failures,
                "until": r.until.isoformat() if r.until else None,
            }))  # fmt: skip
        return
    table = Table(title=f"ticks of {name}, newest first")
    for column in ("recorded (UTC)", "tick (UTC)", "outcome", "task", "backoff"):
        table.add_column(column, overflow="fold")
    for r in records:
        backoff = ""
        if r.failures is not None and r.until is not None:
            backoff = f"{r.failures} failed in a row; until {_short(r.until)}"
        table.add_row(
            _short(r.at), _short(r.tick) or "by hand", r.outcome, r.task_id or "", backoff
        )
    console.print(table)


@click.command()
@app_argument(required=True)
@connection_options
@click.option(
    "--loop-interval", type=float, default=0.5, show_default=True, help="Seconds between passes."
)
@click.option("--leader-ttl", type=float, default=10.0, show_default=True, help="Leadership lease.")
@log_level_option
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

    from ..scheduler import Scheduler

    setup_logging(log_level)
    app = open_app(app_spec, url, namespace)
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
