"""The worker: it composes the parts and runs their lifecycle.

- the **ledger** owns what the worker holds and its ``max_pending`` bound;
- the **fetcher** runs maintenance, then fetches up to the free capacity (``_fetch.py``);
- the **runner** runs tasks up to ``concurrency``, buffering the rest by priority;
- the **settler** acknowledges outcomes in batches, fenced by ownership;
- the **maintenance** promotes delayed tasks, reclaims orphans, hands off and prunes;
- the **lease keeper**, a thread, renews the leases and publishes the registry record;
- the **metrics** (``metrics_port``), threads of their own, serve ``/metrics`` while the
  worker runs; the settler adds each settled batch to them.

Library code never owns the process: the worker installs signal handlers only when asked
(``handle_signals=True``) and removes them when it returns; the ``tether worker`` command
handles signals itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from .._errors import ConfigError, ServerError, TetherError
from .._faults import describe_error
from .._keys import known_queues_key, registry_keys
from .._redis import (
    AsyncClient,
    async_client,
    close_async,
    sync_client,
)
from .._settings import PRIORITIES, WorkerSettings
from .._version import __version__
from ._fetch import Fetcher, ReadGroup
from ._flow import FlowControl
from ._lease import LeaseKeeper
from ._ledger import Ledger
from ._maintenance import Maintenance
from ._runner import Runner
from ._server import connect
from ._settle import Settler
from ._state import Delivery, QueueState, WorkerCounters

if TYPE_CHECKING:
    from .._core import Core
    from ..metrics import WorkerMetrics

log = logging.getLogger("tether.worker")


class Worker:
    """Runs the tasks of an app. ``await worker.run()`` until :meth:`stop` (or, with
    ``handle_signals=True``, SIGTERM/SIGINT)."""

    def __init__(
        self, app: Core, settings: WorkerSettings, *, handle_signals: bool = False
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
        self.ledger = Ledger(settings.pending_limit)
        self._handle_signals = handle_signals
        self._signals = 0
        self._reclaim_after = 0.0
        self._stopping = False
        self._stop_event: asyncio.Event | None = None
        self._aborted = False
        self._abort_event: asyncio.Event | None = None
        self._last_tick = time.monotonic()
        self._started = False
        self._started_ms = 0
        self._crash: BaseException | None = None
        self._lease: LeaseKeeper | None = None
        self.ready = threading.Event()
        """Set once the worker has its lease and starts fetching (for tests and embedders)."""
        self.metrics: WorkerMetrics | None = None
        """With ``metrics_port`` set: this worker's metrics (``metrics.url`` once it runs,
        ``metrics.registry`` to add your own); else None."""
        if settings.metrics_port is not None:
            self.metrics = _worker_metrics(self)

    # -- public -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask for a graceful stop (idempotent, from the worker's event loop)."""
        self._stopping = True
        if self._stop_event is not None:
            self._stop_event.set()

    def abort(self) -> None:
        """Stop at once: no grace for running tasks (they are cancelled and handed off)."""
        self._aborted = True
        if self._abort_event is not None:
            self._abort_event.set()
        self.stop()

    @property
    def held(self) -> int:
        """Entries delivered to this worker and not yet settled."""
        return self.ledger.held

    @property
    def free_capacity(self) -> int:
        """Entries this worker may still take before it reaches ``max_pending``."""
        return self.ledger.free

    @property
    def running(self) -> int:
        runner = getattr(self, "_runner", None)
        return 0 if runner is None else len(runner.running)

    @property
    def lease_is_held(self) -> bool:
        """Whether this worker's lease is known to be held (renewed within its TTL)."""
        return self._lease_held()

    def record(self) -> dict[str, Any]:
        """This worker's registry record (published by the heartbeat)."""
        s = self.settings
        return {
            "name": self.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": __version__,
            "queues": list(s.queues),
            "concurrency": s.concurrency,
            "max_pending": s.pending_limit,
            "started_ms": self._started_ms,
            "heartbeat_ms": int(time.time() * 1000),
            "held": self.ledger.held,
            "running": self.running,
            "counters": self.counters.as_dict(),
        }

    async def run(self) -> None:
        if self._started:
            raise TetherError("a Worker runs once; create a new one to run again")
        self._started = True
        self._started_ms = int(time.time() * 1000)
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._abort_event = asyncio.Event()
        if self._stopping:
            self._stop_event.set()
        if self._aborted:
            self._abort_event.set()
        metrics = self.metrics
        if metrics is not None:
            metrics.start()  # first: a port in use stops the start-up before anything else
            log.info("worker %s serves its metrics at %s", self.name, metrics.url)
        installed = self._install_signals()
        app = self.app
        self._client: AsyncClient = async_client(
            app.target,
            socket_timeout=app.settings.socket_timeout,
            connect_timeout=app.settings.connect_timeout,
            retries=0,
            max_connections=app.settings.max_connections,
            pool_timeout=app.settings.pool_timeout,
        )
        try:
            server = await self._connect()
            if server is None:
                return
            self._compose()
            if not await self._take_lease():
                return
            self._log_start(server)
            await self._serve()
        finally:
            try:
                await self._finish()
            finally:
                if metrics is not None:  # its threads are joined whatever _finish did
                    await asyncio.to_thread(metrics.stop)
                for sig, previous in installed:
                    self._loop.remove_signal_handler(sig)
                    # remove_signal_handler puts Python's default back; put back what was
                    # there (asyncio.run's own SIGINT handler, for one).
                    if previous is not None:
                        signal.signal(sig, previous)

    # -- start --------------------------------------------------------------------------

    def _install_signals(self) -> list[tuple[signal.Signals, Any]]:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return []
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            self._loop.add_signal_handler(sig, self._on_signal, sig)
            installed.append((sig, previous))
        return installed

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second %s: stopping at once", sig.name)
            self.abort()
            return
        log.info("%s received: stopping gracefully (send it again to stop at once)", sig.name)
        self.stop()

    async def _connect(self) -> str | None:
        """Check the server, create the groups; retry transient faults with backoff."""
        connected = await connect(
            self._client,
            (s for q in self.queues for s in q.streams),
            self.settings,
            self.app.target.redacted,
            stopping=lambda: self._stopping,
            sleep=self._sleep_unless_stopped,
        )
        if connected is None:
            return None
        if connected.after_outage:
            # Live workers could not renew their leases during the outage either: give
            # them two heartbeats to do so before judging anyone dead.
            self._reclaim_after = time.monotonic() + self.settings.outage_grace
        return connected.server

    def _compose(self) -> None:
        app, s = self.app, self.settings
        self._flow = FlowControl(
            app,
            client=self._client,
            consumer=self.name,
            ledger=self.ledger,
            counters=self.counters,
            interval=s.reclaim_interval,
            promote=lambda queue: self._maintenance.promote(queue),  # noqa: PLW0108 - composed below
        )
        self._runner = Runner(
            app,
            client=self._client,
            ledger=self.ledger,
            concurrency=s.concurrency,
            worker_name=self.name,
            max_deliveries=s.max_deliveries,
            counters=self.counters,
            settle=self._settle,
            lease_held=self._lease_held,
            flow=self._flow,
            measure_wait=self.metrics is not None,
        )
        self._settler = Settler(
            client=self._client,
            ledger=self.ledger,
            consumer=self.name,
            dead_letter_maxlen=app.settings.dead_letter_maxlen,
            counters=self.counters,
            retry_delay=self.settings.reconnect_delay,
            stats_window=app.settings.stats_window if app.settings.stats else None,
            flow=self._flow,
            metrics=None if self.metrics is None else self.metrics.tally,
            where=app.target.redacted,
        )
        self._maintenance = Maintenance(
            client=self._client,
            consumer=self.name,
            ledger=self.ledger,
            counters=self.counters,
            page_size=s.reclaim_page_size,
            dead_letter_maxlen=app.settings.dead_letter_maxlen,
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
            burst_done=self._burst_done,
            on_burst_done=self.stop,
            sleep=self._sleep_unless_stopped,
            flow=self._flow,
            where=app.target.redacted,
        )
        self._lease = self._lease_keeper()

    async def _take_lease(self) -> bool:
        """The first renewal must succeed before anything is fetched: a worker without a
        lease would hold entries others may claim."""
        assert self._lease is not None
        attempt = 0
        while not self._stopping:
            if await asyncio.to_thread(self._lease.renew):
                self._lease.start()
                return True
            if self._lease.fatal is not None:
                raise ServerError(
                    describe_error(self._lease.fatal, self.app.target.redacted)
                ) from None
            attempt += 1
            await self._sleep_unless_stopped(self.settings.reconnect_delay(attempt))
        return False

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
            on_lapse=self._on_lapse_threadsafe,
            counters=self.counters,
            where=app.target.redacted,
            registry=registry_keys(app.namespace),
            record=self.record,
            known_queues=known_queues_key(app.namespace),
            health_file=s.health_file,
        )

    def _log_start(self, server: str) -> None:
        s = self.settings
        log.info(
            "worker %s serving queues %s (priorities %s) on %s (%s): concurrency=%d "
            "max_pending=%d heartbeat %.2fs/ttl %.2fs reclaim every %.2fs max_deliveries=%d "
            "shutdown_grace=%.1fs%s",
            self.name, ",".join(s.queues), ">".join(PRIORITIES), self.app.target.redacted,
            server, s.concurrency, s.pending_limit, s.heartbeat_interval, s.heartbeat_ttl,
            s.reclaim_interval, s.max_deliveries, s.shutdown_grace, " burst" if s.burst else "",
        )  # fmt: skip

    # -- serving ------------------------------------------------------------------------

    def _read_groups(self) -> list[ReadGroup]:
        if self.app.target.kind == "cluster":
            groups = [ReadGroup([q]) for q in self.queues]
        else:
            groups = [ReadGroup(self.queues)]
        for group in groups:  # after waiting for the server at start, as after an outage
            group.reclaim_after = self._reclaim_after
        return groups

    async def _serve(self) -> None:
        assert self._stop_event is not None
        settler = asyncio.create_task(self._settler.run(), name="tether-settler")
        ticker = asyncio.create_task(self._tick(), name="tether-ticker")
        loops = [
            asyncio.create_task(self._fetcher.run(g), name=f"tether-fetch[{g.name}]")
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
        await asyncio.wait([stop, settler, ticker, *loops], return_when=asyncio.FIRST_COMPLETED)
        self._stopping = True
        for task in (settler, ticker, *loops):
            if task.done() and not task.cancelled() and task.exception() is not None:
                self._crash = task.exception()
                if isinstance(self._crash, ServerError):  # a refusal no retry fixes: said once
                    log.error("worker %s stops: %s; handing off", self.name, self._crash)
                else:
                    log.error(
                        "worker %s crashed in %s; handing off and stopping",
                        self.name, task.get_name(),
                    )  # fmt: skip
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
            lease = self._lease
            if lease is not None and lease.fatal is not None:
                raise ServerError(describe_error(lease.fatal, self.app.target.redacted))
            await asyncio.sleep(period)

    def _lease_held(self) -> bool:
        return self._lease is not None and self._lease.held()

    def _burst_done(self) -> bool:
        if self.ledger.held or self._settler.backlog:
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
        deliveries: int,
        suspect: bool,
    ) -> None:
        delivery = Delivery(queue, sidx, entry_id, payload, deliveries, suspect, not suspect)
        delivery.epoch = self.counters.groups_recreated
        if not self.ledger.accept(delivery):
            return  # already held here (a resync raced a fetch): keep one
        self.counters.fetched += 1
        if self._stopping:
            self.ledger.late.append(delivery)
        else:
            self._runner.submit(delivery)

    def _settle(self, delivery: Delivery, outcome: Any) -> None:
        self._settler.add(delivery, outcome)

    def _on_cancel_threadsafe(self, task_ids: list[str]) -> None:
        """Called by the heartbeat thread."""
        self._loop.call_soon_threadsafe(self._on_cancel, task_ids)

    def _on_cancel(self, task_ids: list[str]) -> None:
        log.info("cancel requested for %s", ", ".join(task_ids))
        self._runner.request_cancel(set(task_ids))

    def _on_lapse_threadsafe(self, sent_at: float) -> None:
        """Called by the heartbeat thread when a renewal found the lease lapsed."""
        self._loop.call_soon_threadsafe(self._on_lapse, sent_at)

    def _on_lapse(self, sent_at: float) -> None:
        dropped = self._runner.take_buffered()
        if dropped:
            self.ledger.release(dropped)
            log.warning(
                "dropped %d entries waiting to start: this worker's lease had lapsed, so others "
                "may have claimed them; those still its own are taken up again",
                len(dropped),
            )
        self.ledger.resync = True
        assert self._lease is not None
        self._lease.confirm(sent_at)
        self._runner.schedule()

    # -- stop ---------------------------------------------------------------------------

    async def _shutdown(self, loops: list[asyncio.Task[None]]) -> None:
        s = self.settings
        runner = self._runner
        self._flow.close()
        # Handed-off entries give their flow-control slots back too.
        maintenance, slots = self._maintenance, self._flow.release
        await maintenance.hand_off(runner.take_buffered(), "buffered", slots)
        await asyncio.wait(loops, timeout=self.settings.reclaim_interval * 1.5 + 1)
        for task in loops:
            task.cancel()
        late, self.ledger.late = self.ledger.late, []
        await maintenance.hand_off(late, "fetched while stopping", slots)
        if runner.busy:
            grace = 0.0 if self._aborted else s.shutdown_grace
            if grace:
                log.info("waiting up to %.1fs for %d running tasks", grace, runner.busy)
            if not await self._wait_idle_unless_aborted(grace):
                stuck = runner.cancel_running()
                await asyncio.sleep(0)
                await maintenance.hand_off(
                    stuck, "still running when the shutdown grace ended", slots
                )
        await self._settler.drain(timeout=max(5.0, s.heartbeat_ttl))
        await maintenance.hand_off_leftovers(self.queues, slots)

    async def _wait_idle_unless_aborted(self, grace: float) -> bool:
        assert self._abort_event is not None
        idle = asyncio.create_task(self._runner.wait_idle(grace))
        abort = asyncio.create_task(self._abort_event.wait())
        await asyncio.wait([idle, abort], return_when=asyncio.FIRST_COMPLETED)
        abort.cancel()
        if not idle.done():
            idle.cancel()
            return False
        return idle.result()

    async def _finish(self) -> None:
        lease = self._lease
        if lease is not None:
            # The lease goes last: until now other workers must not take what we hold.
            await asyncio.to_thread(lease.stop, True)
        runner = getattr(self, "_runner", None)
        if runner is not None:
            runner.close()
        await close_async(self._client)
        if lease is not None:
            log.info(
                "worker %s stopped: %s", self.name, _format_counters(self.counters) or "no tasks"
            )

    # -- helpers ------------------------------------------------------------------------

    async def _sleep_unless_stopped(self, delay: float) -> None:
        assert self._stop_event is not None
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), delay)


def _worker_metrics(worker: Worker) -> WorkerMetrics:
    """The metrics of a worker with ``metrics_port`` set; a clear error without the extra."""
    try:
        from ..metrics import WorkerMetrics
    except ImportError as exc:
        raise ConfigError(
            f"metrics_port needs prometheus-client ({exc}): pip install 'tether-queue[metrics]'"
        ) from None
    return WorkerMetrics(worker)


def _format_counters(counters: WorkerCounters) -> str:
    return " ".join(f"{k}={v}" for k, v in counters.as_dict().items() if v)
