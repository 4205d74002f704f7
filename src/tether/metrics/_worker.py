"""A worker's metrics: the counts of its attempts, its gauges and its delivery counters.

Nothing is updated per task but the :class:`~tether.metrics._tally.AttemptTally`; the
gauges and counters are read from the worker when Prometheus scrapes (a custom collector),
so they cost nothing between scrapes. Each worker has its own ``CollectorRegistry``: a
worker embedded in an application leaves the application's registry alone, and two
workers in one process do not clash.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from ..base._settings import WorkerSettings
from ..base._version import __version__
from ._catalog import WORKER_COUNTERS, spec
from ._server import MetricsServer
from ._tally import AttemptTally, Histogram


class WorkerCounterView(Protocol):
    def as_dict(self) -> dict[str, Any]: ...


class WorkerView(Protocol):
    """What the collector reads of a worker at scrape time (a :class:`~tether.Worker`)."""

    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> WorkerSettings: ...

    @property
    def counters(self) -> WorkerCounterView: ...

    @property
    def held(self) -> int: ...

    @property
    def running(self) -> int: ...

    @property
    def lease_is_held(self) -> bool: ...


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, spec(name).help, value=value)


def _histogram(family: HistogramMetricFamily, labels: list[str], h: Histogram) -> None:
    buckets = [("+Inf" if b == float("inf") else repr(b), float(n)) for b, n in h.buckets]
    family.add_metric(labels, buckets, h.sum)


class WorkerCollector:
    """Builds the worker's families on each scrape, from the tally and the worker."""

    def __init__(self, worker: WorkerView, tally: AttemptTally, started: float) -> None:
        self._worker = worker
        self._tally = tally
        self._started = started

    def collect(self) -> Iterator[Metric]:
        yield from self._attempts()
        w = self._worker
        s = w.settings
        yield _gauge("tether_worker_running", w.running)
        yield _gauge("tether_worker_held", w.held)
        yield _gauge("tether_worker_concurrency", s.concurrency)
        yield _gauge("tether_worker_max_pending", s.pending_limit)
        yield _gauge("tether_worker_lease_held", 1 if w.lease_is_held else 0)
        yield _gauge("tether_worker_start_time_seconds", self._started)
        info = spec("tether_worker_info")
        yield InfoMetricFamily(
            info.family,
            info.help,
            value={"worker": w.name, "version": __version__, "queues": ",".join(s.queues)},
        )
        counts = w.counters.as_dict()
        for field in WORKER_COUNTERS:
            name = f"tether_worker_{field}_total"
            yield CounterMetricFamily(spec(name).family, spec(name).help, value=counts[field])

    def _attempts(self) -> Iterator[Metric]:
        tasks = spec("tether_tasks_total")
        outcomes = CounterMetricFamily(tasks.family, tasks.help, labels=tasks.labels)
        run_spec = spec("tether_task_duration_seconds")
        run = HistogramMetricFamily(run_spec.name, run_spec.help, labels=run_spec.labels)
        wait_spec = spec("tether_task_wait_seconds")
        wait = HistogramMetricFamily(wait_spec.name, wait_spec.help, labels=wait_spec.labels)
        timeouts_spec = spec("tether_task_timeouts_total")
        timeouts = CounterMetricFamily(
            timeouts_spec.family, timeouts_spec.help, labels=timeouts_spec.labels
        )
        for series in self._tally.snapshot():
            labels = [series.queue, series.task]
            for outcome, count in sorted(series.outcomes.items()):
                outcomes.add_metric([*labels, outcome], count)
            _histogram(run, labels, series.run)
            _histogram(wait, labels, series.wait)
            timeouts.add_metric(labels, series.timeouts)
        yield from (outcomes, run, wait, timeouts)


class WorkerMetrics:
    """The metrics of one worker: its tally, its registry and, when a port is set, the
    server of ``/metrics`` that starts and stops with the worker.

    ``registry`` is this worker's own ``CollectorRegistry`` (with the process, platform
    and garbage collector metrics of prometheus_client): register your own metrics there
    to serve them on the same port."""

    def __init__(self, worker: WorkerView) -> None:
        self.tally = AttemptTally()
        self.registry = CollectorRegistry()
        self._started = time.time()
        self.registry.register(WorkerCollector(worker, self.tally, self._started))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        settings = worker.settings
        self.server: MetricsServer | None = None
        if settings.metrics_port is not None:
            self.server = MetricsServer(self.registry, settings.metrics_bind, settings.metrics_port)

    @property
    def url(self) -> str | None:
        """Where the metrics are served (once started), else None."""
        return None if self.server is None else self.server.url

    def start(self) -> None:
        """Listen (a port in use is a :class:`~tether.ConfigError`)."""
        if self.server is not None:
            self.server.start()

    def stop(self) -> None:
        """Stop the server and join its threads (blocking: call it from a thread)."""
        if self.server is not None:
            self.server.stop()
