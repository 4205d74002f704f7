"""Tether: ``task.enqueue`` / ``task.enqueue_many``, and the ``tether worker`` CLI."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import redis.asyncio

from tether import Tether

from .. import body
from .base import Adapter as Base

QUEUE = "default"

app = Tether(body.CONFIG.url, namespace=body.CONFIG.tag)


@app.task(store_result=False)
async def noop(i: int) -> None:
    await body.run(i)


class Adapter(Base):
    batch = True

    async def open(self) -> None:
        await app.open()

    async def close(self) -> None:
        await app.close()

    async def enqueue(self, i: int) -> None:
        await noop.enqueue(i)

    async def enqueue_many(self, items: Sequence[int]) -> None:
        await noop.enqueue_many([(i,) for i in items])

    def worker_argv(self, name: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "tether",
            "worker",
            f"{__name__}:app",
            "--queues",
            QUEUE,
            "--concurrency",
            str(self.config.concurrency),
            "--log-level",
            "WARNING",
            "--no-scheduler",
            "--name",
            name,
        ]

    async def ready(self, counters: redis.asyncio.Redis, names: Sequence[str]) -> bool:
        # A Tether worker writes its lease just before it starts fetching: no hook needed.
        keys = app.keys(QUEUE)
        return int(await app.client.exists(*(keys.lease(n) for n in names))) == len(names)
