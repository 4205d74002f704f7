"""taskiq with Tether's ``TetherBroker`` (``tether.contrib.taskiq``): ``task.kiq`` and
``taskiq worker``, the same task body and command line as the taskiq-redis row.

taskiq has no batch enqueue call. No result backend is configured. The broker's
``max_pending`` (100 by default, taskiq's default ``--max-async-tasks``) is set to the
concurrency, 32, as the bench runs ``--max-async-tasks 32``.
"""

from __future__ import annotations

from tether.contrib.taskiq import TetherBroker

from .. import body
from .taskiq_cli import adapter_for

broker = TetherBroker(
    body.CONFIG.url, namespace=body.CONFIG.tag, max_pending=body.CONFIG.concurrency
)

Adapter = adapter_for(broker, __name__)
