"""The companion middleware: what only taskiq's receiver knows, told to the broker.

- **pre_execute**: the message really starts now. For an entry taken over from a dead
  worker this is when its start is counted toward quarantine (an entry that only waited in
  taskiq's prefetch queue when its worker died is not counted), and when this worker checks
  it still owns the entry. It also makes :func:`current_delivery` work inside the task.
- **on_error**: the task raised. If no taskiq retry took it (a retry middleware re-kicks
  the same task id, or marks the result ``NoResultError``), its ack moves it to Tether's
  dead-letter stream with status ``failed``, the error and its traceback.
- **post_send**: a kick refused because another task holds its ``dedup_key`` returns the
  handle of that task.

:class:`TetherBroker` installs it first in its middleware list: its ``on_error`` then runs
after every other middleware's (taskiq calls them in reverse), once retry middlewares have
decided.
"""

from __future__ import annotations

from typing import Any

from taskiq import TaskiqMessage, TaskiqMiddleware, TaskiqResult
from taskiq.exceptions import NoResultError

from ._consumer import Consumer
from ._delivery import _current


class TetherMiddleware(TaskiqMiddleware):
    """Installed by :class:`TetherBroker`; has no effect on another broker."""

    def _consumer(self) -> Consumer | None:
        consumer = getattr(self.broker, "tether_consumer", None)
        return consumer if isinstance(consumer, Consumer) else None

    async def pre_execute(self, message: TaskiqMessage) -> TaskiqMessage:
        consumer = self._consumer()
        if consumer is not None and consumer.handover is not None:
            delivery = await consumer.handover.begin(message.task_id)
            if delivery is not None:
                # The task runs in this same asyncio task (or a thread with a copy of its
                # context), so the variable is visible to it and to on_error.
                _current.set(delivery)
        return message

    def on_error(
        self, message: TaskiqMessage, result: TaskiqResult[Any], exception: BaseException
    ) -> None:
        delivery = _current.get()
        consumer = self._consumer()
        if consumer is None or consumer.handover is None:
            return
        if delivery is None or delivery.taskiq_id != message.task_id:
            return
        consumer.handover.failed(
            delivery, exception, retried=isinstance(result.error, NoResultError)
        )

    def post_send(self, message: TaskiqMessage) -> None:
        duplicates = getattr(self.broker, "tether_duplicates", None)
        if not isinstance(duplicates, dict):
            return
        holder = duplicates.pop(message.task_id, None)
        if holder is not None:
            # kiq() builds the handle it returns from this message after post_send.
            message.task_id = holder
