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

from ..base._unreadable import parsed, skip, text_or_none
from ..protocol._keys import registry_keys
from ._models import Page, WorkerInfo

if TYPE_CHECKING:
    from ..producer._core import Core

MAX_RECORD = 1_000_000
"""A record larger than this is not ours: skipped rather than parsed."""


def _parse(key: str, raw: Any) -> WorkerInfo | None:
    """A worker's record, or None: expired (a dead worker), or unreadable (reported)."""
    if raw is None:
        return None
    if len(raw) > MAX_RECORD:
        skip("worker", key, f"{len(raw)} bytes, more than a worker writes")
        return None
    return parsed("worker", key, lambda: _info(json.loads(raw)))


def _info(record: Any) -> WorkerInfo:
    if not isinstance(record, dict):
        raise TypeError(f"a {type(record).__name__}, not an object")
    return WorkerInfo.from_record(record)


async def page(core: Core, cursor: str | None, limit: int) -> Page[WorkerInfo]:
    index, prefix = registry_keys(core.namespace)
    client: Any = core.client
    read = (text_or_none("worker", index, n) for n in await client.zrange(index, 0, -1))
    names = sorted(n for n in read if n is not None)
    if cursor is not None:
        names = [n for n in names if n > cursor]
    items: list[WorkerInfo] = []
    position = 0
    while position < len(names) and len(items) < limit:
        chunk = names[position : position + (limit - len(items))]
        position += len(chunk)
        for name, raw in zip(chunk, await client.mget([prefix + n for n in chunk]), strict=True):
            info = _parse(prefix + name, raw)
            if info is not None:
                items.append(info)
    more = position < len(names)
    return Page(items, items[-1].name if items and more else None)


async def one(core: Core, name: str) -> WorkerInfo | None:
    _, prefix = registry_keys(core.namespace)
    return _parse(prefix + name, await core.client.get(prefix + name))


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
