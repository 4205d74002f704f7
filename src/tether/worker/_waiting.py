"""What waits to start, by priority, and the rule for suspects: shared by every executor.

A *suspect* is an entry started twice or more without an outcome (its workers died running
it, or it was resumed after a restart): it starts only once nothing else runs, and nothing
else starts until it ends, so a task that kills its worker cannot take innocent neighbours
with it. Everything else starts by priority (high, normal, low), in arrival order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from ._state import Delivery

D = TypeVar("D", bound=Delivery)


def quarantine_reason(delivery: Delivery, max_deliveries: int) -> str | None:
    """Why a reclaimed entry goes to the dead letters instead of starting again; None
    when it may start."""
    if delivery.suspect and delivery.deliveries >= max_deliveries:
        return f"delivered {delivery.deliveries} times; its workers died"
    return None


class Waiting(Generic[D]):
    __slots__ = ("_buffers", "_suspects", "alone", "count")

    def __init__(self) -> None:
        self._buffers: tuple[deque[D], deque[D], deque[D]] = (deque(), deque(), deque())
        self._suspects: deque[D] = deque()
        self.alone: D | None = None
        """The suspect running alone now, if any."""
        self.count = 0
        """Deliveries waiting (an attribute, not a method: the runner reads it per task)."""

    @staticmethod
    def is_suspect(delivery: Delivery) -> bool:
        return delivery.suspect and delivery.deliveries >= 2

    def open(self) -> bool:
        """Nothing waits and no suspect runs: a new plain entry may start at once."""
        return self.alone is None and not self.count

    def add(self, delivery: D) -> None:
        if self.is_suspect(delivery):
            self._suspects.append(delivery)
        else:
            self._buffers[delivery.sidx - 1].append(delivery)
        self.count += 1

    def __len__(self) -> int:
        return self.count

    def next(self, busy: int) -> D | None:
        """What may start now, with ``busy`` running: nothing while a suspect runs; a
        suspect once nothing runs (it then runs alone); else the first by priority."""
        if self.alone is not None:
            return None
        if self._suspects:
            if busy:
                return None
            self.alone = self._suspects.popleft()
            self.count -= 1
            return self.alone
        for buffer in self._buffers:
            if buffer:
                self.count -= 1
                return buffer.popleft()
        return None

    def ended(self, delivery: Delivery) -> None:
        """``delivery`` ended (or never started after all): the next may start."""
        if self.alone is delivery:
            self.alone = None

    def take_all(self) -> list[D]:
        """Remove and return everything waiting (for a hand-off, or a lapsed lease)."""
        out = list(self._suspects)
        self._suspects.clear()
        for buffer in self._buffers:
            out.extend(buffer)
            buffer.clear()
        self.count = 0
        return out

    def take_where(self, wanted: Callable[[D], bool]) -> Iterator[D]:
        """Remove and yield the waiting deliveries ``wanted`` accepts."""
        for queue in (self._suspects, *self._buffers):
            for delivery in [d for d in queue if wanted(d)]:
                queue.remove(delivery)
                self.count -= 1
                yield delivery
