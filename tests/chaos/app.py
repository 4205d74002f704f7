"""Tasks for the chaos suite's worker processes.

The app reads TETHER_URL and TETHER_NAMESPACE like any app. Each task counts its runs on a
*separate* server (CHAOS_RECORD_URL), which no fault touches, so every run is counted
exactly: a tag counted 0 times is a lost task, counted twice a duplicate.
"""

from __future__ import annotations

import asyncio
import os

import redis.asyncio

from tether import Retry, Tether, current_task

app = Tether(socket_timeout=float(os.environ.get("CHAOS_SOCKET_TIMEOUT", "10")))
"""CHAOS_SOCKET_TIMEOUT shortens how long the workers wait for a reply (a frozen server)."""

_record: redis.asyncio.Redis | None = None


def recorder() -> redis.asyncio.Redis:
    global _record
    if _record is None:
        _record = redis.asyncio.Redis.from_url(os.environ["CHAOS_RECORD_URL"])
    return _record


def runs_key(namespace: str) -> str:
    """Hash: tag -> runs completed."""
    return f"{namespace}:runs"


def starts_key(namespace: str) -> str:
    """Hash: tag -> runs started."""
    return f"{namespace}:starts"


def entries_key(namespace: str) -> str:
    """Hash: task id -> tag, for every task that ran (a tag with two ids was enqueued
    twice: a producer's retry, not a worker's duplicate)."""
    return f"{namespace}:entries"


async def _ran(tag: str) -> None:
    ns = app.namespace
    pipe = recorder().pipeline(transaction=False)
    pipe.hincrby(runs_key(ns), tag, 1)
    pipe.hset(entries_key(ns), current_task().task_id, tag)
    await pipe.execute()


def gate_key(namespace: str) -> str:
    """While this key is missing, gated tasks wait."""
    return f"{namespace}:gate"


@app.task(retries=0)
async def count(tag: str, seconds: float = 0.0) -> None:
    """Counts a start, waits ``seconds``, counts a run."""
    ns = app.namespace
    await recorder().hincrby(starts_key(ns), tag, 1)
    if seconds:
        await asyncio.sleep(seconds)
    await _ran(tag)


@app.task(retries=0)
async def gated(tag: str) -> None:
    """Counts a start, waits for the gate to open, counts a run."""
    ns = app.namespace
    await recorder().hincrby(starts_key(ns), tag, 1)
    while not await recorder().exists(gate_key(ns)):  # noqa: ASYNC110 - set by another process
        await asyncio.sleep(0.02)
    await _ran(tag)


@app.task(retries=0)
async def doomed(tag: str) -> None:
    """Counts a start, waits for the gate, and fails for good (to the dead letters)."""
    ns = app.namespace
    await recorder().hincrby(starts_key(ns), tag, 1)
    while not await recorder().exists(gate_key(ns)):  # noqa: ASYNC110 - set by another process
        await asyncio.sleep(0.02)
    raise RuntimeError(f"{tag} fails on purpose")


@app.task(retries=1)
async def flaky(tag: str) -> None:
    """Fails its first attempt after the gate opens (a retry in 0.5 s), then runs."""
    ns = app.namespace
    await recorder().hincrby(starts_key(ns), tag, 1)
    while not await recorder().exists(gate_key(ns)):  # noqa: ASYNC110 - set by another process
        await asyncio.sleep(0.02)
    if current_task().attempt == 1:
        raise Retry(delay=0.5)
    await _ran(tag)
