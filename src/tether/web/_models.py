"""Request and response bodies of the JSON API. The readers' dataclasses
(:mod:`tether.admin`) are used as they are; pages and bodies of the API's own are here."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..admin import (
    DelayedTask,
    MinuteCounts,
    QueueStats,
    RunningTask,
    TaskStats,
    WorkerInfo,
)
from ..dead import SCAN_BUDGET, DeadLetter
from ._format import shallow

QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$"
ENTRY_PATTERN = r"^\d{1,20}-\d{1,20}$"
BULK_CURSOR_PATTERN = r"^\d{1,20}-\d{1,20}~\d{1,20}-\d{1,20}$"
LISTED_PAYLOAD = 2000
"""Dead-letter payloads in a list are cut to this many characters (one entry shows all)."""


class _Page(BaseModel):
    cursor: str | None = Field(
        description="Pass it back as ?cursor= for the next page; null at the end."
    )


class QueuePage(_Page):
    items: list[QueueStats]


class RunningPage(_Page):
    items: list[RunningTask]


class DelayedPage(_Page):
    items: list[DelayedTask]


class WorkerPage(_Page):
    items: list[WorkerInfo]


class TaskStatsPage(_Page):
    items: list[TaskStats]


class Throughput(BaseModel):
    queue: str
    task: str | None
    minutes: list[MinuteCounts]


class Session(BaseModel):
    """How this caller is authenticated, and the CSRF token its state-changing requests
    must carry (null for a caller that authenticates by header)."""

    authenticated_by: str
    csrf_token: str | None
    read_only: bool


class QueueControl(BaseModel):
    queue: str
    paused: bool
    changed: bool
    """False when the queue already was in that state."""


class DeadLetterOut(BaseModel):
    entry_id: str
    task_id: str
    task: str
    status: str
    reason: str
    error: dict[str, Any]
    payload: str
    """The original payload as text (undecodable bytes replaced)."""
    payload_truncated: bool = False
    at: datetime | None
    deliveries: int
    stream: str

    @classmethod
    def of(cls, letter: DeadLetter, limit: int | None = None) -> DeadLetterOut:
        payload = letter.payload.decode(errors="replace")
        cut = limit is not None and len(payload) > limit
        return cls(
            entry_id=letter.entry_id,
            task_id=letter.task_id,
            task=letter.task,
            status=letter.status,
            reason=letter.reason,
            error=shallow(letter.error),
            payload=payload[:limit] if cut else payload,
            payload_truncated=cut,
            at=letter.at,
            deliveries=letter.deliveries,
            stream=letter.stream,
        )


class DeadPage(_Page):
    total: int
    """Entries in the queue's dead-letter stream."""
    items: list[DeadLetterOut]


class Selection(BaseModel):
    """Which dead letters a bulk call acts on: exactly one of ``ids``, ``task`` or ``all``.

    With ``task`` or ``all`` a call handles at most ``limit`` entries (reading at most
    1,000) and answers a ``cursor``: call again with it until it is null. ``all`` with
    purge deletes the whole stream at once."""

    model_config = ConfigDict(extra="forbid")

    ids: list[str] | None = Field(None, max_length=SCAN_BUDGET)
    task: str | None = Field(None, min_length=1, max_length=500)
    all: bool = False
    cursor: str | None = Field(None, pattern=BULK_CURSOR_PATTERN)
    limit: int = Field(100, ge=1, le=500)

    @model_validator(mode="after")
    def _one_choice(self) -> Selection:
        chosen = sum((self.ids is not None, self.task is not None, self.all))
        if chosen != 1:
            raise ValueError("give exactly one of ids, task or all=true")
        if self.ids is not None:
            for entry_id in self.ids:
                if not re.match(ENTRY_PATTERN, entry_id):
                    raise ValueError(f"{entry_id!r} is not a dead-letter entry id (ms-seq)")
        return self


class BulkOut(BaseModel):
    count: int
    """Entries retried or purged by this call."""
    done: list[str]
    """Their entry ids (empty when ``all`` purged the whole stream)."""
    task_ids: dict[str, str] = {}
    """Retried entries: entry id -> the task id queued again."""
    failed: dict[str, str] = {}
    """Entries that could not be retried: entry id -> why."""
    cursor: str | None = None


class Retried(BaseModel):
    entry_id: str
    task_id: str


class Cancelled(BaseModel):
    task_id: str
    result: str
    """cancelled, requested, not_cancellable or finished (see ``CancelResult``)."""


class RanNow(BaseModel):
    task_id: str
    due: str
    """'now': a worker's next maintenance pass moves it into its stream."""


class ScheduleBackoffOut(BaseModel):
    failures: int
    """Runs in a row that ended in final failure."""
    until: datetime
    """Ticks due before this time are skipped."""
    resting: bool
    """Whether ticks are skipped now."""


class ScheduleOut(BaseModel):
    name: str
    task: str
    queue: str
    priority: str
    spec: str
    source: str
    """'code' (declared with @app.periodic) or 'runtime' (added with Schedules.add)."""
    paused: bool
    next_run: datetime | None
    last_run: datetime | None
    last_task_id: str | None
    last_outcome: str | None
    error: str | None
    backoff: ScheduleBackoffOut | None = None
    """Set while its runs fail: its ticks are skipped until ``backoff.until``."""


class SchedulePage(_Page):
    items: list[ScheduleOut]


class ScheduleControl(BaseModel):
    name: str
    paused: bool | None = None
    task_id: str | None = None
    """The run enqueued by a trigger."""
    removed: bool | None = None
    backoff_until: datetime | None = None
    """Trigger: set when the run was enqueued during the schedule's backoff (the rest it
    went through). Reset: when the rest that was ended would have ended."""
    backoff_reset: bool | None = None
    """Reset: whether the schedule was in backoff."""
