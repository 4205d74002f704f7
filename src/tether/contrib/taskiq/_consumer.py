"""The worker side of :class:`TetherBroker`: Tether's own machinery, fed to taskiq's receiver.

taskiq's receiver pulls messages from the broker one at a time and runs them; everything
else is Tether's, reused as the ``tether worker`` uses it:

- the **ledger** (``worker/_ledger.py``) holds every entry delivered and not yet
  acknowledged, buffered here or handed to taskiq, and bounds them by ``max_pending``;
- the **fetcher** (``worker/_fetch.py``) runs maintenance (promotion of delayed messages,
  lock-free reclaim of dead workers' entries, pruning) on its timer, then fetches up to the
  free capacity, and blocks no longer than the next maintenance;
- the **lease keeper** (``worker/_lease.py``) renews the lease from a thread;
- the **settler** (``worker/_settle.py``) sends taskiq's acks as batched fenced settles.

This module composes them and runs their lifecycle (start, the lease, the shutdown handoff);
``_handover.py`` decides what taskiq's receiver gets and what its acks become.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any

from ..._core import Core
from ..._errors import ConfigError, ServerError
from ..._faults import describe_error
from ..._keys import registry_keys
from ..._redis import (
    AsyncClient,
    async_client,
    close_async,
    sync_client,
)
from ..._settings import WorkerSettings
from ..._version import __version__
from ...worker._fetch import Fetcher, ReadGroup
from ...worker._lease import LeaseKeeper
from ...worker._ledger import Ledger
from ...worker._maintenance import Maintenance
from ...worker._server import connect
from ...worker._settle import Settler
from ...worker._state import QueueState, WorkerCounters
from ._delivery import TaskiqDelivery
from ._handover import Handover

log = logging.getLogger("tether.taskiq")


class Consumer:
    """One taskiq worker process's side of the delivery protocol."""

    def __init__(
        self,
        core: Core,
        settings: WorkerSettings,
        *,
        find_task: Callable[[str], object | None],
        counts_starts: bool,
        dead_letter_failures: bool,
        ack_linger: float = 0.0,
    ) -> None:
        if settings.reclaim_interval * 1.2 >= core.settings.socket_timeout:
            raise ConfigError(
                f"reclaim_interval={settings.reclaim_interval} must stay well below "
                f"socket_timeout={core.settings.socket_timeout}: blocking reads wait that long"
            )
        self.core = core
        self.settings = settings
        self.name = settings.consumer
        self.token = secrets.token_hex(8)
        self.counters = WorkerCounters()
        self.queues = [QueueState(core.keys(q)) for q in settings.queues]
        self.ledger = Ledger(settings.pending_limit)
        self._find_task = find_task
        self._counts_starts = counts_starts
        self._dead_letter_failures = dead_letter_failures
        self._ack_linger = ack_linger
        self._wake = asyncio.Event()
        self._stop_event = asyncio.Event()
        self._stopping = False
        self._closed = False
        self._crash: BaseException | None = None
        self._last_tick = time.monotonic()
        self._started_ms = 0
        self._lease: LeaseKeeper | None = None
        self.handover: Handover | None = None
        """Set once composed (in start)."""
        self._fetch_tasks: list[asyncio.Task[None]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.ready = False
        """Set once the lease is held and fetching has begun (for tests and embedders)."""

    # -- start --------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the server, take the lease, start fetching."""
        self._loop = asyncio.get_running_loop()
        self._started_ms = int(time.time() * 1000)
        core = self.core
        self._client: AsyncClient = async_client(
            core.target,
            socket_timeout=core.settings.socket_timeout,
            connect_timeout=core.settings.connect_timeout,
            retries=0,
            max_connections=core.settings.max_connections,
            pool_timeout=core.settings.pool_timeout,
        )
        try:
            server = await self._connect()
            self._compose()
            await self._take_lease()
        except BaseException:
            await self._release()
            raise
        s = self.settings
        log.info(
            "taskiq worker %s serving queue %s on %s (%s) through Tether: max_pending=%d "
            "heartbeat %.2fs/ttl %.2fs reclaim every %.2fs max_deliveries=%d",
            self.name, ",".join(s.queues), core.target.redacted, server, s.pending_limit,
            s.heartbeat_interval, s.heartbeat_ttl, s.reclaim_interval, s.max_deliveries,
        )  # fmt: skip
        self._spawn(self._settler.run(), "tether-settler")
        self._spawn(self._tick(), "tether-ticker")
        if core.target.kind == "cluster":
            groups = [ReadGroup([q]) for q in self.queues]
        else:
            groups = [ReadGroup(self.queues)]
        for group in groups:
            group.reclaim_after = self._reclaim_after
            self._fetch_tasks.append(
                self._spawn(self._fetcher.run(group), f"tether-fetch[{group.name}]")
            )
        self.ready = True

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._on_task_done)
        self._tasks.append(task)
        return task

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or self._stopping:
            return
        exc = task.exception()
        if exc is not None and self._crash is None:
            log.error("%s failed: %s", task.get_name(), exc)
            self._crash = exc
            self._wake.set()

    async def _connect(self) -> str:
        """Check the server and create the groups, retrying transient faults with backoff
        up to ``connect_timeout``; an error no retry can fix stops here."""
        self._reclaim_after = 0.0
        connected = await connect(
            self._client,
            (s for q in self.queues for s in q.streams),
            self.settings,
            self.core.target.redacted,
            stopping=lambda: False,
            sleep=asyncio.sleep,
        )
        assert connected is not None  # it never stops on its own
        if connected.after_outage:
            self._reclaim_after = time.monotonic() + self.settings.outage_grace
        return connected.server

    def _compose(self) -> None:
        s, core = self.settings, self.core
        self._settler = Settler(
            client=self._client,
            ledger=self.ledger,
            consumer=self.name,
            dead_letter_maxlen=core.settings.dead_letter_maxlen,
            counters=self.counters,
            retry_delay=self.settings.reconnect_delay,
            stats_window=None,
            linger=self._ack_linger,
            linger_batch=s.pending_limit // 2,
            where=core.target.redacted,
        )
        self.handover = Handover(
            client=self._client,
            consumer=self.name,
            ledger=self.ledger,
            counters=self.counters,
            settle=self._settler.add,
            wake=self._wake.set,
            find_task=self._find_task,
            max_deliveries=s.max_deliveries,
            result_ttl_ms=int(core.settings.result_ttl * 1000),
            counts_starts=self._counts_starts,
            dead_letter_failures=self._dead_letter_failures,
        )
        self._maintenance = Maintenance(
            client=self._client,
            consumer=self.name,
            ledger=self.ledger,
            counters=self.counters,
            page_size=s.reclaim_page_size,
            dead_letter_maxlen=core.settings.dead_letter_maxlen,
            accept=self._accept,
        )
        self._fetcher = Fetcher(
            client=self._client,
            consumer=self.name,
            settings=s,
            ledger=self.ledger,
            maintenance=self._maintenance,
            counters=self.counters,
            accept=self._accept,
            stopping=lambda: self._stopping,
            lease_held=self._lease_held,
            burst_done=lambda: False,
            on_burst_done=lambda: None,
            sleep=self._sleep_unless_stopped,
            where=core.target.redacted,
        )

        def factory() -> Any:
            return sync_client(
                core.target,
                socket_timeout=min(core.settings.socket_timeout, s.heartbeat_interval * 2),
                connect_timeout=min(core.settings.connect_timeout, s.heartbeat_interval),
            )

        self._lease = LeaseKeeper(
            client_factory=factory,
            leases=[(q.keys.lease(self.name), q.keys.cancels(self.name)) for q in self.queues],
            token=self.token,
            interval=s.heartbeat_interval,
            ttl=s.heartbeat_ttl,
            stall_timeout=s.stall_timeout,
            last_tick=lambda: self._last_tick,
            on_cancel=self._on_cancel,
            on_lapse=self._on_lapse_threadsafe,
            counters=self.counters,
            where=core.target.redacted,
            registry=registry_keys(core.namespace),
            record=self.record,
        )

    async def _take_lease(self) -> None:
        """The first renewal must succeed before anything is fetched."""
        assert self._lease is not None
        attempt = 0
        while not await asyncio.to_thread(self._lease.renew):
            if self._lease.fatal is not None:
                raise ServerError(describe_error(self._lease.fatal, self.core.target.redacted))
            attempt += 1
            await asyncio.sleep(self.settings.reconnect_delay(attempt))
        self._lease.start()

    def record(self) -> dict[str, Any]:
        """This worker's registry record (published by the heartbeat thread)."""
        s = self.settings
        return {
            "name": self.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "runtime": "taskiq",
            "queues": list(s.queues),
            "concurrency": s.pending_limit,
            "max_pending": s.pending_limit,
            "started_ms": self._started_ms,
            "heartbeat_ms": int(time.time() * 1000),
            "held": self.ledger.held,
            "running": self._handover.busy,
            "counters": self.counters.as_dict(),
        }

    async def _tick(self) -> None:
        period = min(0.5, self.settings.heartbeat_interval / 2)
        while True:
            self._last_tick = time.monotonic()
            lease = self._lease
            if lease is not None and lease.fatal is not None:
                raise ServerError(describe_error(lease.fatal, self.core.target.redacted))
            await asyncio.sleep(period)

    @property
    def _handover(self) -> Handover:
        assert self.handover is not None, "used before start()"
        return self.handover

    def _lease_held(self) -> bool:
        return self._lease is not None and self._lease.held()

    # -- deliveries in ------------------------------------------------------------------

    def _accept(
        self,
        queue: QueueState,
        sidx: int,
        entry_id: bytes,
        payload: bytes | None,
        deliveries: int,
        suspect: bool,
    ) -> None:
        delivery = TaskiqDelivery(
            queue, sidx, entry_id, payload, deliveries, suspect, not suspect, consumer=self.name
        )
        if not self.ledger.accept(delivery):
            return  # already held here (a resync raced a fetch)
        self.counters.fetched += 1
        if self._stopping:
            self.ledger.late.append(delivery)
        else:
            self._handover.put(delivery)

    # -- hand-over to taskiq ------------------------------------------------------------

    async def next(self) -> tuple[TaskiqDelivery, bytes] | None:
        """The next message for taskiq (its delivery and taskiq's bytes); None once
        stopping. Raises what stopped the fetch loops or the heartbeat."""
        while not self._stopping:
            if self._crash is not None:
                raise self._crash
            delivery = self._handover.pick(self._lease_held())
            if delivery is None:
                self._wake.clear()
                # While the lease is in doubt nothing is handed over; it is judged by time.
                timeout = None if self._lease_held() else 0.05
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            data = await self._handover.admit(delivery)
            if data is not None:
                return delivery, data
        return None

    def ack(self, delivery: TaskiqDelivery) -> None:
        """taskiq acknowledged a message (the broker's ack callback)."""
        self._handover.ack(delivery)

    # -- the lease ----------------------------------------------------------------------

    def _on_cancel(self, task_ids: list[str]) -> None:
        """Called by the heartbeat thread: Tether cancel requests for running tasks."""
        log.warning(
            "cancel requested for %s: a running taskiq task cannot be cancelled by Tether; "
            "it runs to the end",
            ", ".join(task_ids),
        )

    def _on_lapse_threadsafe(self, sent_at: float) -> None:
        self._loop.call_soon_threadsafe(self._on_lapse, sent_at)

    def _on_lapse(self, sent_at: float) -> None:
        """The lease had lapsed: others may have claimed what waits here. Drop it, take up
        again what is still this worker's."""
        dropped = self._handover.take_buffered()
        if dropped:
            self.ledger.release(dropped)
            log.warning(
                "dropped %d entries waiting for taskiq: this worker's lease had lapsed, so others "
                "may have claimed them; those still its own are taken up again",
                len(dropped),
            )
        self.ledger.resync = True
        assert self._lease is not None
        self._lease.confirm(sent_at)
        self._wake.set()

    # -- stop ---------------------------------------------------------------------------

    async def stop_fetching(self) -> None:
        """taskiq stopped listening: fetch nothing more, and hand the entries it never got
        to other workers at once."""
        if self._stopping:
            return
        self._stopping = True
        self._stop_event.set()
        self._wake.set()
        if self.handover is None:  # never composed: nothing was fetched
            return
        await self._maintenance.hand_off(self.handover.take_buffered(), "buffered")
        for task in self._fetch_tasks:
            task.cancel()
        await asyncio.gather(*self._fetch_tasks, return_exceptions=True)
        late, self.ledger.late = self.ledger.late, []
        await self._maintenance.hand_off(late, "fetched while stopping")

    async def close(self) -> None:
        """Settle what taskiq acknowledged, hand off what is left, release the lease last."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.stop_fetching()
            if self.handover is not None:
                await self._settler.drain(timeout=3.0)
                await self._maintenance.hand_off_leftovers(self.queues)
        finally:
            await self._release()

    async def _release(self) -> None:
        self._stopping = True
        settler = getattr(self, "_settler", None)
        if settler is not None:
            settler.close()
        for task in self._tasks:
            if task.get_name() != "tether-settler":
                task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=2)
        lease = self._lease
        if lease is not None:
            # The lease goes last: until now other workers must not take what is held here.
            await asyncio.to_thread(lease.stop, True)
        await close_async(self._client)
        if lease is not None:
            done = " ".join(f"{k}={v}" for k, v in self.counters.as_dict().items() if v)
            log.info("taskiq worker %s stopped: %s", self.name, done)

    # -- helpers ------------------------------------------------------------------------

    async def _sleep_unless_stopped(self, delay: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), delay)
