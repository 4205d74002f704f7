"""Every Redis key Tether uses, computed once per queue.

All keys of one queue share the hash tag ``{<namespace>:<queue>}``, so every script that
touches a queue runs in one cluster slot. Keys are always built here, in Python, and passed
to scripts in ``KEYS``; no script builds a key and nothing scans the keyspace.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..base._settings import PRIORITIES

GROUP = "tether"
"""The consumer group on every stream."""

PAYLOAD_FIELD = b"m"
"""The single field of a stream entry that holds the encoded envelope."""


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The keys of one queue. Per-task and per-consumer keys are methods."""

    namespace: str
    queue: str
    tag: str
    streams: tuple[str, str, str]
    """One stream per priority, highest first (the order of ``PRIORITIES``)."""
    dead: str
    delayed: str
    scheduled_payloads: str
    index: str
    schedules: str
    backoff: str
    """schedule name -> '<failures>|<retry after ms>|<forget at ms>' while its runs fail"""
    paused: str
    """Present while the queue is paused: no worker fetches from it."""

    @classmethod
    def of(cls, namespace: str, queue: str) -> QueueKeys:
        tag = f"{{{namespace}:{queue}}}"
        high, normal, low = (f"{tag}:stream:{p}" for p in PRIORITIES)
        return cls(
            namespace=namespace,
            queue=queue,
            tag=tag,
            streams=(high, normal, low),
            dead=f"{tag}:dead",
            delayed=f"{tag}:delayed",
            scheduled_payloads=f"{tag}:sched",
            index=f"{tag}:idx",
            schedules=f"{tag}:ticks",
            backoff=f"{tag}:backoff",
            paused=f"{tag}:paused",
        )

    def lease(self, consumer: str) -> str:
        """The lease of ``consumer`` on this queue: present while the worker is alive."""
        return f"{self.tag}:lease:{consumer}"

    def cancels(self, consumer: str) -> str:
        """Task ids a running worker is asked to cancel (read by its heartbeat)."""
        return f"{self.tag}:cancel:{consumer}"

    def tick_log(self, schedule: str) -> str:
        """The last ticks of ``schedule`` and how they ended (a capped stream)."""
        return f"{self.tag}:ticklog:{schedule}"

    def result(self, task_id: str) -> str:
        return f"{self.tag}:result:{task_id}"

    def attempts(self, task_id: str) -> str:
        """The records of a task's attempts that were retried, oldest first (a list that
        lives as long as its result): what each earlier attempt raised."""
        return f"{self.tag}:attempts:{task_id}"

    def done(self, task_id: str) -> str:
        """A one-element list pushed at the final outcome; result waiters block on it."""
        return f"{self.tag}:done:{task_id}"

    def dedup(self, key: str) -> str:
        return f"{self.tag}:dedup:{key}"

    def stats_minute(self, minute: int) -> str:
        """Statistics of the minute ``minute`` (unix time // 60): a hash of counters."""
        return f"{self.tag}:stats:m:{minute}"

    def stats_hour(self, hour: int) -> str:
        """The same counters summed over the hour ``hour`` (unix time // 3600)."""
        return f"{self.tag}:stats:h:{hour}"

    def stream(self, priority: str) -> str:
        return self.streams[PRIORITIES.index(priority)]


KEYS_CACHED = 1024
"""Queues whose keys :func:`queue_keys` keeps. Far more than a deployment serves; the cap is
there because a queue name may come from outside (the queue part of a task id in a URL)."""


@functools.lru_cache(maxsize=KEYS_CACHED)
def queue_keys(namespace: str, queue: str) -> QueueKeys:
    """:meth:`QueueKeys.of`, computed once for the queues in use. Bounded: every made-up task
    id names a queue of its own, and an unbounded cache grew by each of them for good."""
    return QueueKeys.of(namespace, queue)


TASK_ID_MAX = 300
"""The longest task id: a queue name (at most 100 characters), ':' and the rest."""

_TASK_ID_RE = re.compile(
    # The queue is a valid queue name; the rest is one token of printable characters: a
    # stream entry (2-1732870000000-0), 32 hex digits, or a taskiq id with a suffix.
    r"(?P<queue>[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}):[^\s:\x00-\x1f\x7f]{1,199}"
)


def queue_of_task_id(task_id: str) -> str:
    """Task ids start with their queue, so a handle can be rebuilt from the id alone.
    ValueError for anything else: ids come from callers (URLs, forms), and a queue part
    that is no queue name must not reach a key."""
    found = _TASK_ID_RE.fullmatch(task_id) if isinstance(task_id, str) else None
    if found is None:
        raise ValueError(clipped(task_id))
    return found["queue"]


def clipped(value: object, limit: int = 80) -> str:
    """``repr(value)``, cut to about ``limit`` characters: a made-up id may be megabytes
    long, and goes into error messages, logs and pages."""
    shown = repr(value)
    return shown if len(shown) <= limit else f"{shown[:limit]}... ({len(shown)} characters)"


def task_id_problem(value: object) -> str:
    """Why ``value`` is not a task id, with the forms task ids take, for an error message."""
    forms = (
        "task ids name their queue: default:2-1732870000000-0 (a plain enqueue: the queue, "
        "the stream 1-3 and its entry id) or default:9f2c... (the queue and 32 hex digits)"
    )
    if isinstance(value, str) and re.fullmatch(r"\d{1,20}-\d{1,20}", value):
        return f"{value!r} is a stream entry id, not a task id: {forms}"
    return f"{clipped(value)} is not a Tether task id: {forms}"


def derived_task_id(queue: str, sidx: int, entry_id: str) -> str:
    """The id of a task enqueued with a plain XADD: its queue, stream and entry id.

    Plain enqueues (no delay, no dedup key) write nothing but the stream entry; the entry id
    is the task id. Tasks enqueued by a script (delayed, deduplicated, scheduled, retried)
    carry an id of their own, ``<queue>:<32 hex>``, and an index entry.
    """
    return f"{queue}:{sidx}-{entry_id}"


def entry_of_task_id(task_id: str) -> tuple[int, str] | None:
    """(stream index, entry id) of a derived task id, or None for an indexed one."""
    rest = task_id.rpartition(":")[2]
    sidx, dash, entry = rest.partition("-")
    if dash and sidx in ("1", "2", "3") and "-" in entry:
        return int(sidx), entry
    return None


def registry_keys(namespace: str) -> tuple[str, str]:
    """The worker registry: a sorted set of worker names by last heartbeat (ms), and the
    prefix of each worker's record key (``<prefix><name>``), under a hash tag of their own."""
    tag = f"{{{namespace}:workers}}"
    return f"{tag}:index", f"{tag}:worker:"


def known_queues_key(namespace: str) -> str:
    """The queues of a namespace that readers list without scanning the keyspace: a sorted
    set (every score 0, read in name order) that each worker adds its queues to from its
    heartbeat, and that pausing a queue adds it to. Beside the worker registry; it expires
    :data:`KNOWN_QUEUES_TTL_MS` after the last of those, so an abandoned namespace leaves
    nothing behind."""
    return f"{{{namespace}:workers}}:queues"


KNOWN_QUEUES_TTL_MS = 7 * 24 * 3600 * 1000


def scheduler_tag(namespace: str) -> str:
    """Cross-queue scheduler keys live under a hash tag of their own."""
    return f"{{{namespace}:scheduler}}"


@dataclass(frozen=True)
class SchedulerKeys:
    leader: str
    definitions: str
    paused: str
    version: str
    errors: str
    """schedule name -> the last error firing it met (cleared by its next successful tick)"""

    @classmethod
    def of(cls, namespace: str) -> SchedulerKeys:
        tag = scheduler_tag(namespace)
        return cls(
            f"{tag}:leader", f"{tag}:defs", f"{tag}:paused", f"{tag}:version", f"{tag}:errors"
        )


# -- flow-control limit keys -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScopeKeys:
    """The keys of one limit scope: a task, or a task and a limit key."""

    bucket: str
    """string: '<generation> <schedule TAT ms> <meter TAT ms>', with an expiry: the
    theoretical arrival times (GCRA) of the schedule (every admission and every reserved
    start) and of the meter (the starts admitted, when they were admitted)"""
    running: str
    """hash: task id -> the lease instance running it (:func:`slot_holder`); '' while no
    worker runs it: woken and not yet started, or waiting for its rate token"""
    waiting: str
    """list: '<task id>\\n<its park score>' of tasks parked until a slot frees"""


@dataclass(frozen=True, slots=True)
class TaskLimitKeys:
    """The keys of one task's limits on one queue."""

    tag: str
    task: str
    scope: ScopeKeys
    reservations: str
    """sorted set: task id -> the time its rate token is reserved for (ms), counted in
    every rate's schedule; negated when it is a time of the key's rate only (its key's rate
    bound it: the task-wide rate is asked when it comes back)"""
    waiting_keys: str
    """set: the limit keys with tasks parked on them (so a runtime change finds them)"""

    @classmethod
    def of(cls, tag: str, task: str) -> TaskLimitKeys:
        t = f"{len(task)}:{task}"
        return cls(tag, task, _scope(tag, t), f"{tag}:lim:resv:{t}", f"{tag}:lim:wkeys:{t}")

    def key_scope(self, key: str) -> ScopeKeys:
        return _scope(self.tag, f"{len(self.task)}:{self.task}:{key}")


def _scope(tag: str, name: str) -> ScopeKeys:
    return ScopeKeys(f"{tag}:lim:tat:{name}", f"{tag}:lim:run:{name}", f"{tag}:lim:wait:{name}")


def overrides_key(tag: str) -> str:
    """hash: task name -> the runtime override of its limits (JSON)"""
    return f"{tag}:limits"


def held_key(tag: str) -> str:
    """hash: task id -> '<holder>\\n<JSON [task, limit key]>' for every concurrency slot
    held (holder: :func:`slot_holder`, or '' for a task no worker runs), so maintenance can
    find the slots of dead workers"""
    return f"{tag}:lim:held"
