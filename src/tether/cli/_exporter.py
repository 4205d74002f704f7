"""``tether exporter``: the deployment's Prometheus metrics on a port of their own
(``pip install 'tether-queue[metrics]'``), for deployments that do not run ``tether web``."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import TYPE_CHECKING

import click

from ._app_argument import app_argument
from ._common import connection_options, log_level_option, open_app, setup_logging

if TYPE_CHECKING:
    from ..metrics import Exporter

MIN_TOKEN_LENGTH = 16
"""As for ``tether web``: a token short enough to guess protects nothing."""


@click.command()
@app_argument()
@click.option("--port", type=click.IntRange(0, 65535), required=True, help="Port to listen on.")
@click.option(
    "--bind",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on; beyond the loopback interface a token is required.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    help="A file whose first line is the token scrapes must send (else TETHER_WEB_TOKEN). "
    "On a loopback address without either, scrapes need no token.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(0.1, 60),
    default=8.0,
    show_default=True,
    help="Seconds a scrape may spend reading Redis before it answers tether_up 0.",
)
@log_level_option
@connection_options
def exporter(
    app_spec: str | None,
    port: int,
    bind: str,
    token_file: str | None,
    timeout: float,
    log_level: str,
    url: str | None,
    namespace: str | None,
) -> None:
    """Serve the deployment metrics of APP (module:attribute; optional: without it, the
    server and namespace of --url/--namespace) at http://BIND:PORT/metrics until SIGTERM or
    SIGINT: queue depth per priority, running, delayed, dead letters, the age of the oldest
    waiting task, live workers per queue, the scheduler leader, read from Redis at each
    scrape (tether_up 0 when it cannot be read).

    A token (TETHER_WEB_TOKEN or --token-file) makes every scrape send 'Authorization:
    Bearer <token>' (Prometheus: the authorization setting of the scrape config). Beyond the
    loopback interface it is required; on loopback it is optional."""
    from ..base._errors import ConfigError
    from ..base._settings import check_host
    from ._bind import is_loopback, read_token

    try:  # a refused address or token is said before anything heavy is imported
        check_host("--bind", bind)
        token = read_token(token_file)
        if token is not None and len(token) < MIN_TOKEN_LENGTH:
            raise ConfigError(f"the token must be at least {MIN_TOKEN_LENGTH} characters")
        if token is None and not is_loopback(bind):
            raise ConfigError(
                f"refusing to serve metrics on {bind} without a token: set TETHER_WEB_TOKEN "
                "or give --token-file (only a loopback address may go without)"
            )
        from ..metrics import Exporter

        app = open_app(app_spec, url, namespace)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except ImportError as exc:
        why = f"tether exporter needs prometheus-client ({exc})"
        raise click.ClickException(f"{why}: pip install 'tether-queue[metrics]'") from None
    setup_logging(log_level)
    asyncio.run(_serve(Exporter(app, port=port, host=bind, token=token, timeout=timeout)))


async def _serve(exporter: Exporter) -> None:
    """Serve until the first SIGTERM or SIGINT (the CLI owns the process's signals)."""
    log = logging.getLogger("tether.metrics")
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with exporter:
            log.info(
                "serving the metrics of namespace %r at %s%s",
                exporter.app.namespace, exporter.url,
                "" if exporter.token is None else " (scrapes must send the token)",
            )  # fmt: skip
            await stop.wait()
            log.info("stopping")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
