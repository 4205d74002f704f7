"""The tasks `tether demo` runs: a mix of async and sync work at every priority.

Each task counts its completion in Redis, so the demo can show progress without storing
results.
"""

from __future__ import annotations

import hashlib
import os

import redis.asyncio

from .. import Tether

app = Tether()

_counter: redis.asyncio.Redis | None = None


def _done_key() -> str:
    return f"{{{app.namespace}:demo}}:done"


async def _count() -> None:
    global _counter
    if _counter is None:
        _counter = redis.asyncio.Redis.from_url(os.environ.get("TETHER_URL", app.settings.url))
    await _counter.incr(_done_key())


@app.task(queue="demo", store_result=False)
async def greet(name: str) -> str:
    """An I/O-bound task: one round trip to the server."""
    await _count()
    return f"hello {name}"


@app.task(queue="demo", priority="high", store_result=False)
async def urgent_ping(n: int) -> int:
    await _count()
    return n


@app.task(queue="demo", priority="low", store_result=False)
def checksum(data: str, rounds: int) -> str:
    """A CPU-bound sync task: runs in the worker's thread pool, never on its event loop."""
    digest = data.encode()
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    import redis as sync_redis

    client = sync_redis.Redis.from_url(os.environ.get("TETHER_URL", app.settings.url))
    try:
        client.incr(_done_key())
    finally:
        client.close()
    return digest.hex()
