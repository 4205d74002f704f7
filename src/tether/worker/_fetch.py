"""The fetch loop: maintenance when due, then a fetch up to the free capacity, then a
blocking read bounded by the next maintenance or due task.

One loop per read group: all queues on a single server; one queue per group on a Cluster,
where a blocking read cannot span slots. Every slot a read takes is reserved in the ledger
before the read is sent and comes back when it returns, whatever happens to it.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..base._errors import ServerError
from ..base._faults import Fault, UnknownReplies, classify, describe_error, is_out_of_memory
from ..protocol import scripts
from ..protocol._keys import GROUP
from ._maintenance import _stream_entries
from ._server import create_groups, why_groups_vanished

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from ..base._redis import AsyncClient
    from ..base._settings import WorkerSettings
    from ._flow import FlowControl
    from ._ledger import Ledger
    from ._maintenance import Accept, Maintenance
    from ._state import QueueState, WorkerCounters

log = logging.getLogger("tether.worker")


class ReadGroup:
    """Queues whose streams one blocking read can cover."""

    def __init__(self, queues: list[QueueState]) -> None:
        self.queues = queues
        self.stream_map: dict[bytes, tuple[QueueState, int]] = {
            s.encode(): (q, i) for q in queues for i, s in enumerate(q.streams, 1)
        }
        self.next_maintenance = 0.0
        self.next_housekeeping = 0.0
        self.reclaim_after = 0.0
        """No reclaim before this monotonic time (set after an outage)."""
        self.failures = 0
        self.unknown = UnknownReplies()
        self.outage_since = 0.0
        self.resync = True
        self.recreate = False
        """The consumer groups are to be created again (the server lost them)."""
        self.name = ",".join(q.name for q in queues)

    @property
    def active(self) -> list[QueueState]:
        """The queues not paused."""
        return [q for q in self.queues if not q.paused]


class Fetcher:
    def __init__(
        self,
        *,
        client: AsyncClient,
        consumer: str,
        settings: WorkerSettings,
        ledger: Ledger,
        maintenance: Maintenance,
        counters: WorkerCounters,
        accept: Accept,
        stopping: Callable[[], bool],
        lease_held: Callable[[], bool],
        burst_done: Callable[[], bool],
        on_burst_done: Callable[[], None],
        sleep: Callable[[float], Awaitable[None]],
        flow: FlowControl | None = None,
        where: str = "the server",
    ) -> None:
        self._client = client
        self._me = consumer
        self._settings = settings
        self._ledger = ledger
        self._maintenance = maintenance
        self._counters = counters
        self._accept = accept
        self._stopping = stopping
        self._lease_held = lease_held
        self._burst_done = burst_done
        self._on_burst_done = on_burst_done
        self._sleep = sleep
        self._flow = flow
        self._where = where
        """The server, as messages name it (its URL without the password)."""

    async def run(self, group: ReadGroup) -> None:
        while not self._stopping():
            try:
                await self._cycle(group)
                group.unknown.succeeded()
                if group.failures:
                    log.info("Redis is reachable again; resuming")
                    self._counters.reconnects += 1
                    group.failures = 0
                    # Live workers could not renew their leases during the outage either:
                    # give them two heartbeats to do so before judging anyone dead.
                    group.reclaim_after = time.monotonic() + self._settings.outage_grace
            except Exception as exc:
                fault = classify(exc, self._where)
                if fault is Fault.INTERNAL:
                    raise
                if fault is Fault.FATAL:  # a password changed, a permission taken away
                    raise self._fatal(exc) from None
                if fault is Fault.LOST:
                    self._counters.groups_recreated += 1
                    group.recreate = group.resync = True  # in the loop: that may fail too
                    continue
                if fault is Fault.UNKNOWN and group.unknown.failed(exc, f"fetch ({group.name})"):
                    raise self._fatal(exc) from None
                await self._outage(group, exc)

    def _fatal(self, exc: BaseException) -> ServerError:
        """No retry can fix ``exc``: the worker stops, as it does when this happens at
        start-up, with one line naming what was refused (the CLI exits with status 1)."""
        return ServerError(describe_error(exc, self._where, scripts.refused_in_script(str(exc))))

    async def _outage(self, group: ReadGroup, exc: BaseException) -> None:
        group.resync = True
        group.reclaim_after = float("inf")  # until the server answers again
        if not group.failures:
            group.outage_since = time.monotonic()
        group.failures += 1
        give_up = self._settings.give_up_after
        if (
            self._settings.burst
            and give_up is not None
            and time.monotonic() - group.outage_since >= give_up
        ):
            raise ServerError(
                f"the server has been unavailable for {give_up:g}s ({exc}); a burst worker "
                "gives up (give_up_after)"
            ) from None
        delay = self._settings.reconnect_delay(group.failures)
        if group.failures == 1:
            if is_out_of_memory(exc):
                log.warning(
                    "the server is full (maxmemory reached with noeviction): delayed tasks wait; "
                    "retrying with backoff"
                )
            else:
                log.warning("%s; retrying with backoff", describe_error(exc, self._where))
        else:
            log.debug("Redis still unavailable (%s); next try in %.1fs", exc, delay)
        await self._sleep(delay)

    async def _cycle(self, group: ReadGroup) -> None:
        if group.recreate:
            why = await why_groups_vanished(self._client)
            log.warning(
                "the consumer groups of %s are missing: %s; recreating them", group.name, why
            )
            await create_groups(self._client, (s for q in group.queues for s in q.streams))
            group.recreate = False
        await self._maintain_or_promote(group, time.monotonic())
        if self._ledger.resync:
            self._ledger.resync = False
            group.resync = True
        if group.resync:
            done = True
            for queue in group.queues:
                done = await self._maintenance.read_own(queue) and done
            group.resync = not done
        queues = group.active
        free = self._ledger.free
        if free <= 0:
            await self._ledger.wait_for_free(self._budget(group))
            return
        if not queues:  # every queue of the group is paused
            await self._sleep(self._budget(group))
            return
        streams = [s for q in queues for s in q.streams]
        want_ids = free < len(streams)
        last_ids: list[Any] = []
        got = 0
        for queue in queues:
            # Reserve before awaiting: on a Cluster other read groups fetch concurrently.
            with self._ledger.reserve(self._ledger.free) as count:
                if count <= 0:
                    break
                reply = await scripts.fetch(queue.streams, self._me, count, want_ids).run(
                    self._client
                )
                last_ids += reply.last_ids
                for sidx, entry_id, payload in reply.entries:
                    self._accept(queue, sidx, entry_id, payload, 1, False)
                got += len(reply.entries)
        if got or self._stopping():
            return
        if self._settings.burst and self._burst_done():
            log.info("burst: the queues are empty; stopping")
            self._on_burst_done()
            return
        await self._wait_for_work(group, queues, streams, free, last_ids if want_ids else None)

    async def _maintain_or_promote(self, group: ReadGroup, now: float) -> None:
        if now >= group.next_maintenance:
            await self._maintain(group, now)
            return
        # A loop kept busy by fetching never waits (where the budget would wake it for due
        # tasks): promote them anyway, so delayed tasks and rate-limited starts are not held
        # back until the next maintenance pass.
        for queue in group.queues:
            timed = self._flow is not None and self._flow.promotes(queue)
            if queue.next_due is not None and queue.next_due <= now and not timed:
                await self._maintenance.promote(queue)

    async def _maintain(self, group: ReadGroup, now: float) -> None:
        s = self._settings
        # Claim from others only while this worker's own lease is known to be held: a worker
        # whose lease is in doubt (a full server refused to write it anew) must not take
        # entries others could take back.
        reclaim = now >= group.reclaim_after and self._lease_held()
        for queue in group.queues:
            await self._maintenance.promote(queue)
            if self._flow is not None:
                # Slots of dead workers first, so their reclaimed entries find them free.
                await self._flow.maintain(queue, reclaim)
            if reclaim and not queue.paused and self._ledger.free > 0:
                await self._maintenance.reclaim(queue)
        if now >= group.next_housekeeping:
            group.next_housekeeping = now + s.housekeeping_interval * random.uniform(0.8, 1.2)
            for queue in group.queues:
                await self._maintenance.prune_consumers(queue)
        group.next_maintenance = time.monotonic() + s.reclaim_interval * random.uniform(0.8, 1.0)

    def _budget(self, group: ReadGroup) -> float:
        """Seconds until this group's next maintenance or next due delayed task."""
        deadline = group.next_maintenance
        for queue in group.queues:
            # Woken then, the cycle promotes that queue; unless flow control's timer does
            # (its promotion wakes the blocked read).
            timed = self._flow is not None and self._flow.promotes(queue)
            if queue.next_due is not None and queue.next_due < deadline and not timed:
                deadline = queue.next_due
        return max(0.001, deadline - time.monotonic())

    async def _wait_for_work(
        self,
        group: ReadGroup,
        queues: list[QueueState],
        streams: list[str],
        free: int,
        last_ids: list[Any] | None,
    ) -> None:
        block_ms = max(1, int(self._budget(group) * 1000))
        if last_ids is None:
            # Enough capacity for one entry per stream: block with delivery, so only one
            # idle worker wakes for each new task.
            per_stream = max(1, free // len(streams))
            with self._ledger.reserve(per_stream * len(streams)) as reserved:
                if reserved < per_stream * len(streams):
                    return  # capacity changed meanwhile: go round again
                reply = await self._client.execute_command(
                    "XREADGROUP", "GROUP", GROUP, self._me, "COUNT", per_stream,
                    "BLOCK", block_ms, "STREAMS", *streams, *([">"] * len(streams)),
                )  # fmt: skip
                for stream, entries in _streams_of(reply):
                    queue, sidx = group.stream_map[stream]
                    for entry_id, fields in entries:
                        payload = None if fields is None else fields.get(b"m")
                        self._accept(queue, sidx, entry_id, payload, 1, False)
        else:
            # Too little capacity to take one of each: wait without taking anything.
            await self._client.execute_command(
                "XREAD", "BLOCK", block_ms, "STREAMS", *streams, *last_ids
            )


def _streams_of(reply: Any) -> list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes] | None]]]]:
    """(stream, entries) pairs of a multi-stream XREADGROUP reply."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(k, _stream_entries({k: v})) for k, v in reply.items()]
    return [(stream, _stream_entries([[stream, entries]])) for stream, entries in reply]
