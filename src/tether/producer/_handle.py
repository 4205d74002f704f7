"""A handle on an enqueued task: its id, and its status, result and cancellation from
asyncio (``await handle.result()``) or from plain threads (``handle.result_sync()``)."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Generic, TypeVar, cast

from ..base._blocking import refuse_on_loop
from ..base._status import CancelResult, TaskStatus
from . import _lifecycle

if TYPE_CHECKING:
    from ._core import Core

R = TypeVar("R")


class TaskHandle(Generic[R]):
    """A reference to an enqueued task. Rebuild one from an id with ``app.handle(id)``.

    Every method has a blocking twin ending in ``_sync`` for code without an event loop
    (Django, Flask, scripts); those refuse to run on a thread that runs an event loop.
    """

    __slots__ = ("app", "duplicate", "id", "queue")

    def __init__(self, app: Core, task_id: str, queue: str, duplicate: bool = False) -> None:
        self.app = app
        self.id = task_id
        self.queue = queue
        self.duplicate = duplicate
        """True when a dedup key matched and this handle is the earlier task's."""

    def __repr__(self) -> str:
        return f"<TaskHandle {self.id}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TaskHandle) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    async def status(self) -> TaskStatus:
        """Queued, scheduled, running, succeeded, failed, retrying, dead or cancelled;
        :class:`~tether.TaskNotFound` when the id is unknown or its record expired, and when
        its record is not one Tether writes (another program's, or a status this release
        does not know): the message says so, and the record is logged once and counted in
        ``tether_unreadable_records_total{kind="task"}``. Never a status of its own: a
        caller waiting for a final status would wait for good."""
        return await _lifecycle.status(self.app, self.id)

    async def result(self, timeout: float | timedelta | None = None) -> R:
        """Wait for the outcome: the value, or :class:`~tether.TaskFailed` for failed, dead
        and cancelled tasks. Blocks on Redis (no polling); ``timeout`` raises
        :class:`~tether.ResultTimeout`; a record Tether cannot read raises
        :class:`~tether.TaskNotFound`, as :meth:`status` does."""
        return cast("R", await _lifecycle.wait_result(self.app, self.id, timeout))

    async def cancel(self) -> CancelResult:
        """Cancel the task: a queued or scheduled task is removed; a running async task is
        cancelled at its next await; a running plain function cannot be interrupted. Says
        which happened (see :class:`~tether.CancelResult`)."""
        return await _lifecycle.cancel(self.app, self.id)

    def status_sync(self) -> TaskStatus:
        """:meth:`status`, blocking."""
        refuse_on_loop("status_sync")
        return _lifecycle.status_sync(self.app, self.id)

    def result_sync(self, timeout: float | timedelta | None = None) -> R:
        """:meth:`result`, blocking."""
        refuse_on_loop("result_sync")
        return cast("R", _lifecycle.wait_result_sync(self.app, self.id, timeout))

    def cancel_sync(self) -> CancelResult:
        """:meth:`cancel`, blocking."""
        refuse_on_loop("cancel_sync")
        return _lifecycle.cancel_sync(self.app, self.id)
