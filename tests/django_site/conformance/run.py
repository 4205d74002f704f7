"""Run Django's own task tests on Tether and print each test's outcome as one JSON object.

    python run.py DJANGO_TESTS_DIR LABEL...     (labels such as tasks.test_tasks)

``DJANGO_TESTS_DIR`` is the ``tests`` folder of Django's source distribution (or of the
django-tasks repository): its ``tasks`` package is imported from there, unchanged. The one
change is the ``TASKS`` setting: every backend a test class or a test names that is Django's
dummy or immediate backend becomes Tether's (:class:`conformance.backend.ClearableTetherBackend`
on ``TETHER_URL`` and ``TETHER_NAMESPACE``), whenever the setting changes. A test fails or
passes as Django's own runner says; the outcome of a test with subtests is its first failing
subtest's."""

from __future__ import annotations

import json
import os
import sys
import unittest
from pathlib import Path
from typing import Any, ClassVar

TETHER = "conformance.backend.ClearableTetherBackend"
REPLACED = {
    f"{package}.backends.{module}.{cls}"
    for package in ("django.tasks", "django_tasks")
    for module, cls in (("dummy", "DummyBackend"), ("immediate", "ImmediateBackend"))
}
"""The backends Django's task tests use, by the paths Django 6 and django-tasks give them."""


def to_tether(tasks: object) -> None:
    """Point the dummy and immediate backends of a ``TASKS`` value at Tether, in place: the
    value is the very dict an ``override_settings`` holds, so it stays changed on re-entry."""
    if isinstance(tasks, dict):
        for params in tasks.values():
            if isinstance(params, dict) and params.get("BACKEND") in REPLACED:
                params["BACKEND"] = TETHER


def on_setting_changed(*, setting: str, value: object, **kwargs: Any) -> None:
    if setting == "TASKS":
        to_tether(value)


class Recording(unittest.TextTestResult):
    """Keeps each test's outcome: ``passed``, ``skipped``, or the failure's last line."""

    outcomes: ClassVar[dict[str, str]] = {}
    """By test id, for the whole run (unittest makes the result; main() reads it here)."""

    def _failed(self, test: unittest.TestCase, err: Any) -> None:
        exc = err[1]
        line = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
        self.outcomes.setdefault(test.id(), f"failed: {line}")

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self.outcomes.setdefault(test.id(), "passed")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._failed(test, err)

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._failed(test, err)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._failed(test, err)

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self.outcomes.setdefault(test.id(), "skipped")


def main() -> None:
    tests_dir, labels = Path(sys.argv[1]), sys.argv[2:]
    sys.path.insert(0, str(tests_dir))
    sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # this package
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "conformance.settings")
    import django

    django.setup()
    from django.core.signals import setting_changed
    from django.test.runner import DiscoverRunner

    setting_changed.connect(on_setting_changed, dispatch_uid="tether-conformance")

    class Runner(DiscoverRunner):
        def get_resultclass(self) -> type[unittest.TextTestResult]:
            return Recording

    Runner(verbosity=0, interactive=False, parallel=1).run_tests(labels)
    print(json.dumps(Recording.outcomes, sort_keys=True))


if __name__ == "__main__":
    main()
