"""The small value formats the Lua scripts write, read back in Python in one place.

- an **index value** (``<queue>:idx`` hash, task id -> ``<stream index><entry id>``): where
  an indexed task waits or runs;
- a **scheduled payload** (``<queue>:sched`` hash, task id -> ``<stream index><payload>``):
  a delayed task and the stream it goes to when due;
- an **entry name** in a settle reply (``<stream index><entry id>``);
- a **slot holder** and a **held-slot record** of flow control (``<holder>\n<JSON>``).

A value no Tether writes (set by hand, corrupted) is refused with None here; the caller
decides whether that is worth a log line (``tether.base._unreadable``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ._keys import PAYLOAD_FIELD, entry_of_task_id

_INDEX_VALUE = re.compile(rb"([123])(\d{1,20}-\d{1,20})")
_STREAM_INDEXES = (b"1", b"2", b"3")
DEFAULT_SIDX = 2
"""The normal priority's stream: where a scheduled payload without a readable index goes."""


def index_value(sidx: int, entry_id: str) -> bytes:
    """What the enqueue script writes for an indexed task at ``entry_id`` of stream
    ``sidx`` (the same bytes, for tests and tools)."""
    return f"{sidx}{entry_id}".encode()


def parse_index_value(raw: bytes | bytearray | memoryview | None) -> tuple[int, str] | None:
    """(stream index, entry id) of an index value; None when absent or not one Tether
    writes."""
    if raw is None:
        return None
    found = _INDEX_VALUE.fullmatch(bytes(raw))
    if found is None:
        return None
    return int(found[1]), found[2].decode()


def locate(task_id: str, raw_index_value: bytes | None) -> tuple[int, str] | None:
    """Where a task's entry is: from its index value, else from its derived id (a plain
    enqueue's id names its entry); None for an indexed task no longer indexed."""
    return parse_index_value(raw_index_value) or entry_of_task_id(task_id)


def payload_of(rows: Any) -> bytes | None:
    """The payload of the entry an ``XRANGE <id> <id>`` read (None when it is gone, or
    carries no payload field)."""
    if not rows:
        return None
    fields = rows[0][1]
    return fields.get(PAYLOAD_FIELD) if isinstance(fields, dict) else None


def parse_scheduled(raw: bytes | bytearray | memoryview) -> tuple[int, bytes]:
    """(stream index, payload) of a scheduled payload; a first byte that is no stream
    index reads as the normal stream, with the rest as the payload (as promotion does)."""
    data = bytes(raw)
    head = data[:1]
    return (int(head) if head in _STREAM_INDEXES else DEFAULT_SIDX), data[1:]


def parse_entry_name(raw: bytes) -> tuple[int, bytes]:
    """(stream index, entry id) of an entry as a settle reply names it; (0, b'') for
    nothing."""
    named = raw or b"0"
    return int(named[:1]), named[1:]


# -- flow control's slot holders and held-slot records --------------------------------


def slot_holder(consumer: str, instance: str) -> str:
    """Who holds a slot: a lease instance, '<consumer> <instance>' (a consumer name has no
    space), the instance new at every start of a worker. A slot held by a name alone would
    outlive the process that took it: a worker restarted under that name holds the lease
    and could neither tell its predecessor's slots from its own nor let the sweep free them."""
    return f"{consumer} {instance}"


def holder_name(holder: str) -> str:
    """The worker name of a slot holder (whose lease says whether it is alive); a record
    written before holders had instances is the name alone."""
    return holder.partition(" ")[0]


def parse_held(value: bytes | str) -> tuple[str, str, str] | None:
    """(holder, task, limit key) of a held-slot record; None when malformed."""
    raw = value.decode() if isinstance(value, bytes) else value
    holder, sep, rest = raw.partition("\n")
    if not sep:
        return None
    try:
        task, key = json.loads(rest)
    except (ValueError, TypeError):
        return None
    if not isinstance(task, str) or not isinstance(key, str):
        return None
    return holder, task, key
