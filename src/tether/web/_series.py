"""An hour of each queue's attempts per minute, kept between the dashboard's refreshes.

The charts of the overview show every queue's last hour, minute by minute: read whole, that
is sixty ``HGETALL`` per queue at every live refresh (3,000 for 50 queues, most of a
refresh's time). But a minute's hash stops changing soon after the minute ends: a worker
writes the minute of its own clock, in the call that acknowledges the attempt. So this
cache keeps the minutes that ended more than :data:`SETTLED_AFTER_S` ago, and a refresh
reads (through the same reader, :meth:`tether.admin.Stats.throughput`) only the minutes
after the last one it keeps: two or three per queue. And a chart shows minutes: the last
ones are read again at most every :data:`FRESH_S` seconds, not at every refresh.

One cache per router (it lives on the :class:`~tether.web._context.WebContext`), bounded
by :data:`MAX_QUEUES` queues of at most an hour each.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from datetime import datetime, timezone
from typing import TYPE_CHECKING

from ..admin import Counts, MinuteCounts

if TYPE_CHECKING:
    from ..admin import Stats

SETTLED_AFTER_S = 60.0
"""A minute's hash is taken as final this long after the minute ended: more than the clock
skew between workers and the time an attempt takes to be acknowledged."""
FRESH_S = 10.0
"""A queue's series read less than this long ago is shown again as it is (within the same
minute): the figures of the overview refresh every two seconds, its charts every ten."""
MAX_QUEUES = 1000


def _minute(m: MinuteCounts) -> int:
    return int(m.minute.timestamp() // 60)


class SeriesCache:
    """Per queue, the settled minutes of the last hour read so far."""

    def __init__(self, fresh_s: float = FRESH_S) -> None:
        self.fresh_s = fresh_s
        self._held: OrderedDict[str, dict[int, MinuteCounts]] = OrderedDict()
        self._shown: dict[tuple[str, int], tuple[float, list[MinuteCounts]]] = {}

    async def series(self, stats: Stats, queue: str, minutes: int) -> list[MinuteCounts]:
        """The last ``minutes`` minutes of ``queue`` (oldest first, the current one last),
        as :meth:`~tether.admin.Stats.throughput` gives them (the last ones at most
        :data:`FRESH_S` old)."""
        now = time.time()
        last = int(now // 60)
        shown = self._shown.get((queue, minutes))
        if shown is not None and now - shown[0] < self.fresh_s and _minute(shown[1][-1]) == last:
            return shown[1]
        series = await self._read(stats, queue, minutes, now)
        if len(self._shown) >= MAX_QUEUES:
            self._shown.clear()
        self._shown[(queue, minutes)] = (now, series)
        return series

    async def _read(self, stats: Stats, queue: str, minutes: int, now: float) -> list[MinuteCounts]:
        last = int(now // 60)
        first = last - minutes + 1
        held = {m: c for m, c in self._held.pop(queue, {}).items() if m >= first}
        missing = next((m for m in range(first, last + 1) if m not in held), last)
        read = await stats.throughput(queue, minutes=last - missing + 1)
        merged = {**held, **{_minute(m): m for m in read}}
        settled = int((now - SETTLED_AFTER_S) // 60) - 1
        self._held[queue] = {m: c for m, c in merged.items() if m <= settled}
        while len(self._held) > MAX_QUEUES:
            self._held.popitem(last=False)
        end = max(merged, default=last)
        return [merged.get(m) or _empty(m) for m in range(end - minutes + 1, end + 1)]


def _empty(minute: int) -> MinuteCounts:
    """A minute the reader's answer did not cover (its clock turned over meanwhile): no
    attempts shown this once; it is read at the next refresh (it is not kept)."""
    return MinuteCounts(datetime.fromtimestamp(minute * 60, tz=timezone.utc), Counts())
