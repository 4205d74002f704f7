"""What a worker knows of its queues and deliveries, and what it counts."""

from __future__ import annotations

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
    cursors: list[str] = field(default_factory=lambda: ["-", "-", "-"])
    next_due: float | None = None
    """Monotonic time when the earliest delayed task of this queue is due."""
    paused: bool = False
    """Paused by an operator: not fetched from (read at each maintenance pass)."""

    def __post_init__(self) -> None:
        self.name = self.keys.queue
        self.streams = self.keys.streams

    def note_due(self, when: float) -> None:
        """A delayed task of this queue falls due at monotonic time ``when``."""
        if self.next_due is None or when < self.next_due:
            self.next_due = when


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
    envelope: Envelope | None = None
    cancel_requested: bool = False
    run_ms: float | None = None
    """How long the task ran (set when it ran), for the statistics."""
    wait_ms: float | None = None
    """How long it waited from due to start (set when statistics are on)."""
    timed_out: bool = False

    @property
    def stream(self) -> str:
        return self.queue.streams[self.sidx - 1]

    @property
    def key(self) -> tuple[str, bytes]:
        return (self.queue.streams[self.sidx - 1], self.entry_id)


@dataclass
class WorkerCounters:
    """What one worker did since it started. Read ``worker.counters``; logged at shutdown."""

    fetched: int = 0
    succeeded: int = 0
    failed: int = 0
    """Tasks that failed for good (they go to the dead-letter stream, status 'failed')."""
    retried: int = 0
    timed_out: int = 0
    """Attempts that ran past their timeout (also counted as failed or retried)."""
    cancelled: int = 0
    dead_lettered: int = 0
    """Every entry this worker wrote to the dead-letter stream: failed tasks, malformed
    entries, unknown tasks, quarantined entries."""
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
    reconnects: int = 0
    """Times the worker lost the connection to the server and got it back."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
