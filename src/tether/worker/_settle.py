"""Settling: fenced acks batched across tasks.

Finished entries wait here until the next flush; a flush sends one ``settle`` script call
per queue for everything that finished meanwhile, so a busy worker pays one round trip per
batch instead of one per task. Nothing is acknowledged unless this worker still owns it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis.exceptions

from .._keys import GROUP
from .._redis import TRANSIENT_ERRORS, is_missing_group
from ..scripts import SETTLE

if TYPE_CHECKING:
    from .._redis import AsyncClient
    from ._outcome import Outcome
    from ._state import Delivery, QueueState, WorkerCounters

log = logging.getLogger("tether.worker")

SETTLE_CHUNK = 500


class Settler:
    def __init__(
        self,
        *,
        client: AsyncClient,
        consumer: str,
        dead_letter_maxlen: int,
        counters: WorkerCounters,
        on_settled: Callable[[list[Delivery]], None],
        retry_delay: Callable[[int], float],
    ) -> None:
        self._client = client
        self._consumer = consumer
        self._dead_cap = dead_letter_maxlen
        self._counters = counters
        self._on_settled = on_settled
        self._retry_delay = retry_delay
        self._pending: list[tuple[Delivery, Outcome]] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False

    def add(self, delivery: Delivery, outcome: Outcome) -> None:
        self._pending.append((delivery, outcome))
        self._idle.clear()
        self._wake.set()

    @property
    def backlog(self) -> int:
        return len(self._pending)

    async def run(self) -> None:
        failures = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            # One turn of the loop lets the other tasks whose replies already arrived finish
            # too, so they share this round trip.
            await asyncio.sleep(0)
            while self._pending:
                batch, self._pending = self._pending, []
                try:
                    await self._flush(batch)
                    failures = 0
                except redis.exceptions.ResponseError as exc:
                    if not is_missing_group(exc):
                        raise
                    # The server lost the streams (restarted empty): these entries no longer
                    # exist, so there is nothing left to acknowledge.
                    log.warning(
                        "dropping %d outcomes: their streams were lost by the server (%s)",
                        len(batch), exc,
                    )  # fmt: skip
                    self._on_settled([d for d, _ in batch])
                except TRANSIENT_ERRORS as exc:
                    # Keep every outcome: they are settled when the server is back.
                    self._pending[:0] = batch
                    failures += 1
                    if failures == 1:
                        log.warning("cannot settle %d entries (%s); will retry", len(batch), exc)
                    await asyncio.sleep(self._retry_delay(failures))
            self._idle.set()
            if self._closing:
                return

    async def drain(self, timeout: float) -> bool:
        """Wait until everything added so far is settled (or ``timeout`` passes)."""
        if not self._pending and self._idle.is_set():
            return True
        self._wake.set()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return not self._pending

    async def _flush(self, batch: list[tuple[Delivery, Outcome]]) -> None:
        by_queue: dict[QueueState, list[tuple[Delivery, Outcome]]] = {}
        for item in batch:
            by_queue.setdefault(item[0].queue, []).append(item)
        if len(by_queue) == 1:
            ((queue, items),) = by_queue.items()
            await self._settle_queue(queue, items)
        else:
            await asyncio.gather(*(self._settle_queue(q, items) for q, items in by_queue.items()))

    async def _settle_queue(self, queue: QueueState, items: list[tuple[Delivery, Outcome]]) -> None:
        for start in range(0, len(items), SETTLE_CHUNK):
            chunk = items[start : start + SETTLE_CHUNK]
            keys: list[str] = list(queue.settle_keys)
            args: list[Any] = [GROUP, self._consumer, self._dead_cap]
            for delivery, o in chunk:
                if o.op == "o":  # the hot path: a success with nothing to record
                    args += ("o", delivery.sidx, delivery.entry_id)
                    continue
                rk = dk = xk = 0
                if o.result_key is not None:
                    keys.append(o.result_key)
                    rk = len(keys)
                if o.done_key is not None:
                    keys.append(o.done_key)
                    dk = len(keys)
                if o.dedup_key is not None:
                    keys.append(o.dedup_key)
                    xk = len(keys)
                args += (
                    o.op,
                    delivery.sidx,
                    delivery.entry_id,
                    o.task_id,
                    rk,
                    dk,
                    xk,
                    o.record,
                    o.ttl_ms,
                    o.a1,
                    o.a2,
                    o.dedup_hold_ms,
                )
            lost = await SETTLE(self._client, keys, args)
            if lost:
                self._lost(chunk, {bytes(x) for x in lost})
            self._on_settled([d for d, _ in chunk])

    def _lost(self, chunk: list[tuple[Delivery, Outcome]], lost: set[bytes]) -> None:
        for delivery, outcome in chunk:
            if delivery.entry_id in lost:
                self._counters.lost_leases += 1
                log.warning(
                    "lost lease: entry %s (%s) is no longer this worker's (another worker claimed "
                    "it while it ran here, or the server lost it); this worker's outcome (%s) is "
                    "discarded",
                    delivery.entry_id.decode(),
                    outcome.task_id or "unknown task",
                    outcome.op,
                )

    def close(self) -> None:
        self._closing = True
        self._wake.set()
