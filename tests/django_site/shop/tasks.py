"""The project's tasks, declared with Django's ``@task`` as in any Django project."""

from __future__ import annotations

import os
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


def not_a_task() -> None:
    """A plain function: an entry naming it is refused."""
