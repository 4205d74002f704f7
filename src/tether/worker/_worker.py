"""The worker: the delivery engine with the runner, plus flow control, the scheduler and
the metrics.

- the **engine** (``_engine.py``) connects, fetches, leases, settles and hands off;
- the **runner** runs tasks up to ``concurrency``, buffering the rest by priority;
- the **scheduler** (``scheduler=True``) leads or stands by beside it;
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
import secrets
import signal
import threading
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from ..base._errors import ConfigError, TetherError
from ..base._settings import PRIORITIES, WorkerSettings
from ._engine import Engine, Executor, Options, Parts, check_settings
from ._ledger import Ledger
from ._runner import Runner
from ._state import WorkerCounters

if TYPE_CHECKING:
    from ..metrics import WorkerMetrics
    from ..producer._core import Core

log = logging.getLogger("tether.worker")


class Worker:
    """Runs the tasks of an app. ``await worker.run()`` until :meth:`stop` (or, with
    ``handle_signals=True``, SIGTERM/SIGINT)."""

    def __init__(
        self, app: Core, settings: WorkerSettings, *, handle_signals: bool = False
    ) -> None:
        check_settings(app, settings)
        self.app = app
        self.settings = settings
        self.name = settings.consumer
        self.token = secrets.token_hex(8)
        self.counters = WorkerCounters()
        self.ledger = Ledger(settings.pending_limit)
        self._handle_signals = handle_signals
        self._signals = 0
        self._stopping = False
        self._aborted = False
        self._abort_event: asyncio.Event | None = None
        self._started = False
        self._engine: Engine | None = None
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
        if self._engine is not None:
            self._engine.stop()

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
        """Tasks running now (with threads still busy past their timeout)."""
        return 0 if self._engine is None else self._engine.executor.busy

    @property
    def lease_is_held(self) -> bool:
        """Whether this worker's lease is known to be held (renewed within its TTL)."""
        return self._engine is not None and self._engine.lease_held()

    def record(self) -> dict[str, Any]:
        """This worker's registry record (published by the heartbeat); empty before it runs."""
        return {} if self._engine is None else self._engine.record()

    async def run(self) -> None:
        if self._started:
            raise TetherError("a Worker runs once; create a new one to run again")
        self._started = True
        loop = asyncio.get_running_loop()
        self._abort_event = asyncio.Event()
        if self._aborted:
            self._abort_event.set()
        metrics = self.metrics
        if metrics is not None:
            metrics.start()  # first: a port in use stops the start-up before anything else
            log.info("worker %s serves its metrics at %s", self.name, metrics.url)
        installed = self._install_signals(loop)
        try:
            async with self._app_open():
                await self._run_engine()
        finally:
            if metrics is not None:  # its threads are joined whatever happened
                await asyncio.to_thread(metrics.stop)
            for sig, previous in installed:
                loop.remove_signal_handler(sig)
                # remove_signal_handler puts Python's default back; put back what was
                # there (asyncio.run's own SIGINT handler, for one).
                if previous is not None:
                    signal.signal(sig, previous)

    async def _run_engine(self) -> None:
        engine = self._engine = self._build_engine()
        try:
            if self._stopping:
                engine.stop()
            server = await engine.start()
            if server is not None:
                self._log_start(server)
                await self._serve(engine)
        finally:
            await engine.close()
        if engine.crash is not None:
            raise engine.crash

    @contextlib.asynccontextmanager
    async def _app_open(self) -> AsyncIterator[None]:
        """The app open while the worker runs: tasks enqueue through it (a task that
        enqueues another), and under ``tether worker`` nothing else opens it. Opening is
        lazy: no connection is made here."""
        opened_here = not self.app.is_open
        if opened_here:
            await self.app.open()
        try:
            yield
        finally:
            if opened_here:
                await self.app.close()

    # -- start --------------------------------------------------------------------------

    def _build_engine(self) -> Engine:
        app, s = self.app, self.settings
        measure_wait = self.metrics is not None

        def runner(parts: Parts) -> Executor:
            return Runner(
                app,
                client=parts.client,
                ledger=parts.ledger,
                concurrency=s.concurrency,
                worker_name=parts.name,
                max_deliveries=s.max_deliveries,
                counters=parts.counters,
                settle=parts.settle,
                lease_held=parts.lease_held,
                flow=parts.flow,
                measure_wait=measure_wait,
            )

        return Engine(
            app,
            s,
            name=self.name,
            token=self.token,
            ledger=self.ledger,
            counters=self.counters,
            executor=runner,
            options=Options(
                flow_control=True,
                stats=app.settings.stats,
                sinks=() if self.metrics is None else (self.metrics.tally,),
                concurrency=s.concurrency,
            ),
        )

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> list[tuple[signal.Signals, Any]]:
        if not self._handle_signals or threading.current_thread() is not threading.main_thread():
            return []
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            loop.add_signal_handler(sig, self._on_signal, sig)
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

    def _log_start(self, server: str) -> None:
        s = self.settings
        log.info(
            "worker %s serving queues %s (priorities %s) of namespace %r on %s (%s): "
            "concurrency=%d max_pending=%d heartbeat %.2fs/ttl %.2fs reclaim every %.2fs "
            "max_deliveries=%d shutdown_grace=%.1fs%s",
            self.name, ",".join(s.queues), ">".join(PRIORITIES), self.app.namespace,
            self.app.target.redacted, server, s.concurrency, s.pending_limit,
            s.heartbeat_interval, s.heartbeat_ttl, s.reclaim_interval, s.max_deliveries,
            s.shutdown_grace, " burst" if s.burst else "",
        )  # fmt: skip

    # -- serving ------------------------------------------------------------------------

    async def _serve(self, engine: Engine) -> None:
        scheduler_stop = asyncio.Event()
        scheduler = None
        if self.settings.scheduler:
            from ..scheduler import Scheduler

            scheduler = asyncio.create_task(
                Scheduler(self.app, client=engine.client, identity=self.name).run(scheduler_stop),
                name="tether-scheduler",
            )
        self.ready.set()
        await engine.stopped()
        self._stopping = True
        scheduler_stop.set()  # resign first, so another instance leads at once
        if scheduler is not None:
            await asyncio.wait([scheduler], timeout=5)
        grace = 0.0 if self._aborted else self.settings.shutdown_grace
        await engine.shutdown(grace, self._abort_event)


def _worker_metrics(worker: Worker) -> WorkerMetrics:
    """The metrics of a worker with ``metrics_port`` set; a clear error without the extra."""
    try:
        from ..metrics import WorkerMetrics
    except ImportError as exc:
        raise ConfigError(
            f"metrics_port needs prometheus-client ({exc}): pip install 'tether-queue[metrics]'"
        ) from None
    return WorkerMetrics(worker)
