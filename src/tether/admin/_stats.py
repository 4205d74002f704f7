"""``app.stats``: the readers of :mod:`tether.admin._reader` with a blocking twin each
(``overview_sync()`` for ``await overview()``), for scripts and tests that run no event
loop. A twin runs its reader on a connection of its own
(:func:`tether.base._blocking.run_blocking`); the readers stay in one module, the twins in
this one."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..base._blocking import run_blocking
from . import _reader
from ._models import (
    DelayedTask,
    Health,
    MinuteCounts,
    Overview,
    Page,
    QueueStats,
    RunningTask,
    TaskInfo,
    TaskStats,
    WorkerInfo,
)
from ._reader import DEFAULT_LIMIT, MAX_LIMIT

T = TypeVar("T")


class Stats(_reader.Stats):
    __doc__ = _reader.Stats.__doc__

    def queue_names_sync(self, *, cursor: str | None = None, limit: int = MAX_LIMIT) -> Page[str]:
        """:meth:`queue_names`, blocking."""
        return self._blocking(
            "queue_names_sync", lambda s: s.queue_names(cursor=cursor, limit=limit)
        )

    def queues_sync(
        self, *, cursor: str | None = None, limit: int = DEFAULT_LIMIT
    ) -> Page[QueueStats]:
        """:meth:`queues`, blocking."""
        return self._blocking("queues_sync", lambda s: s.queues(cursor=cursor, limit=limit))

    def queue_sync(self, name: str) -> QueueStats:
        """:meth:`queue`, blocking."""
        return self._blocking("queue_sync", lambda s: s.queue(name))

    def running_sync(
        self, queue: str, *, cursor: str | None = None, limit: int = DEFAULT_LIMIT
    ) -> Page[RunningTask]:
        """:meth:`running`, blocking."""
        return self._blocking(
            "running_sync", lambda s: s.running(queue, cursor=cursor, limit=limit)
        )

    def delayed_sync(
        self, queue: str, *, cursor: str | None = None, limit: int = DEFAULT_LIMIT
    ) -> Page[DelayedTask]:
        """:meth:`delayed`, blocking."""
        return self._blocking(
            "delayed_sync", lambda s: s.delayed(queue, cursor=cursor, limit=limit)
        )

    def task_sync(self, task_id: str) -> TaskInfo:
        """:meth:`task`, blocking."""
        return self._blocking("task_sync", lambda s: s.task(task_id))

    def tasks_sync(
        self, queue: str | None = None, *, window: float = 3600.0, task: str | None = None
    ) -> list[TaskStats]:
        """:meth:`tasks`, blocking."""
        return self._blocking("tasks_sync", lambda s: s.tasks(queue, window=window, task=task))

    def tasks_page_sync(
        self,
        queue: str | None = None,
        *,
        window: float = 3600.0,
        task: str | None = None,
        cursor: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> Page[TaskStats]:
        """:meth:`tasks_page`, blocking."""
        return self._blocking(
            "tasks_page_sync",
            lambda s: s.tasks_page(queue, window=window, task=task, cursor=cursor, limit=limit),
        )

    def throughput_sync(
        self, queue: str, *, minutes: int = 60, task: str | None = None
    ) -> list[MinuteCounts]:
        """:meth:`throughput`, blocking."""
        return self._blocking(
            "throughput_sync", lambda s: s.throughput(queue, minutes=minutes, task=task)
        )

    def workers_sync(
        self, *, cursor: str | None = None, limit: int = DEFAULT_LIMIT
    ) -> Page[WorkerInfo]:
        """:meth:`workers`, blocking."""
        return self._blocking("workers_sync", lambda s: s.workers(cursor=cursor, limit=limit))

    def worker_sync(self, name: str) -> WorkerInfo | None:
        """:meth:`worker`, blocking."""
        return self._blocking("worker_sync", lambda s: s.worker(name))

    def all_workers_sync(self) -> list[WorkerInfo]:
        """:meth:`all_workers`, blocking."""
        return self._blocking("all_workers_sync", lambda s: s.all_workers())

    def health_sync(self) -> Health:
        """:meth:`health`, blocking."""
        return self._blocking("health_sync", lambda s: s.health())

    def overview_sync(self) -> Overview:
        """:meth:`overview`, blocking."""
        return self._blocking("overview_sync", lambda s: s.overview())

    def _blocking(self, method: str, work: Callable[[_reader.Stats], Awaitable[T]]) -> T:
        return run_blocking(method, self.app, lambda app: work(_reader.Stats(app)))
