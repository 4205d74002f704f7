"""Every metric Tether exposes, in one place: its name, type, labels and meaning.

The collectors take their help texts and label names from here, and the tests check the
documentation, the dashboard and the alert rules against this list, so a metric cannot be
renamed in one of them alone. Names follow the Prometheus conventions: the ``tether_``
prefix, base units (seconds), ``_total`` on counters, and bounded label sets (a queue, a
task name, an outcome, a priority; never a task id).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram", "info"]
Scope = Literal["worker", "deployment"]


@dataclass(frozen=True)
class MetricSpec:
    """One metric family: ``name`` as it appears in the exposition (counters with
    ``_total``, an info metric with ``_info``; a histogram's series add ``_bucket``,
    ``_sum`` and ``_count``)."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str
    scope: Scope

    @property
    def family(self) -> str:
        """The name given to prometheus_client, which adds ``_total`` and ``_info``."""
        if self.kind == "counter":
            return self.name.removesuffix("_total")
        if self.kind == "info":
            return self.name.removesuffix("_info")
        return self.name

    @property
    def series(self) -> tuple[str, ...]:
        """The names of the samples of this family."""
        if self.kind == "histogram":
            return (f"{self.name}_bucket", f"{self.name}_sum", f"{self.name}_count")
        return (self.name,)


BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0,
)  # fmt: skip
"""Upper bounds (seconds) of the run and wait time histograms: Prometheus's defaults, then
on to an hour for long tasks and long queues."""

OUTCOMES: dict[str, str] = {
    "ok": "succeeded",
    "fail": "failed",
    "retry": "retried",
    "dead": "dead",
    "cancel": "cancelled",
}
"""Outcome values of the settle records (``worker/_outcome.py``) to the ``outcome`` label,
the names the statistics readers use too; an attempt pushed back by ``RateLimited`` is
``rate_limited``."""

WORKER_COUNTERS: dict[str, str] = {
    "fetched": "Entries delivered to this worker, by its fetches and its claims.",
    "claimed": "Entries this worker took over from dead workers or from a stopping "
    "worker's handoff.",
    "handed_off": "Entries this worker gave back at shutdown for other workers to take.",
    "lost_leases": "Outcomes discarded because another worker had claimed the entry while "
    "it ran here (this worker's lease had lapsed).",
    "quarantined": "Entries sent to the dead letters after too many deliveries (their "
    "workers died running them).",
    "lease_lapses": "Heartbeats that found this worker's lease already expired (a frozen "
    "or stalled worker).",
    "reconnects": "Times this worker lost the connection to the server and got it back.",
    "lost_by_server": "Outcomes discarded because the server lost their entries (restarted "
    "without persistence, or flushed).",
    "groups_recreated": "Times this worker found its queues' consumer groups missing (the "
    "server lost its data) and created them again.",
    "dead_lettered": "Entries this worker wrote to the dead letters: failed tasks, "
    "malformed entries, unknown tasks, quarantined entries.",
    "promoted": "Delayed tasks and retries this worker moved into their streams when due.",
    "pruned_consumers": "Dead consumers this worker removed from the consumer groups.",
    "held_back": "Tasks a flow-control limit held back (waiting for a rate token or a slot).",
}
"""``WorkerCounters`` fields exported as ``tether_worker_<field>_total``. The counts by
outcome (succeeded, failed, ...) are in ``tether_tasks_total`` instead, per queue and task."""

_QT = ("queue", "task")

METRICS: tuple[MetricSpec, ...] = (
    # -- per worker: `tether worker --metrics-port` ------------------------------------
    MetricSpec(
        "tether_tasks_total", "counter", ("queue", "task", "outcome"),
        "Task attempts this worker ran to an outcome: succeeded, retried, failed (to the "
        "dead letters), dead, cancelled, or rate_limited (pushed back by RateLimited).",
        "worker",
    ),
    MetricSpec(
        "tether_task_duration_seconds", "histogram", _QT,
        "Run time of each attempt, from the call of the task's function to its end.",
        "worker",
    ),
    MetricSpec(
        "tether_task_wait_seconds", "histogram", _QT,
        "Wait time of each attempt, from when the task was due (its enqueue, or the end of "
        "its delay or backoff) to its start.",
        "worker",
    ),
    MetricSpec(
        "tether_task_timeouts_total", "counter", _QT,
        "Attempts that ran past their timeout (also counted as retried or failed).",
        "worker",
    ),
    MetricSpec(
        "tether_worker_running", "gauge", (), "Tasks running in this worker now.", "worker"
    ),
    MetricSpec(
        "tether_worker_held", "gauge", (),
        "Entries delivered to this worker and not yet settled: running, buffered, or "
        "finished and waiting for their acknowledgement.",
        "worker",
    ),
    MetricSpec(
        "tether_worker_concurrency", "gauge", (),
        "Tasks this worker runs at once at most (its concurrency setting).",
        "worker",
    ),
    MetricSpec(
        "tether_worker_max_pending", "gauge", (),
        "Entries this worker holds at most (its max_pending setting).",
        "worker",
    ),
    MetricSpec(
        "tether_worker_lease_held", "gauge", (),
        "1 while this worker's lease is known to be held (renewed within its time to "
        "live), else 0: the worker starts nothing new meanwhile.",
        "worker",
    ),
    MetricSpec(
        "tether_worker_start_time_seconds", "gauge", (),
        "When this worker started, in seconds since the epoch.",
        "worker",
    ),
    MetricSpec(
        "tether_worker_info", "info", ("worker", "version", "queues"),
        "This worker: its consumer name, Tether version and queues (comma-separated).",
        "worker",
    ),
    *(
        MetricSpec(f"tether_worker_{field}_total", "counter", (), text, "worker")
        for field, text in WORKER_COUNTERS.items()
    ),
    # -- per deployment: `tether web` /metrics and `tether exporter` ---------------------
    MetricSpec(
        "tether_up", "gauge", (),
        "1 when this scrape read the figures from Redis, 0 when the server could not be "
        "read (then no other tether_ metric is given).",
        "deployment",
    ),
    MetricSpec(
        "tether_read_duration_seconds", "gauge", (),
        "How long this scrape took to read the figures from Redis.",
        "deployment",
    ),
    MetricSpec(
        "tether_queue_depth", "gauge", ("queue", "priority"),
        "Entries waiting in the queue for a worker, per priority (high, normal, low).",
        "deployment",
    ),
    MetricSpec(
        "tether_queue_running", "gauge", ("queue",),
        "Entries delivered to workers and not yet settled.",
        "deployment",
    ),
    MetricSpec(
        "tether_queue_delayed", "gauge", ("queue",),
        "Tasks waiting for their due time: scheduled ones and retries in their backoff.",
        "deployment",
    ),
    MetricSpec(
        "tether_queue_dead_letters", "gauge", ("queue",),
        "Entries in the queue's dead-letter stream (capped at the app's "
        "dead_letter_maxlen).",
        "deployment",
    ),
    MetricSpec(
        "tether_queue_oldest_waiting_seconds", "gauge", ("queue",),
        "Age of the oldest waiting entry by the server's clock (0 when nothing waits): "
        "the queue's latency.",
        "deployment",
    ),
    MetricSpec(
        "tether_queue_workers", "gauge", ("queue",),
        "Live workers serving the queue (from the worker registry).",
        "deployment",
    ),
    MetricSpec(
        "tether_queue_paused", "gauge", ("queue",),
        "1 while the queue is paused (no worker fetches from it), else 0.",
        "deployment",
    ),
    MetricSpec(
        "tether_workers", "gauge", (), "Live workers in the registry, over every queue.",
        "deployment",
    ),
    MetricSpec(
        "tether_scheduler_leader", "gauge", (),
        "1 when a scheduler instance holds the leadership (periodic tasks fire), else 0.",
        "deployment",
    ),
    MetricSpec(
        "tether_schedules_in_backoff", "gauge", (),
        "Schedules resting after failed runs: their ticks are skipped until the backoff "
        "ends (a success or a reset ends it).",
        "deployment",
    ),
    MetricSpec(
        "tether_unreadable_records_total", "counter", ("kind",),
        "Records in Redis this process's readers skipped because they could not parse them "
        "(not what Tether writes), by kind: worker, statistics, queue, delayed, task, "
        "schedule, dead, limit. Counted at each reading; each record is logged once.",
        "deployment",
    ),
)  # fmt: skip

BY_NAME: dict[str, MetricSpec] = {spec.name: spec for spec in METRICS}


def spec(name: str) -> MetricSpec:
    """The catalogue entry of ``name`` (a KeyError names a metric not in the catalogue)."""
    return BY_NAME[name]
