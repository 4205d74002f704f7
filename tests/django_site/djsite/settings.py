"""Settings of the tests' Django project. The Tether server and namespace come from the
environment (``TETHER_URL``, ``TETHER_NAMESPACE``), as a deployment would set them."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
TIME_ZONE = "UTC"

# Django 6 ships django.tasks; on Django 5.2 the django-tasks backport is an app.
BACKPORT = importlib.util.find_spec("django.tasks") is None
INSTALLED_APPS = [*(["django_tasks"] if BACKPORT else []), "shop"]

DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}

TASKS = {
    "default": {
        "BACKEND": "tether.contrib.django.TetherBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "URL": os.environ.get("TETHER_URL", "redis://localhost:6379/0"),
            "NAMESPACE": os.environ.get("TETHER_NAMESPACE", "djsite"),
        },
    }
}
