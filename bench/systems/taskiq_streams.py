"""taskiq with the taskiq-redis-streams broker: ``task.kiq`` and ``taskiq worker``.

taskiq has no batch enqueue call. No result backend is configured. The broker's
``max_pending`` (entries fetched and not yet acknowledged, default 10) is raised to the
concurrency, 32, so that one worker can run 32 tasks at once like every other system.
"""

from __future__ import annotations

from taskiq import TaskiqEvents, TaskiqState
from taskiq_redis_streams import RedisStreamsBroker

from .. import body
from .base import Adapter as Base
from .taskiq_cli import worker_argv

broker = RedisStreamsBroker(
    body.CONFIG.url,
    queue_name="bench",
    namespace=body.CONFIG.tag,
    max_pending=body.CONFIG.concurrency,
)


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
