"""SAQ: ``Queue.enqueue`` and the ``saq`` CLI with a settings dict.

SAQ has no batch enqueue call (``Queue.batch`` groups aborts, ``Queue.map`` waits for
results). Results are not stored: each job is enqueued with ``ttl=-1``, which SAQ documents
as "disabled" (the job record is deleted when it finishes). The CLI logs at WARNING by
default.
"""

from __future__ import annotations

from typing import Any

from saq import Queue

from .. import body
from .base import Adapter as Base

queue = Queue.from_url(body.CONFIG.url, name=body.CONFIG.tag)


async def noop(ctx: dict[str, Any], *, i: int) -> None:
    await body.run(i)


async def startup(ctx: dict[str, Any]) -> None:
    await body.mark_ready()


settings = {
    "queue": queue,
    "functions": [noop],
    "concurrency": body.CONFIG.concurrency,
    "startup": startup,
}


class Adapter(Base):
    async def open(self) -> None:
        await queue.connect()

    async def close(self) -> None:
        await queue.disconnect()

    async def enqueue(self, i: int) -> None:
        await queue.enqueue("noop", i=i, ttl=-1)

    def worker_argv(self, name: str) -> list[str]:
        return [self.script("saq"), f"{__name__}.settings"]
