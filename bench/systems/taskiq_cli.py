"""What both taskiq brokers share: the bench task, the readiness hook, the adapter, and the
``taskiq worker`` command line."""

from __future__ import annotations

from typing import Any

from taskiq import AsyncBroker, TaskiqEvents, TaskiqState

from .. import body
from .base import Adapter as Base


def worker_argv(script: str, app: str, concurrency: int) -> list[str]:
    """``taskiq worker`` with one worker process (its default is two) running ``concurrency``
    async tasks at once, logging at WARNING."""
    return [
        script,
        "worker",
        app,
        "--workers",
        "1",
        "--max-async-tasks",
        str(concurrency),
        "--log-level",
        "WARNING",
    ]


def adapter_for(broker: AsyncBroker, module: str) -> type[Base]:
    """Register the bench task and the readiness hook on ``broker`` (the module named
    ``module`` holds it as ``broker``, which ``taskiq worker`` imports), and return the
    adapter that drives it."""

    @broker.task(task_name="noop")
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
            task: Any = noop
            await task.kiq(i)

        def worker_argv(self, name: str) -> list[str]:
            return worker_argv(self.script("taskiq"), f"{module}:broker", self.config.concurrency)

    return Adapter
