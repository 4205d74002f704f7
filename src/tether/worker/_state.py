"""The worker's bookkeeping: queues served, deliveries held, capacity, counters."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._envelope import Envelope
    from .._keys import QueueKeys


@dataclass(slots=True, eq=False)
class QueueState:
    """One served queue: its keys, precomputed argument lists, and maintenance cursors."""

    keys: QueueKeys
    name: str = ""
    streams: tuple[str, str, str] = ("", "", "")
    settle_keys: tuple[str, ...] = ()
    promote_keys: tuple[str, ...] = ()
    cursors: list[str] = field(default_factory=lambda: ["-", "-", "-"])
    next_due: float | None = None
    """Monotonic time when the earliest delayed task of this queue is due."""

    def __post_init__(self) -> None:
        k = self.keys
        self.name = k.queue
        self.streams = k.streams
        self.settle_keys = (*k.streams, k.index, k.delayed, k.scheduled_payloads, k.dead)
        self.promote_keys = (*k.streams, k.index, k.delayed, k.scheduled_payloads)


@dataclass(slots=True, eq=False)
class Delivery:
    """An entry delivered to this worker and not yet settled."""

    queue: QueueState
    sidx: int
    """1-based index of the stream (1 high, 2 normal, 3 low)."""
    entry_id: bytes
    payload: bytes | None
    deliveries: int
    suspect: bool = False
    """Reclaimed from a dead worker (or resumed after a restart): its count means starts."""
    counted: bool = True
    """This worker raised the delivery count (by fetching it, or by starting a suspect)."""
    started: bool = False
    indexed: bool = True
    """The task has an id of its own and an index entry (False for plain enqueues)."""
    envelope: Envelope | None = None
    cancel_requested: bool = False

    @property
    def stream(self) -> str:
        return self.queue.streams[self.sidx - 1]

    @property
    def key(self) -> tuple[str, bytes]:
        return (self.queue.streams[self.sidx - 1], self.entry_id)


class Capacity:
    """The ``max_pending`` bound: entries delivered here and not yet acknowledged."""

    __slots__ = ("_freed", "limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._freed = asyncio.Event()

    @property
    def free(self) -> int:
        return self.limit - self.used

    def take(self, n: int) -> None:
        self.used += n

    def release(self, n: int) -> None:
        if n:
            self.used -= n
            self._freed.set()

    async def wait_for_free(self, timeout: float) -> None:
        """Wait until a slot is free, or ``timeout`` seconds passed."""
        if self.free > 0:
            return
        self._freed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._freed.wait(), max(timeout, 0.001))


@dataclass
class WorkerCounters:
    """What one worker did since it started. Read ``worker.counters``; logged at shutdown."""

    fetched: int = 0
    succeeded: int = 0
    failed: int = 0
    retried: int = 0
    cancelled: int = 0
    dead_lettered: int = 0
    claimed: int = 0
    """Entries taken over from consumers whose lease had expired, or from 'abandoned'."""
    handed_off: int = 0
    """Entries given to 'abandoned' at shutdown for other workers to take."""
    lost_leases: int = 0
    """Acks refused because another worker had claimed the entry meanwhile."""
    quarantined: int = 0
    """Entries sent to the dead-letter stream after too many deliveries."""
    lease_lapses: int = 0
    """Renewals that found this worker's lease already expired."""
    pruned_consumers: int = 0
    promoted: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
