"""The small value formats the Lua scripts write, read back in Python in one place.

- an **index value** (``<queue>:idx`` hash, task id -> ``<stream index><entry id>``): where
  an indexed task waits or runs;
- a **scheduled payload** (``<queue>:sched`` hash, task id -> ``<stream index><payload>``):
  a delayed task and the stream it goes to when due;
- an **entry name** in a settle reply (``<stream index><entry id>``).

A value no Tether writes (set by hand, corrupted) is refused with None here; the caller
decides whether that is worth a log line (``tether.base._unreadable``).
"""

from __future__ import annotations

import re

from ._keys import entry_of_task_id

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
