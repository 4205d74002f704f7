"""Settings for Django's ``tests/tasks`` (the test app ``tasks``, from Django's source
distribution) on Tether. The server and namespace come from ``TETHER_URL`` and
``TETHER_NAMESPACE``, which the backend reads when its OPTIONS leave them out."""

from __future__ import annotations

import importlib.util

SECRET_KEY = "tests-only"
USE_TZ = True
TIME_ZONE = "UTC"

# Django 6 ships django.tasks; django-tasks (the backport) is an app on Django 5.2.
BACKPORT = importlib.util.find_spec("django.tasks") is None
INSTALLED_APPS = [*(["django_tasks"] if BACKPORT else []), "tasks"]

# Two of Django's task tests are TransactionTestCases: they need a database, never a table.
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

TASKS = {"default": {"BACKEND": "conformance.backend.ClearableTetherBackend"}}
"""Each of Django's test classes sets TASKS itself; the runner points them here too."""
