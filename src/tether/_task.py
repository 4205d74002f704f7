"""Tasks, per-call options, and handles.

``@app.task`` turns a function into a :class:`Task`, generic over the function's parameters
and result, so ``await add.enqueue(1, "x")`` is a type error when ``add`` takes two ints,
and ``await handle.result()`` is typed as the function's return value.
"""

from __future__ import annotations

import inspect
import random
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, cast

from ._errors import ConfigError, EnqueueError
from ._settings import check_name, check_priority, seconds

if TYPE_CHECKING:
    from ._app import Tether

P = ParamSpec("P")
R = TypeVar("R")


class TaskStatus(str, Enum):
    """Where a task is in its life."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYING = "retrying"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (
            TaskStatus.SUCCEEDED,
            TaskStatus.FAILED,
            TaskStatus.DEAD,
            TaskStatus.CANCELLED,
        )


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with a cap and jitter: attempt n waits about
    ``min(cap, base * factor ** (n - 1))`` seconds, scaled by a random factor in
    ``[1 - jitter, 1]`` so a fleet of retries does not arrive at once.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        seconds(self.base, "backoff base", allow_zero=True)
        seconds(self.cap, "backoff cap", allow_zero=True)
        if self.factor < 1:
            raise ConfigError(f"backoff factor={self.factor!r}: must be 1 or more")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"backoff jitter={self.jitter!r}: must be between 0 and 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` after attempt ``attempt`` failed."""
        raw = min(self.cap, self.base * self.factor ** max(attempt - 1, 0))
        return raw * (1 - self.jitter * random.random())


@dataclass(frozen=True, slots=True, kw_only=True)
class CallOptions:
    """Options for one enqueue; ``None`` means the task's default."""

    queue: str | None = None
    priority: str | None = None
    delay: float | None = None
    at_ms: int | None = None
    key: str | None = None
    key_ttl: float | None = None
    timeout: float | None = None
    retries: int | None = None
    store_result: bool | None = None


@dataclass(frozen=True, slots=True)
class TaskCall:
    """Arguments for one task in :meth:`Task.enqueue_many`, built by :meth:`Task.call`."""

    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """A task's declared defaults."""

    name: str
    queue: str = "default"
    priority: str = "normal"
    retries: int = 0
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    backoff: Backoff | Callable[[int], float] = field(default_factory=Backoff)
    timeout: float | None = None
    store_result: bool = True
    result_ttl: float | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ConfigError(f"task name {self.name!r} must be a non-empty string")
        check_name("queue", self.queue)
        check_priority(self.priority)
        check_retries(self.retries, self.name)
        if self.timeout is not None:
            object.__setattr__(self, "timeout", check_timeout(self.timeout, self.name))
        if self.result_ttl is not None:
            object.__setattr__(self, "result_ttl", seconds(self.result_ttl, "result_ttl"))
        for exc in self.retry_on:
            if not (isinstance(exc, type) and issubclass(exc, BaseException)):
                raise ConfigError(
                    f"task {self.name!r}: retry_on holds {exc!r}, not an exception class"
                )

    def retry_delay(self, attempt: int) -> float:
        if isinstance(self.backoff, Backoff):
            return self.backoff.delay(attempt)
        return max(0.0, float(self.backoff(attempt)))


def check_retries(value: object, task: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"task {task!r}: retries={value!r} must be a whole number, 0 or more")
    return value


def check_timeout(value: float | timedelta, task: str) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"task {task!r}: timeout={value!r} must be more than zero seconds")
    return float(value)


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
    :meth:`enqueue` to run it on a worker."""

    def __init__(
        self,
        app: Tether,
        fn: Callable[P, Awaitable[R]] | Callable[P, R],
        config: TaskConfig,
        call_options: CallOptions | None = None,
    ) -> None:
        self.app = app
        self.fn = fn
        self.config = config
        self.name = config.name
        self.is_async = inspect.iscoroutinefunction(fn)
        self.signature = inspect.signature(fn)
        self._arity = _simple_arity(self.signature)
        self.plan: tuple[Any, Any] | None = None
        """(app, enqueue plan), computed at the first enqueue (see tether._enqueue.Plan)."""
        self._call_options = call_options or CallOptions()

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.config.queue}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R] | R:
        return self.fn(*args, **kwargs)

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
    ) -> Task[P, R]:
        """This task with per-call options. They never collide with the task's own
        arguments, because they are given here and not to :meth:`enqueue`.

        ``delay`` (seconds or timedelta) and ``at`` (a timezone-aware datetime) run the task
        later; ``key`` enqueues at most one task per key while one is queued, scheduled or
        running, and ``key_ttl`` keeps the key that long after it finished.
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
        return Task(self.app, self.fn, self.config, replace(self._call_options, **changes))

    @property
    def call_options(self) -> CallOptions:
        return self._call_options

    async def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> TaskHandle[R]:
        """Send one task to its queue and return a handle carrying its id."""
        handles = await self.app._enqueue(self, [(args, kwargs)])
        return handles[0]

    async def enqueue_many(
        self, calls: Iterable[tuple[Any, ...] | TaskCall]
    ) -> list[TaskHandle[R]]:
        """Send many tasks in one round trip per batch. Each item is a tuple of positional
        arguments or a :class:`TaskCall` from :meth:`call`."""
        items: list[tuple[tuple[Any, ...], Mapping[str, Any]]] = []
        for item in calls:
            if isinstance(item, TaskCall):
                items.append((item.args, item.kwargs))
            elif isinstance(item, tuple):
                items.append((item, {}))
            else:
                raise EnqueueError(
                    f"task {self.name!r}: enqueue_many takes tuples of arguments or "
                    f"task.call(...) items, not {type(item).__name__}"
                )
        return await self.app._enqueue(self, items)

    def check_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        """Refuse arguments that do not fit the signature (fast for plain signatures)."""
        if kwargs or len(args) != self._arity:
            self.bind_arguments(args, kwargs)

    def bind_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Check the arguments against the signature; name the problem if they do not fit."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise EnqueueError(f"task {self.name!r}: {exc}") from None
        return dict(bound.arguments)


def _simple_arity(signature: inspect.Signature) -> int:
    """The argument count that needs no binding check: all parameters positional without
    defaults. -1 when any call must be checked in full."""
    params = signature.parameters.values()
    if all(p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty for p in params):
        return len(signature.parameters)
    return -1


class TaskHandle(Generic[R]):
    """A reference to an enqueued task. Rebuild one from an id with ``app.handle(id)``."""

    __slots__ = ("app", "duplicate", "id", "queue")

    def __init__(self, app: Tether, task_id: str, queue: str, duplicate: bool = False) -> None:
        self.app = app
        self.id = task_id
        self.queue = queue
        self.duplicate = duplicate
        """True when a dedup key matched and this handle is the earlier task's."""

    def __repr__(self) -> str:
        return f"<TaskHandle {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    async def status(self) -> TaskStatus:
        """Queued, scheduled, running, succeeded, failed, retrying, dead or cancelled."""
        return await self.app._status(self.id)

    async def result(self, timeout: float | timedelta | None = None) -> R:
        """Wait for the outcome: the value, or :class:`TaskFailed` for failed, dead and
        cancelled tasks. Blocks on Redis (no polling); ``timeout`` raises
        :class:`ResultTimeout`."""
        return cast("R", await self.app._result(self.id, timeout))

    async def cancel(self) -> bool:
        """Cancel the task: a queued or scheduled task is removed; a running async task is
        cancelled at its next await. Returns False when it had already finished."""
        return await self.app._cancel(self.id)


AsyncFn = Callable[P, Coroutine[Any, Any, R]]
