"""Tasks, per-call options, and handles.

``@app.task`` turns a function into a :class:`Task`, generic over the function's parameters
and result, so ``await add.enqueue(1, "x")`` is a type error when ``add`` takes two ints,
and ``await handle.result()`` is typed as the function's return value. An ``async def``
function makes an :class:`AsyncTask` and a plain one a :class:`SyncTask`: they differ only in
what calling the task in-process is typed to return (``await add(1, 2)`` for the first).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, cast

from typing_extensions import Self

from ..base._config import TaskConfig, check_retries, check_timeout
from ..base._errors import ConfigError, InvalidArguments
from ..base._limits import check_limit_key
from ..base._settings import check_name, check_priority, seconds
from . import _enqueue
from ._enqueue import CallOptions, Plan
from ._handle import TaskHandle

if TYPE_CHECKING:
    from ._core import Core

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class TaskCall:
    """Arguments for one task in :meth:`Task.enqueue_many`, built by :meth:`Task.call`."""

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def _timing_changes(
    task: str, delay: float | timedelta | None, at: datetime | None
) -> dict[str, Any]:
    """Validate ``delay`` or ``at`` into the CallOptions fields they set."""
    if delay is not None and at is not None:
        raise ConfigError(f"task {task!r}: give delay or at, not both")
    if delay is not None:
        if isinstance(delay, timedelta):
            delay = delay.total_seconds()
        if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
            raise ConfigError(f"task {task!r}: delay={delay!r} must be zero or more seconds")
        return {"delay": float(delay), "at_ms": None}
    if at is not None:
        if not isinstance(at, datetime):
            raise ConfigError(f"task {task!r}: at={at!r} must be a datetime")
        if at.tzinfo is None or at.utcoffset() is None:
            raise ConfigError(
                f"task {task!r}: at={at.isoformat()} is a naive datetime; give it a "
                "time zone, for example datetime.now(timezone.utc)"
            )
        return {"at_ms": int(at.timestamp() * 1000), "delay": None}
    return {}


def default_task_name(fn: Callable[..., Any]) -> str:
    module = fn.__module__
    if module == "__main__":
        # Run as a script, the producer would say "__main__" where the worker imports the
        # module under its real name; use that name so both sides agree.
        main = sys.modules.get("__main__")
        spec = getattr(main, "__spec__", None)
        if spec is not None and spec.name:
            module = spec.name
        else:
            path = getattr(main, "__file__", "") or "__main__"
            module = path.rsplit("/", 1)[-1].removesuffix(".py")
    return f"{module}.{fn.__qualname__}"


class Task(Generic[P, R]):
    """A function registered with an app. Call it directly to run it in-process; use
    :meth:`enqueue` (or :meth:`enqueue_sync` from code without an event loop) to run it on a
    worker."""

    def __init__(
        self,
        app: Core,
        fn: Callable[P, Awaitable[R]] | Callable[P, R] | None,
        config: TaskConfig,
        call_options: CallOptions | None = None,
    ) -> None:
        self.app = app
        self.fn = fn
        """The function; None for a task known only by name (:meth:`Tether.by_name`)."""
        self.config = config
        self.name = config.name
        self.is_async = fn is not None and inspect.iscoroutinefunction(fn)
        self.signature = inspect.signature(fn) if fn is not None else None
        self.plain_arity = _simple_arity(self.signature) if self.signature is not None else -2
        """See :class:`~tether.producer._core.RegisteredTask`."""
        self._plan: Plan | None = None
        self._plan_generation = app.generation
        self._call_options = call_options or CallOptions()

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.config.queue}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R] | R:
        """Run the function here, in this process, as a plain call: no queue, no worker.
        For an async function this returns its coroutine, to be awaited."""
        if self.fn is None:
            raise ConfigError(f"task {self.name!r} is known here by name only: enqueue it")
        return self.fn(*args, **kwargs)

    @property
    def default_queue(self) -> str:
        return self.config.queue

    @property
    def default_priority(self) -> str:
        return self.config.priority

    @property
    def call_options(self) -> CallOptions:
        return self._call_options

    def call(self, *args: P.args, **kwargs: P.kwargs) -> TaskCall:
        """Type-checked arguments for :meth:`enqueue_many`."""
        return TaskCall(args, kwargs)

    def options(
        self,
        *,
        queue: str | None = None,
        priority: str | None = None,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        key: str | None = None,
        key_ttl: float | timedelta | None = None,
        timeout: float | timedelta | None = None,
        retries: int | None = None,
        store_result: bool | None = None,
        limit_key: str | None = None,
    ) -> Self:
        """This task with per-call options. They never collide with the task's own
        arguments, because they are given here and not to :meth:`enqueue`.

        ``delay`` (seconds or timedelta) and ``at`` (a timezone-aware datetime) run the task
        later; ``key`` enqueues at most one task per key while one is queued, scheduled or
        running, and ``key_ttl`` keeps the key that long after it finished. ``limit_key``
        ("tenant:42") puts the task under its declared per-key limits for that key.
        """
        changes: dict[str, Any] = _timing_changes(self.name, delay, at)
        if queue is not None:
            changes["queue"] = check_name("queue", queue)
        if priority is not None:
            changes["priority"] = check_priority(priority)
        if key is not None:
            if not isinstance(key, str) or not key or len(key) > 512:
                raise ConfigError(f"task {self.name!r}: key={key!r} must be 1 to 512 characters")
            changes["key"] = key
        if key_ttl is not None:
            changes["key_ttl"] = seconds(key_ttl, "key_ttl")
        if timeout is not None:
            changes["timeout"] = check_timeout(timeout, self.name)
        if retries is not None:
            changes["retries"] = check_retries(retries, self.name)
        if store_result is not None:
            changes["store_result"] = bool(store_result)
        if limit_key is not None:
            changes["limit_key"] = check_limit_key(self.name, limit_key)
        return type(self)(self.app, self.fn, self.config, replace(self._call_options, **changes))

    # -- enqueue --------------------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        """What every enqueue of this task shares (queue, stream, options), computed once."""
        plan = self._plan
        if plan is None or self._plan_generation != self.app.generation:
            plan = self._plan = Plan.of(self.app, self)
            self._plan_generation = self.app.generation
        return plan

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Send one task to its queue and return a handle carrying its id."""
        handles = await _enqueue.enqueue(self.app, self, self.plan, [(args, kwargs)])
        return handles[0]

    async def enqueue_many(
        self, calls: Iterable[tuple[Any, ...] | TaskCall]
    ) -> list[TaskHandle[R]]:
        """Send many tasks in one round trip per batch. Each item is a tuple of positional
        arguments or a :class:`TaskCall` from :meth:`call`."""
        return await _enqueue.enqueue(self.app, self, self.plan, self._items(calls))

    def enqueue_sync(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """:meth:`enqueue` for code without an event loop (Django, Flask, scripts): the same
        commands on the app's blocking client. Thread-safe."""
        return _enqueue.enqueue_one_sync(self.app, self, self.plan, args, kwargs)

    def enqueue_many_sync(self, calls: Iterable[tuple[Any, ...] | TaskCall]) -> list[TaskHandle[R]]:
        """:meth:`enqueue_many`, blocking."""
        return _enqueue.enqueue_sync(
            self.app, self, self.plan, self._items(calls), "enqueue_many_sync"
        )

    def _items(
        self, calls: Iterable[tuple[Any, ...] | TaskCall]
    ) -> list[tuple[tuple[Any, ...], Mapping[str, Any]]]:
        items: list[tuple[tuple[Any, ...], Mapping[str, Any]]] = []
        for item in calls:
            if isinstance(item, TaskCall):
                items.append((item.args, item.kwargs))
            elif isinstance(item, tuple):
                items.append((item, {}))
            else:
                raise InvalidArguments(
                    f"task {self.name!r}: enqueue_many takes tuples of arguments or "
                    f"task.call(...) items, not {type(item).__name__}"
                )
        return items

    def check_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """Refuse arguments that do not fit the signature (fast for plain signatures). A
        task known by name only is checked by the worker that runs it."""
        if self.plain_arity == -2:
            return
        if kwargs or len(args) != self.plain_arity:
            self.bind_arguments(args, kwargs)

    def bind_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Check the arguments against the signature; name the problem if they do not fit."""
        if self.signature is None:
            bound = {f"args[{i}]": v for i, v in enumerate(args)}
            bound.update(kwargs)
            return bound
        try:
            arguments = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArguments(f"task {self.name!r}: {exc}") from None
        return dict(arguments.arguments)


class AsyncTask(Task[P, R]):
    """A task whose function is ``async def``. Calling it returns the function's coroutine,
    so ``await add(1, 2)`` runs it in-process and is typed as its result."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Coroutine[Any, Any, R]:
        # The same call; only the type is narrower, as ``@app.task`` knows the function's.
        return cast("Coroutine[Any, Any, R]", super().__call__(*args, **kwargs))


class SyncTask(Task[P, R]):
    """A task whose function is a plain one. Calling it runs the function in-process and
    returns its result."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return cast("R", super().__call__(*args, **kwargs))


def task_class(fn: Callable[..., Any]) -> type[Task[Any, Any]]:
    """The class ``@app.task`` makes of ``fn``: :class:`AsyncTask` for an ``async def``."""
    return AsyncTask if inspect.iscoroutinefunction(fn) else SyncTask


def _simple_arity(signature: inspect.Signature) -> int:
    """The argument count that needs no binding check: all parameters positional without
    defaults. -1 when any call must be checked in full."""
    params = signature.parameters.values()
    if all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params):
        return len(signature.parameters)
    return -1
