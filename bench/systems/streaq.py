"""streaq: ``task.enqueue`` / ``Worker.enqueue_many``, and the ``streaq run`` CLI.

Results are not stored (``ttl=0`` on the task). The CLI configures streaq's logger at INFO
with no option to change it, so the worker's documented ``lifespan`` hook lowers it to
WARNING; ``silent=True`` also turns off the per-task log lines, which streaq formats even
when they are filtered out. Both favour streaq, never Tether.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from streaq import Worker

from .. import body
from .base import Adapter as Base


@asynccontextmanager
async def lifespan() -> AsyncIterator[None]:
    logging.getLogger("streaq").setLevel(logging.WARNING)
    await body.mark_ready()
    yield None


worker = Worker(
    redis_url=body.CONFIG.url,
    queue_name=body.CONFIG.tag,
    concurrency=body.CONFIG.concurrency,
    lifespan=lifespan,
)


@worker.task(ttl=0, silent=True)
async def noop(i: int) -> None:
    await body.run(i)


class Adapter(Base):
    batch = True

    async def open(self) -> None:
        # The documented form is `async with worker:`; the driver opens and closes the
        # producer in separate steps, in the same task.
        await worker.__aenter__()

    async def close(self) -> None:
        await worker.__aexit__(None, None, None)

    async def enqueue(self, i: int) -> None:
        await noop.enqueue(i)

    async def enqueue_many(self, items: Sequence[int]) -> None:
        await worker.enqueue_many([noop.enqueue(i) for i in items])

    def worker_argv(self, name: str) -> list[str]:
        return [self.script("streaq"), "run", f"{__name__}:worker"]
