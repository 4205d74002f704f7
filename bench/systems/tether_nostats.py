"""Tether with statistics off (``Tether(stats=False)``): the cost of the statistics that the
settle call writes, measured beside the default row."""

from __future__ import annotations

import redis.asyncio

from tether import Tether

from .. import body
from . import tether as with_stats

app = Tether(body.CONFIG.url, namespace=body.CONFIG.tag, stats=False)


@app.task(name=with_stats.noop.name, store_result=False)
async def noop(i: int) -> None:
    await body.run(i)


class Adapter(with_stats.Adapter):
    async def open(self) -> None:
        await app.open()

    async def close(self) -> None:
        await app.close()

    async def enqueue(self, i: int) -> None:
        await noop.enqueue(i)

    async def enqueue_many(self, items: list[int]) -> None:  # type: ignore[override]
        await noop.enqueue_many([(i,) for i in items])

    def worker_argv(self, name: str) -> list[str]:
        argv = super().worker_argv(name)
        argv[argv.index(f"{with_stats.__name__}:app")] = f"{__name__}:app"
        return argv

    async def ready(self, counters: redis.asyncio.Redis, names: list[str]) -> bool:  # type: ignore[override]
        keys = app.keys(with_stats.QUEUE)
        return int(await app.client.exists(*(keys.lease(n) for n in names))) == len(names)
