"""``TetherBroker``: a taskiq broker on Tether's delivery protocol."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import multiprocessing
import os
import re
import signal
import time
from collections.abc import AsyncGenerator, Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import redis.exceptions
from taskiq import AckableMessage, AsyncBroker, BrokerMessage

from ...base._errors import ConfigError, ServerError
from ...base._redis import AsyncClient
from ...base._settings import (
    WorkerSettings,
    _positive_int,
    check_name,
    refuse_unknown,
    seconds,
)
from ...dead import DeadLetters
from ...producer import enqueue_error, execute, plain_steps, scripted_steps
from ...producer._core import Core
from ...protocol._envelope import JsonSerializer
from ._consumer import Consumer
from ._delivery import _current
from ._middleware import TetherMiddleware
from ._wire import Kick, plan, taskiq_id_of, tether_id, wrap

log = logging.getLogger("tether.taskiq")

_TASKIQ_CHILD = re.compile(r"^worker-(\d+)$")
DUPLICATES_KEPT = 1000
"""Refused duplicates remembered until the middleware's post_send reads them."""


_BROKERS_OWN = {
    "queues": "the broker serves one queue: give queue=",
    "concurrency": "taskiq runs the tasks (--max-async-tasks): give max_pending=",
    "max_pending": "give the broker's max_pending=",
    "name": "give the broker's name=",
    "shutdown_grace": "taskiq's receiver finishes or cancels running tasks at shutdown; the "
    "broker hands the rest back at once",
    "scheduler": "a taskiq worker runs no Tether scheduler (taskiq has its own)",
    "metrics_port": "a taskiq worker serves no Tether metrics (tether exporter does)",
    "metrics_bind": "a taskiq worker serves no Tether metrics (tether exporter does)",
}
"""WorkerSettings fields the broker sets itself, and why an override of one is refused."""


def worker_settings(
    settings: WorkerSettings | None,
    overrides: dict[str, Any],
    *,
    queue: str,
    max_pending: int,
    name: str | None,
) -> WorkerSettings:
    """``settings`` (or the defaults) with ``overrides`` applied and the broker's own fields
    set; a bad or unknown override raises ConfigError naming it."""
    if settings is not None and not isinstance(settings, WorkerSettings):
        raise ConfigError(
            f"settings={settings!r}: expected a tether.WorkerSettings (or its fields as keywords)"
        )
    for key in overrides:
        if key in _BROKERS_OWN:
            raise ConfigError(f"TetherBroker sets {key} itself: {_BROKERS_OWN[key]}")
    own = set(inspect.signature(TetherBroker).parameters) - {"overrides"}
    refuse_unknown(WorkerSettings, overrides, where="TetherBroker", also=own)
    return replace(
        WorkerSettings() if settings is None else settings,
        **overrides,
        queues=(queue,),
        concurrency=max_pending,
        max_pending=max_pending,
        name=name,
        shutdown_grace=0.0,
        scheduler=False,
    )


class TetherBroker(AsyncBroker):
    """A taskiq broker with Tether's delivery promises: leases renewed by a thread, lock-free
    reclaim on a timer, fenced acks, a bound on what a worker holds, handoff at shutdown,
    quarantine of tasks that kill their workers, dead letters.

    The worker side runs on :class:`~tether.WorkerSettings`: give ``settings`` (a
    ``WorkerSettings``, for example one shared with ``tether worker`` processes), any of its
    fields as keywords (``heartbeat_ttl=30``, ``give_up_after=timedelta(minutes=1)``, applied
    over ``settings``), or both. They mean what they mean for a Tether worker, and a bad or
    unknown one raises :class:`~tether.ConfigError` when the broker is made. A few are the
    broker's own, replaced in ``settings`` and refused as keywords: it serves
    ``queues=(queue,)`` with ``concurrency`` and ``max_pending`` set to ``max_pending``
    (taskiq runs the tasks, up to its ``--max-async-tasks``), names its consumers from
    ``name``, hands what it holds back at once at shutdown (``shutdown_grace=0``: taskiq's
    receiver finishes or cancels running tasks) and runs no Tether scheduler or metrics
    server.

    Args:
        url: ``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://`` or
            ``redis+sentinel://``; default ``TETHER_URL``, else ``redis://localhost:6379/0``.
        queue: the Tether queue the messages go to (its own streams, delayed set and
            dead-letter stream).
        namespace: prefix of every key; default ``TETHER_NAMESPACE``, else ``tether``.
        settings: the worker settings; default ``WorkerSettings()``.
        max_pending: messages a worker process holds delivered and not yet acknowledged,
            across the queue's three priority streams: set it to taskiq's
            ``--max-async-tasks`` (plus ``--max-prefetch``).
        name: a stable consumer name (the pod name); each taskiq worker process adds its
            index (``pod-a-0``), so a process that taskiq restarts resumes its entries at
            once. Default: host-pid-random.
        dead_letter_failures: a task that raised and was not retried by taskiq goes to the
            dead-letter stream (status ``failed``), where ``tether dead retry`` can run it
            again.
        ack_linger: taskiq acknowledges each message on its own; an ack waits up to this
            long for others (at most half of ``max_pending``), so they share one fenced
            settle call and the capacity they free is fetched again in one read. 0 sends
            each ack at once (one settle and one fetch per message).
        result_ttl: how long outcome records are kept.
        dead_letter_maxlen: the approximate cap of the queue's dead-letter stream.
        socket_timeout: how long one command may wait for the server before it fails.
        **overrides: fields of :class:`~tether.WorkerSettings` (``heartbeat_interval``,
            ``heartbeat_ttl``, ``reclaim_interval``, ``stall_timeout``, ``max_deliveries``,
            ``give_up_after``, ``reclaim_page_size``, ``housekeeping_interval``,
            ``reconnect_max_delay``, ``health_file``, ...), applied over ``settings``.
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        queue: str = "taskiq",
        namespace: str | None = None,
        settings: WorkerSettings | None = None,
        max_pending: int = 100,
        name: str | None = None,
        dead_letter_failures: bool = True,
        ack_linger: float | timedelta = 0.005,
        result_ttl: float | timedelta = 3600.0,
        dead_letter_maxlen: int = 10_000,
        socket_timeout: float | timedelta = 10.0,
        **overrides: Any,
    ) -> None:
        super().__init__()
        self.core = Core(
            url,
            namespace=namespace,
            result_ttl=result_ttl,
            dead_letter_maxlen=dead_letter_maxlen,
            socket_timeout=socket_timeout,
            stats=False,
        )
        self.queue = check_name("queue", queue)
        # The worker's concurrency is taskiq's (--max-async-tasks); name the broker's setting.
        _positive_int("max_pending", max_pending)
        self._name = name
        # Validated now, so a bad setting fails when the module is imported.
        self._settings = worker_settings(
            settings, overrides, queue=queue, max_pending=max_pending, name=name
        )
        self._dead_letter_failures = bool(dead_letter_failures)
        self._ack_linger = seconds(ack_linger, "ack_linger", allow_zero=True)
        if self._ack_linger >= self._settings.heartbeat_interval:
            raise ConfigError(
                f"ack_linger={self._ack_linger:g} must stay below heartbeat_interval="
                f"{self._settings.heartbeat_interval:g}"
            )
        self._keys = self.core.keys(queue)
        self._envelopes = JsonSerializer()
        self.tether_consumer: Consumer | None = None
        """The worker side, while this process listens."""
        self._failures = 0
        """Listeners (or consumer starts) that failed in a row: the next one waits first."""
        self._join_lock: asyncio.Lock | None = None
        self._join_loop: asyncio.AbstractEventLoop | None = None
        self.tether_duplicates: dict[str, str] = {}
        """taskiq id of a refused duplicate -> taskiq id of the task holding its key."""
        self.add_middlewares(TetherMiddleware())

    def __repr__(self) -> str:
        return f"<TetherBroker {self.core.target.redacted} queue={self.queue!r}>"

    @property
    def namespace(self) -> str:
        return self.core.namespace

    def dead_letters(self) -> DeadLetters:
        """The queue's dead-letter stream (after :meth:`startup`): list, show, retry, purge,
        like ``tether dead ... --queue <queue>``."""
        return DeadLetters(self.core, self.queue)

    # -- lifecycle ----------------------------------------------------------------------

    async def startup(self) -> None:
        await super().startup()
        await self.core.open()

    async def shutdown(self) -> None:
        consumer, self.tether_consumer = self.tether_consumer, None
        if consumer is not None:
            await consumer.close()
        await super().shutdown()
        await self.core.close()

    # -- producing ----------------------------------------------------------------------

    async def kick(self, message: BrokerMessage) -> None:
        """Enqueue one message: an ``XADD``, or Tether's enqueue script when it is delayed
        (``delay`` label) or deduplicated (``dedup_key`` label). The ``queue_name`` label
        sends it to that queue of the broker's namespace (served by a broker made with
        ``queue=`` that name), as taskiq-redis sends it to the stream it names."""
        kick = plan(message.task_name, message.labels)
        client = await self._producer()
        try:
            await self._send(client, message, kick)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise enqueue_error(self.core, message.task_name, exc) from exc
        running = _current.get()
        if running is not None and running.taskiq_id == message.task_id:
            running.rekicked = True  # a taskiq retry of the task running in this context

    async def _send(self, client: AsyncClient, message: BrokerMessage, kick: Kick) -> None:
        """Tether's own enqueue steps (``tether.producer``) with taskiq's message inside."""
        now_ms = int(time.time() * 1000)
        queue = kick.queue or self.queue
        keys = self._keys if kick.queue is None else self.core.keys(kick.queue)
        if kick.plain:
            payload = wrap(
                self._envelopes,
                task_name=message.task_name,
                taskiq_id=message.task_id,
                message=message.message,
                now_ms=now_ms,
            )
            steps = plain_steps(keys.streams[kick.sidx - 1], [payload], replicas=False)
            await execute(self.core, steps, client)
            return
        task_id = tether_id(queue, message.task_id)
        payload = wrap(
            self._envelopes,
            task_name=message.task_name,
            taskiq_id=message.task_id,
            message=message.message,
            now_ms=now_ms,
            task_id=task_id,
            kick=kick,
        )
        mode, when = ("r", kick.delay_ms) if kick.delay_ms is not None else ("n", 0)
        steps = scripted_steps(
            keys, kick.sidx, [task_id], [payload], mode=mode, when=when,
            dedup_key=keys.dedup(kick.dedup_key) if kick.dedup_key is not None else None,
        )  # fmt: skip
        (reply,) = await execute(self.core, steps, client)
        if reply.duplicate_of is None:
            return
        holder = taskiq_id_of(queue, reply.duplicate_of)
        if holder == message.task_id:
            # taskiq kicked the task holding the key again (a retry): it is that task.
            await self._send(client, message, replace(kick, dedup_key=None, dedup_ttl=None))
            return
        log.info(
            "task %s (%s) not enqueued: task %s holds its dedup key %r",
            message.task_name, message.task_id, holder, kick.dedup_key,
        )  # fmt: skip
        duplicates = self.tether_duplicates
        if len(duplicates) >= DUPLICATES_KEPT:
            duplicates.pop(next(iter(duplicates)))
        duplicates[message.task_id] = holder

    async def _producer(self) -> AsyncClient:
        if not self.core.is_open:  # taskiq asks producers to call startup(); be forgiving
            await self.core.open()
        return self.core.client

    # -- consuming ----------------------------------------------------------------------

    async def listen(self) -> AsyncGenerator[AckableMessage, None]:
        """Messages for taskiq's receiver, each acknowledged by a fenced settle.

        Listeners running at once (two receivers on one broker, as ``RedisStreamBroker``
        serves them) pull from this process's one consumer: a message goes to one of them.
        A listener started after every earlier one ended gets a fresh consumer, once the
        tasks those started are acknowledged. After a listener failed, the next one starts
        after a pause that grows with each failure (``reconnect_delay``), so a receiver that
        listens again at once (taskiq's ``run_receiver_task``) never spins."""
        consumer = await self._join()
        try:
            with self._failure_counted():
                while True:
                    got = await consumer.next()
                    if got is None:
                        return
                    delivery, data = got
                    self._failures = 0
                    ack = functools.partial(consumer.ack, delivery)
                    yield AckableMessage(data=data, ack=ack)
        finally:
            consumer.listeners -= 1
            if consumer.listeners == 0:
                await consumer.stop_fetching()

    async def _join(self) -> Consumer:
        """The consumer a new listener pulls from: the serving one, else a fresh one."""
        async with self._joining():
            current = self.tether_consumer
            if current is not None and current.serving:
                current.listeners += 1
                return current
            if current is not None:
                await self._retire(current)
            if self._failures:
                pause = self._settings.reconnect_delay(self._failures)
                log.warning(
                    "the last listener of this broker failed (%d in a row): listening "
                    "again in %.2fs", self._failures, pause,
                )  # fmt: skip
                await asyncio.sleep(pause)
            consumer = self.tether_consumer = Consumer(
                self.core,
                replace(self._settings, name=self._consumer_name()),
                find_task=self.find_task,
                read_task_id=self._read_task_id,
                counts_starts=any(isinstance(m, TetherMiddleware) for m in self.middlewares),
                dead_letter_failures=self._dead_letter_failures,
                ack_linger=self._ack_linger,
            )
            with self._failure_counted():
                await consumer.start()
            consumer.listeners += 1
            return consumer

    @contextlib.contextmanager
    def _failure_counted(self) -> Iterator[None]:
        """A listener, or its consumer's start, failed: the next listener waits longer
        first, and a refusal no retry fixes stops taskiq's process manager too."""
        try:
            yield
        except ServerError as exc:
            self._failures += 1
            _stop_taskiq_process_manager(exc)
            raise
        except Exception:
            self._failures += 1
            raise

    async def _retire(self, consumer: Consumer) -> None:
        """Close a consumer every listener has left: settle what taskiq acknowledged, hand
        the rest back, release the lease. The tasks taskiq started from it finish first
        (their acks are its fenced settles), so the fresh consumer, under the same name,
        takes over none of them while they run."""
        if consumer.handover is not None and consumer.handover.started:
            log.info(
                "waiting for %d tasks the previous listener started to be acknowledged "
                "before listening again", consumer.handover.started,
            )  # fmt: skip
            await consumer.tasks_acknowledged()
        self.tether_consumer = None
        await consumer.close()

    def _joining(self) -> asyncio.Lock:
        """One listener joins at a time (a lock of the running loop)."""
        loop = asyncio.get_running_loop()
        if self._join_lock is None or self._join_loop is not loop:
            self._join_loop, self._join_lock = loop, asyncio.Lock()
        return self._join_lock

    def _read_task_id(self, data: bytes) -> str | None:
        """The task id in taskiq's bytes as its receiver reads them (this broker's
        formatter), or None when the receiver could not read them."""
        try:
            message = self.formatter.loads(message=data)
            message.parse_labels()
        except Exception:
            return None
        return message.task_id

    def _consumer_name(self) -> str | None:
        """The stable name, with the index of taskiq's worker process when it runs several."""
        if self._name is None:
            return None  # WorkerSettings makes host-pid-random in this very process
        child = _TASKIQ_CHILD.match(multiprocessing.current_process().name)
        return self._name if child is None else f"{self._name}-{child.group(1)}"


def _stop_taskiq_process_manager(exc: ServerError) -> None:
    """A refusal no retry fixes (a wrong password, a missing permission, a refused
    certificate, a server too old) stopped this worker process. taskiq's process manager
    restarts a dead worker process every second, forever, and each would be refused the
    same way: ask the manager to shut down instead (as SIGTERM does), so ``taskiq worker``
    stops at once with the reason in its log."""
    if _TASKIQ_CHILD.match(multiprocessing.current_process().name) is None:
        return  # not under taskiq's process manager: the caller sees the error
    manager = os.getppid()
    if manager <= 1:
        return
    log.error("%s; no restart can fix this: stopping taskiq's worker processes", exc)
    os.kill(manager, signal.SIGTERM)
