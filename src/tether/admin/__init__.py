"""Seeing and steering a running Tether: queue figures, per-task statistics, the worker
registry, what a queue holds, queue pause and resume.

``app.stats`` is a :class:`Stats` reader, whose readers have blocking twins
(``app.stats.overview_sync()``) for code that runs no event loop; ``await app.workers()``,
``await app.pause(queue)`` and ``await app.resume(queue)`` are on the app. The web API
(:mod:`tether.web`), the dashboard, the metrics exporter and ``tether info`` read through
these same calls.
"""

from ._control import is_paused, pause, resume, run_now
from ._models import (
    Counts,
    DelayedTask,
    Distribution,
    EarlierAttempt,
    Health,
    MinuteCounts,
    Overview,
    Page,
    QueueStats,
    Rate,
    RunningTask,
    TaskError,
    TaskInfo,
    TaskStats,
    WorkerInfo,
)
from ._reader import DEFAULT_LIMIT, MAX_LIMIT, check_limit
from ._stats import Stats

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "Counts",
    "DelayedTask",
    "Distribution",
    "Health",
    "MinuteCounts",
    "Overview",
    "Page",
    "QueueStats",
    "Rate",
    "RunningTask",
    "Stats",
    "EarlierAttempt",
    "TaskError",
    "TaskInfo",
    "TaskStats",
    "WorkerInfo",
    "check_limit",
    "is_paused",
    "pause",
    "resume",
    "run_now",
]
