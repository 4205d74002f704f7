"""Maintenance, run by every worker before it fetches: promote due delayed tasks, reclaim
entries whose owner's lease expired, hand off, remove dead consumers.

No lock guards any of it. Each step is one atomic script that re-checks its conditions,
so any number of workers may run it at once, and a worker killed in the middle leaves
nothing behind that stops the others.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from ..base._faults import Fault, classify
from ..base._redis import text
from ..base._settings import ABANDONED
from ..protocol import scripts
from ..protocol._keys import GROUP
from ._state import Delivery

if TYPE_CHECKING:
    from ..base._redis import AsyncClient
    from ._ledger import Ledger
    from ._state import QueueState, WorkerCounters

log = logging.getLogger("tether.worker")

PROMOTE_BATCH = 500
PROMOTE_ROUNDS = 4
"""Promotion is batch-bounded: at most this many batches per queue per pass."""
RECLAIM_PAGES = 10
"""Pages of XPENDING examined per stream per pass; the cursor carries on next pass."""
HISTORY_PAGE = 100

Accept = Callable[["QueueState", int, bytes, "bytes | None", int, bool], None]
"""Hands a delivered entry to the worker: queue, stream index, entry id, payload, delivery
count, suspect (reclaimed or resumed)."""


class Maintenance:
    def __init__(
        self,
        *,
        client: AsyncClient,
        consumer: str,
        ledger: Ledger,
        counters: WorkerCounters,
        page_size: int,
        dead_letter_maxlen: int,
        accept: Accept,
    ) -> None:
        self._client = client
        self._me = consumer
        self._ledger = ledger
        self._counters = counters
        self._page = page_size
        self._dead_cap = dead_letter_maxlen
        self._accept = accept

    # -- delayed tasks ------------------------------------------------------------------

    async def promote(self, queue: QueueState) -> bool:
        """Move due tasks into their streams and read the queue's pause flag. Returns True
        if more tasks are due right now than one pass moves."""
        call = scripts.promote(queue.keys, PROMOTE_BATCH, self._dead_cap)
        for _ in range(PROMOTE_ROUNDS):
            reply = await call.run(self._client)
            self._counters.promoted += reply.moved
            if reply.malformed:
                self._counters.dead_lettered += reply.malformed
                log.error(
                    "%d malformed members of queue %s's delayed set went to the dead letters",
                    reply.malformed,
                    queue.name,
                )
            if reply.paused != queue.paused:
                log.info("queue %s is %s", queue.name, "paused" if reply.paused else "resumed")
                queue.paused = reply.paused
            if reply.next_due_ms is None:
                queue.next_due = None
            else:
                wait = max(0.0, (reply.next_due_ms - reply.now_ms) / 1000)
                queue.next_due = time.monotonic() + wait
            if reply.moved + reply.malformed < PROMOTE_BATCH:
                return False
        return True

    # -- reclaim ------------------------------------------------------------------------

    async def reclaim(self, queue: QueueState) -> int:
        """Claim entries of dead owners (and of 'abandoned'), within free capacity."""
        claimed = 0
        for sidx in (1, 2, 3):
            pages = 0
            while pages < RECLAIM_PAGES and self._ledger.free > 0:
                pages += 1
                got, wrapped = await self._reclaim_page(queue, sidx)
                claimed += got
                if wrapped:
                    break
        return claimed

    async def _reclaim_page(self, queue: QueueState, sidx: int) -> tuple[int, bool]:
        stream = queue.streams[sidx - 1]
        start = queue.cursors[sidx - 1]
        rows = await self._client.xpending_range(stream, GROUP, start, "+", self._page)
        wrapped = len(rows) < self._page
        if rows:
            last = _field(rows[-1], "message_id", 0)
            queue.cursors[sidx - 1] = "-" if wrapped else "(" + text(last)
        else:
            queue.cursors[sidx - 1] = "-"
        candidates: list[tuple[bytes, str]] = []
        for row in rows:
            owner = text(_field(row, "consumer", 1))
            if owner != self._me:
                candidates.append((_bytes(_field(row, "message_id", 0)), owner))
        if not candidates:
            return 0, wrapped
        owners = sorted({o for _, o in candidates if o != ABANDONED})
        live: set[str] = set()
        if owners:
            values = await self._client.execute_command(
                "MGET", *(queue.keys.lease(o) for o in owners)
            )
            live = {o for o, v in zip(owners, values, strict=True) if v is not None}
        orphans = [(e, o) for e, o in candidates if o not in live]
        if not orphans:
            return 0, wrapped
        with self._ledger.reserve(len(orphans)) as free:
            if not free:
                return 0, wrapped
            claimed = await scripts.claim(stream, queue.keys.lease, self._me, orphans[:free]).run(
                self._client
            )
            for c in claimed:
                log.info(
                    "claimed entry %s of %s from %s (delivery %d)",
                    c.entry_id.decode(), stream, c.owner, c.deliveries,
                )  # fmt: skip
                self._accept(queue, sidx, c.entry_id, c.payload, c.deliveries, True)
        self._counters.claimed += len(claimed)
        return len(claimed), wrapped

    # -- own entries --------------------------------------------------------------------

    async def read_own(self, queue: QueueState) -> bool:
        """Take up this consumer's pending entries that it does not hold: a restart with the
        same name resumes its predecessor's work at once, and a fetch whose reply was lost is
        not stranded. Returns True when every such entry is held."""
        for sidx in (1, 2, 3):
            stream = queue.streams[sidx - 1]
            start = "-"
            while True:
                rows = await self._client.xpending_range(
                    stream, GROUP, start, "+", HISTORY_PAGE, consumername=self._me
                )
                missing = [
                    e
                    for e in (_bytes(_field(r, "message_id", 0)) for r in rows)
                    if not self._ledger.holds(stream, e)
                ]
                free = self._ledger.free
                if missing and free <= 0:
                    return False
                if missing:
                    await self._resume(queue, sidx, missing[:free])
                    if len(missing) > free:
                        return False
                if len(rows) < HISTORY_PAGE:
                    break
                start = "(" + text(_field(rows[-1], "message_id", 0))
        return True

    async def _resume(self, queue: QueueState, sidx: int, entry_ids: list[bytes]) -> None:
        stream = queue.streams[sidx - 1]
        call = scripts.claim(stream, queue.keys.lease, self._me, [(e, self._me) for e in entry_ids])
        # An entry settled while this call is in flight must not be taken up again.
        with self._ledger.reserve(len(entry_ids)), self._ledger.watch_releases() as settled:
            claimed = await call.run(self._client)
            for c in claimed:
                if not (self._ledger.holds(stream, c.entry_id) or (stream, c.entry_id) in settled):
                    self._accept(queue, sidx, c.entry_id, c.payload, c.deliveries, True)

    # -- handoff ------------------------------------------------------------------------

    async def hand_off(
        self,
        deliveries: Sequence[Delivery],
        what: str,
        also: Callable[[Sequence[Delivery]], Awaitable[None]] | None = None,
    ) -> None:
        """Give ``deliveries`` to 'abandoned', for other workers to take at once (and run
        ``also`` on them, such as giving back their flow-control slots), then forget them
        here whatever the server said: what could not be handed off comes back to the
        others when this worker's lease expires. ``what`` says why, in the log."""
        if not deliveries:
            return
        try:
            moved = await self._handoff(deliveries)
            log.info(
                "handed off %d %s (%s) to other workers",
                moved, "entry" if moved == 1 else "entries", what,
            )  # fmt: skip
            if also is not None:
                await also(deliveries)
        except Exception as exc:
            # Best effort, whatever the server answered (the worker may be stopping because
            # of it): what stays pending returns to the others when this lease expires.
            if classify(exc) is Fault.INTERNAL:
                raise
            log.warning(
                "could not hand off %d entries (%s); they return when the lease expires",
                len(deliveries),
                exc,
            )
        self._ledger.release(deliveries)

    async def hand_off_leftovers(
        self,
        queues: Iterable[QueueState],
        also: Callable[[Sequence[Delivery]], Awaitable[None]] | None = None,
    ) -> None:
        """Hand off whatever this consumer still owns on ``queues`` (a settle that failed,
        a read whose reply was lost, what an embedding dropped at shutdown), so nothing
        waits for the lease to expire."""
        try:
            for queue in queues:
                own = await self.own_pending(queue)
                if own:
                    leftovers = [
                        self._ledger.get(queue.streams[sidx - 1], eid)
                        or Delivery(queue, sidx, eid, None, 0, counted=False)
                        for sidx, eid in own
                    ]
                    await self.hand_off(leftovers, "left over", also)
        except Exception as exc:
            fault = classify(exc)
            if fault is Fault.INTERNAL:
                raise
            if fault is Fault.LOST:
                log.warning(
                    "the server lost this worker's streams (%s); no leftovers to hand off", exc
                )
            else:
                log.warning("could not check for leftover entries (%s)", exc)

    async def _handoff(self, deliveries: Iterable[Delivery]) -> int:
        by_stream: dict[tuple[QueueState, str], list[Delivery]] = {}
        for d in deliveries:
            by_stream.setdefault((d.queue, d.stream), []).append(d)
        moved = 0
        for (_, stream), items in by_stream.items():
            pairs = [(d.entry_id, d.counted) for d in items]
            moved += await scripts.handoff(stream, self._me, pairs).run(self._client)
        self._counters.handed_off += moved
        return moved

    async def own_pending(self, queue: QueueState) -> list[tuple[int, bytes]]:
        """Every entry this consumer owns on ``queue`` (for the final handoff)."""
        out: list[tuple[int, bytes]] = []
        for sidx, stream in enumerate(queue.streams, 1):
            start = "-"
            while True:
                rows = await self._client.xpending_range(
                    stream, GROUP, start, "+", 1000, consumername=self._me
                )
                out += [(sidx, _bytes(_field(r, "message_id", 0))) for r in rows]
                if len(rows) < 1000:
                    break
                start = "(" + text(_field(rows[-1], "message_id", 0))
        return out

    # -- housekeeping -------------------------------------------------------------------

    async def prune_consumers(self, queue: QueueState) -> int:
        """Remove consumers with no lease and no pending entries (checked atomically)."""
        names: set[str] = set()
        for stream in queue.streams:
            try:
                consumers = await self._client.execute_command("XINFO", "CONSUMERS", stream, GROUP)
            except ResponseError:
                continue
            for c in consumers:
                info = _as_dict(c)
                name = text(info.get("name", b""))
                if name and name != self._me and int(info.get("pending", 0)) == 0:
                    names.add(name)
        removed = 0
        for name in sorted(names):
            call = scripts.prune(queue.streams, queue.keys.lease(name), name)
            removed += await call.run(self._client)
        if removed:
            log.debug(
                "removed %d dead %s from queue %s",
                removed, "consumer" if removed == 1 else "consumers", queue.name,
            )  # fmt: skip
        self._counters.pruned_consumers += removed
        return removed


# -- reply helpers (redis-py parses some replies into dicts, depending on version) ---------


def _field(row: Any, name: str, index: int) -> Any:
    if isinstance(row, dict):
        return row[name]
    return row[index]


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def _as_dict(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {text(k): v for k, v in value.items()}
    return {text(value[i]): value[i + 1] for i in range(0, len(value), 2)}


def _stream_entries(reply: Any) -> list[tuple[bytes, dict[bytes, bytes] | None]]:
    """Entries of a one-stream XREAD(GROUP) reply, as (id, fields or None)."""
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3
        entries = next(iter(reply.values()))
        if (
            entries
            and isinstance(entries[0], list)
            and len(entries) == 1
            and isinstance(entries[0][0], list)
        ):
            entries = entries[0]
    else:
        entries = reply[0][1]
    out: list[tuple[bytes, dict[bytes, bytes] | None]] = []
    for entry_id, fields in entries:
        if fields is None or (isinstance(fields, (list, dict)) and not fields):
            out.append((_bytes(entry_id), None))
        elif isinstance(fields, dict):
            out.append((_bytes(entry_id), fields))
        else:
            out.append((_bytes(entry_id), dict(zip(fields[::2], fields[1::2], strict=True))))
    return out
