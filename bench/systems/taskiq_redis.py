"""taskiq with taskiq-redis's ``RedisStreamBroker``: ``task.kiq`` and ``taskiq worker``.

taskiq has no batch enqueue call. No result backend is configured, so results are not
stored. The broker's consumer group starts at ``$``: the producer's ``broker.startup()``
(which taskiq documents for clients) creates it before anything is sent.
"""

from __future__ import annotations

from taskiq import TaskiqEvents, TaskiqState
from taskiq_redis import RedisStreamBroker

from .. import body
from .base import Adapter as Base
from .taskiq_cli import worker_argv

broker = RedisStreamBroker(body.CONFIG.url, queue_name=f"taskiq:{body.CONFIG.tag}")


@broker.task
async def noop(i: int) -> None:
    await body.run(i)


@broker.on_event(TaskiqEvents.WORKER_STARTUP)
async def startup(state: TaskiqState) -> None:
    await body.mark_ready()


class Adapter(Base):
    async def open(self) -> None:
        await broker.startup()

    async def close(self) -> None:
        await broker.shutdown()

    async def enqueue(self, i: int) -> None:
        await noop.kiq(i)

    def worker_argv(self, name: str) -> list[str]:
        return worker_argv(self.script("taskiq"), f"{__name__}:broker", self.config.concurrency)
