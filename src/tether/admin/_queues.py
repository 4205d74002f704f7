"""A queue's figures on demand: waiting per priority, running, delayed, dead, the age of the
oldest waiting entry, the pause flag and the recent throughput.

Two pipelined round trips for any number of queues, a fixed number of O(1) commands per
queue (``XLEN``, ``XINFO GROUPS``, the ``XPENDING`` summary, ``ZCARD``, ...): the cost does
not grow with the tasks queued, delayed or dead.

Waiting entries are those after the group's last delivered id (a consumer group delivers in
id order) plus those a stopping worker handed off to ``abandoned``; the oldest of them is the
first entry after the last delivered id, or the oldest handed-off one. Entry ids carry the
server's time of the ``XADD`` (the enqueue, or the promotion of a delayed task when it fell
due), so its age is measured by the server's clock.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..base._redis import text
from ..base._settings import ABANDONED, PRIORITIES
from ..base._unreadable import finite
from ..protocol._keys import GROUP
from ._buckets import RECENT_MINUTES, recent_keys, recent_rate
from ._models import QueueStats, from_ms
from ._replies import (
    CLOCK,
    counters_of,
    detached,
    entry_ms,
    group_info,
    pending_by_consumer,
    server_ms,
    value,
)

if TYPE_CHECKING:
    from ..producer._core import Core

_PER_STREAM = 3  # XLEN, XINFO GROUPS, XPENDING summary


@dataclass
class _Stream:
    length: int
    pending: int
    last_delivered: str
    abandoned: int

    @property
    def waiting(self) -> int:
        # Entries deleted under a pending entry would make this negative: never below zero.
        return max(0, self.length - self.pending) + self.abandoned


async def figures(
    core: Core, queues: Sequence[str], workers: Mapping[str, int]
) -> list[QueueStats]:
    """The figures of ``queues``; ``workers`` maps a queue to its live workers."""
    if not queues:
        return []
    client = core.client
    now_s = time.time()
    pipe: Any = client.pipeline(transaction=False)
    for queue in queues:
        keys = core.keys(queue)
        pipe.eval(CLOCK, 1, keys.streams[0])
        for stream in keys.streams:
            pipe.xlen(stream)
            pipe.xinfo_groups(stream)
            pipe.xpending(stream, GROUP)
        pipe.zcard(keys.delayed)
        pipe.zrange(keys.delayed, 0, 0, withscores=True)
        pipe.xlen(keys.dead)
        pipe.get(keys.paused)
        for key in recent_keys(keys, now_s):
            pipe.hgetall(key)
    recent_at = {q: recent_keys(core.keys(q), now_s) for q in queues}
    replies = detached(await pipe.execute(raise_on_error=False))
    per_queue = 1 + 3 * _PER_STREAM + 4 + RECENT_MINUTES
    parsed = []
    for i, queue in enumerate(queues):
        now_ms, *r = replies[i * per_queue : (i + 1) * per_queue]
        streams = []
        for s in range(3):
            length, groups, summary = r[s * _PER_STREAM : (s + 1) * _PER_STREAM]
            pending, last = group_info(groups)
            abandoned = pending_by_consumer(summary).get(ABANDONED, 0)
            streams.append(_Stream(int(value(length, 0)), pending, last, abandoned))
        parsed.append((queue, server_ms(value(now_ms, None)), streams, r[3 * _PER_STREAM :]))
    oldest = await _oldest_waiting(core, [(q, s) for q, _, s, _ in parsed])
    out = []
    for queue, now_ms, streams, rest in parsed:
        delayed, head, dead, paused, *recent = rest
        head = value(head, [])
        oldest_ms = oldest.get(queue)
        out.append(
            QueueStats(
                name=queue,
                waiting={p: s.waiting for p, s in zip(PRIORITIES, streams, strict=True)},
                depth=sum(s.waiting for s in streams),
                running=sum(max(0, s.pending - s.abandoned) for s in streams),
                delayed=int(value(delayed, 0)),
                dead=int(value(dead, 0)),
                oldest_waiting_s=None if oldest_ms is None else max(0, now_ms - oldest_ms) / 1000,
                next_due_s=_due_in(core.keys(queue).delayed, head, now_ms),
                paused=value(paused, None) is not None,
                paused_at=_paused_at(value(paused, None)),
                workers=workers.get(queue, 0),
                recent=recent_rate(
                    [counters_of(h, k) for h, k in zip(recent, recent_at[queue], strict=True)],
                    now_s,
                ),
            )
        )
    return out


def _due_in(key: str, head: Any, now_ms: int) -> float | None:
    """Seconds until the first delayed task is due; None without one, or for a score that
    is no time (an infinity added by hand: JSON cannot say it)."""
    due = finite("delayed", f"{key} first member", float(head[0][1])) if head else None
    return None if due is None else (due - now_ms) / 1000


def _paused_at(raw: Any) -> datetime | None:
    try:
        return None if raw is None else from_ms(int(raw))
    except ValueError:
        return None  # a flag set by hand, with another value


async def _oldest_waiting(
    core: Core, queues: Sequence[tuple[str, list[_Stream]]]
) -> dict[str, int]:
    """Queue -> the server time (ms) of its oldest waiting entry, for queues with any."""
    pipe: Any = core.client.pipeline(transaction=False)
    asked: list[str] = []
    for queue, streams in queues:
        keys = core.keys(queue)
        for stream_key, s in zip(keys.streams, streams, strict=True):
            if s.length > s.pending:
                start = "-" if s.last_delivered in ("0-0", "0") else "(" + s.last_delivered
                pipe.xrange(stream_key, start, "+", count=1)
                asked.append(queue)
            if s.abandoned:
                pipe.xpending_range(stream_key, GROUP, "-", "+", 1, consumername=ABANDONED)
                asked.append(queue)
    if not asked:
        return {}
    out: dict[str, int] = {}
    for queue, reply in zip(asked, detached(await pipe.execute(raise_on_error=False)), strict=True):
        rows = value(reply, [])
        if not rows:
            continue
        first = rows[0]
        entry_id = first["message_id"] if isinstance(first, dict) else first[0]
        ms = entry_ms(text(entry_id))
        out[queue] = min(ms, out.get(queue, ms))
    return out
