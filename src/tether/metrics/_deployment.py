"""The deployment's metrics, read from Redis at each scrape through ``app.stats``.

One scrape reads every known queue's figures, the worker registry and the scheduler
leader (:meth:`tether.admin.Stats.overview`): a fixed number of commands per queue, in a
few pipelined round trips, whatever the queues hold. Nothing is cached between scrapes.

A server that cannot be read gives ``tether_up 0`` (and the time the attempt took), never
an error page: Prometheus keeps scraping, and an alert on ``tether_up == 0`` says why the
other series stopped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from ..admin import Overview, Stats
from ..base import _unreadable
from ..base._faults import describe_error
from ..base._settings import PRIORITIES
from ..scheduler import Schedules
from ._catalog import spec

if TYPE_CHECKING:
    from ..producer._core import Core

log = logging.getLogger("tether.metrics")

READ_TIMEOUT = 8.0
"""Seconds one scrape may spend reading Redis: below Prometheus's default scrape timeout
(10 s), so a slow server gives ``tether_up 0`` rather than a failed scrape."""


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, spec(name).help, value=value)


def _per_queue(name: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, spec(name).help, labels=spec(name).labels)


def families(overview: Overview, in_backoff: int = 0) -> list[Metric]:
    """The deployment's families from an overview of every known queue."""
    depth = _per_queue("tether_queue_depth")
    running = _per_queue("tether_queue_running")
    delayed = _per_queue("tether_queue_delayed")
    dead = _per_queue("tether_queue_dead_letters")
    oldest = _per_queue("tether_queue_oldest_waiting_seconds")
    workers = _per_queue("tether_queue_workers")
    paused = _per_queue("tether_queue_paused")
    for q in overview.queues:
        for priority in PRIORITIES:
            depth.add_metric([q.name, priority], q.waiting.get(priority, 0))
        running.add_metric([q.name], q.running)
        delayed.add_metric([q.name], q.delayed)
        dead.add_metric([q.name], q.dead)
        oldest.add_metric([q.name], q.oldest_waiting_s or 0.0)
        workers.add_metric([q.name], q.workers)
        paused.add_metric([q.name], 1 if q.paused else 0)
    return [
        depth,
        running,
        delayed,
        dead,
        oldest,
        workers,
        paused,
        _gauge("tether_workers", overview.workers),
        _gauge("tether_scheduler_leader", 1 if overview.scheduler_leader else 0),
        _gauge("tether_schedules_in_backoff", in_backoff),
        unreadable(),
    ]


def unreadable() -> CounterMetricFamily:
    """Records the readers of this process skipped (see :mod:`tether.base._unreadable`)."""
    name = "tether_unreadable_records_total"
    family = CounterMetricFamily(spec(name).family, spec(name).help, labels=spec(name).labels)
    for kind, skipped in _unreadable.counts().items():
        family.add_metric([kind], skipped)
    return family


async def read(app: Core, timeout: float = READ_TIMEOUT) -> list[Metric]:
    """One scrape's families; ``tether_up 0`` when Redis cannot be read within
    ``timeout`` seconds (the reason is logged on the ``tether.metrics`` logger)."""
    started = time.monotonic()
    try:
        overview, resting = await asyncio.wait_for(
            asyncio.gather(Stats(app).overview(), Schedules(app).resting()), timeout
        )
    except asyncio.TimeoutError:
        log.warning("scrape: reading %s took more than %gs", app.target.redacted, timeout)
        return _down(started)
    except Exception as exc:  # the scrape answers whatever went wrong; the log says what
        log.warning("scrape: cannot read %s: %s", app.target.redacted, _why(app, exc))
        return _down(started)
    return [
        _gauge("tether_up", 1),
        _gauge("tether_read_duration_seconds", time.monotonic() - started),
        *families(overview, len(resting)),
    ]


def _why(app: Core, exc: BaseException) -> str:
    from redis.exceptions import RedisError

    from ..base._faults import TRANSIENT_ERRORS

    if isinstance(exc, (RedisError, *TRANSIENT_ERRORS)):
        return describe_error(exc, app.target.redacted)
    log.error("scrape: unexpected error", exc_info=exc)
    return f"{type(exc).__name__}: {exc}"


def _down(started: float) -> list[Metric]:
    return [
        _gauge("tether_up", 0),
        _gauge("tether_read_duration_seconds", time.monotonic() - started),
    ]


class _Scrape:
    """The families of one scrape, in the shape the encoders take (a registry)."""

    def __init__(self, metrics: Sequence[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


async def exposition(
    app: Core, accept: str | None = None, *, timeout: float = READ_TIMEOUT
) -> tuple[bytes, str]:
    """The deployment's metrics as an HTTP body and its content type, in the format the
    ``Accept`` header asks for (OpenMetrics or the Prometheus text format): for a
    ``/metrics`` route of your own (``tether web`` serves one)."""
    encode, content_type = choose_encoder(accept or "")
    return encode(_Scrape(await read(app, timeout))), content_type


class DeploymentCollector:
    """A collector for a server in another thread (``tether exporter``): each scrape reads
    on the event loop that owns the app's connection, and waits for it."""

    def __init__(
        self, app: Core, loop: asyncio.AbstractEventLoop, timeout: float = READ_TIMEOUT
    ) -> None:
        self._app = app
        self._loop = loop
        self._timeout = timeout

    def collect(self) -> Iterable[Metric]:
        started = time.monotonic()
        try:
            future = asyncio.run_coroutine_threadsafe(read(self._app, self._timeout), self._loop)
        except RuntimeError:  # the loop has closed: the exporter is stopping
            return _down(started)
        try:
            return future.result(self._timeout + 2)
        except concurrent.futures.TimeoutError:  # the loop itself is stuck
            future.cancel()
            log.warning("scrape: the event loop did not answer within %gs", self._timeout + 2)
            return _down(started)
