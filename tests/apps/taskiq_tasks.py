"""taskiq tasks for the ``taskiq worker`` processes the tests start. The broker is configured
from the environment: TETHER_URL and TETHER_NAMESPACE, and TQ_BROKER, a JSON object of
TetherBroker options. Every task records what it did under the namespace."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

from taskiq import SimpleRetryMiddleware

from tether.base._redis import AsyncClient, async_client
from tether.contrib.taskiq import TetherBroker, current_delivery

broker = TetherBroker(**json.loads(os.environ.get("TQ_BROKER", "{}"))).with_middlewares(
    SimpleRetryMiddleware(default_retry_count=3)
)

_client: AsyncClient | None = None


def _redis() -> AsyncClient:
    global _client
    if _client is None:
        _client = async_client(broker.core.target, socket_timeout=10, connect_timeout=5)
    return _client


def _line(tag: str) -> str:
    delivery = current_delivery()
    deliveries = delivery.deliveries if delivery is not None else 0
    return f"{tag}|{os.getpid()}|{deliveries}|{time.time():.6f}"


async def _note(kind: str, tag: str) -> None:
    await _redis().rpush(f"{broker.namespace}:{kind}", _line(tag))


@broker.task(task_name="record")
async def record(tag: str) -> str:
    await _note("runs", tag)
    return tag


@broker.task(task_name="slow")
async def slow(tag: str, seconds: float) -> str:
    await _note("starts", tag)
    await asyncio.sleep(seconds)
    await _note("runs", tag)
    return tag


@broker.task(task_name="slow_then_slower")
async def slow_then_slower(tag: str, first: float, later: float) -> str:
    """Sleeps ``first`` seconds on its first delivery and ``later`` on any other: the worker
    that took it over still holds it when the first one finishes."""
    await _note("starts", tag)
    delivery = current_delivery()
    await asyncio.sleep(first if delivery is None or delivery.deliveries == 1 else later)
    await _note("runs", tag)
    return tag


@broker.task(task_name="gated")
async def gated(tag: str) -> str:
    """Runs until the test sets the key ``<namespace>:gate:<tag>`` (at most 60 s)."""
    await _note("starts", tag)
    deadline = time.monotonic() + 60
    while not await _redis().exists(f"{broker.namespace}:gate:{tag}"):
        assert time.monotonic() < deadline, "the gate never opened"
        await asyncio.sleep(0.02)
    await _note("runs", tag)
    return tag


@broker.task(task_name="hog")
async def hog(tag: str, seconds: float, cpu_seconds: float) -> str:
    """Runs ``seconds`` in all, blocking the event loop with CPU work for ``cpu_seconds``."""
    await _note("starts", tag)
    end = time.monotonic() + cpu_seconds
    while time.monotonic() < end:
        sum(i * i for i in range(1000))
    await asyncio.sleep(max(0.0, seconds - cpu_seconds))
    await _note("runs", tag)
    return tag


@broker.task(task_name="suicide")
async def suicide(tag: str) -> None:
    """Kills the worker process that runs it: a poison task."""
    await _note("starts", tag)
    os.kill(os.getpid(), signal.SIGKILL)


@broker.task(task_name="flaky", retry_on_error=True, max_retries=2)
async def flaky(tag: str, failures: int) -> str:
    """Fails its first ``failures`` runs (counted across retries and workers)."""
    await _note("starts", tag)
    if await _redis().incr(f"{broker.namespace}:flaky:{tag}") <= failures:
        raise RuntimeError(f"{tag} fails")
    await _note("runs", tag)
    return tag


@broker.task(task_name="exits")
async def exits(tag: str, code: int) -> None:
    """Calls ``sys.exit(code)``: the attempt fails, the worker process serves on."""
    await _note("starts", tag)
    sys.exit(code)


@broker.task(task_name="exits_sync")
def exits_sync(tag: str, code: int) -> None:
    """The same in a sync task, which taskiq runs on a thread of its executor."""
    sys.exit(code)


@broker.task(task_name="interrupted")
async def interrupted(tag: str) -> None:
    await _note("starts", tag)
    raise KeyboardInterrupt(tag)


@broker.task(task_name="interrupted_sync")
def interrupted_sync(tag: str) -> None:
    raise KeyboardInterrupt(tag)
