"""An app that uses every part of Tether a deployment uses (tasks that succeed, fail, run
long; limits of every kind; a periodic schedule), for the test of the documented ACL rule. It
reads TETHER_URL and TETHER_NAMESPACE."""

from __future__ import annotations

import asyncio

from tether import Tether, current_task

app = Tether()


@app.task(retries=1, backoff=lambda attempt: 0.05, retry_on=(ValueError,))
async def work(n: int) -> int:
    if n < 0:
        raise ValueError(f"{n} is negative")
    return n * 2


@app.task
async def linger(seconds: float) -> str:
    # Says when it runs (a fetched entry may still wait to start), in a key of its queue's.
    await app.client.set(started_key(current_task().task_id), 1, px=60_000)
    await asyncio.sleep(seconds)
    return "done"


def started_key(task_id: str) -> str:
    return f"{app.keys('default').tag}:started:{task_id}"


@app.task(
    rate_limit="20/s",
    concurrency_limit=1,
    key_rate_limit="10/s",
    key_concurrency_limit=1,
)
async def limited(n: int) -> int:
    """Held back by each of its limits in turn: a worker parks it, reserves its start time,
    wakes it, and frees its slots (of dead workers too)."""
    await asyncio.sleep(0.05)
    return n


@app.periodic(every=0.5, name="beat")
@app.task
async def beat() -> None:
    return None
