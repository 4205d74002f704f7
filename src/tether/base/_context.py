"""The context of the running task, readable from inside it (async or sync)."""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ._errors import TetherError


@dataclass(frozen=True, slots=True)
class TaskContext:
    """What a running task may want to know about itself (``current_task()``).

    Attributes:
        task_id: the task's id: ``<queue>:<32 hex>`` (``default:9f2c...``), or for a plain
            enqueue ``<queue>:<stream 1-3>-<entry id>`` (``default:2-1732870000000-0``).
        task_name: the registered name.
        queue, priority: where it was enqueued.
        attempt: counts from 1; ``max_attempts`` is ``retries + 1``.
        deliveries: the times this entry was handed to a worker (above 1 after a worker
            died running it).
        enqueued_ms: when it was enqueued (unix ms, the producer's clock).
        worker: the consumer name of the worker running it.
    """

    task_id: str
    task_name: str
    queue: str
    priority: str
    attempt: int
    max_attempts: int
    deliveries: int
    enqueued_ms: int
    worker: str
    schedule: str | None = None
    """The schedule that enqueued this run, if any."""
    scheduled_for_ms: int | None = None
    """The schedule tick this run is for (unix ms), if any."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """Headers sent with the task by the producer's middleware (``before_enqueue``), for
    example a trace context."""


class LazyContext:
    """Holds what a TaskContext is made of, and builds it only when asked: most tasks never
    ask, and the worker's hot path should not pay for it."""

    __slots__ = ("_ctx", "_fields")

    def __init__(self, *fields: Any) -> None:
        self._fields = fields
        self._ctx: TaskContext | None = None

    def get(self) -> TaskContext:
        if self._ctx is None:
            self._ctx = TaskContext(*self._fields)
        return self._ctx


_current: ContextVar[LazyContext | None] = ContextVar("tether_task", default=None)


def current_task() -> TaskContext:
    """The context of the task running in this coroutine or thread."""
    holder = _current.get()
    if holder is None:
        raise TetherError("current_task() was called outside a running Tether task")
    return holder.get()
