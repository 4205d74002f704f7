"""The floor: the least a Redis Streams queue can do with redis-py asyncio.

Enqueue is one awaited XADD per task (a pipeline of XADDs for the batch phase). The worker
reads up to ``concurrency`` entries with XREADGROUP, runs their bodies at once, then
acknowledges and deletes the batch in one pipelined XACK + XDEL. No envelope, no leases, no
retries, no recovery: whatever a real queue costs above this is the price of its promises.

Run as a worker with ``python -m bench.systems.floor <name>``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Sequence

import redis.asyncio
from redis.exceptions import ResponseError

from .. import body
from .base import Adapter as Base

GROUP = "floor"
STREAM = f"bench:{body.CONFIG.tag}:floor"


async def create_group(client: redis.asyncio.Redis) -> None:
    try:
        await client.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


class Adapter(Base):
    batch = True

    async def open(self) -> None:
        self.client = redis.asyncio.Redis.from_url(self.config.url)
        await create_group(self.client)

    async def close(self) -> None:
        await self.client.aclose()

    async def enqueue(self, i: int) -> None:
        await self.client.xadd(STREAM, {"i": i})

    async def enqueue_many(self, items: Sequence[int]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for i in items:
            pipe.xadd(STREAM, {"i": i})
        await pipe.execute()

    def worker_argv(self, name: str) -> list[str]:
        return [sys.executable, "-m", __name__, name]


async def work(consumer: str) -> None:
    client = redis.asyncio.Redis.from_url(body.CONFIG.url)
    await create_group(client)
    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    await body.mark_ready()
    while not stopping.is_set():
        # Block at most 1 s so a SIGTERM is noticed on an idle queue.
        reply = await client.xreadgroup(
            GROUP, consumer, {STREAM: ">"}, count=body.CONFIG.concurrency, block=1000
        )
        if not reply:
            continue
        entries = reply[0][1]
        await asyncio.gather(*(body.run(int(fields[b"i"])) for _, fields in entries))
        ids = [entry_id for entry_id, _ in entries]
        pipe = client.pipeline(transaction=False)
        pipe.xack(STREAM, GROUP, *ids)
        pipe.xdel(STREAM, *ids)
        await pipe.execute()
    await client.aclose()


if __name__ == "__main__":
    asyncio.run(work(sys.argv[1]))
