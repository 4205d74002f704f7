"""The ``django.tasks`` backend: a Django project's ``@task`` functions enqueued to Tether.

A Django task becomes a Tether task named by its module path (``shop.tasks.send_receipt``),
on the queue named by its ``queue_name``, at the priority its ``priority`` maps to, delayed
to its ``run_after``. ``TaskResult.id`` is the Tether task id, so ``get_result`` reads
Tether's status and result records, and ``app.handle(result.id)`` works on the same task.
"""

from __future__ import annotations

import builtins
import inspect
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from datetime import datetime, timezone
from typing import Any

from asgiref.sync import sync_to_async
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone as dj_timezone
from django.utils.module_loading import import_string

from tether import ConfigError, TaskNotFound, TaskStatus, Tether
from tether import Task as TetherTask
from tether.base._config import TaskConfig
from tether.base._settings import AppSettings, WorkerSettings, check_name, closest
from tether.protocol._codecs import locate, parse_scheduled, payload_of
from tether.protocol._envelope import BadEnvelope, Envelope
from tether.protocol._keys import entry_of_task_id, queue_of_task_id

from ._compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_enqueued,
)

_APP_OPTIONS = frozenset(f.name for f in fields(AppSettings))
"""The ``Tether(...)`` keywords a backend's ``OPTIONS`` may set (in any case): the fields of
the app's settings."""

_apps: dict[tuple[str, str], Tether] = {}
_apps_lock = threading.Lock()


def tether_priority(priority: int) -> str:
    """Django's priorities run from -100 to 100; Tether has three levels: above zero is
    ``high``, zero ``normal``, below zero ``low``."""
    if priority > 0:
        return "high"
    return "low" if priority < 0 else "normal"


def result_status(name: str) -> Any:
    """A member of Django's TaskResultStatus (typed loosely: Django has no types)."""
    return getattr(TaskResultStatus, name)


def _status(status: TaskStatus) -> Any:
    if status is TaskStatus.RUNNING:
        return result_status("RUNNING")
    if status is TaskStatus.SUCCEEDED:
        return result_status("SUCCESSFUL")
    if status.is_final:  # failed, dead, cancelled
        return result_status("FAILED")
    return result_status("READY")  # queued, scheduled, retrying


def from_ms(ms: object) -> datetime | None:
    if not isinstance(ms, int) or isinstance(ms, bool) or ms <= 0:
        return None
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment if dj_timezone.is_aware(dj_timezone.now()) else dj_timezone.make_naive(moment)


def enqueued_ms(task_id: str, recorded: object) -> object:
    """A task's enqueue time (unix ms), the same whoever reads it: ``enqueue``'s result,
    ``get_result`` while the task waits and after it ran, and the worker's signals. A plain
    task's id is its stream entry, whose id is the server's time of the write; a task with
    ``run_after`` has an id of its own, and the time its envelope carries (``recorded``: the
    envelope's, the run's context's, or the stored result's copy of it)."""
    entry = entry_of_task_id(task_id)
    if entry is not None:
        return int(entry[1].split("-")[0])
    return recorded


def signature_of(task: Task[Any, Any]) -> inspect.Signature:
    """The arguments a producer gives: the function's, less ``context`` when the task takes
    the context (the worker passes it)."""
    signature = inspect.signature(task.func)
    if task.takes_context:
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    return signature


def _signature_of(task: Task[Any, Any]) -> Callable[..., Any]:
    """A stand-in for the function on the producer's side: its signature only."""

    def never_called(*args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"{task.module_path} runs on a Tether worker; enqueue it")

    setattr(never_called, "__signature__", signature_of(task))  # noqa: B010 - inspect reads it
    return never_called


def exception_path(error_type: str) -> str:
    """An importable path for a recorded error type: Tether records builtins by bare name
    (``ValueError``); Django's ``TaskError.exception_class`` imports the path. Outcomes that
    are not exceptions of the task (dead letters) become :class:`tether.TaskFailed`."""
    if "." in error_type:
        if error_type == "tether.Dead":
            return "tether.TaskFailed"
        return error_type
    if isinstance(getattr(builtins, error_type, None), type):
        return f"builtins.{error_type}"
    if error_type == "Cancelled":
        return "asyncio.CancelledError"
    return "tether.TaskFailed"


class TetherBackend(BaseTaskBackend):
    """``TASKS = {"default": {"BACKEND": "tether.contrib.django.TetherBackend", ...}}``.

    ``OPTIONS`` take either ``"APP": "module:attribute"`` (a Tether app of the project, with
    its serializer and middleware) or the keywords of ``Tether(...)``, the app's settings, in
    any case: ``"URL"``, ``"NAMESPACE"``, ``"RESULT_TTL"``, ... (``TETHER_URL`` and
    ``TETHER_NAMESPACE`` fill in what is left out). An unknown option is refused by name (a
    worker setting with the ``tether worker`` option that sets it). ``QUEUES`` lists the
    queue names tasks may use, as for any backend.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self._options: dict[str, Any] = {
            str(k).lower(): v for k, v in (params.get("OPTIONS") or {}).items()
        }
        self._tasks: dict[tuple[str, str, int], TetherTask[Any, Any]] = {}

    # -- the Tether app -----------------------------------------------------------------

    @property
    def tether(self) -> Tether:
        """The Tether app this backend enqueues to: one per alias and options, shared by
        every thread (Django makes a backend per thread; the app's blocking client is a
        thread-safe pool)."""
        key = (self.alias, repr(sorted(self._options.items())))
        app = _apps.get(key)
        if app is None:
            with _apps_lock:
                app = _apps.get(key)
                if app is None:
                    app = _apps[key] = self._build_app()
        return app

    def _build_app(self) -> Tether:
        options = dict(self._options)
        spec = options.pop("app", None)
        if spec is not None:
            if options:
                raise ImproperlyConfigured(
                    f"TASKS[{self.alias!r}]: OPTIONS give APP, so the app's own settings apply; "
                    f"remove {', '.join(sorted(k.upper() for k in options))}"
                )
            module, _, attr = str(spec).partition(":")
            try:
                app = import_string(f"{module}.{attr or 'app'}")
            except ImportError as exc:
                raise ImproperlyConfigured(
                    f"TASKS[{self.alias!r}]: OPTIONS APP={spec!r} cannot be imported: {exc}"
                ) from exc
            if not isinstance(app, Tether):
                raise ImproperlyConfigured(
                    f"TASKS[{self.alias!r}]: OPTIONS APP={spec!r} is a {type(app).__name__}, "
                    "not a Tether app"
                )
            return app
        unknown = sorted(set(options) - _APP_OPTIONS)
        if unknown:
            known = sorted(k.upper() for k in {"app", *_APP_OPTIONS})
            raise ImproperlyConfigured(
                f"TASKS[{self.alias!r}]: unknown OPTIONS {', '.join(map(_unknown, unknown))} "
                f"(known: {', '.join(known)})"
            )
        try:
            return Tether(**options)
        except ConfigError as exc:
            raise ImproperlyConfigured(f"TASKS[{self.alias!r}]: {exc}") from exc

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        """``manage.py check`` reports bad OPTIONS and queue names before anything runs."""
        messages: list[checks.CheckMessage] = []
        try:
            self.tether  # noqa: B018 - builds the app, which validates the options
        except ImproperlyConfigured as exc:
            messages.append(checks.Error(str(exc), id="tether.E001"))
        for queue in sorted(self.queues):
            try:
                check_name("queue", queue)
            except ConfigError as exc:
                messages.append(
                    checks.Error(f"TASKS[{self.alias!r}] QUEUES: {exc}", id="tether.E002")
                )
        return messages

    # -- enqueue ------------------------------------------------------------------------

    def validate_task(self, task: Task[Any, Any]) -> None:
        super().validate_task(task)
        try:
            check_name("queue", task.queue_name)
        except ConfigError as exc:
            raise InvalidTask(str(exc)) from None

    def tether_task(self, task: Task[Any, Any]) -> TetherTask[Any, Any]:
        """The Tether task that ``task`` is enqueued as: named by its module path, and
        checking the arguments against the function's signature, so a wrong call fails here
        and a bad argument is named."""
        key = (task.module_path, task.queue_name, task.priority)
        tether_task = self._tasks.get(key)
        if tether_task is None:
            config = TaskConfig(
                name=task.module_path,
                queue=task.queue_name,
                priority=tether_priority(task.priority),
            )
            tether_task = self._tasks[key] = TetherTask(self.tether, _signature_of(task), config)
        if task.run_after is not None:
            run_after = task.run_after
            if dj_timezone.is_naive(run_after):  # USE_TZ = False: local time of TIME_ZONE
                run_after = dj_timezone.make_aware(run_after)
            tether_task = tether_task.options(at=run_after)
        return tether_task

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        self.validate_task(task)
        # Tether's errors go to the caller as they are: an argument JSON cannot encode raises
        # SerializationError (a TypeError) and nothing is written.
        handle = self.tether_task(task).enqueue_sync(*args, **kwargs)
        result: TaskResult[Any] = TaskResult(
            task=task,
            id=handle.id,
            status=result_status("READY"),
            enqueued_at=self._enqueued_at(handle.id),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def _enqueued_at(self, task_id: str) -> datetime | None:
        """The enqueue time ``get_result`` will report: a plain task's is in its id; a task
        with ``run_after`` is read back (one round trip), as the producer does not say
        which time it wrote into the envelope."""
        recorded = None
        if entry_of_task_id(task_id) is None:
            recorded = _recorded_enqueue(*_read(self.tether, task_id))
        return from_ms(enqueued_ms(task_id, recorded)) or dj_timezone.now()

    async def aenqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        # Enqueueing touches no database: any thread will do, not Django's main one.
        return await sync_to_async(self.enqueue, thread_sensitive=False)(task, args, kwargs)

    # -- results ------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult[Any]:
        app = self.tether
        try:
            handle = app.handle(result_id)
            status = handle.status_sync()
        except (ConfigError, TaskNotFound) as exc:
            raise TaskResultDoesNotExist(str(exc)) from None
        record, env = _read(app, result_id)
        if record is None and env is None:
            raise TaskResultDoesNotExist(
                f"task {result_id} is {status.value}, but neither its entry nor its result is "
                "left (the result expired, or was not stored)"
            )
        name = env.task if env is not None else str(record.get("task", "")) if record else ""
        try:
            task = import_string(name)
        except ImportError as exc:
            raise TaskResultDoesNotExist(
                f"task {result_id} is a {name!r}, which cannot be imported here: {exc}"
            ) from None
        if not isinstance(task, Task):
            raise TaskResultDoesNotExist(f"task {result_id} is a {name!r}, not a Django task")
        return _result(self.alias, task, result_id, status, record, env)

    async def aget_result(self, result_id: str) -> TaskResult[Any]:
        return await sync_to_async(self.get_result, thread_sensitive=False)(result_id)


def _unknown(key: str) -> str:
    """An unknown OPTIONS key, with what it may have meant: a worker setting belongs to
    ``tether worker``; another name may be a misspelt option."""
    if key in {f.name for f in fields(WorkerSettings)}:
        flag = "--" + key.replace("_", "-")
        return (
            f"{key.upper()} (a worker setting, not the app's: give it to the worker, "
            f"tether worker tether.contrib.django {flag} ...)"
        )
    near = closest(key, {"app", *_APP_OPTIONS})
    return f"{key.upper()} (did you mean {near.upper()}?)" if near else key.upper()


def _read(app: Tether, task_id: str) -> tuple[dict[str, Any] | None, Envelope | None]:
    """The task's outcome record, if any, and its envelope while it waits or runs.

    A task moves on while it is read (promoted from the scheduled tasks to a stream, settled
    from its entry to its record): the reads follow it in that order, and start again
    should it have moved between two of them, so a task that exists is found somewhere (a
    finishing task was reported missing to a caller polling ``refresh()``)."""
    found: tuple[dict[str, Any] | None, Envelope | None] = (None, None)
    for _ in range(3):
        found = _read_once(app, task_id)
        if found != (None, None):
            break
    return found


def _read_once(app: Tether, task_id: str) -> tuple[dict[str, Any] | None, Envelope | None]:
    keys = app.keys(queue_of_task_id(task_id))
    client: Any = app.sync_client
    scheduled, where = (
        client.pipeline(transaction=False)
        .hget(keys.scheduled_payloads, task_id)
        .hget(keys.index, task_id)
        .execute()
    )
    located = None if scheduled else locate(task_id, where)
    pipe = client.pipeline(transaction=False)
    if located is not None:
        sidx, entry = located
        pipe.xrange(keys.streams[sidx - 1], entry, entry)
    pipe.get(keys.result(task_id))  # last: an entry settled meanwhile has its record now
    *rows, raw_record = pipe.execute()
    record = app.serializer.loads(raw_record) if raw_record is not None else None
    payload = parse_scheduled(scheduled)[1] if scheduled else payload_of(rows[0]) if rows else None
    env = None
    if payload is not None:
        try:
            env = Envelope.decode(payload, app.serializer)
        except BadEnvelope:
            env = None
    return record, env


def _recorded_enqueue(record: Mapping[str, Any] | None, env: Envelope | None) -> object:
    """The enqueue time a task's own records carry: its envelope's while it waits or runs,
    the stored result's copy once it ran (see :func:`enqueued_ms`)."""
    if env is not None:
        return env.enqueued_ms
    return record.get("enqueued_ms") if record else None


def _result(
    alias: str,
    task: Task[Any, Any],
    task_id: str,
    status: TaskStatus,
    record: Mapping[str, Any] | None,
    env: Envelope | None,
) -> TaskResult[Any]:
    """A Django TaskResult from Tether's records (what Tether does not keep stays empty;
    see docs/producers.md)."""
    recorded = _recorded_enqueue(record, env)
    attempt = record.get("attempt", 1) if record else env.attempt if env is not None else 1
    errors: list[TaskError] = []
    error = record.get("error") if record else None
    if isinstance(error, Mapping) and status is not TaskStatus.SUCCEEDED:
        error_type = str(error.get("type") or "")
        errors.append(
            TaskError(
                exception_class_path=exception_path(error_type),
                traceback=str(error.get("traceback") or f"{error_type}: {error.get('message')}"),
            )
        )
    started = status is TaskStatus.RUNNING or (status.is_final and attempt)
    # A record's started_ms is its attempt's start. A Django task is never retried by
    # Tether (Django has no retries), so that is also when the task first started.
    last_start = from_ms(record.get("started_ms")) if record else None
    result: TaskResult[Any] = TaskResult(
        task=task,
        id=task_id,
        status=_status(status),
        enqueued_at=from_ms(enqueued_ms(task_id, recorded)),
        started_at=last_start if attempt == 1 else None,
        finished_at=from_ms(record.get("finished_ms")) if record and status.is_final else None,
        last_attempted_at=last_start,
        args=list(env.args) if env is not None else [],
        kwargs=dict(env.kwargs) if env is not None else {},
        backend=alias,
        errors=errors,
        # Tether does not record which workers ran a task; the count is right.
        worker_ids=["unknown"] * int(attempt) if started else [],
    )
    if status is TaskStatus.SUCCEEDED and record is not None:
        object.__setattr__(result, "_return_value", record.get("value"))
    return result
