"""What the readers return: plain frozen dataclasses with JSON-ready fields.

Times are timezone-aware UTC datetimes; durations are float seconds. The web API uses these
classes as its response models, so a field added here shows in the API's schema too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

T = TypeVar("T")

OUTCOME_NAMES: dict[str, str] = {
    "ok": "succeeded",
    "fail": "failed",
    "retry": "retried",
    "dead": "dead",
    "cancel": "cancelled",
    "timeout": "timed_out",
}
"""Statistics field names (``tether.base._histogram``) to the names the readers use."""


def utc(ms: float) -> datetime:
    """A UTC datetime from unix milliseconds."""
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def from_ms(ms: float | None) -> datetime | None:
    """:func:`utc`, passing None through, and None for a time no datetime holds (past the
    year 9999, an infinity): a payload may carry any number, and shows none rather than
    failing the whole reading."""
    if ms is None:
        return None
    try:
        return utc(ms)
    except (OverflowError, ValueError, OSError):
        return None


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class _ToDict:
    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values (datetimes as ISO 8601 text)."""
        return {k: _plain(v) for k, v in asdict(self).items()}  # type: ignore[call-overload]


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list. Pass ``cursor`` back for the next page; None means the end.

    A page may hold fewer items than asked while ``cursor`` is not None (entries skipped on
    the way, a filter that matched few of the entries read): keep going until it is None.
    Iterating a page iterates its items."""

    items: list[T]
    cursor: str | None = None

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class Counts(_ToDict):
    """Attempts by outcome. ``timed_out`` attempts are also counted as failed or retried."""

    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    dead: int = 0
    cancelled: int = 0
    timed_out: int = 0

    @classmethod
    def of(cls, raw: Mapping[str, int]) -> Counts:
        """From statistics field names (``ok``, ``fail``, ...)."""
        return cls(**{OUTCOME_NAMES[k]: int(v) for k, v in raw.items() if k in OUTCOME_NAMES})

    @property
    def attempts(self) -> int:
        """Attempts that ended (timed out ones are in failed or retried already)."""
        return self.succeeded + self.failed + self.retried + self.dead + self.cancelled

    @property
    def errors(self) -> int:
        """Attempts that raised: failed, retried or dead."""
        return self.failed + self.retried + self.dead


@dataclass(frozen=True)
class Rate(_ToDict):
    """Attempts that ended over a recent window, read from the statistics buckets."""

    window_s: float
    attempts: int
    succeeded: int
    errors: int
    per_second: float


@dataclass(frozen=True)
class QueueStats(_ToDict):
    """A queue's figures, read on demand.

    ``waiting`` counts, per priority, the entries no worker has taken yet (and entries a
    stopping worker handed off, which the next worker takes); ``running`` the entries
    delivered to a worker and not yet settled; ``delayed`` the tasks waiting for their due
    time (scheduled ones and retries in their backoff); ``dead`` the dead letters.
    ``oldest_waiting_s`` is the age of the oldest waiting entry by the server's clock (the
    queue's latency), None when nothing waits."""

    name: str
    waiting: dict[str, int]
    depth: int
    """The sum of ``waiting``."""
    running: int
    delayed: int
    dead: int
    oldest_waiting_s: float | None
    next_due_s: float | None
    """Seconds until the earliest delayed task is due (negative: overdue), None if none."""
    paused: bool
    paused_at: datetime | None
    workers: int
    """Live workers serving the queue (from the worker registry)."""
    recent: Rate
    """Attempts that ended in the last five minutes or so (the current minute and the four
    before it)."""


@dataclass(frozen=True)
class Distribution(_ToDict):
    """Percentiles (seconds) read back from log-spaced buckets: within about 20 percent."""

    count: int
    p50: float | None
    p95: float | None
    p99: float | None


@dataclass(frozen=True)
class TaskStats(_ToDict):
    """One task name of one queue over a window of the statistics."""

    queue: str
    task: str
    since: datetime
    """Start of the first bucket read (the window is rounded out to whole buckets)."""
    window_s: float
    counts: Counts
    attempts: int
    per_second: float
    """Attempts that ended per second over ``active_s``."""
    error_rate: float | None
    """Share of the attempts that raised (failed, retried or dead); None without attempts."""
    run: Distribution
    """Run time: start to end of each attempt."""
    wait: Distribution
    """Wait time: from when the task was due (its enqueue, or the end of its delay) to its
    start."""
    active_s: float | None = None
    """Seconds of the window that hold data: from the start of its first minute (or hour,
    for a window over three hours) with an attempt of this task to now, at least a minute.
    A day of which an hour was recorded is an hour here: what ``per_second`` divides by."""


@dataclass(frozen=True)
class MinuteCounts(_ToDict):
    """Attempts that ended in one minute."""

    minute: datetime
    counts: Counts


@dataclass(frozen=True)
class RunningTask(_ToDict):
    """An entry delivered to a worker and not yet settled."""

    queue: str
    priority: str
    entry_id: str
    task_id: str
    task: str
    """The task name ('' when the payload cannot be decoded)."""
    attempt: int
    worker: str
    worker_alive: bool
    """False when the owner's lease has expired: another worker reclaims the entry soon."""
    delivered_at: datetime
    """When it was last delivered to (or claimed by) that worker, by the server's clock;
    with ``max_pending`` equal to ``concurrency`` (the default) that is when it started."""
    elapsed_s: float
    deliveries: int
    enqueued_at: datetime | None


@dataclass(frozen=True)
class DelayedTask(_ToDict):
    """A task waiting for its due time: scheduled for later, or a retry in its backoff."""

    queue: str
    task_id: str
    task: str
    state: str
    """'scheduled' (a first attempt) or 'retrying' (attempt 2 or later)."""
    attempt: int
    priority: str
    due_at: datetime
    due_in_s: float
    enqueued_at: datetime | None


@dataclass(frozen=True)
class WorkerInfo(_ToDict):
    """A live worker's registry record, published by its heartbeat. The record expires with
    the worker's lease, so a dead worker drops out within its ``heartbeat_ttl``."""

    name: str
    host: str
    pid: int
    version: str
    queues: list[str]
    concurrency: int
    max_pending: int
    started_at: datetime | None
    heartbeat_at: datetime | None
    """The last heartbeat, by the worker's clock."""
    held: int
    running: int
    counters: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> WorkerInfo:
        counters = record.get("counters")
        return cls(
            name=str(record.get("name", "")),
            host=str(record.get("host", "")),
            pid=_int(record.get("pid")),
            version=str(record.get("version", "")),
            queues=[str(q) for q in record.get("queues") or []],
            concurrency=_int(record.get("concurrency")),
            max_pending=_int(record.get("max_pending")),
            started_at=_time(record.get("started_ms")),
            heartbeat_at=_time(record.get("heartbeat_ms")),
            held=_int(record.get("held")),
            running=_int(record.get("running")),
            counters={str(k): _int(v) for k, v in counters.items()}
            if isinstance(counters, dict)
            else {},
        )


def _time(ms: Any) -> datetime | None:
    """A record's time: unix milliseconds, or absent. Raises for anything else (the
    reader skips the record and reports it)."""
    if not ms:
        return None
    if not isinstance(ms, (int, float)) or isinstance(ms, bool):
        raise TypeError(f"time {ms!r:.50} is not a number of milliseconds")
    return utc(ms)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class TaskError(_ToDict):
    type: str
    message: str
    traceback: str = ""


@dataclass(frozen=True)
class EarlierAttempt(_ToDict):
    """An attempt of a task that raised and was retried, from its record."""

    attempt: int | None
    started_at: datetime | None
    finished_at: datetime | None
    error: TaskError | None


@dataclass(frozen=True)
class TaskInfo(_ToDict):
    """One task by its id: where it is, and what it came to."""

    id: str
    queue: str
    status: str
    """queued, scheduled, running, retrying, succeeded, failed, dead or cancelled."""
    task: str | None
    """The task name, when its payload or record is still there."""
    attempt: int | None
    priority: str | None
    args: list[Any] | None
    kwargs: dict[str, Any] | None
    enqueued_at: datetime | None
    due_at: datetime | None
    """For a delayed task or a retry: when it is due."""
    worker: str | None
    """For a running task: the worker that holds it."""
    finished_at: datetime | None
    result: Any = None
    """The value of a succeeded task that stores its result."""
    error: TaskError | None = None
    """The error of a failed, dead or cancelled task (or of the last attempt of a retrying
    one)."""
    started_at: datetime | None = None
    """For a running task: when its worker took it, by the server's clock (with
    ``max_pending`` above ``concurrency`` it may have waited in the worker's buffer)."""
    dead_letter: str | None = None
    """For a failed or dead task: the entry id of its dead letter, while it is there (its
    arguments come from it once the task's payload is gone)."""
    deliveries: int | None = None
    """For a failed or dead task: how many times its last attempt was delivered, from its
    dead letter (more than one: a worker was lost and another took the attempt over)."""
    earlier_attempts: list[EarlierAttempt] = field(default_factory=list)
    """The attempts that raised and were retried, oldest first, with their errors (the last
    25; tasks that store results; none kept for runs settled before this release)."""


@dataclass(frozen=True)
class Health(_ToDict):
    """Whether the server answers, what it is, and who leads the schedulers."""

    reachable: bool
    server: str
    """'redis' or 'valkey' (empty when unreachable)."""
    version: str
    mode: str
    """standalone, cluster or sentinel (the URL's kind)."""
    namespace: str
    scheduler_leader: str | None
    time: datetime | None
    """The server's clock."""
    error: str | None = None


@dataclass(frozen=True)
class Overview(_ToDict):
    """Every known queue's figures, and the fleet: what ``tether info`` prints."""

    queues: list[QueueStats]
    workers: int
    scheduler_leader: str | None
    time: datetime | None
