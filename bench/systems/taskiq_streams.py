"""taskiq with the taskiq-redis-streams broker: ``task.kiq`` and ``taskiq worker``.

taskiq has no batch enqueue call. No result backend is configured. The broker's
``max_pending`` (entries fetched and not yet acknowledged, default 10) is raised to the
concurrency, 32, so that one worker can run 32 tasks at once like every other system.
"""

from __future__ import annotations

from taskiq_redis_streams import RedisStreamsBroker

from .. import body
from .taskiq_cli import adapter_for

broker = RedisStreamsBroker(
    body.CONFIG.url,
    queue_name="bench",
    namespace=body.CONFIG.tag,
    max_pending=body.CONFIG.concurrency,
)

Adapter = adapter_for(broker, __name__)
