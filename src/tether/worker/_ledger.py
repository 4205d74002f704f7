"""The ledger: the one owner of what a worker holds.

A worker holds at most ``max_pending`` entries delivered to it and not yet acknowledged.
Every change to that set goes through here, and capacity is *derived* from it (entries held
plus slots reserved for reads in flight), never counted separately, so no code path can
release a slot twice or leak one:

- :meth:`reserve` takes slots for a read or a claim while it is in flight; the slots come
  back when the block ends, whatever happened (an error, a cancellation).
- :meth:`accept` records a delivered entry (at most once per entry).
- :meth:`release` forgets entries (settled, handed off, no longer ours) and frees exactly
  the slots of the entries it removed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._state import Delivery

Key = tuple[str, bytes]
"""(stream, entry id)"""


class Ledger:
    __slots__ = ("_freed", "_held", "_watchers", "late", "limit", "reserved", "resync")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[Key, Delivery] = {}
        self.reserved = 0
        """Slots taken by reads and claims in flight."""
        self.late: list[Delivery] = []
        """Entries accepted while the worker was stopping: handed off, never run."""
        self.resync = False
        """Set when entries this worker may still own were dropped (a transient error at
        their start, a lapsed lease): the fetch loops re-read the worker's own entries."""
        self._watchers: list[set[Key]] = []
        self._freed = asyncio.Event()

    # -- reading ------------------------------------------------------------------------

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def free(self) -> int:
        return self.limit - len(self._held) - self.reserved

    def holds(self, stream: str, entry_id: bytes) -> bool:
        return (stream, entry_id) in self._held

    def get(self, stream: str, entry_id: bytes) -> Delivery | None:
        return self._held.get((stream, entry_id))

    def deliveries(self) -> list[Delivery]:
        return list(self._held.values())

    # -- changing -----------------------------------------------------------------------

    @contextlib.contextmanager
    def reserve(self, n: int) -> Iterator[int]:
        """Take ``n`` slots (at most the free ones) for the duration of the block; yields
        how many were taken. Entries accepted meanwhile are counted on their own."""
        n = max(0, min(n, self.free))
        self.reserved += n
        try:
            yield n
        finally:
            self.reserved -= n
            if n:
                self._freed.set()

    def accept(self, delivery: Delivery) -> bool:
        """Hold a delivered entry; False when it is held already (a resync raced a read)."""
        key = delivery.key
        if key in self._held:
            return False
        self._held[key] = delivery
        return True

    def release(self, deliveries: Iterable[Delivery]) -> int:
        """Forget these entries; returns how many were held (and so freed)."""
        held = self._held
        removed: list[Key] = []
        for d in deliveries:
            key = d.key
            if held.pop(key, None) is not None:
                removed.append(key)
        if removed:
            for watcher in self._watchers:
                watcher.update(removed)
            self._freed.set()
        return len(removed)

    @contextlib.contextmanager
    def watch_releases(self) -> Iterator[set[Key]]:
        """Collect the keys of entries released while the block runs (a read in flight must
        not take up again an entry settled meanwhile)."""
        seen: set[Key] = set()
        self._watchers.append(seen)
        try:
            yield seen
        finally:
            self._watchers.remove(seen)

    async def wait_for_free(self, timeout: float) -> None:
        """Wait until a slot is free, or ``timeout`` seconds passed."""
        if self.free > 0:
            return
        self._freed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._freed.wait(), max(timeout, 0.001))
