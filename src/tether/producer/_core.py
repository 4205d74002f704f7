"""What every part of Tether shares: settings, the connection, keys, the serializer, the
middleware and the task registry.

The :class:`~tether.Tether` facade is a :class:`Core` with the declaring and composing methods
on top; the parts (tasks, handles, workers, the scheduler, dead letters) depend on this module
and never on the facade, so no import runs back up.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

from ..base._errors import ConfigError, NotOpen
from ..base._middleware import Middleware
from ..base._redis import (
    AsyncClient,
    SyncClient,
    Target,
    async_client,
    close_async,
    close_sync,
    parse_url,
    sync_client,
)
from ..base._settings import AppSettings
from ..protocol._envelope import JsonSerializer, Serializer
from ..protocol._keys import QueueKeys, queue_keys

if TYPE_CHECKING:
    import inspect
    from collections.abc import Callable

    from ..base._config import TaskConfig
    from ..base._schedule import Schedule

DEFAULT_URL = "redis://localhost:6379/0"

log = logging.getLogger("tether")


class RegisteredTask(Protocol):
    """What the parts need of a registered task (a :class:`~tether.Task` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def fn(self) -> Callable[..., Any] | None: ...

    @property
    def config(self) -> TaskConfig: ...

    @property
    def is_async(self) -> bool: ...

    @property
    def signature(self) -> inspect.Signature | None: ...

    @property
    def plain_arity(self) -> int:
        """The argument count a call needs no binding check for (every parameter
        positional, without a default); -1: check every call; -2: no signature."""
        ...


class Intercept(Protocol):
    """What :mod:`tether.testing` puts in place of the server: every enqueue (after its
    arguments were checked and encoded, so nothing that would fail for real passes here) and
    every handle call goes to it instead of Redis. Typed loosely to keep this module at the
    bottom of the imports; the implementation is typed in full."""

    async def enqueue(self, task: Any, plan: Any, ids: list[str], payloads: list[bytes]) -> Any:
        """Accept encoded tasks; return their handles (ids empty for a plain enqueue)."""

    def enqueue_sync(self, task: Any, plan: Any, ids: list[str], payloads: list[bytes]) -> Any:
        """:meth:`enqueue` from a thread without an event loop."""

    async def status(self, task_id: str) -> Any: ...

    def status_sync(self, task_id: str) -> Any: ...

    async def wait_result(self, task_id: str, timeout: float | None) -> Any: ...

    def wait_result_sync(self, task_id: str, timeout: float | None) -> Any: ...

    async def cancel(self, task_id: str) -> Any: ...

    def cancel_sync(self, task_id: str) -> Any: ...


class Core:
    """Settings, connections and registries of an app. Use :class:`~tether.Tether`."""

    def __init__(
        self,
        url: str | None = None,
        *,
        namespace: str | None = None,
        serializer: Serializer | None = None,
        result_ttl: float | timedelta = 3600.0,
        dead_letter_maxlen: int = 10_000,
        socket_timeout: float | timedelta = 10.0,
        connect_timeout: float | timedelta = 5.0,
        max_connections: int = 100,
        pool_timeout: float | timedelta = 10.0,
        enqueue_replicas: int = 0,
        enqueue_replicas_timeout: float | timedelta = 1.0,
        stats: bool = True,
        stats_window: float | timedelta = 24 * 3600.0,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        if isinstance(result_ttl, timedelta):
            result_ttl = result_ttl.total_seconds()
        if isinstance(stats_window, timedelta):
            stats_window = stats_window.total_seconds()
        if isinstance(pool_timeout, timedelta):
            pool_timeout = pool_timeout.total_seconds()
        env_url = os.environ.get("TETHER_URL")
        self.url_source = "code" if url else "TETHER_URL" if env_url else "default"
        """Where the URL came from: 'code', 'TETHER_URL', 'default' or 'override'."""
        self.settings = AppSettings(
            url=url or env_url or DEFAULT_URL,
            namespace=namespace or os.environ.get("TETHER_NAMESPACE") or "tether",
            result_ttl=result_ttl,
            dead_letter_maxlen=dead_letter_maxlen,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
            max_connections=max_connections,
            pool_timeout=pool_timeout,
            enqueue_replicas=enqueue_replicas,
            enqueue_replicas_timeout=enqueue_replicas_timeout,
            stats=stats,
            stats_window=stats_window,
        )
        self.target: Target = parse_url(self.settings.url)
        self.serializer: Serializer = serializer or JsonSerializer()
        self.middleware: tuple[Middleware, ...] = tuple(middleware)
        self.tasks: dict[str, RegisteredTask] = {}
        """Registered tasks by name."""
        self.task_loaders: list[Callable[[str], RegisteredTask | None]] = []
        """Asked, in order, for a task name the registry does not hold (an integration that
        imports tasks on demand, such as the Django backend's worker)."""
        self.intercept: Intercept | None = None
        """Set by :mod:`tether.testing`: enqueues and handles are served in memory."""
        self.declared_schedules: list[Schedule] = []
        self.generation = 0
        """Raised by :meth:`configure`: cached enqueue plans are stale."""
        self._client: AsyncClient | None = None
        self._sync_client: SyncClient | None = None
        self._sync_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.target.redacted} namespace={self.namespace!r}>"

    @property
    def namespace(self) -> str:
        return self.settings.namespace

    def configure(self, *, url: str | None = None, namespace: str | None = None) -> None:
        """Point a closed app at another server or namespace (an explicit ``--url`` or
        ``--namespace`` given to the CLI wins over the values in code)."""
        if self._client is not None or self._sync_client is not None:
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
        # Tasks compute their enqueue plan (keys included) again at their next enqueue.
        self.generation += 1

    def keys(self, queue: str) -> QueueKeys:
        """Every key of ``queue`` (cached for the queues in use, see :func:`queue_keys`)."""
        return queue_keys(self.namespace, queue)

    def find_task(self, name: str) -> RegisteredTask | None:
        """The task registered as ``name``, else the first one a loader provides (registered
        then, so each name is loaded once). A loader returns None for a name it does not
        serve, and raises :class:`LookupError` to say why it cannot load one it does (the
        worker dead-letters the entry with that reason)."""
        task = self.tasks.get(name)
        if task is None:
            for loader in self.task_loaders:
                task = loader(name)
                if task is not None:
                    self.tasks[name] = task
                    break
        return task

    def add_middleware(self, middleware: Middleware) -> None:
        self.middleware = (*self.middleware, middleware)

    # -- the asyncio connection -------------------------------------------------------

    async def open(self) -> Any:
        """Open the connection (lazily connected). ``async with app:`` does this for you."""
        if self._client is None:
            self._client = async_client(
                self.target,
                socket_timeout=self.settings.socket_timeout,
                connect_timeout=self.settings.connect_timeout,
                max_connections=self.settings.max_connections,
                pool_timeout=self.settings.pool_timeout,
            )
        return self

    async def close(self) -> None:
        """Close the asyncio connection and, if one was opened, the synchronous one."""
        client, self._client = self._client, None
        if client is not None:
            await close_async(client)
        self.close_sync()

    @property
    def client(self) -> AsyncClient:
        """The open asyncio client; raises :class:`NotOpen` outside ``async with app``."""
        if self._client is None:
            raise NotOpen("the Tether app is not open: use `async with app:` or `await app.open()`")
        return self._client

    @property
    def is_open(self) -> bool:
        return self._client is not None

    # -- the synchronous connection ---------------------------------------------------

    @property
    def sync_client(self) -> SyncClient:
        """A blocking client with a thread-safe connection pool, opened at first use; the
        ``*_sync`` methods of tasks and handles use it. :meth:`close_sync` closes it."""
        client = self._sync_client
        if client is None:
            with self._sync_lock:
                client = self._sync_client
                if client is None:
                    client = self._sync_client = sync_client(
                        self.target,
                        socket_timeout=self.settings.socket_timeout,
                        connect_timeout=self.settings.connect_timeout,
                        retries=3,
                        max_connections=self.settings.max_connections,
                        pool_timeout=self.settings.pool_timeout,
                    )
        return client

    def close_sync(self) -> None:
        with self._sync_lock:
            client, self._sync_client = self._sync_client, None
        if client is not None:
            close_sync(client)
