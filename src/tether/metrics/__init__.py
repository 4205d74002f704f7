"""Prometheus metrics (``pip install 'tether-queue[metrics]'``).

- **Per worker**: ``tether worker APP --metrics-port 9100`` (or ``metrics_port=`` in
  :class:`~tether.WorkerSettings`) serves ``/metrics`` while the worker runs: attempts by
  outcome, run and wait time histograms per queue and task, the worker's gauges and its
  delivery counters. :class:`WorkerMetrics` is what ``worker.metrics`` holds.
- **Per deployment**: queue depth per priority, running, delayed, dead letters, the age of
  the oldest waiting task, live workers per queue and the scheduler leader, read from Redis
  at each scrape: ``/metrics`` of ``tether web`` (behind its token), ``tether exporter``, or
  :func:`exposition` in a route of your own. :class:`Exporter` is ``tether exporter``.

:data:`METRICS` lists every metric with its type, labels and meaning. The guide is
``docs/observability.md``.
"""

from ._catalog import BUCKETS, METRICS, OUTCOMES, MetricSpec
from ._deployment import READ_TIMEOUT, exposition
from ._exporter import Exporter
from ._worker import WorkerMetrics

__all__ = [
    "BUCKETS",
    "METRICS",
    "OUTCOMES",
    "READ_TIMEOUT",
    "Exporter",
    "MetricSpec",
    "WorkerMetrics",
    "exposition",
]
