"""Statistics a worker adds up per settle batch and writes with the batch's acks (see
:mod:`tether._histogram` for the format): no extra round trip per task."""

from __future__ import annotations

import time
from collections import Counter

from .._histogram import ALL, bucket
from .._keys import QueueKeys
from ..scripts._calls import StatsWrite


class Observation:
    """What one finished attempt contributes."""

    __slots__ = ("outcome", "run_ms", "task", "timed_out", "wait_ms")

    def __init__(
        self, task: str, outcome: str, run_ms: float, wait_ms: float | None, timed_out: bool
    ) -> None:
        self.task = task
        self.outcome = outcome
        self.run_ms = run_ms
        self.wait_ms = wait_ms
        self.timed_out = timed_out


def stats_write(
    keys: QueueKeys, observations: list[Observation], window_s: float
) -> StatsWrite | None:
    """The increments of a batch, summed per field, for this minute's and hour's hashes."""
    if not observations:
        return None
    counts: Counter[str] = Counter()
    for o in observations:
        for task in (o.task, ALL):
            counts[f"{task}|{o.outcome}"] += 1
            if o.timed_out:
                counts[f"{task}|timeout"] += 1
            counts[f"{task}|r{bucket(o.run_ms)}"] += 1
            counts[f"{task}|rs"] += round(o.run_ms)
            if o.wait_ms is not None:
                counts[f"{task}|w{bucket(o.wait_ms)}"] += 1
                counts[f"{task}|ws"] += round(o.wait_ms)
    now = time.time()
    ttl_ms = int(window_s * 1000) + 3_600_000
    return StatsWrite(
        keys.stats_minute(int(now // 60)),
        keys.stats_hour(int(now // 3600)),
        ttl_ms,
        ttl_ms,
        sorted(counts.items()),
    )
