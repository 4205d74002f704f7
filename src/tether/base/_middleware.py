"""Hooks around enqueue and execution. Every hook is a documented no-op by default.

Register with ``Tether(middleware=[...])`` or ``app.add_middleware(...)``. A hook that
raises is logged with its class and hook name and never takes the worker down, nor does it
fail the enqueue or the task.

Two pairs of hooks surround the work, for instrumentation that opens something before and
closes it after (a tracing span): ``before_enqueue`` and ``after_enqueue`` around each
enqueue call, and the context manager ``run_scope`` around each call of a task's function.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from types import TracebackType
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

    def after_enqueue(
        self,
        task_name: str,
        queue: str,
        task_ids: Sequence[str],
        error: BaseException | None,
    ) -> None:
        """Once per enqueue call that ran :meth:`before_enqueue`, when it is over: in the
        same thread or asyncio task, so what ``before_enqueue`` opened (a span made current)
        can be closed here. ``task_ids`` are the ids of the handles returned (a deduplicated
        enqueue's is the id of the task that holds the key); on failure they are empty and
        ``error`` is the exception the caller gets. Called in the reverse order of the
        middleware list. A plain function, like ``before_enqueue``."""

    async def on_enqueue(self, task_name: str, task_id: str, queue: str) -> None:
        """After a task was accepted by Redis (once per task, batches included)."""

    async def before_run(self, ctx: TaskContext) -> None:
        """In the worker, just before the task's function is called."""

    def run_scope(
        self, ctx: TaskContext, retry_headers: dict[str, str]
    ) -> AbstractContextManager[Any] | None:
        """In the worker, a context manager around the call of the task's function (or
        None to stay out of this run). It is entered after :meth:`before_run` and exited
        when the function returned or raised, with the exception (a timeout or a
        cancellation too) as ``__exit__``'s arguments.

        It is entered in the run's own context, so a context variable it sets (the current
        span) is what the function sees, an async function on the event loop and a plain
        function in its thread alike. ``retry_headers`` starts as a copy of
        ``ctx.headers``; if this attempt is retried (or pushed back by ``RateLimited``),
        the next attempt carries these headers instead: set an entry to tell it something
        about this one. A scope that raises is logged and its run goes on; it cannot
        swallow the task's exception."""
        return None

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


def call_hooks_sync(middleware: Sequence[Middleware], hook: str, *args: Any) -> None:
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


class RunScopes:
    """The ``run_scope`` context managers of one run, entered in the middleware's order
    and exited in reverse. Each is guarded on its own: one that fails to enter is logged
    and left out, one that fails to exit is logged, and none can suppress the task's
    exception (what ``__exit__`` returns is ignored)."""

    __slots__ = ("_ctx", "_entered", "_middleware", "retry_headers")

    def __init__(
        self, middleware: tuple[Middleware, ...], ctx: TaskContext, retry_headers: dict[str, str]
    ) -> None:
        self._middleware = middleware
        self._ctx = ctx
        self.retry_headers = retry_headers
        """The headers a retry of this attempt carries (the scopes may have set some)."""
        self._entered: list[tuple[Middleware, AbstractContextManager[Any]]] = []

    def __enter__(self) -> None:
        for mw in self._middleware:
            try:
                scope = mw.run_scope(self._ctx, self.retry_headers)
                if scope is not None:
                    scope.__enter__()
                    self._entered.append((mw, scope))
            except Exception:
                log.exception("middleware %s.run_scope failed; carrying on", type(mw).__name__)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        while self._entered:
            mw, scope = self._entered.pop()
            try:
                scope.__exit__(exc_type, exc, tb)
            except Exception:
                log.exception(
                    "middleware %s.run_scope failed on exit; carrying on", type(mw).__name__
                )
