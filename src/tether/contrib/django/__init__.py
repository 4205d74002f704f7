"""Tether as a backend of Django's tasks framework (``django.tasks`` in Django 6, or the
``django-tasks`` backport on Django 5.2).

In settings::

    TASKS = {
        "default": {
            "BACKEND": "tether.contrib.django.TetherBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"URL": "redis://localhost:6379/0"},
        }
    }

Run the tasks with ``DJANGO_SETTINGS_MODULE=mysite.settings tether worker
tether.contrib.django --queues default,emails``. See docs/producers.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._backend import TetherBackend, tether_priority
from ._worker import worker_app

if TYPE_CHECKING:
    from tether import Tether

    app: Tether
    """The worker's app (``tether worker tether.contrib.django``): built on first access, which
    sets Django up."""
else:

    def __getattr__(name: str) -> Any:
        if name == "app":
            # Built once and kept: the CLI's loader asks twice (hasattr, then getattr), and
            # each build set Django up again and logged its line again.
            built = globals()["app"] = worker_app()
            return built
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TetherBackend", "tether_priority", "worker_app"]
