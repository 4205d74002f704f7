"""``tether check``: is the named worker alive? For orchestrators' liveness probes.

A worker is alive while it holds its lease on every queue it serves: the heartbeat thread
renews the leases every ``heartbeat_interval`` and stops when the event loop has stalled for
``stall_timeout``, so a lease that is gone means the worker died, stopped, or hangs."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from ._app_argument import APP_HELP, app_argument
from ._common import connection_options, open_app, run
from ._dead import describe_where

if TYPE_CHECKING:
    from .._app import Tether


@click.command(epilog=APP_HELP)
@app_argument()
@click.option("--name", required=True, help="The worker's name (its --name, e.g. the pod name).")
@click.option(
    "-q",
    "--queues",
    default=None,
    help="Queues it serves, comma-separated; default: those its registry record names, "
    "else 'default'.",
)
@connection_options
def check(
    name: str,
    queues: str | None,
    app_spec: str | None,
    url: str | None,
    namespace: str | None,
) -> None:
    """Check that a worker is alive, for liveness probes: exit 0 while the worker --name
    holds its lease on each of its queues, 1 once a lease is gone (the worker is dead,
    stopped, or its event loop stalled), naming what is missing."""
    from ..protocol._keys import registry_keys
    from ..worker._server import EVICTION_WARNING, eviction_policy

    app = open_app(app_spec, url, namespace)
    typed = tuple(q.strip() for q in (queues or "").split(",") if q.strip())

    async def work(a: Tether) -> tuple[tuple[str, ...], list[int], str | None]:
        served = typed
        if not served:
            _, prefix = registry_keys(a.namespace)
            raw = await a.client.get(prefix + name)
            record = json.loads(raw) if raw else {}
            served = tuple(record.get("queues") or ("default",))
        ttls = [int(await a.client.pttl(a.keys(q).lease(name))) for q in served]
        return served, ttls, await eviction_policy(a.client)

    served, ttls, policy = run(app, work)
    if policy is not None:
        # Not a liveness failure, but the one setting under which tasks vanish silently.
        click.echo(f"warning: {EVICTION_WARNING.format(policy=policy)}", err=True)
    missing = [q for q, ttl in zip(served, ttls, strict=True) if ttl == -2]  # no such key
    if missing:
        click.echo(
            f"worker {name} holds no lease on queue {', '.join(missing)} ({describe_where(app)}): "
            "it is dead, stopped, or stalled",
            err=True,
        )
        sys.exit(1)
    soonest = min(ttl for ttl in ttls if ttl >= 0) / 1000 if max(ttls) >= 0 else 0.0
    click.echo(
        f"worker {name} is alive: it holds its lease on queue {', '.join(served)} "
        f"(renewed; the soonest expires in {soonest:.1f}s)"
    )
