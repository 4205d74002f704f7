"""Enqueue the project's tasks through Django's API and wait for their results; prints one
JSON object. The tests run it in each environment (the django-tasks backport on Django 5.2,
and django.tasks on Django 6) against a real `tether worker`."""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "djsite.settings")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.utils import timezone  # noqa: E402
from shop import tasks  # noqa: E402


def wait(result, timeout=20.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not result.is_finished:
        if time.monotonic() > deadline:
            raise SystemExit(f"task {result.id} did not finish: {result.status}")
        time.sleep(0.05)
        result.refresh()
    return result


def main() -> None:
    import django.utils.version

    added = tasks.add.enqueue(2, 3)
    receipt = tasks.send_receipt.enqueue(7, to="ann@example.com")
    described = tasks.describe.enqueue("ctx")
    doubled = tasks.double.enqueue(21)
    before = timezone.now()
    later = tasks.add.using(run_after=before + timedelta(seconds=1)).enqueue(1, 1)
    failed = tasks.explode.enqueue("no ink")
    for result in (added, receipt, described, doubled, later, failed):
        wait(result)
    fetched = tasks.add.get_result(added.id)
    error = failed.errors[0]
    print(
        json.dumps(
            {
                "django": django.utils.version.get_version(),
                "backport": settings.BACKPORT,
                "python": sys.version_info[:2],
                "add": added.return_value,
                "fetched": [fetched.status, fetched.return_value, fetched.task.module_path],
                "receipt": [receipt.return_value, receipt.id.split(":")[0]],
                "describe": described.return_value,
                "double": doubled.return_value,
                "later": [later.return_value, (later.finished_at - before).total_seconds()],
                "failed": [
                    failed.status,
                    error.exception_class.__name__,
                    "no ink" in error.traceback,
                ],
            }
        )
    )


main()
