"""The Tether facade: declare tasks on it, enqueue them, and run workers for it.

It is a :class:`~tether.producer._core.Core` (settings, connection, keys, serializer, registry) with
the declaring and composing methods on top. The parts it composes depend on the core, never
on this module.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, overload

from typing_extensions import Self

from .base._blocking import refuse_on_loop
from .base._config import Backoff, TaskConfig
from .base._errors import ConfigError
from .base._limits import TaskLimits
from .base._settings import WorkerSettings, check_name, check_priority
from .producer._core import DEFAULT_URL, Core
from .producer._handle import TaskHandle
from .producer._task import AsyncTask, P, R, SyncTask, Task, default_task_name, task_class
from .protocol._keys import queue_of_task_id, task_id_problem

if TYPE_CHECKING:
    from .admin import Stats, WorkerInfo
    from .base._schedule import Missed, ScheduleBackoff
    from .dead import DeadLetters
    from .limits import Limits
    from .scheduler import Scheduler, Schedules
    from .worker import Worker

__all__ = ["DEFAULT_URL", "Tether"]


AnyTask = TypeVar("AnyTask", bound=Task[Any, Any])


# An async function matches both overloads (its result is a coroutine); the first, which
# mypy tries first, is the one meant for it, hence the overlap ignored on it.
class _TaskDecorator(Protocol):
    @overload
    def __call__(  # type: ignore[overload-overlap]
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> AsyncTask[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> SyncTask[P, R]: ...


class Tether(Core):
    """A Tether app: declare tasks on it, enqueue them, and run workers for it.

    ``url`` defaults to the ``TETHER_URL`` environment variable, then to
    ``redis://localhost:6379/0``; ``namespace`` to ``TETHER_NAMESPACE``, then ``tether``.
    Producers open the connection with ``async with app:``; blocking producers
    (``task.enqueue_sync``) open theirs at first use.

    Keyword arguments: ``serializer`` (JSON by default), ``result_ttl`` (how long outcomes
    are kept, 1 h), ``dead_letter_maxlen`` (10,000), ``socket_timeout`` (10 s),
    ``connect_timeout`` (5 s), ``max_connections`` (connections to each server at most, 100;
    calls wait for a free one) and ``pool_timeout`` (how long they wait, 10 s),
    ``enqueue_replicas`` and ``enqueue_replicas_timeout`` (wait for
    replicas on each enqueue), ``stats`` (record per-task statistics, on) and
    ``stats_window`` (how long they are kept, 24 h), ``middleware``.
    """

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- declaring --------------------------------------------------------------------

    @overload
    def task(  # type: ignore[overload-overlap]  # the first is meant for async functions
        self, fn: Callable[P, Coroutine[Any, Any, R]], /
    ) -> AsyncTask[P, R]: ...
    @overload
    def task(self, fn: Callable[P, R], /) -> SyncTask[P, R]: ...
    @overload
    def task(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: str = "normal",
        retries: int = 0,
        retry_on: Sequence[type[BaseException]] = (Exception,),
        backoff: Backoff | Callable[[int], float] | None = None,
        timeout: float | timedelta | None = None,
        store_result: bool = True,
        result_ttl: float | timedelta | None = None,
        rate_limit: str | None = None,
        rate_burst: int | None = None,
        concurrency_limit: int | None = None,
        key_rate_limit: str | None = None,
        key_rate_burst: int | None = None,
        key_concurrency_limit: int | None = None,
    ) -> _TaskDecorator: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: str = "normal",
        retries: int = 0,
        retry_on: Sequence[type[BaseException]] = (Exception,),
        backoff: Backoff | Callable[[int], float] | None = None,
        timeout: float | timedelta | None = None,
        store_result: bool = True,
        result_ttl: float | timedelta | None = None,
        rate_limit: str | None = None,
        rate_burst: int | None = None,
        concurrency_limit: int | None = None,
        key_rate_limit: str | None = None,
        key_rate_burst: int | None = None,
        key_concurrency_limit: int | None = None,
    ) -> Any:
        """Register a function as a task. Async functions run on the worker's event loop;
        plain functions run in its thread pool, never on the loop.

        Flow control (see docs/flow-control.md), across every worker of the queue:
        ``rate_limit`` ('60/m', '100/s', '5/10s') with ``rate_burst`` (default 1),
        ``concurrency_limit`` (running at once), and the same per limit key
        (``task.options(limit_key=...)``): ``key_rate_limit``, ``key_rate_burst``,
        ``key_concurrency_limit``."""

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            if not callable(func):
                raise ConfigError(f"@app.task needs a function, not {func!r}")
            task_name = name or default_task_name(func)
            limits = TaskLimits.declare(
                task_name, rate_limit=rate_limit, rate_burst=rate_burst,
                concurrency_limit=concurrency_limit, key_rate_limit=key_rate_limit,
                key_rate_burst=key_rate_burst, key_concurrency_limit=key_concurrency_limit,
            )  # fmt: skip
            config = TaskConfig(
                name=task_name,
                queue=queue,
                priority=priority,
                retries=retries,
                retry_on=tuple(retry_on),
                backoff=backoff or Backoff(),
                timeout=timeout.total_seconds() if isinstance(timeout, timedelta) else timeout,
                store_result=store_result,
                result_ttl=result_ttl.total_seconds()
                if isinstance(result_ttl, timedelta)
                else result_ttl,
                limits=limits,
            )
            if config.name in self.tasks:
                raise ConfigError(f"a task named {config.name!r} is already registered")
            task = task_class(func)(self, func, config)
            self.tasks[config.name] = task
            return task

        if fn is not None:
            return register(fn)
        return register

    def by_name(
        self, name: str, *, queue: str = "default", priority: str = "normal"
    ) -> Task[..., Any]:
        """A task this process knows only by name, to enqueue it without importing its
        module (a web tier that should not load the workers' dependencies). The worker that
        runs it checks the arguments; a task it does not know goes to the dead letters. A
        task registered in this app is returned as it is (and its arguments are checked)."""
        registered = self.tasks.get(name)
        if isinstance(registered, Task):
            return registered
        if not isinstance(name, str) or not name:
            raise ConfigError(f"task name {name!r} must be a non-empty string")
        config = TaskConfig(
            name=name, queue=check_name("queue", queue), priority=check_priority(priority)
        )
        return Task(self, None, config)

    async def enqueue_by_name(self, name: str, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        """Enqueue the task ``name`` with these arguments (see :meth:`by_name`; use
        ``app.by_name(name, queue=...).options(...).enqueue(...)`` for options)."""
        return await self.by_name(name).enqueue(*args, **kwargs)

    def enqueue_by_name_sync(self, name: str, *args: Any, **kwargs: Any) -> TaskHandle[Any]:
        """:meth:`enqueue_by_name`, blocking."""
        refuse_on_loop("enqueue_by_name_sync")
        return self.by_name(name).enqueue_sync(*args, **kwargs)

    def handle(self, task_id: str) -> TaskHandle[Any]:
        """Rebuild a handle from a task id, in any process."""
        try:
            queue = queue_of_task_id(task_id)
        except ValueError:
            raise ConfigError(task_id_problem(task_id)) from None
        return TaskHandle(self, task_id, queue)

    def dead_letters(self, queue: str = "default") -> DeadLetters:
        """List, show, retry and purge the dead-letter stream of ``queue``."""
        from .dead import DeadLetters

        return DeadLetters(self, queue)

    # -- seeing and steering -----------------------------------------------------------

    @property
    def stats(self) -> Stats:
        """Read queue figures, per-task statistics, workers and what a queue holds (see
        :class:`tether.admin.Stats`)."""
        from .admin import Stats

        return Stats(self)

    async def workers(self) -> list[WorkerInfo]:
        """The live workers, from the registry their heartbeats publish (a dead worker drops
        out within its ``heartbeat_ttl``)."""
        from .admin import Stats

        return await Stats(self).all_workers()

    async def pause(self, queue: str) -> bool:
        """Pause ``queue``: within one ``reclaim_interval`` no worker fetches from it;
        enqueues are still accepted. True if it was not paused already."""
        from .admin import pause

        return await pause(self, queue)

    async def resume(self, queue: str) -> bool:
        """Resume a paused queue: workers fetch from it again at their next maintenance
        pass. True if it was paused."""
        from .admin import resume

        return await resume(self, queue)

    # -- workers and the scheduler ----------------------------------------------------

    def worker(self, **settings: Any) -> Worker:
        """A worker for this app; keyword arguments are :class:`WorkerSettings` fields."""
        from .worker import Worker

        return Worker(self, WorkerSettings(**settings))

    def periodic(
        self,
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
        missed: Missed = "latest",
        catchup_limit: int = 10,
        overlap: bool = True,
        run_at_startup: bool = False,
        grace: float = 5.0,
        backoff: ScheduleBackoff | bool = True,
    ) -> Callable[[AnyTask], AnyTask]:
        """Run a task periodically: put ``@app.periodic(cron=... | every=...)`` on top of
        ``@app.task``; stack several for several schedules. See :class:`tether.scheduler.Schedule`
        for the options."""

        def declare(task: AnyTask) -> AnyTask:
            schedule = self.schedules.build(
                task, cron=cron, every=every, tz=tz, args=args, kwargs=kwargs, name=name,
                missed=missed, catchup_limit=catchup_limit, overlap=overlap,
                run_at_startup=run_at_startup, grace=grace, backoff=backoff,
            )  # fmt: skip
            if schedule.name in {s.name for s in self.declared_schedules}:
                raise ConfigError(f"a schedule named {schedule.name!r} is declared already")
            self.declared_schedules.append(schedule)
            return task

        return declare

    @property
    def limits(self) -> Limits:
        """Runtime control of flow-control limits: get, set, reset, list, usage and
        held-back counts (see docs/flow-control.md)."""
        from .limits import Limits

        return Limits(self)

    @property
    def schedules(self) -> Schedules:
        """Runtime control of schedules: add, remove, pause, resume, trigger, list, leader."""
        from .scheduler import Schedules

        return Schedules(self)

    def scheduler(self, **options: Any) -> Scheduler:
        """A scheduler instance (workers run one themselves unless told not to)."""
        from .scheduler import Scheduler

        return Scheduler(self, **options)
