"""Tasks for bench/promises.py. The app reads TETHER_URL and TETHER_NAMESPACE."""

from __future__ import annotations

import asyncio
import os
import time

import redis.asyncio

from tether import Tether, current_task

app = Tether()
_client: redis.asyncio.Redis | None = None


def client() -> redis.asyncio.Redis:
    global _client
    if _client is None:
        _client = redis.asyncio.Redis.from_url(os.environ["TETHER_URL"])
    return _client


async def note(key: str) -> None:
    seconds, micros = await client().time()
    ctx = current_task()
    await client().rpush(
        f"{app.namespace}:{key}", f"{ctx.task_id}|{os.getpid()}|{seconds + micros / 1e6:.6f}"
    )


@app.task
async def long(seconds: float) -> None:
    await note("starts")
    await asyncio.sleep(seconds)


@app.task(store_result=False)
async def noop() -> None: ...


@app.task
async def noop_with_result() -> int:
    return 1


@app.task(retries=1)
async def fails_once(marker: str) -> None:
    if current_task().attempt == 1:
        raise RuntimeError(marker)


@app.task(store_result=False)
async def on_time() -> None:
    await note("on_time")


@app.task(store_result=False)
async def tick() -> None:
    await note("ticks")


def wall() -> float:
    return time.time()
