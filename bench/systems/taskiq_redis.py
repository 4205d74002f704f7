"""taskiq with taskiq-redis's ``RedisStreamBroker``: ``task.kiq`` and ``taskiq worker``.

taskiq has no batch enqueue call. No result backend is configured, so results are not
stored. The broker's consumer group starts at ``$``: the producer's ``broker.startup()``
(which taskiq documents for clients) creates it before anything is sent.
"""

from __future__ import annotations

from taskiq_redis import RedisStreamBroker

from .. import body
from .taskiq_cli import adapter_for

broker = RedisStreamBroker(body.CONFIG.url, queue_name=f"taskiq:{body.CONFIG.tag}")

Adapter = adapter_for(broker, __name__)
