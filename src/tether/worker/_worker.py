"""The worker: maintenance, then fetch, then run, then a fenced ack; a heartbeat beside it.

One loop per read group (all queues on a single server; one queue per group on a Cluster,
where a blocking read cannot span slots) repeats:

1. maintenance when due (every ``reclaim_interval``, jittered): promote due delayed tasks,
   claim orphans of dead workers, now and then prune dead consumers;
2. fetch without blocking, up to the free capacity, highest priority first;
3. if nothing came, block on the streams, never longer than the time to the next
   maintenance or the next due delayed task, so an idle queue is still swept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import signal
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from .._errors import ConfigError, TetherError
from .._keys import GROUP
from .._redis import (
    TRANSIENT_ERRORS,
    AsyncClient,
    async_client,
    close_async,
    is_missing_group,
    sync_client,
)
from .._settings import PRIORITIES, WorkerSettings
from ..scripts import FETCH, START
from ._lease import LeaseKeeper
from ._maintenance import Maintenance, _stream_entries
from ._runner import Runner
from ._server import check_eviction_policy, check_version, create_groups
from ._settle import Settler
from ._state import Capacity, Delivery, QueueState, WorkerCounters

if TYPE_CHECKING:
    from .._app import Tether

log = logging.getLogger("tether.worker")

CONNECTION_ERRORS = TRANSIENT_ERRORS


class _ReadGroup:
    """Queues whose streams one blocking read can cover."""

    def __init__(self, queues: list[QueueState]) -> None:
        self.queues = queues
        self.streams = [s for q in queues for s in q.streams]
        self.stream_map: dict[bytes, tuple[QueueState, int]] = {
            s.encode(): (q, i) for q in queues for i, s in enumerate(q.streams, 1)
        }
        self.next_maintenance = 0.0
        self.next_housekeeping = 0.0
        self.reclaim_after = 0.0
        """No reclaim before this monotonic time (set after an outage)."""
        self.failures = 0
        self.resync = True
        self.name = ",".join(q.name for q in queues)


class Worker:
    """Runs the tasks of an app. ``await worker.run()`` until :meth:`stop` or a signal."""

    def __init__(
        self, app: Tether, settings: WorkerSettings, *, handle_signals: bool = True
    ) -> None:
        self.app = app
        self.settings = settings
        if settings.reclaim_interval * 1.2 >= app.settings.socket_timeout:
            raise ConfigError(
                f"reclaim_interval={settings.reclaim_interval} must stay well below "
                f"socket_timeout={app.settings.socket_timeout}: blocking reads wait that long"
            )
        self.name = settings.consumer
        self.token = secrets.token_hex(8)
        self.counters = WorkerCounters()
        self.queues = [QueueState(app.keys(q)) for q in settings.queues]
        self._handle_signals = handle_signals
        self._held: dict[tuple[str, bytes], Delivery] = {}
        self._late: list[Delivery] = []
        self._settle_watchers: list[set[tuple[str, bytes]]] = []
        self._reclaim_after = 0.0
        self._stopping = False
        self._stop_event: asyncio.Event | None = None
        self._signals = 0
        self._last_tick = time.monotonic()
        self._started = False
        self._crash: BaseException | None = None
        self.ready = threading.Event()
        """Set once the worker has its lease and starts fetching (for tests and embedders)."""

    # -- public -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask for a graceful stop (idempotent, from the worker's event loop)."""
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()

    @property
    def held(self) -> int:
        """Entries delivered to this worker and not yet settled."""
        return len(self._held)

    @property
    def free_capacity(self) -> int:
        """Entries this worker may still take before it reaches ``max_pending``."""
        capacity = getattr(self, "_capacity", None)
        return self.settings.pending_limit if capacity is None else capacity.free

    async def run(self) -> None:
        if self._started:
            raise TetherError("a Worker runs once; create a new one to run again")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        self._install_signals()
        app, s = self.app, self.settings
        self._client: AsyncClient = async_client(
            app.target,
            socket_timeout=app.settings.socket_timeout,
            connect_timeout=app.settings.connect_timeout,
            retries=0,
        )
        lease: LeaseKeeper | None = None
        try:
            server = await self._connect()
            if server is None:
                return
            self._capacity = Capacity(s.pending_limit)
            self._runner = Runner(
                app,
                concurrency=s.concurrency,
                worker_name=self.name,
                max_deliveries=s.max_deliveries,
                counters=self.counters,
                settle=self._settle_one,
                mark_started=self._mark_started,
                forget=self._forget,
            )
            self._settler = Settler(
                client=self._client,
                consumer=self.name,
                dead_letter_maxlen=app.settings.dead_letter_maxlen,
                counters=self.counters,
                on_settled=self._on_settled,
                retry_delay=self._backoff,
            )
            self._maintenance = Maintenance(
                client=self._client,
                consumer=self.name,
                capacity=self._capacity,
                counters=self.counters,
                page_size=s.reclaim_page_size,
                accept=self._accept,
                is_held=lambda stream, entry: (stream, entry) in self._held,
                watch_settles=self._watch_settles,
            )
            lease = self._lease_keeper()
            await asyncio.to_thread(lease.renew)
            lease.start()
            self._log_start(server)
            await self._serve()
        finally:
            await self._finish(lease)

    # -- start --------------------------------------------------------------------------

    def _install_signals(self) -> None:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._loop.add_signal_handler(sig, self._on_signal, sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning(
                "second %s: exiting at once; leftovers return when the lease expires", sig.name
            )
            logging.shutdown()
            os._exit(130)
        log.info("%s received: stopping gracefully (send it again to exit at once)", sig.name)
        self.stop()

    async def _connect(self) -> str | None:
        """Check the server, create the groups; on connection errors retry with backoff."""
        attempt = 0
        while not self._stopping:
            try:
                server = await check_version(self._client)
                await check_eviction_policy(self._client)
                await create_groups(self._client, (s for q in self.queues for s in q.streams))
                if attempt:
                    log.info("connected to %s", self.app.target.redacted)
                    self._reclaim_after = time.monotonic() + self._outage_grace()
                return server
            except CONNECTION_ERRORS as exc:
                attempt += 1
                delay = self._backoff(attempt)
                log.warning(
                    "Redis at %s is unreachable (%s); retrying in %.1fs",
                    self.app.target.redacted,
                    exc,
                    delay,
                )
                await self._sleep_unless_stopped(delay)
        return None

    def _lease_keeper(self) -> LeaseKeeper:
        app, s = self.app, self.settings

        def factory() -> Any:
            return sync_client(
                app.target,
                socket_timeout=min(app.settings.socket_timeout, s.heartbeat_interval * 2),
                connect_timeout=min(app.settings.connect_timeout, s.heartbeat_interval),
            )

        return LeaseKeeper(
            client_factory=factory,
            leases=[(q.keys.lease(self.name), q.keys.cancels(self.name)) for q in self.queues],
            token=self.token,
            interval=s.heartbeat_interval,
            ttl=s.heartbeat_ttl,
            stall_timeout=s.stall_timeout,
            last_tick=lambda: self._last_tick,
            on_cancel=self._on_cancel_threadsafe,
            counters=self.counters,
        )

    def _log_start(self, server: str) -> None:
        s = self.settings
        log.info(
            "worker %s serving queues %s (priorities %s) on %s (%s): concurrency=%d "
            "max_pending=%d heartbeat %.2fs/ttl %.2fs reclaim every %.2fs max_deliveries=%d "
            "shutdown_grace=%.1fs%s",
            self.name,
            ",".join(s.queues),
            ">".join(PRIORITIES),
            self.app.target.redacted,
            server,
            s.concurrency,
            s.pending_limit,
            s.heartbeat_interval,
            s.heartbeat_ttl,
            s.reclaim_interval,
            s.max_deliveries,
            s.shutdown_grace,
            " burst" if s.burst else "",
        )

    # -- serving ------------------------------------------------------------------------

    def _read_groups(self) -> list[_ReadGroup]:
        if self.app.target.kind == "cluster":
            groups = [_ReadGroup([q]) for q in self.queues]
        else:
            groups = [_ReadGroup(self.queues)]
        for group in groups:  # after waiting for the server at start, as after an outage
            group.reclaim_after = self._reclaim_after
        return groups

    async def _serve(self) -> None:
        assert self._stop_event is not None
        settler = asyncio.create_task(self._settler.run(), name="tether-settler")
        ticker = asyncio.create_task(self._tick(), name="tether-ticker")
        loops = [
            asyncio.create_task(self._fetch_loop(g), name=f"tether-fetch[{g.name}]")
            for g in self._read_groups()
        ]
        scheduler_stop = asyncio.Event()
        scheduler = None
        if self.settings.scheduler:
            from ..scheduler import Scheduler

            scheduler = asyncio.create_task(
                Scheduler(self.app, client=self._client, identity=self.name).run(scheduler_stop),
                name="tether-scheduler",
            )
        self.ready.set()
        stop = asyncio.create_task(self._stop_event.wait())
        await asyncio.wait([stop, settler, *loops], return_when=asyncio.FIRST_COMPLETED)
        self._stopping = True
        for task in (settler, *loops):
            if task.done() and not task.cancelled() and task.exception() is not None:
                self._crash = task.exception()
                log.error(
                    "worker %s crashed in %s; handing off and stopping", self.name, task.get_name()
                )
        if settler.done():  # keep settling during the shutdown, whatever happened to it
            settler = asyncio.create_task(self._settler.run(), name="tether-settler")
        scheduler_stop.set()  # resign first, so another instance leads at once
        if scheduler is not None:
            await asyncio.wait([scheduler], timeout=5)
        await self._shutdown(loops)
        stop.cancel()
        ticker.cancel()
        self._settler.close()
        await asyncio.wait([settler], timeout=5)
        if self._crash is not None:
            raise self._crash

    async def _tick(self) -> None:
        period = min(0.5, self.settings.heartbeat_interval / 2)
        while True:
            self._last_tick = time.monotonic()
            await asyncio.sleep(period)

    async def _fetch_loop(self, group: _ReadGroup) -> None:
        while not self._stopping:
            try:
                await self._cycle(group)
                if group.failures:
                    log.info("Redis is reachable again; resuming")
                    group.failures = 0
                    # Live workers could not renew their leases during the outage either:
                    # give them two heartbeats to do so before judging anyone dead.
                    group.reclaim_after = time.monotonic() + self._outage_grace()
            except CONNECTION_ERRORS as exc:
                group.resync = True
                group.reclaim_after = float("inf")  # until the server answers again
                group.failures += 1
                delay = self._backoff(group.failures)
                if group.failures == 1:
                    log.warning("lost the connection to Redis (%s); retrying with backoff", exc)
                else:
                    log.debug("Redis still unreachable (%s); next try in %.1fs", exc, delay)
                await self._sleep_unless_stopped(delay)
            except ResponseError as exc:
                if not is_missing_group(exc):
                    log.exception("unexpected error from Redis; stopping the worker")
                    raise
                log.warning(
                    "consumer groups are missing (server restarted empty?); recreating them"
                )
                await create_groups(self._client, group.streams)
                group.resync = True

    async def _cycle(self, group: _ReadGroup) -> None:
        now = time.monotonic()
        if now >= group.next_maintenance:
            await self._maintain(group, now)
        if group.resync:
            done = True
            for queue in group.queues:
                done = await self._maintenance.read_own(queue) and done
            group.resync = not done
        free = self._capacity.free
        if free <= 0:
            await self._capacity.wait_for_free(self._budget(group))
            return
        want_ids = free < len(group.streams)
        last_ids: list[Any] = []
        got = 0
        for queue in group.queues:
            count = self._capacity.free
            if count <= 0:
                break
            # Reserve before awaiting: on a Cluster other read groups fetch concurrently.
            self._capacity.take(count)
            try:
                entries, last = await FETCH(
                    self._client, queue.streams, [GROUP, self.name, count, "1" if want_ids else "0"]
                )
            finally:
                self._capacity.release(count)
            last_ids += last
            for i in range(0, len(entries), 3):
                self._accept(queue, entries[i], entries[i + 1], entries[i + 2])
            got += len(entries) // 3
        if got or self._stopping:
            return
        if self.settings.burst and self._burst_done():
            log.info("burst: the queues are empty; stopping")
            self.stop()
            return
        await self._wait_for_work(group, free, last_ids if want_ids else None)

    async def _maintain(self, group: _ReadGroup, now: float) -> None:
        s = self.settings
        reclaim = now >= group.reclaim_after
        for queue in group.queues:
            await self._maintenance.promote(queue)
            if reclaim and self._capacity.free > 0:
                await self._maintenance.reclaim(queue)
        if now >= group.next_housekeeping:
            group.next_housekeeping = now + s.housekeeping_interval * random.uniform(0.8, 1.2)
            for queue in group.queues:
                await self._maintenance.prune_consumers(queue)
        group.next_maintenance = time.monotonic() + s.reclaim_interval * random.uniform(0.8, 1.0)

    def _budget(self, group: _ReadGroup) -> float:
        """Seconds until this group's next maintenance or next due delayed task."""
        deadline = group.next_maintenance
        for queue in group.queues:
            if queue.next_due is not None and queue.next_due < deadline:
                deadline = queue.next_due
                group.next_maintenance = min(group.next_maintenance, queue.next_due)
        return max(0.001, deadline - time.monotonic())

    async def _wait_for_work(
        self, group: _ReadGroup, free: int, last_ids: list[Any] | None
    ) -> None:
        block_ms = max(1, int(self._budget(group) * 1000))
        streams = group.streams
        if last_ids is None:
            # Enough capacity for one entry per stream: block with delivery, so only one
            # idle worker wakes for each new task.
            per_stream = max(1, free // len(streams))
            reserved = per_stream * len(streams)
            self._capacity.take(reserved)
            try:
                reply = await self._client.execute_command(
                    "XREADGROUP",
                    "GROUP",
                    GROUP,
                    self.name,
                    "COUNT",
                    per_stream,
                    "BLOCK",
                    block_ms,
                    "STREAMS",
                    *streams,
                    *([">"] * len(streams)),
                )
            finally:
                self._capacity.release(reserved)
            for stream, entries in _streams_of(reply):
                queue, sidx = group.stream_map[stream]
                for entry_id, fields in entries:
                    payload = None if fields is None else fields.get(b"m")
                    self._accept(queue, sidx, entry_id, payload)
        else:
            # Too little capacity to take one of each: wait without taking anything.
            await self._client.execute_command(
                "XREAD", "BLOCK", block_ms, "STREAMS", *streams, *last_ids
            )

    def _burst_done(self) -> bool:
        if self._held or self._settler.backlog:
            return False
        now = time.monotonic()
        return all(q.next_due is None or q.next_due > now for q in self.queues)

    # -- deliveries ---------------------------------------------------------------------

    def _accept(
        self,
        queue: QueueState,
        sidx: int,
        entry_id: bytes,
        payload: bytes | None,
        deliveries: int = 1,
        suspect: bool = False,
    ) -> None:
        delivery = Delivery(queue, sidx, entry_id, payload, deliveries, suspect, not suspect)
        key = delivery.key
        if key in self._held:  # already running here (a resync raced a fetch): keep one
            return
        self._held[key] = delivery
        self._capacity.take(1)
        self.counters.fetched += 1
        if self._stopping:
            self._late.append(delivery)
        else:
            self._runner.submit(delivery)

    def _settle_one(self, delivery: Delivery, outcome: Any) -> None:
        self._settler.add(delivery, outcome)

    async def _mark_started(self, delivery: Delivery) -> int:
        count = await START(self._client, [delivery.stream], [GROUP, self.name, delivery.entry_id])
        return int(count)

    def _forget(self, delivery: Delivery) -> None:
        """Drop a delivery that is no longer ours, without settling it."""
        if self._held.pop(delivery.key, None) is not None:
            self._capacity.release(1)

    def _on_settled(self, deliveries: list[Delivery]) -> None:
        held = self._held
        for d in deliveries:
            held.pop(d.key, None)
        for watcher in self._settle_watchers:
            watcher.update(d.key for d in deliveries)
        self._capacity.release(len(deliveries))

    @contextlib.contextmanager
    def _watch_settles(self) -> Iterator[set[tuple[str, bytes]]]:
        """Collect the keys of entries settled while the block runs."""
        seen: set[tuple[str, bytes]] = set()
        self._settle_watchers.append(seen)
        try:
            yield seen
        finally:
            self._settle_watchers.remove(seen)

    def _on_cancel_threadsafe(self, task_ids: list[str]) -> None:
        """Called by the heartbeat thread."""
        self._loop.call_soon_threadsafe(self._on_cancel, task_ids)

    def _on_cancel(self, task_ids: list[str]) -> None:
        log.info("cancel requested for %s", ", ".join(task_ids))
        self._runner.request_cancel(set(task_ids))

    # -- stop ---------------------------------------------------------------------------

    async def _shutdown(self, loops: list[asyncio.Task[None]]) -> None:
        s = self.settings
        runner = self._runner
        await self._hand_off(runner.take_buffered(), "buffered")
        await asyncio.wait(loops, timeout=self.settings.reclaim_interval * 1.5 + 1)
        for task in loops:
            task.cancel()
        late, self._late = self._late, []
        await self._hand_off(late, "fetched while stopping")
        if runner.busy:
            log.info("waiting up to %.1fs for %d running tasks", s.shutdown_grace, runner.busy)
            if not await runner.wait_idle(s.shutdown_grace):
                stuck = runner.cancel_running()
                await asyncio.sleep(0)
                await self._hand_off(stuck, "still running after shutdown_grace")
        await self._settler.drain(timeout=max(5.0, s.heartbeat_ttl))
        await self._hand_off_leftovers()

    async def _hand_off(self, deliveries: list[Delivery], what: str) -> None:
        if not deliveries:
            return
        try:
            moved = await self._maintenance.handoff(deliveries)
            log.info("handed off %d %s entries to '%s'", moved, what, "abandoned")
        except ResponseError as exc:
            if not is_missing_group(exc):
                raise
            log.warning(
                "%d entries were lost by the server (%s); nothing to hand off", len(deliveries), exc
            )
        except CONNECTION_ERRORS as exc:
            log.warning(
                "could not hand off %d entries (%s); they return when the lease expires",
                len(deliveries),
                exc,
            )
        released = sum(1 for d in deliveries if self._held.pop(d.key, None) is not None)
        self._capacity.release(released)

    async def _hand_off_leftovers(self) -> None:
        """Whatever this consumer still owns (a settle that failed, a read whose reply was
        lost) goes to 'abandoned' too, so nothing waits for the lease to expire."""
        try:
            for queue in self.queues:
                own = await self._maintenance.own_pending(queue)
                if own:
                    leftovers = [
                        self._held.get((queue.streams[sidx - 1], eid))
                        or Delivery(queue, sidx, eid, None, 0, counted=False)
                        for sidx, eid in own
                    ]
                    await self._hand_off(leftovers, "left over")
        except ResponseError as exc:
            if not is_missing_group(exc):
                raise
            log.warning("the server lost this worker's streams (%s); no leftovers to hand off", exc)
        except CONNECTION_ERRORS as exc:
            log.warning("could not check for leftover entries (%s)", exc)

    async def _finish(self, lease: LeaseKeeper | None) -> None:
        if lease is not None:
            # The lease goes last: until now other workers must not take what we hold.
            await asyncio.to_thread(lease.stop, True)
        runner = getattr(self, "_runner", None)
        if runner is not None:
            runner.close()
        await close_async(self._client)
        if self._started and lease is not None:
            log.info("worker %s stopped: %s", self.name, _format_counters(self.counters))

    # -- helpers ------------------------------------------------------------------------

    def _outage_grace(self) -> float:
        """How long after an outage reclaim waits: two heartbeats, so every live worker
        renews its lease (which may have expired while the server was away) before anyone
        judges it dead."""
        return 2 * self.settings.heartbeat_interval + self.settings.reclaim_interval

    def _backoff(self, attempt: int) -> float:
        cap = self.settings.reconnect_max_delay
        return float(min(cap, 0.1 * 2 ** min(attempt, 10)) * random.uniform(0.5, 1.0))

    async def _sleep_unless_stopped(self, delay: float) -> None:
        assert self._stop_event is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), delay)


def _streams_of(reply: Any) -> list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes] | None]]]]:
    """(stream, entries) pairs of a multi-stream XREADGROUP reply."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(k, _stream_entries({k: v})) for k, v in reply.items()]
    return [(stream, _stream_entries([[stream, entries]])) for stream, entries in reply]


def _format_counters(counters: WorkerCounters) -> str:
    return " ".join(f"{k}={v}" for k, v in counters.as_dict().items())
