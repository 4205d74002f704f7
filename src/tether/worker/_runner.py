"""Running deliveries: a bounded set of running tasks and a buffer ordered by priority.

Async tasks run on the event loop; plain functions in a thread pool of ``concurrency``
threads. A sync task past its timeout cannot be killed inside its thread: its outcome is
recorded as timed out, and its slot stays taken until the thread really returns, so the
worker never runs more than ``concurrency`` things at once.

An entry that waits in the buffer starts only while the worker's lease is known to be held
(renewed within the lease's time to live). A worker frozen past its lease may have lost its
buffered entries to other workers; it starts none of them until the heartbeat has either
confirmed the lease never lapsed, or found it lapsed, and then the buffer is dropped.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..base._context import LazyContext
from ..base._errors import TaskTimeout
from ..base._faults import Fault, UnknownReplies, classify
from ..base._middleware import call_hooks
from ..base._settings import PRIORITIES
from ..protocol import scripts
from ..protocol._envelope import BadEnvelope, Envelope
from ..protocol._keys import derived_task_id
from . import _attempt as attempt
from . import _outcome as policy
from ._outcome import Outcome, Target
from ._stats import Observation
from ._waiting import Waiting, quarantine_reason

if TYPE_CHECKING:
    from ..base._redis import AsyncClient
    from ..producer._core import Core, RegisteredTask
    from ._flow import FlowControl
    from ._ledger import Ledger
    from ._state import Delivery, WorkerCounters

log = logging.getLogger("tether.worker")


class Runner:
    def __init__(
        self,
        app: Core,
        *,
        client: AsyncClient,
        ledger: Ledger,
        concurrency: int,
        worker_name: str,
        max_deliveries: int,
        counters: WorkerCounters,
        settle: Callable[[Delivery, Outcome], None],
        lease_held: Callable[[], bool],
        flow: FlowControl | None = None,
        measure_wait: bool = False,
    ) -> None:
        self.app = app
        self.client = client
        self.ledger = ledger
        self.concurrency = concurrency
        self.worker_name = worker_name
        self.max_deliveries = max_deliveries
        self.counters = counters
        self._settle = settle
        self._lease_held = lease_held
        self._flow = flow
        self.waiting: Waiting[Delivery] = Waiting()
        """What waits to start (suspects run alone: see _waiting.py)."""
        self.running: dict[Delivery, asyncio.Task[None]] = {}
        self.busy = 0
        """Slots in use: running tasks plus threads still busy past their timeout."""
        self._threads = ThreadPoolExecutor(concurrency, thread_name_prefix="tether-task")
        self._idle = asyncio.Event()
        self._idle.set()
        self._shutting_down = False
        self._loop = asyncio.get_running_loop()
        self._default_result_ttl_ms = int(app.settings.result_ttl * 1000)
        self._measure_wait = app.settings.stats or measure_wait
        """Wait times are measured for the statistics, and for the metrics when asked."""
        self._scopes = attempt.Scopes()

    # -- admission ----------------------------------------------------------------------

    def submit(self, delivery: Delivery) -> None:
        waiting = self.waiting
        if (
            self.busy < self.concurrency
            and not waiting.count
            and waiting.alone is None
            and not (delivery.suspect and delivery.deliveries >= 2)  # Waiting.is_suspect
        ):
            self._start(delivery)
        else:
            waiting.add(delivery)
            self.schedule()

    def _start(self, delivery: Delivery) -> None:
        self.busy += 1
        self._idle.clear()
        delivery.started = True
        self.running[delivery] = self._loop.create_task(self._execute(delivery))

    def schedule(self) -> None:
        """Start what may start (see ``Waiting.next``); none while the lease is in doubt."""
        waiting = self.waiting
        if self._shutting_down or not waiting.count or not self._lease_held():
            return
        while self.busy < self.concurrency:
            delivery = waiting.next(self.busy)
            if delivery is None:
                return
            self._start(delivery)

    def resume(self) -> None:
        """The lease is known to be held again: start what waits."""
        self.schedule()

    def _free_slot(self, delivery: Delivery) -> None:
        self.busy -= 1
        waiting = self.waiting
        if waiting.alone is delivery:  # Waiting.ended, inline: this runs once per task
            waiting.alone = None
        self.schedule()
        if self.busy == 0:
            self._idle.set()

    def _thread_returned(self, delivery: Delivery) -> None:
        self._free_slot(delivery)
        if self._flow is not None and delivery.hold is not None:
            self._flow.release_later(delivery)

    def take_buffered(self) -> list[Delivery]:
        """Remove and return every delivery that has not started (for a handoff, or to drop
        them when the lease lapsed)."""
        return self.waiting.take_all()

    @property
    def buffered(self) -> int:
        return len(self.waiting)

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    def cancel_running(self) -> list[Delivery]:
        """At the end of the grace period: cancel what still runs; return its deliveries."""
        self._shutting_down = True
        stuck = list(self.running)
        for task in self.running.values():
            task.cancel()
        return stuck

    def request_cancel(self, task_ids: set[str]) -> None:
        """A user asked to cancel these tasks: cancel them if they run here."""
        for delivery, task in list(self.running.items()):
            env = delivery.envelope
            if env is None or env.id not in task_ids:
                continue
            fn = self.app.tasks.get(env.task)
            if fn is not None and not fn.is_async:
                # A thread cannot be interrupted: let it finish and record its real outcome.
                log.warning(
                    "task %s runs in a thread and cannot be cancelled; it runs to the end", env.id
                )
                continue
            delivery.cancel_requested = True
            task.cancel()

        def asked(delivery: Delivery) -> bool:
            env = delivery.envelope or _peek_envelope(self.app, delivery)
            if env is None or env.id not in task_ids:
                return False
            delivery.envelope = env
            return True

        for delivery in list(self.waiting.take_where(asked)):
            self._settle(delivery, self._cancelled(delivery, delivery.envelope))

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

    # -- execution ----------------------------------------------------------------------

    async def _execute(self, delivery: Delivery) -> None:
        free_slot = True
        outcome: Outcome | None
        try:
            outcome, free_slot = await self._run(delivery)
        except asyncio.CancelledError:
            if self._shutting_down and not delivery.cancel_requested:
                return  # handed off by the shutdown
            outcome = self._cancelled(delivery, delivery.envelope)
        except Exception as exc:  # a bug in Tether itself: keep the payload in the dead letters
            log.exception("internal error running entry %s", delivery.entry_id.decode())
            env = delivery.envelope or _peek_envelope(self.app, delivery)
            outcome = await self._dead(
                delivery,
                env,
                f"internal error in the worker: {exc!r}",
                env.id if env else _derived_id(delivery),
            )
        finally:
            self.running.pop(delivery, None)
            if free_slot:
                self._free_slot(delivery)
        if outcome is None:
            self.ledger.release([delivery])
        else:
            self._settle(delivery, outcome)

    async def _run(self, delivery: Delivery) -> tuple[Outcome | None, bool]:
        """Run one delivery; return its outcome (None when it is no longer ours) and whether
        its slot is free now."""
        app = self.app
        if delivery.suspect:
            proceed, early = await self._admit_suspect(delivery)
            if not proceed:
                return early, True
        resolved = await self._resolve(delivery)
        if not isinstance(resolved, tuple):
            return resolved, True
        env, task, target = resolved
        cfg = task.config
        opts = env.options
        retries = opts.get("retries", cfg.retries)
        # In TaskContext's field order; built only if the task or a hook asks for it.
        ctx = LazyContext(
            env.id, env.task, delivery.queue.name, PRIORITIES[delivery.sidx - 1], env.attempt,
            retries + 1, delivery.deliveries, env.enqueued_ms, self.worker_name,
            opts.get("schedule"), opts.get("tick"), env.headers or {},
        )  # fmt: skip
        now_ms = time.time() * 1000
        env.started_ms = int(now_ms)
        if self._measure_wait:
            delivery.wait_ms = max(0.0, now_ms - (env.due_ms or env.enqueued_ms))
        call_sync = None if task.is_async else functools.partial(self._run_sync, delivery)
        started = time.monotonic()
        try:
            ran = await attempt.run_attempt(
                app, task, env, ctx, opts.get("timeout", cfg.timeout), self._scopes, call_sync
            )
        except asyncio.CancelledError:
            # Cancelled on request (or by the shutdown): the statistics count the attempt.
            delivery.run_ms = (time.monotonic() - started) * 1000
            raise
        delivery.run_ms = ran.run_ms
        exc = ran.error
        if exc is None:
            try:
                outcome = policy.success(target, app.serializer, env, ran.value)
            except Exception as error:
                exc = attempt.result_error(app.serializer, ran.value, error)
        free_slot = True
        if exc is not None:
            if isinstance(exc, TaskTimeout):
                self.counters.timed_out += 1
                delivery.timed_out = True
                free_slot = not exc.slot_kept
            outcome = await self._after_failure(
                delivery, env, task, target, ctx, exc, retries, ran.retry_headers
            )
            return outcome, free_slot
        self.counters.succeeded += 1
        if app.middleware:
            await attempt.after_success(app, ctx, ran.value)
        return outcome, free_slot

    async def _resolve(
        self, delivery: Delivery
    ) -> tuple[Envelope, RegisteredTask, Target] | Outcome | None:
        """Decode the entry and find its task, or the dead-letter outcome saying why not;
        None when a flow-control limit held it back (it left the stream to wait)."""
        try:
            env = Envelope.decode(delivery.payload, self.app.serializer)
        except BadEnvelope as bad:
            log.error("entry %s cannot be run: %s", delivery.entry_id.decode(), bad.reason)
            return await self._dead(
                delivery, None, bad.reason, bad.task_id or _derived_id(delivery)
            )
        bound = bool(env.id)
        if not bound:  # a plain enqueue: the stream entry is the task's identity
            env.id = _derived_id(delivery)
        delivery.envelope = env
        task = attempt.runnable(self.app, env, arity_checked=True)
        if isinstance(task, str):
            log.error("entry %s cannot be run: %s", delivery.entry_id.decode(), task)
            return await self._dead(delivery, env, task)
        store = bool(env.options.get("store_result", task.config.store_result))
        target = Target.of(delivery.queue.keys, env, bound, store, self._ttl_ms(task))
        flow = self._flow
        if flow is not None and flow.applies(delivery.queue, env.task):
            admitted = await flow.admit(delivery, env, bound, task.config.limits)
            return (env, task, target) if admitted else None
        return env, task, target

    async def _admit_suspect(self, delivery: Delivery) -> tuple[bool, Outcome | None]:
        """A reclaimed entry: quarantine it if it was started too often, else count this
        start. Returns (run it, the outcome when not)."""
        reason = quarantine_reason(delivery, self.max_deliveries)
        if reason is not None:
            env = _peek_envelope(self.app, delivery)
            self.counters.quarantined += 1
            log.error("quarantined entry %s: %s", delivery.entry_id.decode(), reason)
            return False, await self._dead(delivery, env, reason)
        count = await self._count_start(delivery)
        if count is None:
            return False, None
        if count == 0:
            log.warning("entry %s changed owner before it started", delivery.entry_id.decode())
            return False, None
        delivery.deliveries, delivery.counted = count, True
        return True, None

    async def _count_start(self, delivery: Delivery) -> int | None:
        """Count this start on the server; None when the entry was lost with its stream.

        A transient error is not the task's fault: the call is sent again, holding the
        entry and its slot (forgetting it would let the worker take another entry while the
        server still counts this one as its own). The call is idempotent, so a start whose
        reply was lost counts once and cannot push the task toward quarantine."""
        call = scripts.start(
            delivery.stream, self.worker_name, delivery.entry_id, delivery.deliveries
        )
        unknown = UnknownReplies()
        failures = 0
        while True:
            try:
                return await call.run(self.client)
            except Exception as exc:
                fault = classify(exc)
                if fault is Fault.LOST:
                    log.warning(
                        "entry %s was lost with its stream (%s)", delivery.entry_id.decode(), exc
                    )
                    self.counters.lost_by_server += 1
                    return None
                if fault in (Fault.INTERNAL, Fault.FATAL) or (
                    fault is Fault.UNKNOWN and unknown.failed(exc, "counting a start")
                ):
                    raise
                failures += 1
                if failures == 1:
                    log.warning(
                        "could not count the start of entry %s (%s); retrying until the "
                        "server answers",
                        delivery.entry_id.decode(),
                        exc,
                    )
                await asyncio.sleep(min(2.0, 0.05 * 2**failures))

    async def _run_sync(
        self, delivery: Delivery, task: RegisteredTask, env: Envelope, timeout: float | None
    ) -> Any:
        """A plain function, in the pool's threads, with this context (``current_task()``)."""
        assert task.fn is not None
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, task.fn, *env.args, **env.kwargs)
        future = self._loop.run_in_executor(self._threads, call)
        if timeout is None:
            return await future
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except asyncio.TimeoutError:
            # The thread cannot be stopped: keep its slot until it returns (and its
            # flow-control slots too: it still calls whatever they protect).
            future.add_done_callback(lambda _f: self._thread_returned(delivery))
            if delivery.hold is not None:
                delivery.hold.kept = True
            error = TaskTimeout(f"task {task.name!r} ran past its timeout of {timeout}s")
            error.slot_kept = True
            raise error from None

    # -- outcomes -----------------------------------------------------------------------

    def _ttl_ms(self, task: RegisteredTask | None) -> int:
        if task is not None and task.config.result_ttl is not None:
            return int(task.config.result_ttl * 1000)
        return self._default_result_ttl_ms

    async def _after_failure(
        self,
        delivery: Delivery,
        env: Envelope,
        task: RegisteredTask,
        target: Target,
        ctx: LazyContext,
        exc: BaseException,
        retries: int,
        retry_headers: dict[str, str] | None = None,
    ) -> Outcome:
        """``retry_headers``: what a run scope set for the next attempt (else the task's
        headers go with it unchanged)."""
        failure = attempt.judge(exc, task, env.attempt, retries)
        decision, err = failure.decision, failure.err
        if decision.retry:
            nxt = Envelope(
                env.id, env.task, env.args, env.kwargs, env.enqueued_ms,
                env.attempt + (1 if decision.counts else 0), env.options,
                int(time.time() * 1000 + decision.delay * 1000),
                env.headers if retry_headers is None else retry_headers or None, env.extra,
            )  # fmt: skip
            # Promotion starts it: this worker wakes for its next maintenance when it is
            # due, so a short delay is kept (not stretched to the next reclaim_interval); a
            # push-back from RateLimited is promoted on time by flow control's timer.
            due = time.monotonic() + decision.delay
            if self._flow is not None and not decision.counts:
                self._flow.wake_at(delivery.queue, due)
            else:
                delivery.queue.note_due(due)
            if decision.counts:
                self.counters.retried += 1
                log.info(
                    "task %s (%s) attempt %d of %d failed with %s; retry due in %.2fs",
                    env.task, env.id, env.attempt, retries + 1, err["type"], decision.delay,
                )  # fmt: skip
            else:
                self.counters.rate_limited += 1
                delivery.pushed_back = True
                log.info(
                    "task %s (%s) was rate limited (%s); runs again in %.2fs, attempt %d "
                    "not counted", env.task, env.id, err["message"], decision.delay, env.attempt,
                )  # fmt: skip
            await attempt.after_retry(self.app, ctx, exc, decision.delay)
            return policy.retry(
                target,
                self.app.serializer,
                env,
                err,
                decision.delay,
                nxt.encode(self.app.serializer),
            )
        self.counters.failed += 1
        self.counters.dead_lettered += 1
        reason = failure.reason(env.attempt)
        log.warning("task %s (%s) %s", env.task, env.id, reason, exc_info=exc)
        await attempt.after_failure(self.app, ctx, env.id, exc, reason)
        return policy.failure(target, self.app.serializer, env, err, reason)

    async def _dead(
        self, delivery: Delivery, env: Envelope | None, reason: str, task_id: str = ""
    ) -> Outcome:
        self.counters.dead_lettered += 1
        if self.app.middleware:
            await call_hooks(
                self.app.middleware, "on_dead", None, env.id if env else task_id, reason
            )
        if env is None:
            return policy.dead(None, self.app.serializer, None, reason, task_id)
        task = self.app.tasks.get(env.task)
        target = Target.of(
            delivery.queue.keys, env, delivery_bound(delivery, env), True, self._ttl_ms(task)
        )
        return policy.dead(target, self.app.serializer, env, reason)

    def _cancelled(self, delivery: Delivery, env: Envelope | None) -> Outcome:
        self.counters.cancelled += 1
        if env is None:
            return policy.cancelled(None, self.app.serializer, None)
        task = self.app.tasks.get(env.task)
        target = Target.of(
            delivery.queue.keys, env, delivery_bound(delivery, env), True, self._ttl_ms(task)
        )
        return policy.cancelled(target, self.app.serializer, env)


def delivery_bound(delivery: Delivery, env: Envelope) -> bool:
    """Whether the envelope carried its own id (a derived id is the entry's by nature)."""
    return env.id != _derived_id(delivery)


def _peek_envelope(app: Core, delivery: Delivery) -> Envelope | None:
    try:
        env = Envelope.decode(delivery.payload, app.serializer)
    except BadEnvelope:
        return None
    if not env.id:
        env.id = _derived_id(delivery)
    return env


def _derived_id(delivery: Delivery) -> str:
    return derived_task_id(delivery.queue.name, delivery.sidx, delivery.entry_id.decode())


def observation(delivery: Delivery, outcome: Outcome) -> Observation | None:
    """What a finished delivery adds to the statistics (None when it never ran)."""
    env = delivery.envelope
    if env is None or delivery.run_ms is None:
        return None
    op = outcome.op
    name = "ok" if op == "o" else op
    return Observation(
        env.task, name, delivery.run_ms, delivery.wait_ms, delivery.timed_out,
        delivery.pushed_back,
    )  # fmt: skip
