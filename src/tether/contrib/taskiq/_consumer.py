"""The worker side of :class:`TetherBroker`: Tether's delivery engine, fed to taskiq's receiver.

taskiq's receiver pulls messages from the broker one at a time and runs them; everything
else is the engine's (``tether.worker.kit``), as under ``tether worker``: connecting, the
ledger and its ``max_pending`` bound, fetching with maintenance (promotion, lock-free
reclaim, pruning), the lease and the registry record, batched fenced settles and the
hand-off at shutdown. ``_handover.py`` is the executor: what taskiq's receiver gets and what
its acks become.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Generator
from typing import Any

from ...base._settings import WorkerSettings
from ...producer._core import Core
from ...worker.kit import Engine, Ledger, Options, Parts, WorkerCounters, check_settings
from ._delivery import TaskiqDelivery
from ._handover import Handover

log = logging.getLogger("tether.taskiq")


class Acked:
    """What an ack returns. taskiq's ``AckableMessage.ack`` may be sync or async: its
    receiver awaits what the callback returns if it can be awaited, and code that reads
    ``broker.listen()`` itself writes ``await message.ack()`` (taskiq-redis's acks are
    coroutines) or calls it plainly. The ack is taken (batched into a fenced settle) by the
    call itself, so both work: awaiting this returns at once."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, None, None]:
        yield from ()

    def __repr__(self) -> str:
        return "<ack taken>"


ACKED = Acked()


class Consumer:
    """One taskiq worker process's side of the delivery protocol."""

    def __init__(
        self,
        core: Core,
        settings: WorkerSettings,
        *,
        find_task: Callable[[str], object | None],
        read_task_id: Callable[[bytes], str | None],
        counts_starts: bool,
        dead_letter_failures: bool,
        ack_linger: float = 0.0,
    ) -> None:
        check_settings(core, settings)
        self.core = core
        self.settings = settings
        self.name = settings.consumer
        self.token = secrets.token_hex(8)
        self.counters = WorkerCounters()
        self.ledger = Ledger(settings.pending_limit)
        self._find_task = find_task
        self._read_task_id = read_task_id
        self._counts_starts = counts_starts
        self._dead_letter_failures = dead_letter_failures
        self._ack_linger = ack_linger
        self._engine: Engine | None = None
        self.handover: Handover | None = None
        """Set once started (the middleware reports taskiq's starts and failures to it)."""
        self.ready = False
        """Set once the lease is held and fetching has begun (for tests and embedders)."""
        self.listeners = 0
        """The broker's listen() generators pulling from this consumer now."""

    # -- start --------------------------------------------------------------------------

    async def start(self) -> None:
        """Check the server, take the lease, start fetching."""
        engine = self._engine = Engine(
            self.core,
            self.settings,
            name=self.name,
            token=self.token,
            ledger=self.ledger,
            counters=self.counters,
            executor=self._handover_of,
            options=Options(
                runtime="taskiq",
                delivery=TaskiqDelivery,
                settle_linger=self._ack_linger,
                patient_fetch_stop=False,
                label="taskiq worker",
            ),
        )
        try:
            server = await engine.start()
        except BaseException:
            await engine.close()
            raise
        s = self.settings
        log.info(
            "taskiq worker %s serving queue %s on %s (%s) through Tether: max_pending=%d "
            "heartbeat %.2fs/ttl %.2fs reclaim every %.2fs max_deliveries=%d",
            self.name, ",".join(s.queues), engine.where, server, s.pending_limit,
            s.heartbeat_interval, s.heartbeat_ttl, s.reclaim_interval, s.max_deliveries,
        )  # fmt: skip
        self.ready = True

    def _handover_of(self, parts: Parts) -> Handover:
        self.handover = Handover(
            client=parts.client,
            consumer=parts.name,
            ledger=parts.ledger,
            counters=parts.counters,
            settle=parts.settle,
            wake=parts.wake,
            find_task=self._find_task,
            read_task_id=self._read_task_id,
            max_deliveries=self.settings.max_deliveries,
            result_ttl_ms=int(self.core.settings.result_ttl * 1000),
            counts_starts=self._counts_starts,
            dead_letter_failures=self._dead_letter_failures,
        )
        return self.handover

    @property
    def serving(self) -> bool:
        """Started and still fetching: a listener may pull from it."""
        engine = self._engine
        return self.ready and engine is not None and not engine.stopping()

    async def tasks_acknowledged(self) -> None:
        """Until every message whose task taskiq started is acknowledged (a receiver runs
        its tasks to the end after its listener stopped). Only the middleware tells a
        started message from one taskiq dropped unstarted; without it this returns at once."""
        engine = self._engine
        while engine is not None and self.handover is not None and self.handover.started > 0:
            await engine.wait_for_work(1.0)  # each ack wakes it

    # -- hand-over to taskiq ------------------------------------------------------------

    async def next(self) -> tuple[TaskiqDelivery, bytes] | None:
        """The next message for taskiq (its delivery and taskiq's bytes); None once
        stopping. Raises what stopped the fetch loops or the heartbeat."""
        engine, handover = self._engine, self.handover
        assert engine is not None, "used before start()"
        assert handover is not None
        while True:
            if engine.crash is not None:
                raise engine.crash
            if engine.stopping():
                return None
            delivery = handover.pick(engine.lease_held())
            if delivery is None:
                # While the lease is in doubt nothing is handed over; it is judged by time.
                timeout = None if engine.lease_held() else 0.05
                await engine.wait_for_work(timeout)
                continue
            data = await handover.admit(delivery)
            if data is not None:
                return delivery, data

    def ack(self, delivery: TaskiqDelivery) -> Acked:
        """taskiq acknowledged a message (the broker's ack callback): the ack is taken at
        once; what it returns may be awaited."""
        assert self.handover is not None
        self.handover.ack(delivery)
        return ACKED

    # -- stop ---------------------------------------------------------------------------

    async def stop_fetching(self) -> None:
        """taskiq stopped listening: fetch nothing more, and hand the entries it never got
        to other workers at once."""
        if self._engine is not None:
            await self._engine.stop_fetching()

    async def close(self) -> None:
        """Settle what taskiq acknowledged, hand off what is left, release the lease last."""
        engine = self._engine
        if engine is None:
            return
        try:
            if self.ready:
                # taskiq's receiver has finished its tasks before it closes the broker.
                await engine.shutdown(grace=0.0)
        finally:
            await engine.close()
