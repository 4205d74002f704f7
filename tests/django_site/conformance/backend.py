"""The backend Django's task tests run on: :class:`TetherBackend` plus ``clear()``.

Django's tests call ``default_task_backend.clear()`` before each test (the dummy backend's
method, not one of ``BaseTaskBackend``'s: no other backend has it). Here it deletes the
test's namespace, so each test starts with no tasks, as it does on the dummy backend. It is a
test hook, not part of Tether's API: a project's backend has nothing to clear."""

from __future__ import annotations

from typing import Any

from tether.contrib.django import TetherBackend


class ClearableTetherBackend(TetherBackend):
    def clear(self) -> None:
        app = self.tether
        client: Any = app.sync_client
        # One key at a time: the keys of different queues may live on different slots.
        for key in list(client.scan_iter(match=f"{{{app.settings.namespace}:*", count=1000)):
            client.delete(key)
