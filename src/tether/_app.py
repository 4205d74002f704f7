"""The Tether app: settings, the connection, the task registry, and enqueue."""

from __future__ import annotations

import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, overload

from typing_extensions import Self

from . import _enqueue, _lifecycle
from ._envelope import JsonSerializer, Serializer
from ._errors import ConfigError, NotOpen
from ._keys import QueueKeys, queue_of_task_id
from ._middleware import Middleware
from ._redis import AsyncClient, Target, async_client, close_async, parse_url
from ._settings import AppSettings, WorkerSettings
from ._task import Backoff, P, R, Task, TaskConfig, TaskHandle, TaskStatus, default_task_name

if TYPE_CHECKING:
    from .dead import DeadLetters
    from .scheduler import Schedule, Scheduler, Schedules
    from .scheduler._schedule import Missed
    from .worker import Worker

DEFAULT_URL = "redis://localhost:6379/0"


class _TaskDecorator(Protocol):
    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...
    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...


class Tether:
    """A Tether app: declare tasks on it, enqueue them, and run workers for it.

    ``url`` defaults to the ``TETHER_URL`` environment variable, then to
    ``redis://localhost:6379/0``; ``namespace`` to ``TETHER_NAMESPACE``, then ``tether``.
    Producers open the connection with ``async with app:``.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        namespace: str | None = None,
        serializer: Serializer | None = None,
        result_ttl: float | timedelta = 3600.0,
        dead_letter_maxlen: int = 10_000,
        socket_timeout: float = 10.0,
        connect_timeout: float = 5.0,
        enqueue_replicas: int = 0,
        enqueue_replicas_timeout: float = 1.0,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        if isinstance(result_ttl, timedelta):
            result_ttl = result_ttl.total_seconds()
        self.url_source = (
            "code" if url else "TETHER_URL" if os.environ.get("TETHER_URL") else "default"
        )
        """Where the URL came from: 'code', 'TETHER_URL', 'default' or 'override'."""
        self.settings = AppSettings(
            url=url or os.environ.get("TETHER_URL") or DEFAULT_URL,
            namespace=namespace or os.environ.get("TETHER_NAMESPACE") or "tether",
            result_ttl=result_ttl,
            dead_letter_maxlen=dead_letter_maxlen,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
            enqueue_replicas=enqueue_replicas,
            enqueue_replicas_timeout=enqueue_replicas_timeout,
        )
        self.target: Target = parse_url(self.settings.url)
        self.serializer: Serializer = serializer or JsonSerializer()
        self.middleware: tuple[Middleware, ...] = tuple(middleware)
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.declared_schedules: list[Schedule] = []
        self._keys: dict[str, QueueKeys] = {}
        self._client: AsyncClient | None = None

    def __repr__(self) -> str:
        return f"<Tether {self.target.redacted} namespace={self.namespace!r}>"

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    # -- declaring --------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, Coroutine[Any, Any, R]], /) -> Task[P, R]: ...
    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...
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
    ) -> Any:
        """Register a function as a task. Async functions run on the worker's event loop;
        plain functions run in its thread pool, never on the loop."""

        def register(func: Callable[..., Any]) -> Task[Any, Any]:
            if not callable(func):
                raise ConfigError(f"@app.task needs a function, not {func!r}")
            config = TaskConfig(
                name=name or default_task_name(func),
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
            )
            if config.name in self.tasks:
                raise ConfigError(f"a task named {config.name!r} is already registered")
            task: Task[Any, Any] = Task(self, func, config)
            self.tasks[config.name] = task
            return task

        if fn is not None:
            return register(fn)
        return register

    def configure(self, *, url: str | None = None, namespace: str | None = None) -> None:
        """Point a closed app at another server or namespace (an explicit ``--url`` or
        ``--namespace`` given to the CLI wins over the values in code)."""
        if self._client is not None:
            raise ConfigError("configure() needs a closed app: call it before `async with app`")
        changes: dict[str, Any] = {}
        if url is not None:
            changes["url"] = url
        if namespace is not None:
            changes["namespace"] = namespace
        if not changes:
            return
        settings = replace(self.settings, **changes)
        self.target = parse_url(settings.url)
        self.settings = settings
        if url is not None:
            self.url_source = "override"
        self._keys.clear()
        for task in self.tasks.values():
            task.plan = None

    def add_middleware(self, middleware: Middleware) -> None:
        self.middleware = (*self.middleware, middleware)

    # -- connection -------------------------------------------------------------------

    async def open(self) -> Self:
        """Open the connection (lazily connected). ``async with app:`` does this for you."""
        if self._client is None:
            self._client = async_client(
                self.target,
                socket_timeout=self.settings.socket_timeout,
                connect_timeout=self.settings.connect_timeout,
            )
        return self

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await close_async(client)

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def client(self) -> AsyncClient:
        """The open asyncio client; raises :class:`NotOpen` outside ``async with app``."""
        if self._client is None:
            raise NotOpen("the Tether app is not open: use `async with app:` or `await app.open()`")
        return self._client

    def keys(self, queue: str) -> QueueKeys:
        keys = self._keys.get(queue)
        if keys is None:
            keys = self._keys[queue] = QueueKeys.of(self.namespace, queue)
        return keys

    # -- enqueue ----------------------------------------------------------------------

    async def _enqueue(
        self, task: Task[Any, Any], calls: Sequence[tuple[tuple[Any, ...], Mapping[str, Any]]]
    ) -> list[TaskHandle[Any]]:
        return await _enqueue.enqueue(self, task, calls)

    # -- handles, outcomes ------------------------------------------------------------

    def handle(self, task_id: str) -> TaskHandle[Any]:
        """Rebuild a handle from a task id, in any process."""
        try:
            queue = queue_of_task_id(task_id)
        except ValueError:
            raise ConfigError(
                f"{task_id!r} is not a Tether task id (expected <queue>:<hex>)"
            ) from None
        return TaskHandle(self, task_id, queue)

    async def _status(self, task_id: str) -> TaskStatus:
        return await _lifecycle.status(self, task_id)

    async def _result(self, task_id: str, timeout: float | timedelta | None) -> Any:
        return await _lifecycle.wait_result(self, task_id, timeout)

    async def _cancel(self, task_id: str) -> bool:
        return await _lifecycle.cancel(self, task_id)

    def dead_letters(self, queue: str = "default") -> DeadLetters:
        """List, show, retry and purge the dead-letter stream of ``queue``."""
        from .dead import DeadLetters

        return DeadLetters(self, queue)

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
    ) -> Callable[[Task[P, R]], Task[P, R]]:
        """Run a task periodically: put ``@app.periodic(cron=... | every=...)`` on top of
        ``@app.task``; stack several for several schedules. See :class:`tether.scheduler.Schedule`
        for the options."""

        def declare(task: Task[P, R]) -> Task[P, R]:
            schedule = self.schedules.build(
                task, cron=cron, every=every, tz=tz, args=args, kwargs=kwargs, name=name,
                missed=missed, catchup_limit=catchup_limit, overlap=overlap,
                run_at_startup=run_at_startup, grace=grace,
            )  # fmt: skip
            if schedule.name in {s.name for s in self.declared_schedules}:
                raise ConfigError(f"a schedule named {schedule.name!r} is declared already")
            self.declared_schedules.append(schedule)
            return task

        return declare

    @property
    def schedules(self) -> Schedules:
        """Runtime control of schedules: add, remove, pause, resume, trigger, list, leader."""
        from .scheduler import Schedules

        return Schedules(self)

    def scheduler(self, **options: Any) -> Scheduler:
        """A scheduler instance (workers run one themselves unless told not to)."""
        from .scheduler import Scheduler

        return Scheduler(self, **options)
