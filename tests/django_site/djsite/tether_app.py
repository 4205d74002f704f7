"""The project's own Tether app, which ``TASKS`` names with ``OPTIONS {"APP": ...}``
(settings_app.py): the server comes from the environment as in settings.py, the namespace is
the project's own (``<TETHER_NAMESPACE>-app``), and a middleware stamps every enqueue."""

from __future__ import annotations

import os

from tether import Middleware, Tether


class SiteStamp(Middleware):
    def before_enqueue(self, task_name: str, queue: str, headers: dict[str, str]) -> None:
        headers["site"] = "djsite"


app = Tether(
    namespace=f"{os.environ.get('TETHER_NAMESPACE', 'djsite')}-app", middleware=[SiteStamp()]
)

not_an_app = "a name that OPTIONS APP must not accept"
