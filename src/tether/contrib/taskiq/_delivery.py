"""A delivery as the taskiq broker tracks it, and what a running task may read of it."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...base._settings import PRIORITIES
from ...worker.kit import Delivery

if TYPE_CHECKING:
    from ...worker.kit import Target


@dataclass(slots=True, eq=False)
class TaskiqDelivery(Delivery):
    """An entry delivered to this worker, from its fetch to its fenced ack."""

    taskiq_id: str = ""
    """taskiq's task id, from the envelope (the receiver knows the message by it)."""
    target: Target | None = None
    """Where its outcome is recorded (its Tether id, dedup key), once decoded."""
    consumer: str = ""
    yielded: bool = False
    """Handed to taskiq's receiver."""
    acked: bool = False
    rekicked: bool = False
    """A message with the same taskiq id was kicked while it ran (a taskiq retry)."""
    failure: tuple[dict[str, str], str] | None = None
    """(error fields, reason) when it failed and taskiq did not retry it."""
    retried: bool = False
    """It failed and taskiq's retry middleware took it again: its ack is no success."""


_current: ContextVar[TaskiqDelivery | None] = ContextVar("tether_taskiq", default=None)


@dataclass(frozen=True, slots=True)
class DeliveryInfo:
    """What a taskiq task running on a :class:`TetherBroker` may know of its delivery.

    Attributes:
        task_id: the Tether task id (``<queue>:<stream>-<entry id>`` for a plain kick), as
            ``tether dead`` and ``tether task`` show it.
        queue, priority: the stream it came from.
        entry_id: the stream entry.
        deliveries: the times it was handed to a worker; for an entry taken over from a dead
            worker, the times it was started. Above 1 after a worker died running it.
        consumer: the name of the worker running it.
    """

    task_id: str
    queue: str
    priority: str
    entry_id: str
    deliveries: int
    consumer: str


def current_delivery() -> DeliveryInfo | None:
    """The delivery of the taskiq task running in this coroutine or thread; None outside a
    task run by a :class:`TetherBroker` worker (with its middleware, installed by default)."""
    delivery = _current.get()
    if delivery is None:
        return None
    target = delivery.target
    return DeliveryInfo(
        task_id=target.task_id if target is not None else "",
        queue=delivery.queue.name,
        priority=PRIORITIES[delivery.sidx - 1],
        entry_id=delivery.entry_id.decode(),
        deliveries=delivery.deliveries,
        consumer=delivery.consumer,
    )
