"""Statistics a worker adds up per settle batch and writes with the batch's acks (see
:mod:`tether.base._histogram` for the format): no extra round trip per task."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from ..base._histogram import bucket
from ..protocol._keys import QueueKeys
from ..protocol.scripts._calls import StatsWrite


class Observation:
    """What one finished attempt contributes."""

    __slots__ = ("outcome", "pushed_back", "run_ms", "task", "timed_out", "wait_ms")

    def __init__(
        self,
        task: str,
        outcome: str,
        run_ms: float,
        wait_ms: float | None,
        timed_out: bool,
        pushed_back: bool = False,
    ) -> None:
        self.task = task
        self.outcome = outcome
        self.run_ms = run_ms
        self.wait_ms = wait_ms
        self.timed_out = timed_out
        self.pushed_back = pushed_back
        """It raised RateLimited (counted as held_backpressure too)."""


class AttemptSink(Protocol):
    """Where a settled batch's observations go besides the statistics: the worker's
    Prometheus metrics (``tether.metrics``), when they are on."""

    def record(self, queue: str, attempts: Sequence[Observation]) -> None: ...


class StatsKeys:
    """Which statistics hashes this worker has already given their expiry: each gets it
    once (with its first successful write), not with every batch."""

    def __init__(self, window_s: float) -> None:
        self.ttl_ms = int(window_s * 1000) + 3_600_000
        self._expiring: set[str] = set()

    def write(
        self, keys: QueueKeys, observations: Sequence[Observation | None]
    ) -> StatsWrite | None:
        """What each entry of a settle call adds (``observations`` in the call's order,
        None for an entry that never ran), for this minute's and hour's hashes. The script
        counts an entry only if it settles it."""
        signatures: dict[tuple[str, ...], int] = {}
        per_entry: list[int] = []
        for o in observations:
            if o is None:
                per_entry.append(0)
                continue
            fields = _fields(o)
            per_entry.append(signatures.setdefault(fields, len(signatures) + 1))
        if not signatures:
            return None
        now = time.time()
        minute, hour = keys.stats_minute(int(now // 60)), keys.stats_hour(int(now // 3600))
        return StatsWrite(
            minute,
            hour,
            0 if minute in self._expiring else self.ttl_ms,
            0 if hour in self._expiring else self.ttl_ms,
            list(signatures),
            per_entry,
        )

    def written(self, stats: StatsWrite) -> None:
        """The write landed: its hashes expire now."""
        if len(self._expiring) > 1000:  # old minutes and hours: forget them
            self._expiring.clear()
        self._expiring.update((stats.minute_key, stats.hour_key))


def _fields(o: Observation) -> tuple[str, ...]:
    """The statistics fields one finished attempt adds one to."""
    task = o.task
    fields = [f"{task}|{o.outcome}", f"{task}|r{bucket(o.run_ms)}"]
    if o.wait_ms is not None:
        fields.append(f"{task}|w{bucket(o.wait_ms)}")
    if o.timed_out:
        fields.append(f"{task}|timeout")
    if o.pushed_back:
        fields.append(f"{task}|held_backpressure")
    return tuple(fields)
