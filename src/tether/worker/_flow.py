"""Flow control in the worker: admit limited tasks just before they start, give their slots
back when they are settled, and free the slots of dead workers.

- **Admission.** A delivery of a limited task, decoded and about to start, asks
  :meth:`FlowControl.admit`. The requests of one turn of the event loop (the entries of one
  fetch batch) go to the server in one ``limit_admit`` call per queue. An entry held back
  leaves the stream in that same step (into the delayed set until its rate token, or parked
  until a slot frees): it takes no worker slot and nothing polls for it.
- **Release.** The settler gives back the slots of settled entries with ``limit_release``
  right after their fenced ack; a slot is freed only if this consumer still holds it.
- **Maintenance.** Every ``reclaim_interval`` each worker reads the runtime overrides of
  its queues (which tasks are limited now) and, while its lease is known to be held, frees
  the slots whose holder's lease is missing (``limit_reclaim``), before it reclaims entries.
- **Timely starts.** A task that waits for its rate token is due at a known time; a timer
  of the worker that held it back promotes it then (the fetch loop may be blocked in a read
  that began before the time was known).

A task without limits pays one dictionary lookup per start.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from ..base._faults import TRANSIENT_ERRORS, Fault, classify
from ..base._limits import TaskLimits, decode_override, merge
from ..base._redis import text
from ..protocol._codecs import holder_name, parse_held, slot_holder
from ..protocol._keys import TaskLimitKeys, entry_of_task_id, held_key, overrides_key
from ..protocol.scripts import _limits as calls

if TYPE_CHECKING:
    from ..base._redis import AsyncClient
    from ..producer._core import Core
    from ..protocol._envelope import Envelope
    from ._ledger import Ledger
    from ._state import Delivery, QueueState, WorkerCounters

log = logging.getLogger("tether.worker")

PARK_BACKSTOP_S = 300.0
"""A parked task is looked at again after this long even if no wake-up came for it."""
RATE_SLACK_S = 0.05
"""The least tolerance of a rate limit's start meter: a burst of 1 at 50/s would otherwise
refuse every task that starts a few milliseconds less late than the one before it."""
MISSED_START_S = 0.25
"""A reserved start time whose task has not come this long after it goes to a task that is
ready (its entry waits behind a backlog still being read, or its worker stalled): the start
is not lost, and the late task takes a new time when it comes."""
ADMIT_CHUNK = 500
BINDING_MEMORY_S = 1.0
PROMOTE_ERRORS: tuple[type[BaseException], ...] = (ResponseError, *TRANSIENT_ERRORS)
SWEEP_PAGE = 100
SWEEP_PAGES = 10
"""Pages of held slots examined per queue per maintenance pass."""


@dataclass(slots=True)
class Hold:
    """The concurrency slots a delivery was admitted to."""

    task: str
    limit_key: str
    scopes: str
    """'c' the task's slot, 'C' the key's, or both."""
    kept: bool = False
    """A sync task ran past its timeout and its thread still runs: the slot is given back
    when the thread returns, not at the settle."""


@dataclass(slots=True)
class _View:
    """What this worker knows of one queue's limits."""

    limited: frozenset[str]
    concurrency: bool
    rated: frozenset[str] = frozenset()
    """Tasks with a rate limit: their reservations are trimmed each pass."""
    next_pass: float = 0.0
    cursor: int = 0
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(slots=True)
class _Request:
    delivery: Delivery
    env: Envelope
    bound: bool
    declared: TaskLimits | None
    future: asyncio.Future[bool]


class FlowControl:
    def __init__(
        self,
        app: Core,
        *,
        client: AsyncClient,
        consumer: str,
        ledger: Ledger,
        counters: WorkerCounters,
        interval: float,
        promote: Callable[[QueueState], Awaitable[bool]] | None = None,
    ) -> None:
        self._app = app
        self._client = client
        self._me = consumer
        self._holder = slot_holder(consumer, secrets.token_hex(6))
        """Who holds the slots this worker takes: this start of the worker, not its name
        (a restart under the same name must be able to take back its predecessor's)."""
        self._ledger = ledger
        self._counters = counters
        self._interval = interval
        self._promote = promote
        self._timers: dict[QueueState, asyncio.Task[None]] = {}
        self._dues: dict[QueueState, list[float]] = {}
        """Monotonic times of the starts this worker reserved, per queue (a heap)."""
        self._closed = False
        self._declared = {
            name: task.config.limits
            for name, task in app.tasks.items()
            if task.config.limits is not None
        }
        self._default = _View(
            frozenset(self._declared),
            any(_has_concurrency(limits) for limits in self._declared.values()),
            frozenset(n for n, limits in self._declared.items() if _has_rate(limits)),
        )
        self._views: dict[str, _View] = {}
        for name, limits in sorted(self._declared.items()):
            log.info("flow control: task %s: %s", name, limits.summary())
        self._requests: list[_Request] = []
        self._flusher: asyncio.Task[None] | None = None
        self._stats_ttl_ms = (
            int(app.settings.stats_window * 1000) + 3_600_000 if app.settings.stats else 0
        )
        self._warned = False
        self._binding: dict[tuple[QueueState, str], float] = {}
        """When each task's limits last held one back: while they bind, plain tasks are sent
        with their payload at once (no second call to fetch it)."""

    # -- admission ------------------------------------------------------------------------

    def applies(self, queue: QueueState, task: str) -> bool:
        """Whether ``task`` has limits on ``queue`` (as last read): the only cost a task
        without limits pays."""
        return task in self._views.get(queue.name, self._default).limited

    async def admit(
        self, delivery: Delivery, env: Envelope, bound: bool, declared: TaskLimits | None
    ) -> bool:
        """True when the delivery may start now; False when it was held back (it left the
        stream) or is no longer this worker's to run."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._requests.append(_Request(delivery, env, bound, declared, future))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        # One turn of the loop lets every delivery of this batch ask first.
        await asyncio.sleep(0)
        batch, self._requests, self._flusher = self._requests, [], None
        by_queue: dict[QueueState, list[_Request]] = {}
        for request in batch:
            by_queue.setdefault(request.delivery.queue, []).append(request)
        chunks = [
            (queue, requests[i : i + ADMIT_CHUNK])
            for queue, requests in by_queue.items()
            for i in range(0, len(requests), ADMIT_CHUNK)
        ]
        await asyncio.gather(*(self._admit_chunk(q, r) for q, r in chunks))

    async def _admit_chunk(self, queue: QueueState, requests: list[_Request]) -> None:
        binding = time.monotonic() - BINDING_MEMORY_S
        payloads = any(self._binding.get((queue, r.env.task), -1.0) > binding for r in requests)
        again = await self._admit_call(queue, requests, payloads)
        if again:
            # Plain tasks held back need their envelope with its id: encoded only for them.
            await self._admit_call(queue, again, True)

    async def _admit_call(
        self, queue: QueueState, requests: list[_Request], payloads: bool
    ) -> list[_Request]:
        """One admission call; resolves the requests it decided and returns those it asks
        to send again with their payload."""
        try:
            reply = await self._call_admit(queue, requests, payloads=payloads)
        except Exception as exc:
            self._failed(requests, exc)
            return []
        again = []
        started = 0
        for request in requests:
            admission = reply.results.get(request.delivery.entry_id)
            if admission is not None and admission.code == "n":
                again.append(request)
                continue
            admitted = admission is not None and self._apply(request, admission, reply.now_ms)
            started += admitted
            if not request.future.done():
                request.future.set_result(admitted)
        if started:
            # the time the limits counted these starts at (the tests check rates with it)
            log.debug("admitted %d limited entries of queue %s at %d ms (server clock)",
                      started, queue.name, reply.now_ms)  # fmt: skip
        return again

    async def _call_admit(
        self, queue: QueueState, requests: list[_Request], *, payloads: bool
    ) -> calls.AdmitReply:
        stats = None
        if self._stats_ttl_ms:
            now = time.time()
            stats = calls.StatsTarget(
                queue.keys.stats_minute(int(now // 60)),
                queue.keys.stats_hour(int(now // 3600)),
                self._stats_ttl_ms,
            )
        call = calls.admit(
            queue.keys, self._me, self._holder, int(PARK_BACKSTOP_S * 1000),
            int(RATE_SLACK_S * 1000),
            int(MISSED_START_S * 1000), stats, [self._item(r, payloads) for r in requests],
        )  # fmt: skip
        return await call.run(self._client)

    def _item(self, request: _Request, payloads: bool) -> calls.AdmitItem:
        d, env = request.delivery, request.env
        if request.bound and d.payload is not None:
            payload = d.payload
        else:
            # The payload kept while it waits must carry its id: a plain task's id is
            # derived from its stream entry, which it leaves.
            payload = env.encode(self._app.serializer) if payloads else b""
        limit_key = env.options.get("limit_key")
        return calls.AdmitItem(
            d.sidx, d.entry_id, env.id, payload, env.task, request.declared, request.bound,
            d.suspect, limit_key if isinstance(limit_key, str) else "",
        )  # fmt: skip

    def _apply(self, request: _Request, admission: calls.Admission, now_ms: float) -> bool:
        d, env = request.delivery, request.env
        code = admission.code
        if code == "a":
            if admission.detail:
                limit_key = env.options.get("limit_key")
                d.hold = Hold(env.task, limit_key if isinstance(limit_key, str) else "",
                              admission.detail)  # fmt: skip
            return True
        if code == "x":
            log.warning("entry %s changed owner before it started", d.entry_id.decode())
            return False
        self._counters.held_back += 1
        self._binding[(d.queue, env.task)] = time.monotonic()
        if code == "d":
            wait = max(0.0, (admission.due_ms - now_ms) / 1000)
            self.wake_at(d.queue, time.monotonic() + wait)
            log.debug("task %s (%s) waits %.3fs for its rate limit", env.task, env.id, wait)
        elif code == "h":
            log.info("reclaimed task %s (%s) waits for its limit in the pending list",
                     env.task, env.id)  # fmt: skip
        else:
            log.debug("task %s (%s) waits for a concurrency slot", env.task, env.id)
        return False

    def _failed(self, requests: list[_Request], exc: BaseException) -> None:
        if classify(exc) is not Fault.INTERNAL:
            # Not the tasks' fault: they are still this worker's (or lost with their
            # stream); forget them here and take them up again when the server answers
            # (a fault no retry fixes stops the worker through its fetch loop).
            if not self._warned:
                log.warning(
                    "could not admit %d limited entries (%s); they are taken up again when "
                    "the server answers", len(requests), exc,
                )  # fmt: skip
                self._warned = True
            self._ledger.resync = True
            for request in requests:
                if not request.future.done():
                    request.future.set_result(False)
            return
        for request in requests:
            if not request.future.done():
                request.future.set_exception(exc)

    # -- timely starts --------------------------------------------------------------------

    def wake_at(self, queue: QueueState, when: float) -> None:
        """Promote ``queue``'s due tasks at monotonic time ``when``: the start this worker
        reserved for a task it held back (each reservation wakes only the worker that made
        it; its promotion moves whatever is due)."""
        queue.note_due(when)
        if self._promote is None or self._closed:
            return
        dues = self._dues.setdefault(queue, [])
        earlier = not dues or when < dues[0]
        heapq.heappush(dues, when)
        timer = self._timers.get(queue)
        if timer is not None and not timer.done():
            if not earlier:
                return
            timer.cancel()  # it sleeps until a later time
        self._timers[queue] = asyncio.get_running_loop().create_task(self._promote_due(queue))

    async def _promote_due(self, queue: QueueState) -> None:
        assert self._promote is not None
        dues = self._dues[queue]
        while dues and not self._closed:
            wait = dues[0] - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            now = time.monotonic()
            while dues and dues[0] <= now:
                heapq.heappop(dues)
            try:
                if await self._promote(queue):  # more are due than one pass moves
                    heapq.heappush(dues, time.monotonic())
            except PROMOTE_ERRORS as exc:
                # the fetch loop's maintenance promotes them later
                log.debug("could not promote queue %s on time (%s)", queue.name, exc)

    def promotes(self, queue: QueueState) -> bool:
        """A timer promotes this queue's due tasks: the fetch loop need not wake for them."""
        timer = self._timers.get(queue)
        return timer is not None and not timer.done() and bool(self._dues.get(queue))

    def close(self) -> None:
        """Stop the timers (the worker is stopping)."""
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._dues.clear()

    # -- release --------------------------------------------------------------------------

    async def release(self, deliveries: Iterable[Delivery]) -> None:
        """Give back the slots of these deliveries (settled, handed off); a transient error
        propagates so the caller sends again."""
        by_queue: dict[QueueState, list[Delivery]] = {}
        for d in deliveries:
            if d.hold is not None and not d.hold.kept:
                by_queue.setdefault(d.queue, []).append(d)
        for queue, held in by_queue.items():
            await self._release(queue, held)

    async def _release(self, queue: QueueState, held: list[Delivery]) -> None:
        items = []
        for d in held:
            hold = d.hold
            assert hold is not None
            assert d.envelope is not None
            items.append(
                calls.ReleaseItem(
                    d.envelope.id,
                    hold.task,
                    self._declared.get(hold.task),
                    hold.limit_key,
                    hold.scopes,
                )
            )
        await calls.release(queue.keys, self._holder, items).run(self._client)
        self._warned = False
        for d in held:
            d.hold = None

    def release_later(self, delivery: Delivery) -> None:
        """A sync task's thread outlived its timeout and returned now: give its slots back."""
        hold = delivery.hold
        if hold is None:
            return
        hold.kept = False

        async def give_back() -> None:
            try:
                await self.release([delivery])
            except Exception as exc:
                if classify(exc) is Fault.INTERNAL:
                    raise
                log.warning(
                    "could not give back the slot of entry %s (%s); it frees when this "
                    "worker's lease ends", delivery.entry_id.decode(), exc,
                )  # fmt: skip

        asyncio.get_running_loop().create_task(give_back())

    # -- maintenance ----------------------------------------------------------------------

    async def maintain(self, queue: QueueState, reclaim: bool) -> None:
        """Once per ``reclaim_interval``: read the queue's runtime overrides, then (when
        ``reclaim``) free the slots of dead holders."""
        view = self._views.get(queue.name)
        now = time.monotonic()
        if view is not None and now < view.next_pass:
            return
        raw: Any = await self._client.hgetall(overrides_key(queue.keys.tag))
        view = self._refresh(queue, raw, view)
        view.next_pass = now + self._interval * random.uniform(0.8, 1.0)
        if view.rated:
            await self._trim_reservations(queue, view)
        if reclaim and view.concurrency:
            await self._sweep(queue, view)

    async def _trim_reservations(self, queue: QueueState, view: _View) -> None:
        """Reservations of tasks that never came back (cancelled while they waited) go
        an hour after their time (a time of a key's schedule only is stored negated: both
        kinds lie between minus and plus the horizon)."""
        horizon_ms = int((time.time() - 3600) * 1000)
        for name in sorted(view.rated):
            key = TaskLimitKeys.of(queue.keys.tag, name).reservations
            await self._client.zremrangebyscore(key, -horizon_ms, horizon_ms)

    def _refresh(self, queue: QueueState, raw: dict[Any, Any], old: _View | None) -> _View:
        overrides: dict[str, dict[str, Any]] = {}
        for name, value in raw.items():
            override = decode_override(value)
            if override is not None:
                overrides[text(name)] = override
        if old is not None and overrides == old.overrides:
            return old
        limited, rated, concurrency = set(), set(), False
        for name in {*self._declared, *overrides}:
            limits = merge(self._declared.get(name), overrides.get(name))
            if limits.any:
                limited.add(name)
                concurrency = concurrency or _has_concurrency(limits)
            if _has_rate(limits):
                rated.add(name)
        if old is not None:
            log.info("limits of queue %s changed: limited tasks %s", queue.name,
                     ", ".join(sorted(limited)) or "none")  # fmt: skip
        view = _View(frozenset(limited), concurrency, frozenset(rated), overrides=overrides)
        if old is not None:
            view.cursor = old.cursor
        self._views[queue.name] = view
        return view

    async def _sweep(self, queue: QueueState, view: _View) -> None:
        """Take back the slots of holders whose lease is missing, and slots held for woken
        tasks that are gone; lock-free like the reclaim of entries."""
        freed = kept = 0
        key = held_key(queue.keys.tag)
        for _ in range(SWEEP_PAGES):
            reply: Any = await self._client.hscan(key, view.cursor, count=SWEEP_PAGE)
            cursor, page = reply
            view.cursor = int(cursor)
            done = await self._free_dead(queue, page)
            freed, kept = freed + done.freed, kept + done.kept
            if view.cursor == 0:
                break
        if freed or kept:
            log.info(
                "took back %d concurrency slots of queue %s from dead workers: %d kept for "
                "their tasks' next run, %d freed", freed + kept, queue.name, kept, freed,
            )  # fmt: skip

    async def _free_dead(self, queue: QueueState, page: dict[Any, Any]) -> calls.ReclaimReply:
        records: list[tuple[str, bytes, str, str, str]] = []
        for tid, value in page.items():
            raw = value if isinstance(value, bytes) else str(value).encode()
            parsed = parse_held(raw)
            if parsed is None or parsed[0] == self._holder:
                continue
            records.append((text(tid), raw, *parsed))
        if not records:
            return calls.ReclaimReply(0, 0)
        # A holder is dead when its name's lease is missing; an earlier start of this
        # worker's own name is dead too (this start holds the name's lease), whatever the
        # lease says.
        names = sorted({holder_name(r[2]) for r in records if r[2]} - {self._me})
        # Slots held for tasks no worker runs: woken ones (queued) and ones waiting in the
        # delayed set for their rate token keep them; the script checks plain tasks that are
        # neither by their entry.
        idle = [r[0] for r in records if not r[2]]
        indexed = [t for t in idle if entry_of_task_id(t) is None]
        live: set[str] = set()
        present: set[str] = set()
        if names or idle:
            pipe: Any = self._client.pipeline(transaction=False)
            if names:
                pipe.mget([queue.keys.lease(n) for n in names])
            if indexed:
                pipe.hmget(queue.keys.index, indexed)
            for tid in idle:  # ZSCORE each, not ZMSCORE: the documented ACL rule has zscore
                pipe.zscore(queue.keys.delayed, tid)
            replies = iter(await pipe.execute())
            if names:
                live = {n for n, v in zip(names, next(replies), strict=True) if v is not None}
            if indexed:
                present = {t for t, v in zip(indexed, next(replies), strict=True) if v is not None}
            present |= {t for t in idle if next(replies) is not None}
        items = [
            calls.ReclaimItem(tid, raw, holder, task, self._declared.get(task), limit_key)
            for tid, raw, holder, task, limit_key in records
            if (holder_name(holder) not in live if holder else tid not in present)
        ]
        if not items:
            return calls.ReclaimReply(0, 0)
        call = calls.reclaim(queue.keys, self._holder, queue.keys.lease, items)
        return await call.run(self._client)


def _has_rate(limits: TaskLimits) -> bool:
    return limits.rate_limit is not None or limits.key_rate_limit is not None


def _has_concurrency(limits: TaskLimits) -> bool:
    return limits.concurrency_limit is not None or limits.key_concurrency_limit is not None
