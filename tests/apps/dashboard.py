"""Tasks for the dashboard's browser tests: ones that succeed, fail, hold their worker, and
one that fails its first run and succeeds after (a dead letter that a retry fixes), on two
queues, with a schedule. Worker processes use ``app`` (TETHER_URL and TETHER_NAMESPACE);
a test declares the same tasks on an app of its own with :func:`fresh`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import redis.asyncio

from tether import Task, Tether


@dataclass(frozen=True)
class Dash:
    app: Tether
    ok: Task[[int], int]
    fail: Task[[int], None]
    hold: Task[[float], str]
    fragile: Task[[str], str]
    send: Task[[str], str]
    report: Task[[], str]


def declare(app: Tether) -> Dash:
    @app.task(name="dash.ok")
    async def ok(i: int) -> int:
        return i

    @app.task(name="dash.fail")
    async def fail(i: int) -> None:
        raise ValueError(f"card declined for order {i}")

    @app.task(name="dash.hold")
    async def hold(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "held"

    @app.task(name="dash.fragile", retries=0)
    async def fragile(key: str) -> str:
        """Fails its first run (counted in ``key``), succeeds at every run after."""
        client = redis.asyncio.Redis.from_url(app.settings.url)
        try:
            runs = await client.incr(key)
        finally:
            await client.aclose()
        if runs == 1:
            raise RuntimeError("the first run fails")
        return f"fixed at run {runs}"

    @app.task(name="dash.send", queue="mail")
    async def send(to: str) -> str:
        return f"sent to {to}"

    @app.periodic(cron="0 3 * * *", name="nightly-report")
    @app.task(name="dash.report")
    async def report() -> str:
        return "reported"

    return Dash(app, ok, fail, hold, fragile, send, report)


def fresh(url: str, namespace: str, **options: Any) -> Dash:
    """The tasks on a new app of their own."""
    return declare(Tether(url, namespace=namespace, **options))


app = declare(Tether()).app
