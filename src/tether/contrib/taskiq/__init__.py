"""taskiq on Tether's delivery protocol: ``pip install 'tether-queue[taskiq]'``, then::

    from tether.contrib.taskiq import TetherBroker

    broker = TetherBroker("redis://localhost:6379/0")

and run taskiq's own worker, ``taskiq worker myapp.tasks:broker``. See docs/taskiq.md for
which of Tether's promises hold under taskiq, which do not, and why.

**How messages are stored.** Each taskiq message is one entry of the queue's streams
(``{<namespace>:<queue>}:stream:high|normal|low``, queue ``taskiq`` by default): a Tether v1
envelope whose ``task`` is taskiq's task name and whose ``taskiq`` field carries taskiq's
own bytes unchanged (``{"id": <taskiq task id>, "message": <text>}``, or ``message_b64`` for
a binary serializer). The worker hands taskiq exactly the bytes it kicked; ``tether dead
list|show|retry --queue taskiq`` read and re-enqueue these envelopes like any other. The
``delay`` label sends a message to the queue's delayed set, ``priority`` picks the stream
(a number by its sign: above 0 high, 0 normal, below 0 low), ``queue_name`` sends it to another
queue of the namespace, ``dedup_key`` (and ``dedup_key_ttl``) keeps at most one such message
queued, delayed or running.

**What runs where.** taskiq's receiver runs the tasks; Tether's worker machinery does the
rest in each taskiq worker process: a thread renews the lease; maintenance reclaims dead
workers' entries (lock-free, on a timer, idle streams too) and promotes delayed ones; the
ledger bounds what the process holds by ``max_pending``; taskiq's acks become fenced
settles (``XACK`` + ``XDEL`` only while still the owner), batched. The companion
:class:`TetherMiddleware`, installed by the broker, counts real starts for quarantine and
sends failures that taskiq did not retry to the dead letters.
"""

from ._broker import TetherBroker
from ._delivery import DeliveryInfo, current_delivery
from ._handover import DeliveryLost
from ._middleware import TetherMiddleware

__all__ = [
    "DeliveryInfo",
    "DeliveryLost",
    "TetherBroker",
    "TetherMiddleware",
    "current_delivery",
]
