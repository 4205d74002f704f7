"""Per-task statistics read back from the minute and hour hashes the workers write (see
:mod:`tether.base._histogram` for the format): outcome counts, run and wait time percentiles,
throughput.

A window up to :data:`MINUTE_WINDOW_MAX` is read from minute hashes, a longer one from hour
hashes; either way it is rounded out to whole buckets, so it covers at least the window
asked for (``since`` says where it starts). One pipelined ``HGETALL`` per bucket: the cost
grows with the window and the number of task names, never with the number of tasks run.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..base._errors import ConfigError
from ..base._histogram import MAX_BUCKET, OUTCOMES, percentile, split_field
from ..base._unreadable import skip
from ._models import Counts, Distribution, MinuteCounts, Page, Rate, TaskStats, utc
from ._replies import counters_of

if TYPE_CHECKING:
    from ..producer._core import Core
    from ..protocol._keys import QueueKeys

MINUTE_WINDOW_MAX = 3 * 3600.0
"""Windows up to this long are read per minute; longer ones per hour."""
MAX_SERIES_MINUTES = 24 * 60
RECENT_MINUTES = 5
"""Queue figures show the attempts of the current minute and the four before it."""


@dataclass
class Tally:
    """One task's counters summed over buckets."""

    outcomes: Counter[str] = field(default_factory=Counter)
    run: Counter[int] = field(default_factory=Counter)
    wait: Counter[int] = field(default_factory=Counter)
    first: int = 0
    """The index of the first hash (oldest first) holding a field of the task."""

    def add(self, name: str, amount: int) -> bool:
        """Count a field of the task; False for a histogram bucket no worker writes (the
        percentiles of a bucket past :data:`MAX_BUCKET` overflow a float)."""
        if name in OUTCOMES:
            self.outcomes[name] += amount
        elif name[:1] in ("r", "w") and name[1:].isdigit():
            if not (name[1:].isascii() and int(name[1:]) <= MAX_BUCKET):
                return False
            (self.run if name[0] == "r" else self.wait)[int(name[1:])] += amount
        return True


def tally(hashes: Sequence[dict[str, int]]) -> dict[str, Tally]:
    """Task name -> its counters summed over ``hashes``."""
    out: dict[str, Tally] = {}
    for index, fields in enumerate(hashes):
        for key, amount in fields.items():
            task, name = split_field(key)
            if not task:
                continue
            entry = out.get(task)
            if entry is None:
                entry = out[task] = Tally(first=index)
            if not entry.add(name, amount):
                skip("statistics", f"field {key[:100]!r}", "a histogram bucket out of range")
    return out


def distribution(counts: Counter[int]) -> Distribution:
    def seconds(q: float) -> float | None:
        ms = percentile(counts, q)
        return None if ms is None else ms / 1000

    return Distribution(sum(counts.values()), seconds(0.5), seconds(0.95), seconds(0.99))


@dataclass(frozen=True)
class Window:
    """The bucket keys that cover a window, and where they start."""

    keys: list[str]
    since_s: float
    covered_s: float
    bucket_s: float

    def active_s(self, first: int, now_s: float) -> float:
        """Seconds from the start of bucket ``first`` (the first holding data) to now, at
        least a minute (the first seconds of a minute are no rate to divide by)."""
        return max(60.0, min(self.covered_s, now_s - (self.since_s + first * self.bucket_s)))


def window_keys(keys: QueueKeys, window_s: float, now_s: float) -> Window:
    if window_s <= MINUTE_WINDOW_MAX:
        first, last = int((now_s - window_s) // 60), int(now_s // 60)
        return Window([keys.stats_minute(m) for m in range(first, last + 1)], first * 60.0,
                      now_s - first * 60, 60.0)  # fmt: skip
    first, last = int((now_s - window_s) // 3600), int(now_s // 3600)
    return Window([keys.stats_hour(h) for h in range(first, last + 1)], first * 3600.0,
                  now_s - first * 3600, 3600.0)  # fmt: skip


def check_window(core: Core, window_s: float) -> float:
    limit = core.settings.stats_window
    if isinstance(window_s, bool) or not isinstance(window_s, (int, float)):
        raise ConfigError(f"window={window_s!r}: expected seconds")
    if not 60 <= window_s <= limit or math.isnan(window_s):
        raise ConfigError(
            f"window={window_s!r}: must be between 60 seconds and the statistics window "
            f"({limit:g} s)"
        )
    return float(window_s)


async def read(core: Core, keys: Sequence[str]) -> list[dict[str, int]]:
    if not keys:
        return []
    pipe: Any = core.client.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    replies = await pipe.execute(raise_on_error=False)
    return [counters_of(r, key) for r, key in zip(replies, keys, strict=True)]


async def task_stats(
    core: Core, queues: Sequence[str], window_s: float, task: str | None = None
) -> list[TaskStats]:
    """Per queue and task name over the window, sorted by queue then task."""
    window_s = check_window(core, window_s)
    now = time.time()
    windows = [window_keys(core.keys(q), window_s, now) for q in queues]
    hashes = await read(core, [k for w in windows for k in w.keys])
    out: list[TaskStats] = []
    offset = 0
    for queue, w in zip(queues, windows, strict=True):
        tallies = tally(hashes[offset : offset + len(w.keys)])
        offset += len(w.keys)
        for name in sorted(tallies):
            if task is not None and name != task:
                continue
            t = tallies[name]
            counts = Counts.of(t.outcomes)
            attempts = counts.attempts
            # A window longer than the data (a day of which minutes were recorded) divides
            # by the time since its first bucket with an attempt, not by the whole window.
            active = w.active_s(t.first, now)
            out.append(
                TaskStats(
                    queue=queue,
                    task=name,
                    since=utc(w.since_s * 1000),
                    window_s=round(w.covered_s, 3),
                    counts=counts,
                    attempts=attempts,
                    per_second=attempts / active,
                    error_rate=counts.errors / attempts if attempts else None,
                    run=distribution(t.run),
                    wait=distribution(t.wait),
                    active_s=round(active, 3),
                )
            )
    return out


async def task_stats_page(
    core: Core,
    queues: Sequence[str],
    window_s: float,
    task: str | None,
    cursor: str | None,
    limit: int,
) -> Page[TaskStats]:
    """:func:`task_stats` a page at a time, in (queue, task) order after ``cursor``
    (``<queue>|<task>``): only the queues from the cursor's on are read, until the page is
    full; the first one alone, then as many at once as the rows the queues read so far gave
    suggest will fill it. So a page costs about its own queues' buckets, never every
    queue's. A full page always carries a cursor; the page after it may be empty."""
    window_s = check_window(core, window_s)
    after = None if cursor is None else tuple(cursor.partition("|")[::2])
    todo = sorted(q for q in queues if after is None or q >= after[0])
    rows: list[TaskStats] = []
    read = found = 0
    while todo and len(rows) < limit:
        wanted = limit - len(rows)
        size = 1 if not read else wanted if not found else math.ceil(wanted * read / found)
        batch, todo = todo[:size], todo[size:]
        got = await task_stats(core, batch, window_s, task)
        read, found = read + len(batch), found + len(got)
        rows += [r for r in got if after is None or (r.queue, r.task) > after]
    page = rows[:limit]
    return Page(page, f"{page[-1].queue}|{page[-1].task}" if len(page) == limit else None)


async def throughput(
    core: Core, queue: str, minutes: int, task: str | None = None
) -> list[MinuteCounts]:
    """Attempts that ended per minute, the last ``minutes`` minutes (current one last)."""
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not minutes >= 1:
        raise ConfigError(f"minutes={minutes!r}: expected a whole number, 1 or more")
    limit = min(MAX_SERIES_MINUTES, int(core.settings.stats_window // 60))
    if minutes > limit:
        raise ConfigError(f"minutes={minutes}: at most {limit} (the statistics window)")
    keys = core.keys(queue)
    last = int(time.time() // 60)
    first = last - minutes + 1
    hashes = await read(core, [keys.stats_minute(m) for m in range(first, last + 1)])
    out = []
    for minute, fields in zip(range(first, last + 1), hashes, strict=True):
        summed: Counter[str] = Counter()
        for name, t in tally([fields]).items():
            if task is None or name == task:
                summed.update(t.outcomes)
        out.append(MinuteCounts(utc(minute * 60_000), Counts.of(summed)))
    return out


def recent_keys(keys: QueueKeys, now_s: float) -> list[str]:
    last = int(now_s // 60)
    return [keys.stats_minute(m) for m in range(last - RECENT_MINUTES + 1, last + 1)]


def recent_rate(hashes: Sequence[dict[str, int]], now_s: float) -> Rate:
    """The attempts of the hashes read by :func:`recent_keys`."""
    summed: Counter[str] = Counter()
    for t in tally(hashes).values():
        summed.update(t.outcomes)
    counts = Counts.of(summed)
    covered = (RECENT_MINUTES - 1) * 60 + (now_s % 60)
    return Rate(
        window_s=round(covered, 3),
        attempts=counts.attempts,
        succeeded=counts.succeeded,
        errors=counts.errors,
        per_second=counts.attempts / covered if covered > 0 else 0.0,
    )
