"""Tasks for the management tests: ones that succeed, fail, fail then retry, and hold their
worker for a while, declared by :func:`declare` on any app (worker processes use ``app``,
reading TETHER_URL and TETHER_NAMESPACE; a test declares them again on its own apps, one
per event loop)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from tether import Backoff, Task, Tether


@dataclass(frozen=True)
class Ops:
    app: Tether
    ok: Task[[int], int]
    fail: Task[[int], None]
    flaky: Task[[int], None]
    hold: Task[[float], str]
    other: Task[[int], int]


def declare(app: Tether) -> Ops:
    @app.task(name="ops.ok")
    async def ok(i: int) -> int:
        return i

    @app.task(name="ops.fail")
    async def fail(i: int) -> None:
        raise ValueError(f"fail {i}")

    @app.task(name="ops.flaky", retries=1, backoff=Backoff(base=0.05, jitter=0))
    async def flaky(i: int) -> None:
        """Fails both attempts: one retry, then a failure."""
        raise ValueError(f"flaky {i}")

    @app.task(name="ops.hold")
    async def hold(seconds: float) -> str:
        await asyncio.sleep(seconds)
        return "held"

    @app.task(name="ops.other", queue="ops-b")
    async def other(i: int) -> int:
        return i

    @app.periodic(every=3600, name="hourly")
    @app.task(name="ops.hourly")
    async def hourly() -> str:
        return "tick"

    return Ops(app, ok, fail, flaky, hold, other)


def fresh(url: str, namespace: str, **options: Any) -> Ops:
    """The tasks on a new app of their own."""
    return declare(Tether(url, namespace=namespace, **options))


app = declare(Tether()).app
