"""Where a task is in its life, and what a cancel request achieved."""

from __future__ import annotations

from enum import Enum


class TaskStatus(str, Enum):
    """Where a task is in its life."""

    QUEUED = "queued"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYING = "retrying"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (
            TaskStatus.SUCCEEDED,
            TaskStatus.FAILED,
            TaskStatus.DEAD,
            TaskStatus.CANCELLED,
        )


class CancelResult(str, Enum):
    """What :meth:`TaskHandle.cancel` achieved. True in a boolean context when the task will
    not run to its normal end (``CANCELLED`` or ``REQUESTED``)."""

    CANCELLED = "cancelled"
    """It was queued or scheduled and is removed; it will never run."""
    REQUESTED = "requested"
    """It is running as an async task: it is cancelled at its next ``await`` (the worker
    hears of the request within a heartbeat)."""
    NOT_CANCELLABLE = "not_cancellable"
    """It is running in a worker thread (a plain function), which cannot be interrupted:
    it runs to its end and records its real outcome."""
    FINISHED = "finished"
    """It had already reached an outcome."""

    def __bool__(self) -> bool:
        return self in (CancelResult.CANCELLED, CancelResult.REQUESTED)
