"""The delivery engine: everything between Redis and what runs the tasks, for every consumer.

The worker (``Worker``: engine + runner) and the taskiq consumer (engine + hand-over) are
the same machine with a different executor. The engine owns:

- connecting, with backoff on transient faults and a stop on fatal ones;
- the **ledger** (what this consumer holds, bounded by ``max_pending``), the **fetcher**,
  the **maintenance**, the **settler** and, where asked, **flow control**;
- the **lease keeper** (a thread), the lease's lapse handling, the registry record (with
  the queues it serves, so they are known with no other process running) and the health
  file;
- the whole shutdown: hand off what never started, stop fetching, wait for what runs, settle,
  hand off the rest, release the lease last.

It is built whole when a run starts (inside the event loop that runs it); what runs the
tasks is built from its :class:`Parts` and spoken to through :class:`Executor`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..base._errors import ConfigError, ServerError
from ..base._faults import describe_error
from ..base._redis import AsyncClient, SyncClient, async_client, close_async, sync_client
from ..base._version import __version__
from ..protocol._keys import known_queues_key, registry_keys
from ._fetch import Fetcher, ReadGroup
from ._flow import FlowControl
from ._lease import LeaseKeeper
from ._maintenance import Maintenance
from ._server import connect
from ._settle import Settler
from ._state import Delivery, QueueState

if TYPE_CHECKING:
    from ..base._settings import WorkerSettings
    from ..producer._core import Core
    from ._ledger import Ledger
    from ._outcome import Outcome
    from ._state import WorkerCounters
    from ._stats import AttemptSink

log = logging.getLogger("tether.worker")


class Executor(Protocol):
    """What runs the deliveries an engine fetches (the worker's runner, taskiq's hand-over)."""

    busy: int
    """Deliveries running now (or handed over and not yet acknowledged)."""

    def submit(self, delivery: Delivery) -> None:
        """Run this delivery, now or when a slot frees (the engine accepted it)."""
        ...

    def take_buffered(self) -> Sequence[Delivery]:
        """Remove and return every delivery not started yet."""
        ...

    def resume(self) -> None:
        """The lease is known to be held again: start what may start."""
        ...

    def request_cancel(self, task_ids: set[str]) -> None:
        """Users asked to cancel these tasks (called on the event loop)."""
        ...

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing runs; False when ``timeout`` passed first."""
        ...

    def cancel_running(self) -> Sequence[Delivery]:
        """The shutdown's grace ended: cancel what runs, return its deliveries."""
        ...

    def close(self) -> None:
        """The run ended: free what the executor holds (threads)."""
        ...


@dataclass(frozen=True, slots=True)
class Parts:
    """What an executor is built from."""

    client: AsyncClient
    name: str
    ledger: Ledger
    counters: WorkerCounters
    settle: Callable[[Delivery, Outcome], None]
    """Hand an attempt's outcome to the settler."""
    lease_held: Callable[[], bool]
    """Whether the lease is known to be held: start nothing buffered while it is not."""
    flow: FlowControl | None
    wake: Callable[[], None]
    """Wake whoever waits for the engine (the taskiq receiver's pull)."""


@dataclass(frozen=True, slots=True)
class Options:
    """How one kind of consumer uses the engine."""

    runtime: str | None = None
    """Written in the registry record ('taskiq'); None for Tether's own worker."""
    delivery: type[Delivery] = Delivery
    flow_control: bool = False
    stats: bool = False
    """The settle script writes the statistics."""
    sinks: tuple[AttemptSink, ...] = ()
    """Where settled attempts go besides the statistics (the worker's metrics)."""
    settle_linger: float = 0.0
    """Wait up to this long for outcomes to share a settle call (taskiq acks one by one)."""
    patient_fetch_stop: bool = True
    """At shutdown, let a blocking read return (its entries are handed off at once) rather
    than cancel it (they are then handed off as leftovers)."""
    concurrency: int | None = None
    """For the registry record; ``max_pending`` when None."""
    label: str = "worker"


def check_settings(core: Core, settings: WorkerSettings) -> None:
    """Refuse settings the engine cannot serve with, at start-up."""
    if settings.reclaim_interval * 1.2 >= core.settings.socket_timeout:
        raise ConfigError(
            f"reclaim_interval={settings.reclaim_interval} must stay well below "
            f"socket_timeout={core.settings.socket_timeout}: blocking reads wait that long"
        )


class Engine:
    """Fetches, leases, settles and hands off for one consumer; see the module's docstring.

    ``await start()``; then ``await stopped()`` until a stop or a crash; then
    ``await shutdown(grace)`` and ``await close()`` (``close`` alone after a failed start).
    """

    def __init__(
        self,
        core: Core,
        settings: WorkerSettings,
        *,
        name: str,
        token: str,
        ledger: Ledger,
        counters: WorkerCounters,
        executor: Callable[[Parts], Executor],
        options: Options,
    ) -> None:
        self.core = core
        self.settings = settings
        self.name = name
        self.token = token
        self.ledger = ledger
        self.counters = counters
        self.options = options
        self._delivery = options.delivery
        self.queues = [QueueState(core.keys(q)) for q in settings.queues]
        self.where = core.target.redacted
        self.crash: BaseException | None = None
        """What stopped a loop of the engine (raised by ``close`` once all is handed off)."""
        self.started_ms = int(time.time() * 1000)
        self._loop = asyncio.get_running_loop()
        self._stopping = False
        self._stop_event = asyncio.Event()
        self._wake = asyncio.Event()
        self._last_tick = time.monotonic()
        self._reclaim_after = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._fetch_tasks: list[asyncio.Task[None]] = []
        self._settler_task: asyncio.Task[None] | None = None
        self._closed = False
        self._fetching_stopped = False
        settings_of = core.settings
        self.client: AsyncClient = async_client(
            core.target,
            socket_timeout=settings_of.socket_timeout,
            connect_timeout=settings_of.connect_timeout,
            retries=0,
            max_connections=settings_of.max_connections,
            pool_timeout=settings_of.pool_timeout,
        )
        self.maintenance = Maintenance(
            client=self.client,
            consumer=name,
            ledger=ledger,
            counters=counters,
            page_size=settings.reclaim_page_size,
            dead_letter_maxlen=settings_of.dead_letter_maxlen,
            accept=self._accept,
        )
        self.flow = (
            FlowControl(
                core,
                client=self.client,
                consumer=name,
                ledger=ledger,
                counters=counters,
                interval=settings.reclaim_interval,
                promote=self.maintenance.promote,
            )
            if options.flow_control
            else None
        )
        self._release_slots = self.flow.release if self.flow is not None else None
        """Handed-off entries give their flow-control slots back too."""
        self.settler = Settler(
            client=self.client,
            ledger=ledger,
            consumer=name,
            dead_letter_maxlen=settings_of.dead_letter_maxlen,
            counters=counters,
            retry_delay=settings.reconnect_delay,
            stats_window=settings_of.stats_window if options.stats else None,
            flow=self.flow,
            sinks=options.sinks,
            linger=options.settle_linger,
            linger_batch=settings.pending_limit // 2,
            where=self.where,
        )
        self.fetcher = Fetcher(
            client=self.client,
            consumer=name,
            settings=settings,
            ledger=ledger,
            maintenance=self.maintenance,
            counters=counters,
            accept=self._accept,
            stopping=self.stopping,
            lease_held=self.lease_held,
            burst_done=self._burst_done,
            on_burst_done=self.stop,
            sleep=self.sleep_unless_stopped,
            flow=self.flow,
            where=self.where,
        )
        self.lease = LeaseKeeper(
            client_factory=self._heartbeat_client,
            leases=[(q.keys.lease(name), q.keys.cancels(name)) for q in self.queues],
            token=token,
            interval=settings.heartbeat_interval,
            ttl=settings.heartbeat_ttl,
            stall_timeout=settings.stall_timeout,
            last_tick=self._ticked_at,
            on_cancel=self._on_cancel_threadsafe,
            on_lapse=self._on_lapse_threadsafe,
            counters=counters,
            where=self.where,
            registry=registry_keys(core.namespace),
            record=self.record,
            known_queues=known_queues_key(core.namespace),
            health_file=settings.health_file,
        )
        self.executor = executor(
            Parts(
                client=self.client,
                name=name,
                ledger=ledger,
                counters=counters,
                settle=self.settler.add,
                lease_held=self.lease_held,
                flow=self.flow,
                wake=self._wake.set,
            )
        )

    # -- state --------------------------------------------------------------------------

    def stopping(self) -> bool:
        return self._stopping

    def lease_held(self) -> bool:
        return self.lease.held()

    def stop(self) -> None:
        """Fetch nothing more; ``stopped()`` returns."""
        self._stopping = True
        self._stop_event.set()
        self._wake.set()

    def record(self) -> dict[str, Any]:
        """This consumer's registry record (published by the heartbeat thread)."""
        s = self.settings
        record: dict[str, Any] = {
            "name": self.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
        }
        if self.options.runtime is not None:
            record["runtime"] = self.options.runtime
        record.update(
            queues=list(s.queues),
            concurrency=self.options.concurrency or s.pending_limit,
            max_pending=s.pending_limit,
            started_ms=self.started_ms,
            heartbeat_ms=int(time.time() * 1000),
            held=self.ledger.held,
            running=self.executor.busy,
            counters=self.counters.as_dict(),
        )
        return record

    # -- start --------------------------------------------------------------------------

    async def start(self) -> str | None:
        """Check the server and create the groups (retrying transient faults), take the
        lease, start the settler and the fetch loops. The server's description; None when
        stopped first. A fault no retry fixes raises :class:`~tether.ServerError`."""
        connected = await connect(
            self.client,
            (s for q in self.queues for s in q.streams),
            self.settings,
            self.where,
            stopping=self.stopping,
            sleep=self.sleep_unless_stopped,
        )
        if connected is None:
            return None
        if connected.after_outage:
            # Live workers could not renew their leases during the outage either: give
            # them two heartbeats to do so before judging anyone dead.
            self._reclaim_after = time.monotonic() + self.settings.outage_grace
        if not await self._take_lease():
            return None
        self._settler_task = self._spawn(self.settler.run(), "tether-settler")
        self._spawn(self._tick(), "tether-ticker")
        for group in self._read_groups():
            self._fetch_tasks.append(
                self._spawn(self.fetcher.run(group), f"tether-fetch[{group.name}]")
            )
        return connected.server

    async def _take_lease(self) -> bool:
        """The first renewal must succeed before anything is fetched: a consumer without a
        lease would hold entries others may claim."""
        attempt = 0
        while not self._stopping:
            if await asyncio.to_thread(self.lease.renew):
                self.lease.start()
                return True
            if self.lease.fatal is not None:
                raise ServerError(describe_error(self.lease.fatal, self.where)) from None
            attempt += 1
            await self.sleep_unless_stopped(self.settings.reconnect_delay(attempt))
        return False

    def _read_groups(self) -> list[ReadGroup]:
        if self.core.target.kind == "cluster":  # a blocking read cannot span slots
            groups = [ReadGroup([q]) for q in self.queues]
        else:
            groups = [ReadGroup(self.queues)]
        for group in groups:  # after waiting for the server at start, as after an outage
            group.reclaim_after = self._reclaim_after
        return groups

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        task.add_done_callback(self._on_task_done)
        self._tasks.append(task)
        return task

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None or self.crash is not None:
            return
        self.crash = exc
        if isinstance(exc, ServerError):  # a refusal no retry fixes: said once
            log.error("%s %s stops: %s; handing off", self.options.label, self.name, exc)
        else:
            log.error(
                "%s %s crashed in %s; handing off and stopping",
                self.options.label, self.name, task.get_name(), exc_info=exc,
            )  # fmt: skip
        self.stop()

    async def wait_for_work(self, timeout: float | None) -> None:
        """Until the executor or a stop wakes the engine's puller (or ``timeout`` passes)."""
        self._wake.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def stopped(self) -> None:
        """Until a stop is asked or a loop of the engine fails (``crash``)."""
        await self._stop_event.wait()

    def _heartbeat_client(self) -> SyncClient:
        core, s = self.core, self.settings
        return sync_client(
            core.target,
            socket_timeout=min(core.settings.socket_timeout, s.heartbeat_interval * 2),
            connect_timeout=min(core.settings.connect_timeout, s.heartbeat_interval),
        )

    # -- running ------------------------------------------------------------------------

    async def _tick(self) -> None:
        """Prove the event loop alive to the heartbeat thread; stop on a fatal refusal the
        heartbeat met (a password changed)."""
        period = min(0.5, self.settings.heartbeat_interval / 2)
        while True:
            self._last_tick = time.monotonic()
            if self.lease.fatal is not None:
                raise ServerError(describe_error(self.lease.fatal, self.where))
            await asyncio.sleep(period)

    def _ticked_at(self) -> float:
        return self._last_tick

    def _burst_done(self) -> bool:
        if self.ledger.held or self.settler.backlog:
            return False
        now = time.monotonic()
        return all(q.next_due is None or q.next_due > now for q in self.queues)

    def _accept(
        self,
        queue: QueueState,
        sidx: int,
        entry_id: bytes,
        payload: bytes | None,
        deliveries: int,
        suspect: bool,
    ) -> None:
        delivery = self._delivery(queue, sidx, entry_id, payload, deliveries, suspect, not suspect)
        delivery.epoch = self.counters.groups_recreated
        if not self.ledger.accept(delivery):
            return  # already held here (a resync raced a fetch): keep one
        self.counters.fetched += 1
        if self._stopping:
            self.ledger.late.append(delivery)
        else:
            self.executor.submit(delivery)

    def _on_cancel_threadsafe(self, task_ids: list[str]) -> None:
        """Called by the heartbeat thread."""
        self._loop.call_soon_threadsafe(self._on_cancel, task_ids)

    def _on_cancel(self, task_ids: list[str]) -> None:
        log.info("cancel requested for %s", ", ".join(task_ids))
        self.executor.request_cancel(set(task_ids))

    def _on_lapse_threadsafe(self, sent_at: float) -> None:
        """Called by the heartbeat thread when a renewal found the lease lapsed."""
        self._loop.call_soon_threadsafe(self._on_lapse, sent_at)

    def _on_lapse(self, sent_at: float) -> None:
        """Others may have claimed what waits here: drop it, and take up again (resync) what
        is still this consumer's."""
        dropped = self.executor.take_buffered()
        if dropped:
            self.ledger.release(dropped)
            log.warning(
                "dropped %d entries waiting to start: this %s's lease had lapsed, so others "
                "may have claimed them; those still its own are taken up again",
                len(dropped), self.options.label,
            )  # fmt: skip
        self.ledger.resync = True
        self.lease.confirm(sent_at)
        self.executor.resume()

    # -- stop ---------------------------------------------------------------------------

    async def stop_fetching(self) -> None:
        """Fetch nothing more; hand what never started to other workers at once."""
        self.stop()
        if self._fetching_stopped:
            return
        self._fetching_stopped = True
        if self.flow is not None:
            self.flow.close()
        buffered = self.executor.take_buffered()
        await self.maintenance.hand_off(buffered, "buffered", self._release_slots)
        loops = [t for t in self._fetch_tasks if not t.done()]
        if loops and self.options.patient_fetch_stop:
            await asyncio.wait(loops, timeout=self.settings.reclaim_interval * 1.5 + 1)
        for task in loops:
            task.cancel()
        if loops:
            await asyncio.wait(loops)
        late, self.ledger.late = self.ledger.late, []
        await self.maintenance.hand_off(late, "fetched while stopping", self._release_slots)

    async def shutdown(self, grace: float, abort: asyncio.Event | None = None) -> None:
        """The whole hand-off: stop fetching, wait up to ``grace`` for what runs (less when
        ``abort`` is set), hand off what still runs, settle, hand off what is left."""
        if self._settler_task is None or self._settler_task.done():
            # Keep settling during the shutdown, whatever happened to the settler.
            self._settler_task = self._spawn(self.settler.run(), "tether-settler")
        await self.stop_fetching()
        executor = self.executor
        if executor.busy and not await self._wait_idle(grace, abort):
            stuck = executor.cancel_running()
            await asyncio.sleep(0)
            await self.maintenance.hand_off(
                stuck, "still running when the shutdown grace ended", self._release_slots
            )
        await self.settler.drain(timeout=max(5.0, self.settings.heartbeat_ttl))
        await self.maintenance.hand_off_leftovers(self.queues, self._release_slots)

    async def _wait_idle(self, grace: float, abort: asyncio.Event | None) -> bool:
        if abort is not None and abort.is_set():
            grace = 0.0
        if grace:
            log.info("waiting up to %.1fs for %d running tasks", grace, self.executor.busy)
        idle = asyncio.create_task(self.executor.wait_idle(grace))
        waits: list[asyncio.Future[Any]] = [idle]
        if abort is not None:
            waits.append(asyncio.ensure_future(abort.wait()))
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits[1:]:
            waiting.cancel()
        if not idle.done():
            idle.cancel()
            return False
        return idle.result()

    async def close(self) -> None:
        """Stop every loop, release the lease (last: until now other workers must not take
        what is held here) and the connections."""
        if self._closed:
            return
        self._closed = True
        self.stop()
        self.settler.close()
        for task in self._tasks:
            if task is not self._settler_task:  # it ends on its own once drained
                task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        started = self.lease.renewals > 0
        try:
            # Nothing to release (or unpublish) when no renewal ever went through.
            await asyncio.to_thread(self.lease.stop, started)
        finally:
            self.executor.close()
            await close_async(self.client)
        if started:
            log.info(
                "%s %s stopped: %s",
                self.options.label, self.name, format_counters(self.counters) or "no tasks",
            )  # fmt: skip

    # -- helpers ------------------------------------------------------------------------

    async def sleep_unless_stopped(self, delay: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), delay)


def format_counters(counters: WorkerCounters) -> str:
    return " ".join(f"{k}={v}" for k, v in counters.as_dict().items() if v)
