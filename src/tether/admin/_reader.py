"""``app.stats``: one reader for everything an operator looks at. The JSON API, the
dashboard, the metrics exporter and ``tether info`` all call it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..base._errors import ConfigError, QueueNotFound
from ..base._settings import check_name
from . import _buckets, _health, _known, _listing, _queues, _task, _workers
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

if TYPE_CHECKING:
    from ..producer._core import Core

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
"""The largest page any list gives."""


def check_limit(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise ConfigError(f"limit={limit!r}: a page holds 1 to {MAX_LIMIT} items")
    return limit


class Stats:
    """Read what the queues, workers and tasks of an app are doing. Get it as
    ``app.stats``; every method reads Redis on demand (nothing is cached), and every list
    is a :class:`Page` read with O(page) server commands: pass ``page.cursor`` back for
    the next one.

    Queue figures (:meth:`queue`, :meth:`queues`) cost a fixed number of commands per queue;
    task statistics (:meth:`tasks`, :meth:`throughput`) one ``HGETALL`` per minute or hour
    bucket of the window.
    """

    def __init__(self, app: Core) -> None:
        self.app = app

    # -- queues -------------------------------------------------------------------------

    async def queue_names(self, *, cursor: str | None = None, limit: int = MAX_LIMIT) -> Page[str]:
        """Known queue names in name order (see :mod:`tether.admin._known`)."""
        return await _known.known_page(self.app, cursor, check_limit(limit))

    async def queues(
        self, *, cursor: str | None = None, limit: int = DEFAULT_LIMIT
    ) -> Page[QueueStats]:
        """The figures of the known queues, in name order."""
        names = await self.queue_names(cursor=cursor, limit=limit)
        workers = _workers.per_queue(await _workers.every(self.app))
        return Page(await _queues.figures(self.app, names.items, workers), names.cursor)

    async def queue(self, name: str) -> QueueStats:
        """One queue's figures; :class:`~tether.QueueNotFound` for a queue nothing knows."""
        await self.require_queue(name)
        workers = _workers.per_queue(await _workers.every(self.app))
        return (await _queues.figures(self.app, [name], workers))[0]

    async def require_queue(self, name: str) -> str:
        """``name`` if the queue is known, else :class:`~tether.QueueNotFound`."""
        if not await _known.is_known(self.app, name):
            raise QueueNotFound(
                f"queue {name!r} is unknown: no worker serves it, no task of this app names "
                "it, and it has no keys"
            )
        return name

    async def forget_queue(self, name: str) -> bool:
        """Drop a queue no longer used from the known queues (workers serving it add it back)."""
        return await _known.forget(self.app, name)

    # -- what a queue holds ---------------------------------------------------------------

    async def running(
        self, queue: str, *, cursor: str | None = None, limit: int = DEFAULT_LIMIT
    ) -> Page[RunningTask]:
        """Entries delivered to workers and not yet settled: task, worker, elapsed."""
        check_name("queue", queue)
        return await _listing.running(self.app, queue, cursor, check_limit(limit))

    async def delayed(
        self, queue: str, *, cursor: str | None = None, limit: int = DEFAULT_LIMIT
    ) -> Page[DelayedTask]:
        """Tasks waiting for their due time (scheduled, or retrying), soonest first."""
        check_name("queue", queue)
        return await _listing.delayed(self.app, queue, cursor, check_limit(limit))

    async def task(self, task_id: str) -> TaskInfo:
        """A task by its id: status, attempt, arguments, result or error.
        :class:`~tether.TaskNotFound` when unknown."""
        return await _task.task_info(self.app, task_id)

    # -- statistics ---------------------------------------------------------------------

    async def tasks(
        self, queue: str | None = None, *, window: float = 3600.0, task: str | None = None
    ) -> list[TaskStats]:
        """Per task name: counts by outcome, throughput, p50/p95/p99 run and wait time over
        the last ``window`` seconds (at most the app's ``stats_window``), for one queue or
        every known queue."""
        if queue is None:
            queues = await _known.all_known(self.app)
        else:
            queues = [check_name("queue", queue)]
        return await _buckets.task_stats(self.app, queues, window, task)

    async def tasks_page(
        self,
        queue: str | None = None,
        *,
        window: float = 3600.0,
        task: str | None = None,
        cursor: str | None = None,
        limit: int = DEFAULT_LIMIT,
    ) -> Page[TaskStats]:
        """:meth:`tasks` a page at a time, in queue then task name order, after ``cursor``
        (``<queue>|<task>``, the cursor of the page before). A page reads the buckets of
        its own queues only (from the cursor's queue on, until it is full)."""
        if cursor is not None and not (isinstance(cursor, str) and "|" in cursor):
            raise ConfigError(f"cursor {cursor!r} is not <queue>|<task>")
        if queue is None:
            queues = await _known.all_known(self.app)
        else:
            queues = [check_name("queue", queue)]
        return await _buckets.task_stats_page(
            self.app, queues, window, task, cursor, check_limit(limit)
        )

    async def throughput(
        self, queue: str, *, minutes: int = 60, task: str | None = None
    ) -> list[MinuteCounts]:
        """Attempts that ended per minute, by outcome, over the last ``minutes`` minutes
        (oldest first, the current minute last), for the queue or one task of it. Reads one
        minute hash per minute (1,440 for a day, in one pipeline): for long spans prefer
        :meth:`tasks` with a window over three hours, which reads hour hashes."""
        check_name("queue", queue)
        return await _buckets.throughput(self.app, queue, minutes, task)

    # -- workers and the server -----------------------------------------------------------

    async def workers(
        self, *, cursor: str | None = None, limit: int = DEFAULT_LIMIT
    ) -> Page[WorkerInfo]:
        """Live workers in name order."""
        if cursor is not None and not (isinstance(cursor, str) and 0 < len(cursor) <= 200):
            raise ConfigError(f"cursor {cursor!r} is not a worker name")
        return await _workers.page(self.app, cursor, check_limit(limit))

    async def worker(self, name: str) -> WorkerInfo | None:
        """A live worker's record, or None."""
        return await _workers.one(self.app, name)

    async def all_workers(self) -> list[WorkerInfo]:
        return await _workers.every(self.app)

    async def health(self) -> Health:
        """Whether the server answers, its kind and version, and the scheduler leader."""
        return await _health.health(self.app)

    async def overview(self) -> Overview:
        """Every known queue's figures and the fleet (``tether info``)."""
        names = await _known.all_known(self.app)
        workers = await _workers.every(self.app)
        figures = await _queues.figures(self.app, names, _workers.per_queue(workers))
        health = await self.health()
        return Overview(figures, len(workers), health.scheduler_leader, health.time)
