"""The worker registry, read: live workers in name order, a page at a time.

Each worker's heartbeat writes its record (``<prefix><name>``, expiring with its lease) and
its name in an index scored by the time of the beat; the heartbeats drop names not seen for
ten lease lifetimes. A name whose record has expired is a dead worker: it is not listed.
A page reads the index's names (one range: they are the workers seen lately, not every
worker ever) and the records of that page only (``MGET``).
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING, Any

from .._keys import registry_keys
from .._redis import text
from ._models import Page, WorkerInfo

if TYPE_CHECKING:
    from .._core import Core

MAX_RECORD = 1_000_000
"""A record larger than this is not ours: skipped rather than parsed."""


def _parse(raw: Any) -> WorkerInfo | None:
    if raw is None or len(raw) > MAX_RECORD:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    return WorkerInfo.from_record(record) if isinstance(record, dict) else None


async def page(core: Core, cursor: str | None, limit: int) -> Page[WorkerInfo]:
    index, prefix = registry_keys(core.namespace)
    client: Any = core.client
    names = sorted(text(n) for n in await client.zrange(index, 0, -1))
    if cursor is not None:
        names = [n for n in names if n > cursor]
    items: list[WorkerInfo] = []
    position = 0
    while position < len(names) and len(items) < limit:
        chunk = names[position : position + (limit - len(items))]
        position += len(chunk)
        for raw in await client.mget([prefix + n for n in chunk]):
            info = _parse(raw)
            if info is not None:
                items.append(info)
    more = position < len(names)
    return Page(items, items[-1].name if items and more else None)


async def one(core: Core, name: str) -> WorkerInfo | None:
    _, prefix = registry_keys(core.namespace)
    return _parse(await core.client.get(prefix + name))


async def every(core: Core) -> list[WorkerInfo]:
    """Every live worker."""
    out: list[WorkerInfo] = []
    cursor: str | None = None
    while True:
        got = await page(core, cursor, 500)
        out += got.items
        if got.cursor is None:
            return out
        cursor = got.cursor


def per_queue(workers: list[WorkerInfo]) -> Counter[str]:
    """Queue -> live workers serving it."""
    counts: Counter[str] = Counter()
    for w in workers:
        counts.update(set(w.queues))
    return counts
