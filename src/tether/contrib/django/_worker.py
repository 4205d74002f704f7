"""The worker side: ``tether worker tether.contrib.django`` sets Django up, imports the
``tasks`` module of every installed app, and runs Django tasks by their module path.

A name the worker has not seen is imported on demand, but only from the project's own code
(the packages of ``INSTALLED_APPS`` and of the settings module), and only if it names a
Django task: an entry cannot make the worker import arbitrary modules. A task that cannot be
imported goes to the dead letters with the import error as the reason.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

from tether import ConfigError, Task, Tether, current_task
from tether.base._config import TaskConfig
from tether.worker.kit import check_result

from ._backend import (
    TetherBackend,
    enqueued_ms,
    from_ms,
    result_status,
    signature_of,
    tether_priority,
)
from ._compat import (
    FRAMEWORK,
    TaskContext,
    TaskError,
    TaskResult,
    task_backends,
    task_finished,
    task_started,
)
from ._compat import Task as DjangoTask
from ._logging import one_traceback_per_failure

log = logging.getLogger("tether.contrib.django")


def worker_app(alias: str | None = None) -> Tether:
    """Set Django up (``DJANGO_SETTINGS_MODULE``) and return the Tether app of the backend
    ``alias`` (by default the only Tether backend in ``TASKS``), ready to run the project's
    Django tasks. ``tether worker tether.contrib.django`` calls this."""
    if not os.environ.get("DJANGO_SETTINGS_MODULE"):
        from django.conf import settings

        if not settings.configured:
            raise ConfigError(
                "set DJANGO_SETTINGS_MODULE to the project's settings module (for example "
                "DJANGO_SETTINGS_MODULE=mysite.settings tether worker tether.contrib.django)"
            )
    import django
    from django.utils.module_loading import autodiscover_modules

    django.setup()
    backend = task_backends[alias or _only_tether_alias()]
    if not isinstance(backend, TetherBackend):
        raise ConfigError(
            f"TASKS[{alias!r}] uses {type(backend).__module__}.{type(backend).__name__}, "
            "not tether.contrib.django.TetherBackend"
        )
    app = backend.tether
    if not any(isinstance(loader, DjangoTasks) for loader in app.task_loaders):
        app.task_loaders.append(DjangoTasks(app))
    # Import every app's tasks module now, so a broken one fails at start, not mid-run.
    autodiscover_modules("tasks")
    one_traceback_per_failure()
    log.info("Django tasks (%s) of backend %r run on %r", FRAMEWORK, backend.alias, app)
    return app


def _only_tether_alias() -> str:
    from django.conf import settings
    from django.utils.module_loading import import_string

    aliases = []
    for alias, params in getattr(settings, "TASKS", {}).items():
        try:
            backend = import_string(params.get("BACKEND", ""))
        except ImportError:
            continue
        if isinstance(backend, type) and issubclass(backend, TetherBackend):
            aliases.append(alias)
    if len(aliases) == 1:
        return str(aliases[0])
    if not aliases:
        raise ConfigError(
            "no backend in the Django setting TASKS is tether.contrib.django.TetherBackend"
        )
    raise ConfigError(
        f"TASKS has several Tether backends ({', '.join(aliases)}): give the alias, for example "
        "app = tether.contrib.django.worker_app('emails') in a module of yours"
    )


class DjangoTasks:
    """A task loader: Django tasks by module path, wrapped as Tether tasks."""

    def __init__(self, app: Tether) -> None:
        self.app = app

    def roots(self) -> set[str]:
        from django.apps import apps

        # The running script's own tasks (a worker started from it) are imported already.
        roots = {config.name for config in apps.get_app_configs()} | {"__main__"}
        settings_module = os.environ.get("DJANGO_SETTINGS_MODULE", "")
        if settings_module:
            roots.add(settings_module.split(".")[0])
        return roots

    def __call__(self, name: str) -> Task[Any, Any] | None:
        from django.utils.module_loading import import_string

        module, _, attr = name.rpartition(".")
        if not module or not attr:
            return None
        if not any(module == root or module.startswith(root + ".") for root in self.roots()):
            raise LookupError(
                f"unknown task {name!r}: no task is registered by that name, and its module is "
                "outside the project (INSTALLED_APPS and the settings' package), so it is not "
                "imported"
            )
        try:
            found = import_string(name)
        except ImportError as exc:
            raise LookupError(f"cannot import Django task {name!r}: {exc}") from None
        except Exception as exc:  # the module itself failed while importing
            raise LookupError(
                f"cannot import Django task {name!r}: importing {module!r} raised "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if not isinstance(found, DjangoTask):
            raise LookupError(
                f"{name!r} is a {type(found).__name__}, not a Django task (decorate it with @task)"
            )
        return as_tether_task(self.app, found)


def as_tether_task(app: Tether, task: DjangoTask[Any, Any]) -> Task[Any, Any]:
    """The Tether task that runs ``task`` and reports it through Django's signals."""
    func = task.func
    run: Callable[..., Any]
    if inspect.iscoroutinefunction(func):

        async def run(*args: Any, **kwargs: Any) -> Any:
            result, call_args = _started(task, args, kwargs)
            try:
                value = storable(app, await func(*call_args, **kwargs))
            except BaseException as exc:
                _finished(result, error=exc)
                raise
            _finished(result, value=value)
            return value

    else:

        def run(*args: Any, **kwargs: Any) -> Any:
            from django.db import close_old_connections

            # Worker threads live long: drop connections past CONN_MAX_AGE or broken, as a
            # request does.
            close_old_connections()
            result, call_args = _started(task, args, kwargs)
            try:
                value = storable(app, func(*call_args, **kwargs))
            except BaseException as exc:
                _finished(result, error=exc)
                raise
            finally:
                close_old_connections()
            _finished(result, value=value)
            return value

    # The worker checks an entry's arguments against what a producer gives.
    setattr(run, "__signature__", signature_of(task))  # noqa: B010 - inspect reads it
    run.__name__ = run.__qualname__ = task.module_path
    config = TaskConfig(
        name=task.module_path, queue=task.queue_name, priority=tether_priority(task.priority)
    )
    return Task(app, run, config)


def storable(app: Tether, value: Any) -> Any:
    """``value``, once the app's serializer has encoded it: a value it cannot encode raises
    :class:`tether.ResultSerializationError` (a ``TypeError``) here, inside the task, so
    ``task_finished`` says FAILED with that error, as the stored result and the worker's log
    do. Checked after the call, the worker would fail the task once Django had been told it
    succeeded. The same check and words as the worker's (``check_result``)."""
    check_result(app.serializer, value, app.serializer.dumps)
    return value


def _started(
    task: DjangoTask[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[TaskResult[Any], tuple[Any, ...]]:
    from django.utils import timezone as dj_timezone

    ctx = current_task()
    now = dj_timezone.now()
    result: TaskResult[Any] = TaskResult(
        task=task,
        id=ctx.task_id,
        status=result_status("RUNNING"),
        enqueued_at=from_ms(enqueued_ms(ctx.task_id, ctx.enqueued_ms)),
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=list(args),
        kwargs=dict(kwargs),
        backend=task.backend,
        errors=[],
        # Earlier attempts ran on workers Tether does not record; this one is ours.
        worker_ids=["unknown"] * (ctx.attempt - 1) + [ctx.worker],
    )
    task_started.send(sender=TetherBackend, task_result=result)
    call_args = (TaskContext(task_result=result), *args) if task.takes_context else args
    return result, call_args


def _finished(
    result: TaskResult[Any], *, value: Any = None, error: BaseException | None = None
) -> None:
    import traceback

    from django.utils import timezone as dj_timezone

    object.__setattr__(result, "finished_at", dj_timezone.now())
    if error is None:
        object.__setattr__(result, "status", result_status("SUCCESSFUL"))
        object.__setattr__(result, "_return_value", value)
    else:
        kind = type(error)
        result.errors.append(
            TaskError(
                exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
                traceback="".join(traceback.format_exception(kind, error, error.__traceback__)),
            )
        )
        object.__setattr__(result, "status", result_status("FAILED"))
    try:
        task_finished.send(sender=TetherBackend, task_result=result)
    except Exception:
        log.exception("a task_finished receiver failed for task %s", result.id)
