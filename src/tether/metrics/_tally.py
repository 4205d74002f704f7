"""What a worker's finished attempts add to its metrics: plain counts, kept cheap.

The settler hands each settled batch's observations to :meth:`AttemptTally.record` on the
event loop: per attempt a dictionary lookup, a few integer additions and one bisection,
with no lock and nothing of prometheus_client (about a microsecond). The metrics server's
thread reads a :meth:`AttemptTally.snapshot` when it is scraped: the copies it takes
(``dict(...)``, ``list(...)``) are single steps under the GIL, so a scrape never sees a
container half changed; a histogram's count is the sum of its buckets, so the two always
agree.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ._catalog import BUCKETS, OUTCOMES


class Attempt(Protocol):
    """What one finished attempt tells (the worker's ``Observation``)."""

    task: str
    outcome: str
    run_ms: float
    wait_ms: float | None
    timed_out: bool
    pushed_back: bool


class _Series:
    """The counts of one (queue, task)."""

    __slots__ = ("outcomes", "run", "run_sum", "timeouts", "wait", "wait_sum")

    def __init__(self, width: int) -> None:
        self.outcomes: dict[str, int] = {}
        self.run = [0] * width
        """Attempts per bucket (not cumulative); the last one is above every bound."""
        self.run_sum = 0.0
        self.wait = [0] * width
        self.wait_sum = 0.0
        self.timeouts = 0


@dataclass(frozen=True)
class Histogram:
    """A copy of one histogram: cumulative counts per upper bound, the last ``+Inf``."""

    buckets: list[tuple[float, int]]
    sum: float

    @property
    def count(self) -> int:
        return self.buckets[-1][1]


@dataclass(frozen=True)
class SeriesSnapshot:
    queue: str
    task: str
    outcomes: dict[str, int]
    run: Histogram
    wait: Histogram
    timeouts: int


class AttemptTally:
    """Counts by outcome, run and wait time histograms and timeouts per (queue, task) name
    pair, since the worker started."""

    def __init__(self, bounds: Sequence[float] = BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self._width = len(self.bounds) + 1
        self._series: dict[tuple[str, str], _Series] = {}

    def record(self, queue: str, attempts: Sequence[Attempt]) -> None:
        """Add a settled batch of one queue (called on the event loop)."""
        series = self._series
        bounds = self.bounds
        for a in attempts:
            s = series.get((queue, a.task))
            if s is None:
                s = series[(queue, a.task)] = _Series(self._width)
            outcome = "rate_limited" if a.pushed_back else OUTCOMES.get(a.outcome, a.outcome)
            s.outcomes[outcome] = s.outcomes.get(outcome, 0) + 1
            run = a.run_ms / 1000
            s.run[bisect_left(bounds, run)] += 1
            s.run_sum += run
            if a.wait_ms is not None:
                wait = a.wait_ms / 1000
                s.wait[bisect_left(bounds, wait)] += 1
                s.wait_sum += wait
            if a.timed_out:
                s.timeouts += 1

    def snapshot(self) -> list[SeriesSnapshot]:
        """A copy of every series, safe to take from another thread."""
        out = []
        for (queue, task), s in sorted(dict(self._series).items()):
            out.append(
                SeriesSnapshot(
                    queue,
                    task,
                    dict(s.outcomes),
                    self._histogram(list(s.run), s.run_sum),
                    self._histogram(list(s.wait), s.wait_sum),
                    s.timeouts,
                )
            )
        return out

    def _histogram(self, counts: list[int], total: float) -> Histogram:
        cumulative = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
            running += count
            cumulative.append((bound, running))
        return Histogram(cumulative, total)
