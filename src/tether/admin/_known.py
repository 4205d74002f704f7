"""Which queues exist, without scanning the keyspace.

A namespace's known queues are a sorted set (``known_queues_key``, every score 0 so it reads
in name order by ``ZRANGEBYLEX``) that every worker adds its queues to from its heartbeat,
and that pausing a queue adds it to; the readers add the queues the app's own tasks and
schedules name. A queue that only a producer ever wrote to (no worker serves it, no task of
this app names it) is not listed, but reading it by name works.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..base._redis import text
from ..base._settings import check_name
from ..base._unreadable import parsed
from ..protocol._keys import known_queues_key
from ._models import Page

if TYPE_CHECKING:
    from ..producer._core import Core


def declared_queues(core: Core) -> set[str]:
    """The queues this app's tasks and schedules name."""
    return {t.config.queue for t in core.tasks.values()} | {
        s.queue for s in core.declared_schedules
    }


async def known_page(core: Core, cursor: str | None, limit: int) -> Page[str]:
    """Queue names in name order, ``limit`` at a time, after ``cursor`` (a queue name)."""
    if cursor is not None:
        check_name("cursor (a queue name)", cursor)
    key = known_queues_key(core.namespace)
    start = "-" if cursor is None else "(" + cursor
    raw: Any = await core.client.zrangebylex(key, start, "+", start=0, num=limit)
    stored = [n for n in (_queue_name(key, r) for r in raw) if n is not None]
    later = {q for q in declared_queues(core) if cursor is None or q > cursor}
    names = sorted(set(stored) | later)
    page = names[:limit]
    more = len(raw) == limit or len(names) > limit
    return Page(page, page[-1] if page and more else None)


def _queue_name(key: str, raw: Any) -> str | None:
    """A member of the known queues, or None (reported) when it is no queue name."""
    return parsed("queue", f"{key} member {raw[:100]!r}", lambda: check_name("queue", text(raw)))


async def all_known(core: Core) -> list[str]:
    """Every known queue name (a few pages at most: queues are few)."""
    out: list[str] = []
    cursor: str | None = None
    while True:
        page = await known_page(core, cursor, 500)
        out += page.items
        if page.cursor is None:
            return out
        cursor = page.cursor


async def is_known(core: Core, queue: str) -> bool:
    """Known: declared by the app, added by a worker or a pause, or it has keys."""
    check_name("queue", queue)
    if queue in declared_queues(core):
        return True
    keys = core.keys(queue)
    pipe: Any = core.client.pipeline(transaction=False)
    pipe.zscore(known_queues_key(core.namespace), queue)
    pipe.exists(*keys.streams, keys.delayed, keys.dead, keys.paused)
    score, existing = await pipe.execute()
    return score is not None or int(existing) > 0


async def forget(core: Core, queue: str) -> bool:
    """Remove a queue from the known set (a queue no longer used). Workers that still
    serve it add it back at their next heartbeat."""
    check_name("queue", queue)
    return bool(await core.client.zrem(known_queues_key(core.namespace), queue))
