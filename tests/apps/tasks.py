"""Tasks for worker processes started by the tests. The app reads TETHER_URL and
TETHER_NAMESPACE; every task records what it did under the namespace."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time

from tether import Tether, current_task
from tether.base._redis import AsyncClient, async_client, parse_url

app = Tether()

_client: AsyncClient | None = None


def _redis() -> AsyncClient:
    global _client
    if _client is None:
        _client = async_client(parse_url(app.settings.url), socket_timeout=10, connect_timeout=5)
    return _client


def runs_key() -> str:
    return f"{app.namespace}:runs"


def starts_key() -> str:
    return f"{app.namespace}:starts"


def _line(tag: str) -> str:
    return f"{tag}|{os.getpid()}|{current_task().deliveries}|{time.time():.6f}"


async def _note(key: str, tag: str) -> None:
    await _redis().rpush(key, _line(tag))


@app.task
async def record(tag: str) -> str:
    await _note(runs_key(), tag)
    return tag


@app.task
async def fan_out(tag: str, children: int) -> list[str]:
    """Enqueues ``children`` tasks through the app and waits for their results, as a task
    that starts others does."""
    handles = await record.enqueue_many([(f"{tag}.{i}",) for i in range(children)])
    return [await h.result(timeout=20) for h in handles]


@app.task
async def headers(tag: str) -> dict[str, str]:
    """Returns the headers the producer's middleware sent with the task."""
    await _note(runs_key(), tag)
    return dict(current_task().headers)


@app.task(queue="other")
async def record_other(tag: str) -> str:
    await _note(runs_key(), tag)
    return tag


@app.task
async def slow(tag: str, seconds: float) -> str:
    await _note(starts_key(), tag)
    await asyncio.sleep(seconds)
    await _note(runs_key(), tag)
    return f"{tag}|{os.getpid()}"


@app.task
async def slow_then_slower(tag: str, first: float, later: float) -> str:
    """Sleeps ``first`` seconds on its first delivery and ``later`` on any other: the worker
    that took it over still holds it when the first one finishes."""
    await _note(starts_key(), tag)
    await asyncio.sleep(first if current_task().deliveries == 1 else later)
    await _note(runs_key(), tag)
    return f"{tag}|{os.getpid()}"


@app.task
async def gated(tag: str) -> str:
    """Runs until the test sets the key ``<namespace>:gate:<tag>`` (at most 60 s): a task that
    is surely still running when the test acts, however slow the machine."""
    await _note(starts_key(), tag)
    deadline = time.monotonic() + 60
    while not await _redis().exists(f"{app.namespace}:gate:{tag}"):
        assert time.monotonic() < deadline, "the gate never opened"
        await asyncio.sleep(0.02)
    await _note(runs_key(), tag)
    return f"{tag}|{os.getpid()}"


@app.task
async def hog(tag: str, seconds: float, cpu_seconds: float) -> str:
    """Runs ``seconds`` in all, blocking the event loop with CPU work for ``cpu_seconds``."""
    await _note(starts_key(), tag)
    end = time.monotonic() + cpu_seconds
    while time.monotonic() < end:
        sum(i * i for i in range(1000))
    await asyncio.sleep(max(0.0, seconds - cpu_seconds))
    await _note(runs_key(), tag)
    return tag


@app.task
async def suicide(tag: str) -> None:
    """Kills the worker that runs it: a poison task."""
    await _note(starts_key(), tag)
    os.kill(os.getpid(), signal.SIGKILL)


@app.task
async def exits(tag: str, how: str) -> None:
    """Ends the way a task's own code may try to end the process: ``sys.exit(3)`` (how
    'exit'), ``raise KeyboardInterrupt`` ('interrupt') or another BaseException ('base')."""
    await _note(starts_key(), tag)
    _leave(how)


@app.task
def exits_sync(tag: str, how: str) -> None:
    """:func:`exits` in a plain function (the worker's threads)."""
    import redis

    client = redis.Redis.from_url(app.settings.url)
    try:
        client.rpush(starts_key(), _line(tag))
    finally:
        client.close()
    _leave(how)


@app.task(retry_on=(SystemExit,), backoff=lambda _attempt: 0.0)
async def exits_retried(tag: str) -> None:
    """``sys.exit(3)``, in a task that retries on SystemExit."""
    await _note(starts_key(), tag)
    sys.exit(3)


class _Escape(BaseException):
    """An exception outside Exception that is neither SystemExit nor KeyboardInterrupt."""


def _leave(how: str) -> None:
    if how == "exit":
        sys.exit(3)
    if how == "interrupt":
        raise KeyboardInterrupt
    raise _Escape("left through a BaseException")


@app.task
def sync_record(tag: str) -> str:
    import redis

    client = redis.Redis.from_url(app.settings.url)
    try:
        client.rpush(runs_key(), _line(tag))
    finally:
        client.close()
    return tag


@app.task
async def deadlock(tag: str) -> str:
    """Blocks the event loop for good, as a deadlocked worker would."""
    await _note(starts_key(), tag)
    time.sleep(3600)  # noqa: ASYNC251 - blocking the loop is the point
    return tag
