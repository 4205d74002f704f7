"""The tasks framework in use: ``django.tasks`` (Django 6 and later), else the
``django_tasks`` backport (the ``django-tasks`` package, same API, for Django 5.2)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import Task, TaskError
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started

    FRAMEWORK = "django_tasks"
else:
    try:
        from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
        from django.tasks.backends.base import BaseTaskBackend
        from django.tasks.base import Task, TaskError
        from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
        from django.tasks.signals import task_enqueued, task_finished, task_started

        FRAMEWORK = "django.tasks"
    except ImportError:
        try:
            from django_tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import Task, TaskError
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.signals import task_enqueued, task_finished, task_started
        except ImportError:
            raise ImportError(
                "tether.contrib.django needs django.tasks (Django 6 or later) or the "
                "django-tasks backport: pip install 'tether-queue[django]'"
            ) from None

        FRAMEWORK = "django_tasks"

__all__ = [
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
