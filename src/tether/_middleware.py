"""Hooks around enqueue and execution. Every hook is a documented no-op by default.

Register with ``Tether(middleware=[...])`` or ``app.add_middleware(...)``. A hook that
raises is logged with its class and hook name and never takes the worker down, nor does it
fail the enqueue or the task.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._context import TaskContext

log = logging.getLogger("tether.middleware")


class Middleware:
    """Subclass and override the hooks you need; all of them do nothing by default."""

    def before_enqueue(self, task_name: str, queue: str, headers: dict[str, str]) -> None:
        """Before anything is written, once per enqueue call (a batch shares one call): add
        entries to ``headers`` to send them with the tasks (tracing context, for example);
        the worker shows them in ``TaskContext.headers``. A plain function, called by the
        asyncio and the blocking producers alike."""

    async def on_enqueue(self, task_name: str, task_id: str, queue: str) -> None:
        """After a task was accepted by Redis (once per task, batches included)."""

    async def before_run(self, ctx: TaskContext) -> None:
        """In the worker, just before the task's function is called."""

    async def after_run(
        self, ctx: TaskContext, status: str, value: Any, error: BaseException | None
    ) -> None:
        """After the function returned or raised; ``status`` is ``succeeded`` or ``failed``
        (a retry calls :meth:`on_retry` instead)."""

    async def on_retry(self, ctx: TaskContext, error: BaseException, delay: float) -> None:
        """When a failed attempt is scheduled to run again after ``delay`` seconds."""

    async def on_dead(self, ctx: TaskContext | None, task_id: str, reason: str) -> None:
        """When a task goes to the dead-letter stream (``ctx`` is None if it never ran)."""


def overrides(middleware: tuple[Middleware, ...], hook: str) -> bool:
    """Whether any middleware defines ``hook`` (so the caller may skip the work around it)."""
    base = getattr(Middleware, hook)
    return any(getattr(type(mw), hook, base) is not base for mw in middleware)


def call_hooks_sync(middleware: tuple[Middleware, ...], hook: str, *args: Any) -> None:
    for mw in middleware:
        try:
            getattr(mw, hook)(*args)
        except Exception:
            log.exception("middleware %s.%s failed; carrying on", type(mw).__name__, hook)


async def call_hooks(middleware: tuple[Middleware, ...], hook: str, *args: Any) -> None:
    for mw in middleware:
        try:
            await getattr(mw, hook)(*args)
        except Exception:
            log.exception("middleware %s.%s failed; carrying on", type(mw).__name__, hook)
