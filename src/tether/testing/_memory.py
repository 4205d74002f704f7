"""The recording mode: enqueues are kept in memory, checked and encoded exactly as for the
server, and nothing runs. The eager mode (``_eager.py``) builds on it.

Every enqueue still goes through the real producer path up to the write: arguments are
checked against the signature, encoded by the app's serializer (an unserializable one raises
``SerializationError``), ``before_enqueue`` hooks run. What is recorded is what a worker would
decode, so arguments are compared after a round trip through the serializer.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import TracebackType
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from typing_extensions import Self

from ..base._errors import ConfigError, ResultTimeout, TaskFailed, TaskNotFound
from ..base._middleware import call_hooks, overrides
from ..base._settings import PRIORITIES
from ..base._status import CancelResult, TaskStatus
from ..producer._handle import TaskHandle
from ..protocol._envelope import Envelope
from ..protocol._keys import derived_task_id

if TYPE_CHECKING:
    from ..producer import Plan
    from ..producer._core import Core
    from ..producer._task import Task

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Enqueued:
    """One accepted enqueue, as a worker would see it."""

    task: str
    """The task's name."""
    args: tuple[Any, ...]
    """The positional arguments a worker receives, decoded by the app's serializer: a tuple
    (as ``unittest.mock``'s ``call.args``) whose values went through the serializer, so a
    tuple argument is a list here with JSON: ``("mug", [8, 10])``."""
    kwargs: Mapping[str, Any]
    """The keyword arguments a worker receives, decoded the same way."""
    queue: str
    priority: str
    task_id: str
    delay: float | None = None
    """Seconds, as given to ``options(delay=...)``."""
    at: datetime | None = None
    """As given to ``options(at=...)`` (in UTC)."""
    key: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    """The per-call options sent with the task: timeout, retries, store_result, key_ttl,
    limit_key."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """What ``before_enqueue`` hooks added."""
    duplicate: bool = False
    """A dedup key matched a task already held: no new task was created."""

    def __str__(self) -> str:
        call = ", ".join([*map(repr, self.args), *(f"{k}={v!r}" for k, v in self.kwargs.items())])
        extras = [f"queue={self.queue}", f"priority={self.priority}"]
        if self.delay is not None:
            extras.append(f"delay={self.delay:g}")
        if self.at is not None:
            extras.append(f"at={self.at.isoformat()}")
        if self.key is not None:
            extras.append(f"key={self.key!r}")
        extras += [f"{k}={v!r}" for k, v in self.options.items() if k != "key"]
        if self.duplicate:
            extras.append("duplicate")
        return f"{self.task}({call}) {' '.join(extras)}"


@dataclass
class Record:
    """A task held in memory: what it is, and what became of it."""

    enqueued: Enqueued
    envelope: Envelope
    sidx: int
    due_ms: int
    seq: int
    status: TaskStatus
    value: Any = None
    error: dict[str, str] | None = None
    attempt: int = 1


class Recorder:
    """Enqueues of ``app`` kept in memory, nothing runs: ``with recording(app) as queue``.

    Handles work: ``status()`` says queued or scheduled (cancelled after ``cancel()``);
    ``result()`` raises :class:`~tether.ResultTimeout` at once, since nothing will run the
    task. Dedup keys are held as on the server, so a second enqueue with the same key returns
    the first task's handle (``duplicate=True``).
    """

    worker_name = "recording"

    def __init__(self, app: Core) -> None:
        self.app = app
        self.enqueued: list[Enqueued] = []
        """Every enqueue, in order (duplicates included, flagged)."""
        self.dead: list[tuple[str, str]] = []
        """Dead letters: (task id, reason)."""
        self._records: dict[str, Record] = {}
        self._dedup: dict[tuple[str, str], tuple[str, float | None]] = {}
        """(queue, key) -> (task id, expiry on the monotonic clock once the task is done)."""
        self._lock = threading.RLock()
        self._seq = itertools.count(1)

    # -- lifecycle ----------------------------------------------------------------------

    def install(self) -> Self:
        if self.app.intercept is not None:
            raise ConfigError(f"{self.app!r} is already in a testing mode; leave it first")
        self.app.intercept = self
        return self

    def uninstall(self) -> None:
        if self.app.intercept is self:
            self.app.intercept = None

    def __enter__(self) -> Self:
        return self.install()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()

    # -- accepting enqueues (the app's intercept) ---------------------------------------

    def accept(
        self, task: Task[Any, Any], plan: Plan, ids: list[str], payloads: list[bytes]
    ) -> list[tuple[TaskHandle[Any], Record | None]]:
        """Record the encoded tasks; returns each handle with its new record (None for a
        duplicate)."""
        serializer = self.app.serializer
        opts = task.call_options
        at = (
            datetime.fromtimestamp(opts.at_ms / 1000, tz=timezone.utc)
            if opts.at_ms is not None
            else None
        )
        out: list[tuple[TaskHandle[Any], Record | None]] = []
        with self._lock:
            for n, payload in enumerate(payloads):
                env = Envelope.decode(payload, serializer)
                seq = next(self._seq)
                task_id = ids[n] if ids else derived_task_id(
                    plan.queue, plan.sidx, f"{env.enqueued_ms}-{seq}"
                )  # fmt: skip
                env.id = env.id or task_id
                duplicate_of = self._held(plan.queue, opts.key)
                enqueued = Enqueued(
                    task=env.task,
                    args=tuple(env.args),
                    kwargs=env.kwargs,
                    queue=plan.queue,
                    priority=PRIORITIES[plan.sidx - 1],
                    task_id=duplicate_of or task_id,
                    delay=opts.delay,
                    at=at,
                    key=opts.key,
                    options={k: v for k, v in env.options.items() if k != "key"},
                    headers=env.headers or {},
                    duplicate=duplicate_of is not None,
                )
                self.enqueued.append(enqueued)
                if duplicate_of is not None:
                    out.append((TaskHandle(self.app, duplicate_of, plan.queue, True), None))
                    continue
                if opts.key is not None:
                    self._dedup[(plan.queue, opts.key)] = (task_id, None)
                due = env.due_ms if env.due_ms is not None else env.enqueued_ms
                status = TaskStatus.QUEUED if env.due_ms is None else TaskStatus.SCHEDULED
                record = Record(enqueued, env, plan.sidx, due, seq, status)
                self._records[task_id] = record
                out.append((TaskHandle(self.app, task_id, plan.queue), record))
        return out

    def _held(self, queue: str, key: str | None) -> str | None:
        if key is None:
            return None
        held = self._dedup.get((queue, key))
        if held is None:
            return None
        task_id, expires = held
        if expires is not None and expires <= time.monotonic():
            del self._dedup[(queue, key)]
            return None
        return task_id

    def release_key(self, record: Record) -> None:
        """The task reached its outcome: its dedup key is released, or held ``key_ttl``."""
        env = record.envelope
        key = env.options.get("key")
        if not isinstance(key, str):
            return
        with self._lock:
            queue = record.enqueued.queue
            if self._dedup.get((queue, key), ("", None))[0] != env.id:
                return
            hold = env.options.get("key_ttl")
            if isinstance(hold, (int, float)) and hold > 0:
                self._dedup[(queue, key)] = (env.id, time.monotonic() + hold)
            else:
                del self._dedup[(queue, key)]

    async def enqueue(
        self, task: Task[Any, Any], plan: Plan, ids: list[str], payloads: list[bytes]
    ) -> list[TaskHandle[Any]]:
        accepted = self.accept(task, plan, ids, payloads)
        await self._on_enqueue(task.name, plan.queue, accepted)
        return [handle for handle, _ in accepted]

    def enqueue_sync(
        self, task: Task[Any, Any], plan: Plan, ids: list[str], payloads: list[bytes]
    ) -> list[TaskHandle[Any]]:
        accepted = self.accept(task, plan, ids, payloads)
        if overrides(self.app.middleware, "on_enqueue"):
            asyncio.run(self._on_enqueue(task.name, plan.queue, accepted))
        return [handle for handle, _ in accepted]

    async def _on_enqueue(
        self, name: str, queue: str, accepted: list[tuple[TaskHandle[Any], Record | None]]
    ) -> None:
        if not overrides(self.app.middleware, "on_enqueue"):
            return
        for handle, record in accepted:
            if record is not None:
                await call_hooks(self.app.middleware, "on_enqueue", name, handle.id, queue)

    # -- handles ------------------------------------------------------------------------

    def record(self, task_id: str) -> Record:
        with self._lock:
            record = self._records.get(task_id)
        if record is None:
            raise TaskNotFound(f"task {task_id} is unknown: it was not enqueued in this test")
        return record

    def status_sync(self, task_id: str) -> TaskStatus:
        record = self.record(task_id)
        if record.status is TaskStatus.SUCCEEDED and not _stores_result(self.app, record):
            raise TaskNotFound(f"task {task_id} is unknown: it does not store results")
        return record.status

    async def status(self, task_id: str) -> TaskStatus:
        return self.status_sync(task_id)

    def wait_result_sync(self, task_id: str, timeout: float | None) -> Any:
        record = self.record(task_id)
        if record.status is TaskStatus.SUCCEEDED:
            if not _stores_result(self.app, record):
                raise TaskNotFound(f"task {task_id} does not store results")
            return record.value
        if record.status.is_final:
            error = record.error or {}
            raise TaskFailed(
                task_id,
                record.status.value,
                error.get("type", ""),
                error.get("message", ""),
                error.get("traceback", ""),
            )
        raise ResultTimeout(f"task {task_id} is {record.status.value}: {self._why_pending()}")

    async def wait_result(self, task_id: str, timeout: float | None) -> Any:
        return self.wait_result_sync(task_id, timeout)

    def _why_pending(self) -> str:
        return "tasks never run in recording mode (use tether.testing.eager to run them)"

    def cancel_sync(self, task_id: str) -> CancelResult:
        record = self.record(task_id)
        with self._lock:
            if record.status.is_final:
                return CancelResult.FINISHED
            if record.status is TaskStatus.RUNNING:
                task = self.app.tasks.get(record.enqueued.task)
                if task is not None and not task.is_async:
                    return CancelResult.NOT_CANCELLABLE
                return CancelResult.REQUESTED
            record.status = TaskStatus.CANCELLED
            record.error = {"type": "Cancelled", "message": "cancelled before it ran"}
        self.release_key(record)
        return CancelResult.CANCELLED

    async def cancel(self, task_id: str) -> CancelResult:
        return self.cancel_sync(task_id)

    # -- assertions ---------------------------------------------------------------------

    def calls(self, task: Task[Any, Any] | str) -> list[Enqueued]:
        """What was enqueued of ``task`` (a task or its name), duplicates left out."""
        name = task if isinstance(task, str) else task.name
        return [e for e in self.enqueued if e.task == name and not e.duplicate]

    def matching(self, task: Task[P, R], *args: P.args, **kwargs: P.kwargs) -> list[Enqueued]:
        """The enqueues of ``task`` with exactly these arguments, and with the options given
        to ``task.options(...)`` (``queue``, ``priority``, ``delay``, ``at``, ``key``, ...);
        options not given there are not compared. The arguments go through the app's
        serializer before they are compared, as the enqueued ones did: ``(8, 10)`` matches
        an argument recorded as ``[8, 10]``."""
        expected_args, expected_kwargs = self._normalised(args, kwargs)
        wanted = _option_filter(task)
        return [
            e
            for e in self.calls(task)
            if list(e.args) == expected_args
            and dict(e.kwargs) == expected_kwargs
            and all(getattr_option(e, k) == v for k, v in wanted.items())
        ]

    def assert_enqueued(self, task: Task[P, R], *args: P.args, **kwargs: P.kwargs) -> Enqueued:
        """At least one enqueue of ``task`` with these arguments (and the options given to
        ``task.options(...)``); returns the first."""
        found = self.matching(task, *args, **kwargs)
        if not found:
            raise AssertionError(self._explain(task, args, kwargs, "at least once", 0))
        return found[0]

    def assert_enqueued_once(self, task: Task[P, R], *args: P.args, **kwargs: P.kwargs) -> Enqueued:
        """Exactly one enqueue of ``task`` with these arguments (and options), and no other
        enqueue of ``task`` at all."""
        found = self.matching(task, *args, **kwargs)
        every = self.calls(task)
        if len(found) != 1 or len(every) != 1:
            raise AssertionError(self._explain(task, args, kwargs, "once", len(found)))
        return found[0]

    def assert_not_enqueued(self, task: Task[Any, Any] | str) -> None:
        found = self.calls(task)
        if found:
            lines = "\n  ".join(map(str, found))
            raise AssertionError(f"expected no enqueue of {_name(task)}; found:\n  {lines}")

    def _normalised(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> tuple[list[Any], dict[str, Any]]:
        serializer = self.app.serializer
        decoded = serializer.loads(serializer.dumps({"a": list(args), "k": dict(kwargs)}))
        return list(decoded["a"]), dict(decoded["k"])

    def _explain(
        self,
        task: Task[Any, Any],
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        how: str,
        found: int,
    ) -> str:
        call = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        wanted = [f"{k}={v!r}" for k, v in _option_filter(task).items()]
        expected = " ".join([f"{task.name}({call})", *wanted])
        lines = "\n  ".join(map(str, self.calls(task))) or "(nothing)"
        return (
            f"expected {expected} enqueued {how}, matched {found} time(s); {task.name} was "
            f"enqueued as:\n  {lines}"
        )

    def records(self) -> Iterator[Record]:
        with self._lock:
            yield from list(self._records.values())


def _name(task: Task[Any, Any] | str) -> str:
    return task if isinstance(task, str) else task.name


def _option_filter(task: Task[Any, Any]) -> dict[str, Any]:
    """The options the expectation set with ``task.options(...)``, as Enqueued fields."""
    opts = task.call_options
    wanted: dict[str, Any] = {}
    for name in ("queue", "priority", "delay", "key", "timeout", "retries", "store_result"):
        value = getattr(opts, name)
        if value is not None:
            wanted[name] = value
    if opts.key_ttl is not None:
        wanted["key_ttl"] = opts.key_ttl
    if opts.limit_key is not None:
        wanted["limit_key"] = opts.limit_key
    if opts.at_ms is not None:
        wanted["at"] = datetime.fromtimestamp(opts.at_ms / 1000, tz=timezone.utc)
    return wanted


def getattr_option(enqueued: Enqueued, name: str) -> Any:
    if name in ("timeout", "retries", "store_result", "key_ttl", "limit_key"):
        return enqueued.options.get(name)
    return getattr(enqueued, name)


def _stores_result(app: Core, record: Record) -> bool:
    store = record.envelope.options.get("store_result")
    if isinstance(store, bool):
        return store
    task = app.tasks.get(record.enqueued.task)
    return task is None or task.config.store_result
