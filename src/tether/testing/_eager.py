"""The eager mode: tasks run in this process, at enqueue or at an explicit ``drain()``, with
the worker's retry policy, timeouts, dedup keys, hooks and ``current_task()``.

See docs/testing.md for every difference from a real worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..base._blocking import refuse_on_loop
from ..base._context import LazyContext
from ..base._errors import ResultSerializationError, TaskTimeout
from ..base._status import TaskStatus
from ..worker import kit as attempt
from ._memory import Record, Recorder

if TYPE_CHECKING:
    from ..producer import Plan
    from ..producer._core import Core, RegisteredTask
    from ..producer._handle import TaskHandle
    from ..producer._task import Task
    from ..protocol._envelope import Envelope

log = logging.getLogger("tether.testing")


class TaskError(AssertionError):
    """Raised by ``eager(app, propagate=True)`` when a task ends without a value: the
    original exception is its ``__cause__``."""


class Eager(Recorder):
    """Run tasks in this process: ``with eager(app) as queue`` (at enqueue), or
    ``eager(app, inline=False)`` and ``queue.drain_sync()`` / ``await queue.drain()``.

    Everything the recording mode records is recorded too (``queue.assert_enqueued...``).
    ``propagate=True`` raises a task's failure from the enqueue (or the drain) that ran it,
    instead of only recording it for ``result()``.
    """

    worker_name = "eager"

    def __init__(self, app: Core, *, inline: bool = True, propagate: bool = False) -> None:
        super().__init__(app)
        self.inline = inline
        self.propagate = propagate
        self._scopes = attempt.Scopes()

    # -- enqueue: record, then run at once when inline ----------------------------------

    async def enqueue(
        self, task: Task[Any, Any], plan: Plan, ids: list[str], payloads: list[bytes]
    ) -> list[TaskHandle[Any]]:
        handles = await super().enqueue(task, plan, ids, payloads)
        if self.inline:
            for handle in handles:
                if not handle.duplicate:
                    await self._run(self.record(handle.id))
        return handles

    def enqueue_sync(
        self, task: Task[Any, Any], plan: Plan, ids: list[str], payloads: list[bytes]
    ) -> list[TaskHandle[Any]]:
        handles = super().enqueue_sync(task, plan, ids, payloads)
        if self.inline:
            for handle in handles:
                if not handle.duplicate:
                    asyncio.run(self._run(self.record(handle.id)))
        return handles

    def _why_pending(self) -> str:
        return "nothing runs it until queue.drain() (eager mode with inline=False)"

    # -- drain --------------------------------------------------------------------------

    async def drain(self) -> int:
        """Run every waiting task, and what they enqueue, until none is left: the due ones by
        priority and enqueue order, then the delayed ones by due time (their delays are not
        waited for). Returns how many ran."""
        ran = 0
        while True:
            pending = [r for r in self.records() if r.status in _WAITING]
            if not pending:
                return ran
            now_ms = int(time.time() * 1000)
            # As a worker takes them: what is due by priority, then in enqueue order; the
            # delayed ones after, by due time (their delay is not waited for).
            record = min(
                pending,
                key=lambda r: (0 if r.due_ms <= now_ms else r.due_ms, r.sidx, r.seq),
            )
            await self._run(record)
            ran += 1

    def drain_sync(self) -> int:
        """:meth:`drain`, blocking."""
        refuse_on_loop("drain_sync")
        return asyncio.run(self.drain())

    # -- running one task ---------------------------------------------------------------

    async def _run(self, record: Record) -> None:
        """Run a task through its attempts to an outcome, as the worker would."""
        with self._lock:
            if record.status not in _WAITING:
                return  # cancelled meanwhile, or already run by a nested drain
            record.status = TaskStatus.RUNNING
        env = record.envelope
        task = self._resolve(record)
        if task is None:
            return
        failure: BaseException | None = None
        retries = env.options.get("retries", task.config.retries)
        while True:
            error = await self._attempt(record, task, retries)
            if error is None:
                break
            judged = attempt.judge(error, task, record.attempt, retries)
            if not judged.decision.retry:
                failure = error
                break
            record.error = judged.err
            record.status = TaskStatus.RETRYING
            await attempt.after_retry(
                self.app, self._holder(record, task, retries), error, judged.decision.delay
            )
            if judged.decision.counts:  # a RateLimited push-back is no new attempt
                record.attempt += 1
            record.status = TaskStatus.RUNNING
        self.release_key(record)
        if failure is not None:
            await self._fail(record, task, failure, retries)

    def _resolve(self, record: Record) -> RegisteredTask | None:
        """The task, or None when the record went to the dead letters (as on a worker)."""
        env = record.envelope
        task = attempt.runnable(self.app, env)
        if not isinstance(task, str):
            return task
        reason = task
        record.status = TaskStatus.DEAD
        record.error = {"type": "tether.Dead", "message": reason, "traceback": ""}
        self.dead.append((env.id, reason))
        self.release_key(record)
        if self.propagate:
            raise TaskError(f"task {env.id} went to the dead letters: {reason}")
        return None

    async def _attempt(
        self, record: Record, task: RegisteredTask, retries: int
    ) -> BaseException | None:
        """One attempt, run by the worker's attempt policy; None when it succeeded (its
        value recorded)."""
        env = record.envelope
        ctx = self._holder(record, task, retries)
        timeout = env.options.get("timeout", task.config.timeout)
        ran = await attempt.run_attempt(
            self.app, task, env, ctx, timeout, self._scopes, _call_in_thread
        )
        if ran.error is not None:
            if ran.retry_headers is not None:  # what the run scopes set for the next attempt
                env.headers = ran.retry_headers or None
            return ran.error
        try:
            value = attempt.check_result(self.app.serializer, ran.value, self._stored)
        except ResultSerializationError as exc:
            return exc
        record.value = value
        record.error = None
        record.status = TaskStatus.SUCCEEDED
        await attempt.after_success(self.app, ctx, value)
        return None

    def _stored(self, value: Any) -> Any:
        """The value as a waiter reads it back: through the serializer."""
        serializer = self.app.serializer
        return serializer.loads(serializer.dumps(value))

    async def _fail(
        self, record: Record, task: RegisteredTask, error: BaseException, retries: int
    ) -> None:
        env = record.envelope
        failure = attempt.judge(error, task, record.attempt, retries)
        reason = failure.reason(record.attempt)
        record.status = TaskStatus.FAILED
        record.error = failure.err
        self.dead.append((env.id, reason))
        log.info("task %s (%s) %s", env.task, env.id, reason)
        await attempt.after_failure(
            self.app, self._holder(record, task, retries), env.id, error, reason
        )
        if self.propagate:
            raise TaskError(f"task {env.id} {reason}") from error

    def _holder(
        self, record: Record, task: RegisteredTask, retries: int | None = None
    ) -> LazyContext:
        env = record.envelope
        if retries is None:
            retries = env.options.get("retries", task.config.retries)
        return LazyContext(
            env.id, env.task, record.enqueued.queue, record.enqueued.priority, record.attempt,
            retries + 1, 1, env.enqueued_ms, self.worker_name, env.options.get("schedule"),
            env.options.get("tick"), env.headers or {},
        )  # fmt: skip


_WAITING = (TaskStatus.QUEUED, TaskStatus.SCHEDULED, TaskStatus.RETRYING)


async def _call_in_thread(task: RegisteredTask, env: Envelope, timeout: float | None) -> Any:
    """A plain function runs in a thread, as on a worker, with this context
    (``current_task()``): a new thread each, so tasks that enqueue tasks inline never wait
    for a free one."""
    assert task.fn is not None
    context = contextvars.copy_context()
    future = _in_thread(functools.partial(context.run, task.fn, *env.args, **env.kwargs))
    if timeout is None:
        return await future
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout)
    except asyncio.TimeoutError:
        raise TaskTimeout(f"task {task.name!r} ran past its timeout of {timeout}s") from None


def _in_thread(call: Callable[[], Any]) -> asyncio.Future[Any]:
    """Run ``call`` in a new daemon thread; its outcome arrives on the running loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def run() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = call()
        except BaseException as exc:  # delivered to the awaiting task, as an executor does
            error = exc
        # A task that ran past its timeout may end after its loop closed: nobody waits.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=run, name="tether-eager", daemon=True).start()
    return future
