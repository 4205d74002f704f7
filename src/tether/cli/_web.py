"""``tether web``: serve the dashboard and the management API
(``pip install 'tether-queue[web]'``)."""

from __future__ import annotations

import gc
import logging

import click

from ._app_argument import app_argument
from ._bind import DEFAULT_BIND
from ._common import connection_options, log_level_option, open_app, setup_logging


@click.command()
@app_argument()
@click.option(
    "--bind",
    default=DEFAULT_BIND,
    show_default=True,
    help="host:port to listen on; beyond the loopback interface a token is required.",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    help="A file whose first line is the token (else TETHER_WEB_TOKEN; on a loopback "
    "address without either, a token is generated for the run and logged).",
)
@click.option("--read-only", is_flag=True, help="Answer 403 to every state-changing call.")
@log_level_option
@connection_options
def web(
    app_spec: str | None,
    bind: str,
    token_file: str | None,
    read_only: bool,
    log_level: str,
    url: str | None,
    namespace: str | None,
) -> None:
    """Serve the dashboard (at /) and the management API (under /api) of APP
    (module:attribute; optional: without it, the server and namespace of --url/--namespace)
    with uvicorn until interrupted.

    Every page and endpoint needs the token: 'Authorization: Bearer <token>' for scripts,
    the login page at /login for browsers. State-changing calls are logged (logger
    tether.web.audit). With the metrics extra, /metrics gives the deployment's queue gauges
    to Prometheus (bearer token; 'tether exporter' serves them alone)."""
    from ..base._errors import ConfigError
    from ._bind import TOKEN_ENV, parse_bind, read_token, resolve_token

    try:  # a refused address or token is said before anything heavy is imported
        host, port = parse_bind(bind)
        token, generated = resolve_token(host, read_token(token_file))
        from ..web import create_app

        app = open_app(app_spec, url, namespace)
        web_app = create_app(app, token=token, read_only=read_only)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    except ImportError as exc:
        raise click.ClickException(str(exc)) from None
    import uvicorn

    setup_logging(log_level)
    log = logging.getLogger("tether.web")
    if generated:
        log.warning("no token given (%s or --token-file): this run's token is %s", TOKEN_ENV, token)
    log.info(
        "serving the Tether dashboard and API of namespace %r on http://%s:%d%s",
        app.namespace, f"[{host}]" if ":" in host else host, port,
        " (read-only)" if read_only else "",
    )  # fmt: skip
    # What is loaded by now lives as long as the process: frozen, out of the collector's
    # sight, a full collection no longer walks it (10 to 15 ms instead of about 150 on the
    # 2-core reference machine, paid by one refresh in fifteen of an overview of 50 queues:
    # bench/dashboard.py).
    gc.freeze()
    uvicorn.run(web_app, host=host, port=port, log_level=log_level.lower(), server_header=False)
