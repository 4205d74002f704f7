"""Lists of a queue's entries, a page at a time, each page O(page) server commands.

- **Running**: the pending entries lists (``XPENDING`` with a range, highest priority first),
  then the page's envelopes (``XRANGE`` of each entry) and its owners' leases, pipelined.
  The cursor is ``<stream index>-<entry id>`` of the last entry read.
- **Delayed**: the delayed set in due order (``ZRANGE`` by rank from the cursor's rank),
  then the page's payloads (one ``HMGET``). The cursor is ``<due ms>:<task id>``.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from ..base._errors import ConfigError
from ..base._redis import text
from ..base._settings import ABANDONED, PRIORITIES
from ..base._unreadable import finite, text_or_none
from ..protocol._codecs import DEFAULT_SIDX, parse_scheduled, payload_of
from ..protocol._envelope import BadEnvelope, Envelope
from ..protocol._keys import GROUP, derived_task_id
from ._models import DelayedTask, Page, RunningTask, from_ms, utc
from ._replies import CLOCK, is_missing, server_ms, value

if TYPE_CHECKING:
    from ..producer._core import Core

_RUNNING_CURSOR = re.compile(r"^([123])-(\d{1,20}-\d{1,20})$")
_DELAYED_CURSOR = re.compile(r"^(-?\d{1,20}(?:\.\d+)?):(.{1,400})$", re.S)


def parse_running_cursor(cursor: str | None) -> tuple[int, str | None]:
    if cursor is None:
        return 1, None
    match = _RUNNING_CURSOR.match(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise ConfigError(
            f"cursor {cursor!r} is not a running-list cursor (<stream index 1..3>-<entry id>; "
            "pass back the cursor of the previous page)"
        )
    return int(match.group(1)), match.group(2)


def parse_delayed_cursor(cursor: str | None) -> tuple[float, str] | None:
    if cursor is None:
        return None
    match = _DELAYED_CURSOR.match(cursor) if isinstance(cursor, str) else None
    if match is None:
        raise ConfigError(
            f"cursor {cursor!r} is not a delayed-list cursor (<due ms>:<task id>; pass back "
            "the cursor of the previous page)"
        )
    return float(match.group(1)), match.group(2)


def _decode(core: Core, payload: bytes | None) -> Envelope | None:
    try:
        return Envelope.decode(payload, core.serializer)
    except BadEnvelope:
        return None


async def running(core: Core, queue: str, cursor: str | None, limit: int) -> Page[RunningTask]:
    """Entries delivered to workers and not settled, highest priority first, in entry order."""
    keys = core.keys(queue)
    client: Any = core.client
    sidx, after = parse_running_cursor(cursor)
    rows: list[tuple[int, Any]] = []
    full = False
    while sidx <= 3:
        wanted = limit - len(rows)
        try:
            got = await client.xpending_range(
                keys.streams[sidx - 1], GROUP, "-" if after is None else "(" + after, "+", wanted
            )
        except ResponseError as exc:
            if not is_missing(exc):
                raise
            got = []
        rows += [(sidx, row) for row in got]
        if len(got) == wanted:
            full = True
            break
        sidx, after = sidx + 1, None
    next_cursor = None
    if full and rows:
        last_sidx, last = rows[-1]
        next_cursor = f"{last_sidx}-{text(last['message_id'])}"
    shown = [(s, r) for s, r in rows if text(r["consumer"]) != ABANDONED]
    if not shown:
        return Page([], next_cursor)
    pipe: Any = client.pipeline(transaction=False)
    pipe.eval(CLOCK, 1, keys.streams[0])
    owners = sorted({text(r["consumer"]) for _, r in shown})
    for owner in owners:
        pipe.exists(keys.lease(owner))
    for s, r in shown:
        entry_id = text(r["message_id"])
        pipe.xrange(keys.streams[s - 1], entry_id, entry_id)
    replies = await pipe.execute(raise_on_error=False)
    now_ms = server_ms(replies[0])
    alive = {
        o: bool(value(x, 0)) for o, x in zip(owners, replies[1 : 1 + len(owners)], strict=True)
    }
    items = []
    for (s, r), entry in zip(shown, replies[1 + len(owners) :], strict=True):
        entry_id = text(r["message_id"])
        found = value(entry, [])
        env = _decode(core, payload_of(found))
        idle_ms = int(r["time_since_delivered"])
        owner = text(r["consumer"])
        items.append(
            RunningTask(
                queue=queue,
                priority=PRIORITIES[s - 1],
                entry_id=entry_id,
                task_id=(env.id if env and env.id else derived_task_id(queue, s, entry_id)),
                task=env.task if env else "",
                attempt=env.attempt if env else 0,
                worker=owner,
                worker_alive=alive[owner],
                delivered_at=utc(now_ms - idle_ms),
                elapsed_s=idle_ms / 1000,
                deliveries=int(r["times_delivered"]),
                enqueued_at=from_ms(env.enqueued_ms) if env and env.enqueued_ms else None,
            )
        )
    return Page(items, next_cursor)


DELAYED_BUDGET = 1000
"""Rows of the delayed set one page reads at most, unreadable ones included."""


async def _rank_of_score(client: Any, key: str, score: float) -> int:
    """How many members score below ``score``: the rank of the first one at or above it.
    (ZRANGE and ZRANK rather than ZCOUNT, which the documented ACL rule leaves out.)"""
    first: Any = await client.zrange(key, score, "+inf", byscore=True, offset=0, num=1)
    if not first:
        return int(await client.zcard(key))
    rank = await client.zrank(key, first[0])
    return int(rank) if rank is not None else 0


async def delayed(core: Core, queue: str, cursor: str | None, limit: int) -> Page[DelayedTask]:
    """Tasks waiting for their due time, soonest first. Rows that cannot be read are left
    out (reported), and the page reads on past them, up to :data:`DELAYED_BUDGET` rows: a
    page of nothing but unreadable rows ended the list before the tasks after them."""
    keys = core.keys(queue)
    client: Any = core.client
    after = parse_delayed_cursor(cursor)
    start = 0
    if after is not None:
        score, member = after
        rank = await client.zrank(keys.delayed, member)
        if rank is not None:
            start = rank + 1
        else:  # promoted or cancelled meanwhile: carry on from its due time
            start = await _rank_of_score(client, keys.delayed, score)
    rows: list[Any] = []
    read = 0
    last_read: Any = None
    more = True
    while len(rows) < limit and read < DELAYED_BUDGET:
        chunk = min(limit, DELAYED_BUDGET - read)
        raw: Any = await client.zrange(keys.delayed, start, start + chunk - 1, withscores=True)
        start += len(raw)
        read += len(raw)
        taken = 0
        for row in raw:
            taken += 1
            last_read = row
            if _readable_delayed(keys.delayed, row):
                rows.append(row)
                if len(rows) == limit:
                    break
        if taken == len(raw) < chunk:  # the set's end, every row of it seen
            more = False
            break
    if len(rows) == limit:
        last_read = rows[-1]  # the next page starts after the last row shown
    resume = _cursor_at(last_read) if more else None
    if not rows:
        return Page([], resume)
    ids = [text(member) for member, _ in rows]
    pipe: Any = client.pipeline(transaction=False)
    pipe.eval(CLOCK, 1, keys.delayed)
    pipe.hmget(keys.scheduled_payloads, ids)
    now_reply, payloads = await pipe.execute()
    now_ms = server_ms(now_reply)
    items = []
    for (task_id, (_, due)), raw in zip(zip(ids, rows, strict=True), payloads, strict=True):
        sidx, payload = parse_scheduled(raw) if raw else (DEFAULT_SIDX, None)
        env = _decode(core, payload)
        attempt = env.attempt if env else 1
        items.append(
            DelayedTask(
                queue=queue,
                task_id=task_id,
                task=env.task if env else "",
                state="retrying" if attempt > 1 else "scheduled",
                attempt=attempt,
                priority=PRIORITIES[sidx - 1],
                due_at=utc(float(due)),
                due_in_s=(float(due) - now_ms) / 1000,
                enqueued_at=from_ms(env.enqueued_ms) if env and env.enqueued_ms else None,
            )
        )
    return Page(items, resume)


def _cursor_at(row: Any) -> str | None:
    """The cursor of the page after ``row``; None when it cannot name the row, which ends
    the list. That happens only after a whole :data:`DELAYED_BUDGET` of unreadable rows,
    the last of them a member that is not text, or one due at an infinity (those sort
    last: nothing readable follows them)."""
    if row is None:
        return None
    member, score = row
    if not (isinstance(member, bytes) and math.isfinite(float(score))):
        return None
    try:
        return f"{int(float(score))}:{member.decode()}"
    except UnicodeDecodeError:
        return None


def _readable_delayed(key: str, row: tuple[Any, float]) -> bool:
    """A member of the delayed set that is text with a due time (not an infinity)."""
    member, score = row
    return (
        text_or_none("delayed", key, member) is not None
        and finite("delayed", f"{key} member {member[:100]!r}", float(score)) is not None
    )
