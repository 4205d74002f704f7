"""Tasks for the metrics tests' worker processes: each outcome a worker can count. The app
reads TETHER_URL and TETHER_NAMESPACE."""

from __future__ import annotations

import asyncio

from tether import Backoff, Tether, current_task
from tether.base._redis import AsyncClient, async_client, parse_url

app = Tether()

_client: AsyncClient | None = None


def _redis() -> AsyncClient:
    global _client
    if _client is None:
        _client = async_client(parse_url(app.settings.url), socket_timeout=10, connect_timeout=5)
    return _client


def started_key() -> str:
    return f"{app.namespace}:started"


@app.task(name="obs.ok")
async def ok(i: int) -> int:
    return i


@app.task(name="obs.flaky", retries=1, backoff=Backoff(base=0.01, jitter=0))
def flaky() -> None:
    """Fails every attempt: one retried, then failed (a plain function: in a thread)."""
    raise ValueError("always")


@app.task(name="obs.slow", timeout=0.05)
async def slow() -> None:
    await asyncio.sleep(5)


@app.task(name="obs.hold")
async def hold() -> str:
    """Runs until its worker is killed; a reclaimed run returns at once."""
    if current_task().deliveries > 1:
        return "again"
    await _redis().rpush(started_key(), "1")
    await asyncio.sleep(60)
    return "never"


@app.task(name="obs.nap")
async def nap() -> str:
    """Naps two seconds on its first delivery (long enough to be claimed from a frozen
    worker); a reclaimed run returns at once."""
    if current_task().deliveries > 1:
        return "again"
    await _redis().rpush(started_key(), "1")
    await asyncio.sleep(2)
    return "first"
