"""``tether demo``: a server, workers and a batch of tasks, end to end."""

from __future__ import annotations

import sys

import click


@click.command()
@click.option("--url", envvar="TETHER_URL", help="Use this server instead of an embedded one.")
@click.option(
    "--workers", type=int, default=2, show_default=True, help="Worker processes to start."
)
@click.option("--tasks", type=int, default=5000, show_default=True, help="Tasks to enqueue.")
@click.option(
    "--concurrency", type=int, default=32, show_default=True, help="Concurrency per worker."
)
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Give up after this many seconds.",
)
def demo(url: str | None, workers: int, tasks: int, concurrency: int, timeout: float) -> None:
    """Start a server (embedded unless --url), workers, and a batch of tasks; print the rate."""
    from ..demo import run_demo

    if workers < 1 or tasks < 1 or concurrency < 1:
        raise click.UsageError("--workers, --tasks and --concurrency must be 1 or more")
    sys.exit(
        run_demo(url=url, workers=workers, tasks=tasks, concurrency=concurrency, timeout=timeout)
    )
