"""The project's settings, with ``TASKS`` naming the project's own Tether app (OPTIONS APP)
instead of giving its URL and namespace."""

from __future__ import annotations

from .settings import *  # noqa: F403

TASKS = {
    "default": {
        "BACKEND": "tether.contrib.django.TetherBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"APP": "djsite.tether_app:app"},
    }
}
