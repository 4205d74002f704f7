"""Settling: fenced acks batched across tasks.

Finished entries wait here until the next flush; a flush sends one ``settle`` script call
per queue (and per 500 entries) for everything that finished meanwhile, so a busy worker pays
one round trip per batch instead of one per task. Nothing is acknowledged unless this worker
still owns it.

A call that fails on a transient error (a cut connection, a full server, a failover's
CLUSTERDOWN, another client's BUSY script, a failed save's MISCONF: see ``tether.base._faults``)
is sent again with backoff, and only that call: the calls of the same flush that succeeded
are done. A call sent again after its reply was lost finds its entries already settled
("gone") and touches nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from ..base._errors import ServerError
from ..base._faults import Fault, UnknownReplies, classify, describe_error, is_out_of_memory
from ..protocol import scripts
from ._runner import observation
from ._stats import StatsKeys

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ..base._redis import AsyncClient
    from ._flow import FlowControl
    from ._ledger import Ledger
    from ._outcome import Outcome
    from ._state import Delivery, QueueState, WorkerCounters
    from ._stats import AttemptSink, Observation

log = logging.getLogger("tether.worker")

SETTLE_CHUNK = 500
SETTLE_RETRY_CAP_S = 1.0
"""Settles are retried at least this often, below the reconnect backoff's cap: the outcomes
they carry hold the worker's capacity, and a settle sent again is harmless (it finds what
was settled gone), so they must not wait seconds after the server recovers."""

Item = tuple["Delivery", "Outcome"]


class _Chunk:
    """One settle call's worth: a queue's items, and whether it was sent before."""

    __slots__ = ("items", "queue", "resent")

    def __init__(self, queue: QueueState, items: list[Item]) -> None:
        self.queue = queue
        self.items = items
        self.resent = False


class Settler:
    def __init__(
        self,
        *,
        client: AsyncClient,
        ledger: Ledger,
        consumer: str,
        dead_letter_maxlen: int,
        counters: WorkerCounters,
        retry_delay: Callable[[int], float],
        stats_window: float | None,
        flow: FlowControl | None = None,
        sinks: Sequence[AttemptSink] = (),
        linger: float = 0.0,
        linger_batch: int = 1,
        where: str = "the server",
    ) -> None:
        """``linger``: at most this many seconds to wait for ``linger_batch`` outcomes before
        a flush (0: one turn of the event loop). Where outcomes arrive one at a time, slower
        than a round trip (taskiq's receiver acks each message on its own), a short linger
        gathers them into one call, and the capacity they free comes back together, for one
        fetch; the batch size ends the wait early, so a busy worker never waits for it."""
        self._linger = linger
        self._where = where
        """The server, as messages name it (its URL without the password)."""
        self._linger_batch = max(1, linger_batch)
        self._batch_ready = asyncio.Event()
        self._client = client
        self._ledger = ledger
        self._consumer = consumer
        self._dead_cap = dead_letter_maxlen
        self._counters = counters
        self._retry_delay = retry_delay
        self._stats = None if stats_window is None else StatsKeys(stats_window)
        self._flow = flow
        self._sinks = tuple(sinks)
        """Where each settled batch's attempts go, besides the statistics the script writes
        (the worker's metrics)."""
        self._pending: list[Item] = []
        self._retrying: list[_Chunk] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._closing = False
        self._unknown = UnknownReplies()
        self.server_full = False

    def add(self, delivery: Delivery, outcome: Outcome) -> None:
        self._pending.append((delivery, outcome))
        self._idle.clear()
        self._wake.set()
        if self._linger and len(self._pending) >= self._linger_batch:
            self._batch_ready.set()

    @property
    def backlog(self) -> int:
        return len(self._pending) + sum(len(c.items) for c in self._retrying)

    async def run(self) -> None:
        failures = 0
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._linger and not self._closing:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._batch_ready.wait(), self._linger)
                self._batch_ready.clear()
            else:
                # One turn of the loop lets the other tasks whose replies already arrived
                # finish too, so they share this round trip.
                await asyncio.sleep(0)
            while self._pending or self._retrying:
                chunks, self._retrying = self._retrying, []
                batch, self._pending = self._pending, []
                chunks += _chunks(batch)
                failed = await self._flush(chunks)
                if not failed:
                    if failures:
                        log.info("settling again: the server accepts the outcomes")
                    failures = 0
                    self.server_full = False
                    continue
                self._retrying = failed + self._retrying
                failures += 1
                await asyncio.sleep(min(SETTLE_RETRY_CAP_S, self._retry_delay(failures)))
            self._idle.set()
            if self._closing:
                return

    async def drain(self, timeout: float) -> bool:
        """Wait until everything added so far is settled (or ``timeout`` passes)."""
        if not self.backlog and self._idle.is_set():
            return True
        self._wake.set()
        self._batch_ready.set()  # no lingering: someone waits
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return not self.backlog

    def close(self) -> None:
        self._closing = True
        self._wake.set()
        self._batch_ready.set()

    async def _flush(self, chunks: list[_Chunk]) -> list[_Chunk]:
        """Send every chunk (concurrently when there are several); return the ones to send
        again."""
        if len(chunks) == 1:
            return [] if await self._send(chunks[0]) else chunks
        done = await asyncio.gather(*(self._send(c) for c in chunks))
        return [c for c, ok in zip(chunks, done, strict=True) if not ok]

    async def _send(self, chunk: _Chunk) -> bool:
        """One settle call. True when done (settled, or nothing left to settle)."""
        entries = [(d.sidx, d.entry_id, o) for d, o in chunk.items]
        stats = observed = None
        if self._stats is not None or self._sinks:
            each = [observation(d, o) for d, o in chunk.items]
            observed = [ob for ob in each if ob is not None]
            if self._stats is not None:
                stats = self._stats.write(chunk.queue.keys, each)
        call = scripts.settle(chunk.queue.keys, self._consumer, self._dead_cap, entries, stats)
        try:
            held = [d for d, _ in chunk.items if d.hold is not None]
            if self._flow is None or not held:
                reply = await call.run(self._client)
            else:
                # Concurrency slots go back beside the ack, in the same round trip (each is
                # fenced on its own: by owner, by holder); if either fails the chunk is sent
                # again, and its settle then finds it done.
                reply, _ = await asyncio.gather(call.run(self._client), self._flow.release(held))
        except Exception as exc:
            return self._failed(chunk, exc)
        self._unknown.succeeded()
        self._report(chunk, reply)
        self._ledger.release(d for d, _ in chunk.items)
        if stats is not None and self._stats is not None and reply.settled:
            self._stats.written(stats)
        if self._sinks:
            self._record(chunk, reply, observed)
        return True

    def _failed(self, chunk: _Chunk, exc: Exception) -> bool:
        """A settle call failed: True when there is nothing left to settle, False to send
        it again later (the outcomes are kept); raises what no retry can fix."""
        fault = classify(exc, self._where)
        if fault is Fault.INTERNAL:
            raise exc
        if fault is Fault.FATAL:  # a password changed, a permission taken away
            raise ServerError(self._describe(exc)) from None
        if fault is Fault.LOST:
            # The server lost the streams (restarted empty, flushed): these entries no
            # longer exist, so there is nothing left to acknowledge.
            log.warning(
                "dropping %d outcomes: their streams were lost by the server (%s)",
                len(chunk.items), exc,
            )  # fmt: skip
            self._counters.lost_by_server += len(chunk.items)
            self._ledger.release(d for d, _ in chunk.items)
            return True
        if fault is Fault.UNKNOWN and self._unknown.failed(exc, "settle"):
            raise ServerError(self._describe(exc)) from None
        if is_out_of_memory(exc):
            if not self.server_full:
                log.warning(
                    "the server is full (maxmemory reached with noeviction): %d outcomes wait "
                    "until memory frees; this worker keeps them and retries",
                    len(chunk.items),
                )
            self.server_full = True
        elif not chunk.resent:
            # Keep every outcome: they are settled when the server answers again.
            log.warning(
                "cannot settle %d entries of queue %s (%s); will retry",
                len(chunk.items), chunk.queue.name, describe_error(exc, self._where),
            )  # fmt: skip
        chunk.resent = True
        return False

    def _describe(self, exc: BaseException) -> str:
        """The line a fault no retry fixes stops the worker with (for a permission refused
        inside the script, the command its line names, which Redis 7.0 leaves out)."""
        return describe_error(exc, self._where, scripts.refused_in_script(str(exc)))

    def _record(
        self, chunk: _Chunk, reply: scripts.SettleReply, observed: list[Observation] | None
    ) -> None:
        """Give the sinks the attempts whose outcome counted: one discarded because
        another worker had claimed the entry ran here, but the other worker's run is the
        one that counts (this one is in ``lost_leases``)."""
        discarded = reply.taken.keys() | (set() if chunk.resent else reply.gone)
        if observed is None or discarded:
            observed = [
                ob
                for d, o in chunk.items
                if (d.sidx, d.entry_id) not in discarded and (ob := observation(d, o)) is not None
            ]
        if observed:
            for sink in self._sinks:
                sink.record(chunk.queue.name, observed)

    def _report(self, chunk: _Chunk, reply: scripts.SettleReply) -> None:
        if not reply.taken and not reply.gone and not reply.forged:
            return
        for delivery, outcome in chunk.items:
            entry = delivery.entry_id
            key = (delivery.sidx, entry)
            task = outcome.task_id or (delivery.envelope.id if delivery.envelope else "?")
            if key in reply.forged:
                if outcome.op not in ("dead", "fail"):  # those were counted when decided
                    self._counters.dead_lettered += 1
                log.error(
                    "entry %s carries task id %s, which belongs to another entry (a forged or "
                    "copied entry): it went to the dead letters and wrote nothing under that id",
                    entry.decode(), task,
                )  # fmt: skip
                continue
            owner = reply.taken.get(key)
            if owner is not None:
                self._counters.lost_leases += 1
                log.warning(
                    "lost lease: entry %s (task %s) was claimed by %s while it ran here (this "
                    "worker's lease lapsed); this worker's outcome (%s) is discarded",
                    entry.decode(), task, owner, outcome.op,
                )  # fmt: skip
            elif key in reply.gone:
                if chunk.resent:
                    # An earlier send of this call was carried out; its reply was lost.
                    log.debug("entry %s was settled by an earlier attempt", entry.decode())
                elif delivery.epoch < self._counters.groups_recreated:
                    # The groups were recreated since the fetch: nobody took the entry, the
                    # server lost it with its data.
                    self._counters.lost_by_server += 1
                    log.warning(
                        "entry %s (task %s) was lost by the server (its consumer groups were "
                        "created again since it was fetched: a restart without persistence or "
                        "a flush); this worker's outcome (%s) is discarded",
                        entry.decode(), task, outcome.op,
                    )  # fmt: skip
                else:
                    self._counters.lost_leases += 1
                    log.warning(
                        "entry %s (task %s) is no longer pending: another worker took and "
                        "finished it after this worker's lease lapsed, or the server lost it; "
                        "this worker's outcome (%s) is discarded",
                        entry.decode(), task, outcome.op,
                    )  # fmt: skip


def _chunks(batch: list[Item]) -> list[_Chunk]:
    by_queue: dict[QueueState, list[Item]] = {}
    for item in batch:
        by_queue.setdefault(item[0].queue, []).append(item)
    out: list[_Chunk] = []
    for queue, items in by_queue.items():
        for start in range(0, len(items), SETTLE_CHUNK):
            out.append(_Chunk(queue, items[start : start + SETTLE_CHUNK]))
    return out
