"""The task body every system runs, and the start-up hook that says a worker is ready.

The body is one awaited round trip to the server through one client shared by the whole
worker process (redis-py asyncio, created on first use), so the work per task is identical
for every system and small enough that the queue's own overhead dominates.
"""

from __future__ import annotations

import time

import redis.asyncio

from .config import Config

CONFIG = Config.from_env()
_client: redis.asyncio.Redis | None = None


def client() -> redis.asyncio.Redis:
    global _client
    if _client is None:
        _client = redis.asyncio.Redis.from_url(CONFIG.counter_url)
    return _client


async def run(i: int) -> None:
    """A task ``i >= 0`` increments the done counter. A latency probe (``i = -(k + 1)``)
    records when it started instead, so the driver can compute enqueue-to-start."""
    if i >= 0:
        await client().incr(CONFIG.done_key)
    else:
        started = time.time()
        await client().rpush(CONFIG.starts_key, f"{-i - 1} {started!r}")


async def mark_ready() -> None:
    """Called from each peer's documented start-up hook, just before it starts consuming."""
    await client().incr(CONFIG.ready_key)
