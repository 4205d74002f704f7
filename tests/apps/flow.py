"""Limited tasks for the flow-control tests' worker processes. The app reads TETHER_URL and
TETHER_NAMESPACE; every task records its start (and end) on the server's clock, so overlaps
and rates are measured on one clock whatever the processes do."""

from __future__ import annotations

import asyncio
import os

from tether import Tether, current_task
from tether.base._redis import AsyncClient, async_client, parse_url

app = Tether()

_client: AsyncClient | None = None

# Push '<what>|<pid>|<server time, seconds>' in one step.
_NOTE = """
local t = redis.call('TIME')
redis.call('RPUSH', KEYS[1], ARGV[1] .. '|' .. string.format('%s.%06d', t[1], tonumber(t[2])))
"""


def _redis() -> AsyncClient:
    global _client
    if _client is None:
        _client = async_client(parse_url(app.settings.url), socket_timeout=10, connect_timeout=5)
    return _client


def events_key() -> str:
    return f"{{{app.namespace}:flow}}:events"


async def note(what: str) -> None:
    await _redis().eval(_NOTE, 1, events_key(), f"{what}|{os.getpid()}")  # type: ignore[misc]


@app.task(store_result=False)
async def warm_up(i: int, seconds: float) -> None:
    """Opens this worker's connection for the notes, so a first start is not late by it."""
    await note(f"warm|up|{i}")
    await asyncio.sleep(seconds)


@app.task(rate_limit="50/s", rate_burst=5, store_result=False)
async def paced(i: int) -> None:
    await note(f"start|paced|{i}")


@app.task(key_concurrency_limit=3, store_result=False)
async def keyed(key: str, i: int, seconds: float) -> None:
    await note(f"start|{key}|{i}")
    await asyncio.sleep(seconds)
    await note(f"end|{key}|{i}")


@app.task(concurrency_limit=2)
async def guarded(tag: str, first_seconds: float) -> str:
    """Runs ``first_seconds`` on its first delivery, at once when it is run again."""
    await note(f"start|guarded|{tag}")
    if current_task().deliveries == 1:
        await asyncio.sleep(first_seconds)
    await note(f"end|guarded|{tag}")
    return tag


@app.task(concurrency_limit=1)
async def exclusive(tag: str, seconds: float) -> str:
    await note(f"start|exclusive|{tag}")
    await asyncio.sleep(seconds)
    await note(f"end|exclusive|{tag}")
    return tag


@app.task(key_rate_limit="10/s", key_rate_burst=2, store_result=False)
async def key_paced(key: str, i: int) -> None:
    await note(f"start|{key}|{i}")


@app.task(rate_limit="1/m", store_result=False)
async def trickle(i: int) -> None:
    """One start a minute: the others wait for their times in the delayed set."""
    await note(f"start|trickle|{i}")


@app.task(rate_limit="10/s", key_rate_limit="1/s", store_result=False)
async def two_rates(key: str, i: int) -> None:
    """A task-wide rate and a per-key rate ten times slower."""
    await note(f"start|{key}|{i}")
