"""What a worker knows of its queues and deliveries, and what it counts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..protocol._envelope import Envelope
    from ..protocol._keys import QueueKeys


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
    hold: Any = None
    """The flow-control slots it was admitted to (worker/_flow.py Hold), given back when it
    is settled or handed off."""
    pushed_back: bool = False
    """The task raised RateLimited: it runs again later, the attempt not counted."""
    epoch: int = 0
    """``WorkerCounters.groups_recreated`` when it was fetched: an entry found gone at its
    ack after the groups were recreated was lost by the server, not taken by another worker."""

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
    lost_by_server: int = 0
    """Outcomes discarded because the server lost their entries (restarted without
    persistence, flushed): the consumer groups were found missing since they were fetched."""
    groups_recreated: int = 0
    """Times this worker found its queues' consumer groups missing and created them again."""
    pruned_consumers: int = 0
    promoted: int = 0
    reconnects: int = 0
    """Times the worker lost the connection to the server and got it back."""
    held_back: int = 0
    """Tasks a flow-control limit held back (waiting for a rate token or a slot)."""
    rate_limited: int = 0
    """Attempts that raised RateLimited: run again later, not counted as retries."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
