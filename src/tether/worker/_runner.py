"""Running deliveries: a bounded set of running tasks and a buffer ordered by priority.

Async tasks run on the event loop; plain functions in a thread pool of ``concurrency``
threads. A sync task past its timeout cannot be killed inside its thread: its outcome is
recorded as timed out, and its slot stays taken until the thread really returns, so the
worker never runs more than ``concurrency`` things at once.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .._context import LazyContext, _current
from .._envelope import BadEnvelope, Envelope
from .._errors import Retry
from .._keys import derived_task_id
from .._middleware import call_hooks
from .._settings import PRIORITIES
from ._outcome import Outcome, error_fields, make_record

if TYPE_CHECKING:
    from .._app import Tether
    from .._task import Task
    from ._state import Delivery, WorkerCounters

log = logging.getLogger("tether.worker")


class TaskTimeout(TimeoutError):
    """The task ran past its timeout."""

    slot_kept = False
    """True when a sync task's thread still runs and keeps its slot until it returns."""


class Runner:
    def __init__(
        self,
        app: Tether,
        *,
        concurrency: int,
        worker_name: str,
        max_deliveries: int,
        counters: WorkerCounters,
        settle: Callable[[Delivery, Outcome], None],
        mark_started: Callable[[Delivery], Awaitable[int]],
        forget: Callable[[Delivery], None],
    ) -> None:
        self.app = app
        self.concurrency = concurrency
        self.worker_name = worker_name
        self.max_deliveries = max_deliveries
        self.counters = counters
        self._settle = settle
        self._mark_started = mark_started
        self._forget = forget
        self.buffers: tuple[deque[Delivery], ...] = (deque(), deque(), deque())
        self.suspects: deque[Delivery] = deque()
        """Entries started twice or more without an outcome: each runs alone, so a task
        that kills its worker cannot take innocent neighbours with it."""
        self._alone: Delivery | None = None
        self.running: dict[Delivery, asyncio.Task[None]] = {}
        self.busy = 0
        """Slots in use: running tasks plus threads still busy past their timeout."""
        self._threads = ThreadPoolExecutor(concurrency, thread_name_prefix="tether-task")
        self._idle = asyncio.Event()
        self._idle.set()
        self._shutting_down = False
        self._loop = asyncio.get_running_loop()
        self._default_result_ttl_ms = int(app.settings.result_ttl * 1000)

    # -- admission ----------------------------------------------------------------------

    def submit(self, delivery: Delivery) -> None:
        if delivery.suspect and delivery.deliveries >= 2:
            self.suspects.append(delivery)
            self._schedule()
        elif self.busy < self.concurrency and self._alone is None and not self.suspects:
            self._start(delivery)
        else:
            self.buffers[delivery.sidx - 1].append(delivery)

    def _start(self, delivery: Delivery) -> None:
        self.busy += 1
        self._idle.clear()
        delivery.started = True
        self.running[delivery] = self._loop.create_task(self._execute(delivery))

    def _schedule(self) -> None:
        """Start what may start: a suspect once nothing else runs, else by priority."""
        if self._shutting_down or self._alone is not None:
            return
        if self.suspects:
            if self.busy == 0:
                self._alone = self.suspects.popleft()
                self._start(self._alone)
            return
        for buffer in self.buffers:
            while buffer and self.busy < self.concurrency:
                self._start(buffer.popleft())

    def _free_slot(self, delivery: Delivery) -> None:
        self.busy -= 1
        if self._alone is delivery:
            self._alone = None
        self._schedule()
        if self.busy == 0:
            self._idle.set()

    def take_buffered(self) -> list[Delivery]:
        """Remove and return every delivery that has not started (for the handoff)."""
        out: list[Delivery] = list(self.suspects)
        self.suspects.clear()
        for buffer in self.buffers:
            out.extend(buffer)
            buffer.clear()
        return out

    @property
    def buffered(self) -> int:
        return len(self.suspects) + sum(len(b) for b in self.buffers)

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
        for buffer in (self.suspects, *self.buffers):
            for delivery in list(buffer):
                env = delivery.envelope or _peek_envelope(self.app, delivery)
                if env is not None and env.id in task_ids:
                    buffer.remove(delivery)
                    delivery.envelope = env
                    self._settle(delivery, self._cancelled(delivery, env))

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

    # -- execution ----------------------------------------------------------------------

    async def _execute(self, delivery: Delivery) -> None:
        free_slot = True
        try:
            outcome, free_slot = await self._run(delivery)
        except asyncio.CancelledError:
            if self._shutting_down and not delivery.cancel_requested:
                return  # handed off by the shutdown
            outcome = self._cancelled(delivery, delivery.envelope)
        except Exception as exc:  # a bug in Tether itself: keep the payload in the dead letters
            log.exception("internal error running entry %s", delivery.entry_id)
            outcome = Outcome("dead", a1=f"internal error in the worker: {exc!r}")
        finally:
            self.running.pop(delivery, None)
            if free_slot:
                self._free_slot(delivery)
        if outcome is None:
            self._forget(delivery)
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
        if isinstance(resolved, Outcome):
            return resolved, True
        env, task = resolved
        cfg = task.config
        opts = env.options
        retries = opts.get("retries", cfg.retries)
        # In TaskContext's field order; built only if the task or a hook asks for it.
        ctx = LazyContext(
            env.id, env.task, delivery.queue.name, PRIORITIES[delivery.sidx - 1], env.attempt,
            retries + 1, delivery.deliveries, env.enqueued_ms, self.worker_name,
            opts.get("schedule"), opts.get("tick"),
        )  # fmt: skip
        timeout = opts.get("timeout", cfg.timeout)
        middleware = app.middleware
        if middleware:
            await call_hooks(middleware, "before_run", ctx.get())
        token = _current.set(ctx)
        free_slot = True
        try:
            if task.is_async:
                coro = task.fn(*env.args, **env.kwargs)
                if timeout is None:
                    value = await coro
                else:
                    value = await _with_timeout(coro, timeout)
            else:
                value, free_slot = await self._run_sync(delivery, task, env, timeout)
        except Exception as exc:  # the task's error becomes its outcome
            if isinstance(exc, TaskTimeout) and exc.slot_kept:
                free_slot = False
            outcome = await self._after_failure(delivery, env, task, ctx, exc, retries)
            return outcome, free_slot
        finally:
            _current.reset(token)
        outcome = self._succeeded(delivery, env, task, value)
        if middleware:
            await call_hooks(middleware, "after_run", ctx.get(), "succeeded", value, None)
        return outcome, free_slot

    async def _resolve(self, delivery: Delivery) -> tuple[Envelope, Task[Any, Any]] | Outcome:
        """Decode the entry and find its task, or the dead-letter outcome saying why not."""
        try:
            env = Envelope.decode(delivery.payload, self.app.serializer)
        except BadEnvelope as bad:
            log.error("entry %s cannot be run: %s", delivery.entry_id.decode(), bad.reason)
            return await self._dead(
                delivery, None, bad.reason, bad.task_id or _derived_id(delivery)
            )
        if not env.id:  # a plain enqueue: the stream entry is the task's identity
            env.id = _derived_id(delivery)
            delivery.indexed = False
        delivery.envelope = env
        task = self.app.tasks.get(env.task)
        if task is None:
            reason = f"unknown task {env.task!r}: this worker has no task registered by that name"
            log.error("entry %s cannot be run: %s", delivery.entry_id.decode(), reason)
            return await self._dead(delivery, env, reason)
        return env, task

    async def _admit_suspect(self, delivery: Delivery) -> tuple[bool, Outcome | None]:
        """A reclaimed entry: quarantine it if it was started too often, else count this
        start. Returns (run it, the outcome when not)."""
        if delivery.deliveries >= self.max_deliveries:
            env = _peek_envelope(self.app, delivery)
            self.counters.quarantined += 1
            reason = f"delivered {delivery.deliveries} times; its workers died"
            log.error("quarantined entry %s: %s", delivery.entry_id.decode(), reason)
            return False, await self._dead(delivery, env, reason)
        count = await self._mark_started(delivery)
        if count == 0:
            log.warning("entry %s changed owner before it started", delivery.entry_id.decode())
            return False, None
        delivery.deliveries, delivery.counted = count, True
        return True, None

    async def _run_sync(
        self, delivery: Delivery, task: Task[Any, Any], env: Envelope, timeout: float | None
    ) -> tuple[Any, bool]:
        ctx = contextvars.copy_context()
        call = functools.partial(ctx.run, task.fn, *env.args, **env.kwargs)
        future = self._loop.run_in_executor(self._threads, call)
        if timeout is None:
            return await future, True
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout), True
        except asyncio.TimeoutError:
            # The thread cannot be stopped: keep its slot until it returns.
            future.add_done_callback(lambda _f: self._free_slot(delivery))
            error = TaskTimeout(f"task {task.name!r} ran past its timeout of {timeout}s")
            error.slot_kept = True
            raise error from None

    # -- outcomes -----------------------------------------------------------------------

    def _result_keys(self, delivery: Delivery, env: Envelope, store: bool) -> dict[str, Any]:
        keys = delivery.queue.keys
        out: dict[str, Any] = {"task_id": env.id}
        if store:
            out["result_key"] = keys.result(env.id)
            out["done_key"] = keys.done(env.id)
        key = env.options.get("key")
        if key is not None:
            out["dedup_key"] = keys.dedup(key)
            ttl = env.options.get("key_ttl")
            out["dedup_hold_ms"] = int(ttl * 1000) if ttl else 0
        return out

    def _ttl_ms(self, task: Task[Any, Any] | None) -> int:
        if task is not None and task.config.result_ttl is not None:
            return int(task.config.result_ttl * 1000)
        return self._default_result_ttl_ms

    def _store(self, env: Envelope, task: Task[Any, Any] | None) -> bool:
        default = task.config.store_result if task is not None else True
        return bool(env.options.get("store_result", default))

    def _succeeded(
        self, delivery: Delivery, env: Envelope, task: Task[Any, Any], value: Any
    ) -> Outcome:
        self.counters.succeeded += 1
        store = self._store(env, task)
        if not store and "key" not in env.options:
            return Outcome("ok", env.id) if delivery.indexed else Outcome("o")
        record = b""
        if store:
            try:
                record = make_record(
                    self.app.serializer, "succeeded", env.task, env.attempt, value=value
                )
            except Exception as exc:
                err = error_fields(exc)
                err["message"] = f"the result ({type(value).__name__}) cannot be serialized: {exc}"
                record = make_record(
                    self.app.serializer, "failed", env.task, env.attempt, error=err
                )
        return Outcome(
            "ok",
            record=record,
            ttl_ms=self._ttl_ms(task),
            **self._result_keys(delivery, env, store),
        )

    async def _after_failure(
        self,
        delivery: Delivery,
        env: Envelope,
        task: Task[Any, Any],
        ctx: LazyContext,
        exc: Exception,
        retries: int,
    ) -> Outcome:
        cfg = task.config
        err = error_fields(exc)
        store = self._store(env, task)
        wants_retry = isinstance(exc, (Retry, *cfg.retry_on))
        middleware = self.app.middleware
        if wants_retry and env.attempt <= retries:
            delay = (
                exc.delay
                if isinstance(exc, Retry) and exc.delay is not None
                else cfg.retry_delay(env.attempt)
            )
            nxt = Envelope(
                env.id,
                env.task,
                env.args,
                env.kwargs,
                env.enqueued_ms,
                env.attempt + 1,
                env.options,
            )
            self.counters.retried += 1
            log.info(
                "task %s (%s) attempt %d/%d failed with %s; retrying in %.2fs",
                env.task,
                env.id,
                env.attempt,
                retries + 1,
                err["type"],
                delay,
            )
            record = (
                make_record(self.app.serializer, "retrying", env.task, env.attempt, error=err)
                if store
                else b""
            )
            if middleware:
                await call_hooks(middleware, "on_retry", ctx.get(), exc, delay)
            keys = self._result_keys(delivery, env, store)
            return Outcome(
                "retry",
                record=record,
                ttl_ms=self._ttl_ms(task),
                a1=int(delay * 1000),
                a2=nxt.encode(self.app.serializer),
                **keys,
            )
        self.counters.failed += 1
        reason = (
            f"failed on attempt {env.attempt} of {retries + 1}: {err['type']}: {err['message']}"
        )
        log.warning("task %s (%s) %s", env.task, env.id, reason, exc_info=exc)
        if middleware:
            await call_hooks(middleware, "after_run", ctx.get(), "failed", None, exc)
            await call_hooks(middleware, "on_dead", ctx.get(), env.id, reason)
        record = (
            make_record(self.app.serializer, "failed", env.task, env.attempt, error=err)
            if store
            else b""
        )
        return Outcome(
            "fail",
            record=record,
            ttl_ms=self._ttl_ms(task),
            a1=reason,
            a2=self.app.serializer.dumps(err),
            **self._result_keys(delivery, env, store),
        )

    async def _dead(
        self, delivery: Delivery, env: Envelope | None, reason: str, task_id: str = ""
    ) -> Outcome:
        self.counters.dead_lettered += 1
        if self.app.middleware:
            await call_hooks(
                self.app.middleware, "on_dead", None, env.id if env else task_id, reason
            )
        if env is None:
            return Outcome("dead", task_id, a1=reason)
        task = self.app.tasks.get(env.task)
        err = {"type": "tether.Dead", "message": reason, "traceback": ""}
        record = make_record(self.app.serializer, "dead", env.task, env.attempt, error=err)
        return Outcome(
            "dead",
            record=record,
            ttl_ms=self._ttl_ms(task),
            a1=reason,
            a2=self.app.serializer.dumps(err),
            **self._result_keys(delivery, env, True),
        )

    def _cancelled(self, delivery: Delivery, env: Envelope | None) -> Outcome:
        self.counters.cancelled += 1
        if env is None:
            return Outcome("cancel")
        task = self.app.tasks.get(env.task)
        err = {"type": "asyncio.CancelledError", "message": "cancelled on request", "traceback": ""}
        record = make_record(self.app.serializer, "cancelled", env.task, env.attempt, error=err)
        return Outcome(
            "cancel",
            record=record,
            ttl_ms=self._ttl_ms(task),
            **self._result_keys(delivery, env, True),
        )


async def _with_timeout(coro: Any, timeout: float) -> Any:
    try:
        return await asyncio.wait_for(coro, timeout)
    except asyncio.TimeoutError:
        raise TaskTimeout(f"the task ran past its timeout of {timeout}s") from None


def _peek_envelope(app: Tether, delivery: Delivery) -> Envelope | None:
    try:
        env = Envelope.decode(delivery.payload, app.serializer)
    except BadEnvelope:
        return None
    if not env.id:
        env.id = _derived_id(delivery)
    return env


def _derived_id(delivery: Delivery) -> str:
    return derived_task_id(delivery.queue.name, delivery.sidx, delivery.entry_id.decode())
