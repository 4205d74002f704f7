"""The project's tasks, declared with Django's ``@task`` as in any Django project."""

from __future__ import annotations

import os
import sys
from typing import Any

try:
    from django.tasks import task  # Django 6
except ImportError:  # Django 5.2 with the django-tasks backport
    from django_tasks import task  # type: ignore[no-redef]


@task
def add(x: int, y: int) -> int:
    return x + y


@task(priority=50, queue_name="emails")
def send_receipt(order: int, to: str) -> str:
    return f"receipt {order} sent to {to}"


@task(takes_context=True)
def describe(context: Any, tag: str) -> dict[str, Any]:
    """Reports what Django's task context says about this run."""
    return {
        "tag": tag,
        "id": context.task_result.id,
        "attempt": context.attempt,
        "pid": os.getpid(),
    }


@task
async def double(x: int) -> int:
    return 2 * x


@task
def explode(message: str) -> None:
    raise ValueError(message)


@task
def unserialisable() -> object:
    """Returns what JSON cannot encode: the task fails, as Django's immediate backend fails it."""
    return {"when": object()}


@task
def leave(how: str) -> None:
    """Tries to end the process the ways a task's own code may: ``sys.exit(3)`` ('exit') or
    ``raise KeyboardInterrupt`` ('interrupt')."""
    if how == "exit":
        sys.exit(3)
    raise KeyboardInterrupt


def not_a_task() -> None:
    """A plain function: an entry naming it is refused."""
