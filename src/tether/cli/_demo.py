"""``tether demo``: a server, workers and a batch of tasks, end to end."""

from __future__ import annotations

import signal
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
@click.option(
    "--web",
    is_flag=True,
    help="Serve the dashboard during the demo (and after it, until Ctrl-C); print its address.",
)
@click.option(
    "--web-bind",
    default=None,
    help="host:port of the dashboard [default: 127.0.0.1:8080, or a free port if taken].",
)
def demo(
    url: str | None,
    workers: int,
    tasks: int,
    concurrency: int,
    timeout: float,
    web: bool,
    web_bind: str | None,
) -> None:
    """Start a server (embedded unless --url), workers, and a batch of tasks; print the rate.

    With --web, the dashboard of the demo's namespace is served while it runs; it stays up
    after the batch, with a trickle of tasks, until Ctrl-C. Its token is TETHER_WEB_TOKEN,
    or one generated for the run and printed."""
    from ..base._errors import ConfigError
    from ._bind import DEFAULT_BIND, parse_bind, read_token, resolve_token
    from ._demo_run import WebOptions, run_demo

    if workers < 1 or tasks < 1 or concurrency < 1:
        raise click.UsageError("--workers, --tasks and --concurrency must be 1 or more")
    options = None
    if web:
        try:
            host, port = parse_bind(web_bind or DEFAULT_BIND)
            token, _ = resolve_token(host, read_token(None))
            import tether.web  # noqa: F401  (the web extra, said before anything starts)
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None
        except ImportError as exc:
            raise click.ClickException(str(exc)) from None
        options = WebOptions(host, port, token, fallback=web_bind is None)
    # SIGTERM and a closed terminal's SIGHUP stop the demo as Ctrl-C does (asyncio.run turns
    # a SIGINT into a clean cancellation of what runs): every process it started is stopped
    # (they run in sessions of their own, out of the terminal's reach).
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: signal.raise_signal(signal.SIGINT))
    sys.exit(
        run_demo(
            url=url, workers=workers, tasks=tasks, concurrency=concurrency, timeout=timeout,
            web=options,
        )
    )  # fmt: skip
