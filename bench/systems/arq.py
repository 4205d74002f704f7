"""arq: ``ArqRedis.enqueue_job`` and the ``arq`` CLI with a ``WorkerSettings`` class.

arq has no batch enqueue call. Results are not kept (``keep_result = 0``); its log level is
set through the CLI's documented ``--custom-log-dict`` option, because the default log
configuration is INFO. Everything else is arq's default, including ``poll_delay`` (0.5 s)
and ``queue_read_limit`` (5 x max_jobs), which bound its rate and its idle latency.
"""

from __future__ import annotations

from typing import Any

from arq import create_pool
from arq.connections import ArqRedis, RedisSettings

from .. import body
from .base import Adapter as Base

QUEUE = f"arq:{body.CONFIG.tag}"
REDIS = RedisSettings.from_dsn(body.CONFIG.url)

LOG_CONFIG: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler", "level": "WARNING"}},
    "loggers": {"arq": {"handlers": ["console"], "level": "WARNING"}},
}


async def noop(ctx: dict[str, Any], i: int) -> None:
    await body.run(i)


async def startup(ctx: dict[str, Any]) -> None:
    await body.mark_ready()


class WorkerSettings:
    functions = (noop,)
    queue_name = QUEUE
    redis_settings = REDIS
    max_jobs = body.CONFIG.concurrency
    keep_result = 0
    on_startup = startup


class Adapter(Base):
    async def open(self) -> None:
        self.pool: ArqRedis = await create_pool(REDIS, default_queue_name=QUEUE)

    async def close(self) -> None:
        await self.pool.aclose()

    async def enqueue(self, i: int) -> None:
        await self.pool.enqueue_job("noop", i)

    def worker_argv(self, name: str) -> list[str]:
        return [
            self.script("arq"),
            f"{__name__}.WorkerSettings",
            "--custom-log-dict",
            f"{__name__}.LOG_CONFIG",
        ]
