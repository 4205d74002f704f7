"""The statistics format, shared by the workers that write it and the readers (API,
dashboard, metrics).

Each queue has a hash per minute and per hour (``QueueKeys.stats_minute/stats_hour``) of
counters, written by the settle script in the same call as the acks. Fields are
``<task>|<name>`` (a reader sums the tasks for queue-wide figures):

- outcome counts: ``ok``, ``fail``, ``retry``, ``dead``, ``cancel``, and ``timeout`` (attempts
  that ran past their timeout, also counted as ``fail`` or ``retry``);
- run time (start to end) and wait time (due to start) histograms: ``r<b>`` and ``w<b>`` count
  the attempts in bucket ``b`` (see :func:`bucket`).
- flow control (see :mod:`tether.limits`): ``held_rate``, ``held_key_rate``,
  ``held_concurrency``, ``held_key_concurrency`` count the times a limit held the task back,
  ``held_backpressure`` the attempts that raised ``RateLimited``; readers of the counts above
  skip them.

Buckets are log-spaced, two per doubling: bucket 0 holds times under 1 ms, bucket ``b >= 1``
holds [2^((b-1)/2), 2^(b/2)) ms, up to :data:`MAX_BUCKET` (about 12 days). A percentile read
back from them is within about 20 percent of the true value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

OUTCOMES: tuple[str, ...] = ("ok", "fail", "retry", "dead", "cancel", "timeout")
MAX_BUCKET = 60


def bucket(ms: float) -> int:
    """The bucket of a duration in milliseconds."""
    if ms < 1:
        return 0
    return min(MAX_BUCKET, int(2 * math.log2(ms)) + 1)


def upper_bound(b: int) -> float:
    """The upper bound (ms) of bucket ``b``."""
    return 2 ** (b / 2)


def lower_bound(b: int) -> float:
    return 0.0 if b == 0 else 2 ** ((b - 1) / 2)


def percentile(counts: Mapping[int, int], q: float) -> float | None:
    """The ``q``-quantile (0..1) in ms of a histogram {bucket: count}, interpolated inside
    its bucket on a log scale; None when empty."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for b in sorted(counts):
        n = counts[b]
        if n <= 0:
            continue
        if seen + n >= rank:
            low, high = lower_bound(b), upper_bound(b)
            fraction = (rank - seen) / n
            if low <= 0:
                return high * fraction
            return float(low * (high / low) ** fraction)
        seen += n
    return upper_bound(max(counts))


def split_field(field: str) -> tuple[str, str]:
    """``<task>|<name>`` as (task, name); a task name may itself contain '|'."""
    task, _, name = field.rpartition("|")
    return task, name
