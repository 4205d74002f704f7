"""The attempt policy: what may run, how one attempt runs, and how its end is named.

Shared by the worker's runner and the eager mode (``tether.testing``), so a task behaves
the same under both: the same admission (the task found, its arguments checked), the same
run (the ``before_run`` hooks, ``current_task()``, the middleware's ``run_scope``, the
timeout, a thread for a plain function), and the same words for a failure and a dead
letter. The runner adds what only a worker has: slots, leases, flow control and the settle;
the eager mode records the outcome in memory.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..base._context import LazyContext, _current
from ..base._errors import ResultSerializationError, TaskTimeout
from ..base._middleware import Middleware, RunScopes, call_hooks, overrides
from ._outcome import Decision, decide, error_fields

if TYPE_CHECKING:
    from ..producer._core import Core, RegisteredTask
    from ..protocol._envelope import Envelope, Serializer

SyncCall = Callable[["RegisteredTask", "Envelope", "float | None"], Awaitable[Any]]
"""Runs a plain function's call off the event loop (its thread pool, or a thread of its
own), raising :class:`~tether.TaskTimeout` past ``timeout``."""


def runnable(app: Core, env: Envelope, *, arity_checked: bool = False) -> RegisteredTask | str:
    """The task that runs ``env``, or why it cannot run (the dead letter's reason): an
    unknown task, one its loader cannot load, or arguments that do not fit its signature.
    ``arity_checked``: the caller found the plain arguments fit the plain arity (the
    worker's fast path), so only other signatures are bound."""
    try:
        task, missing = app.find_task(env.task), None
    except LookupError as exc:  # a task loader knows the name and why it cannot load it
        task, missing = None, str(exc)
    if task is None or task.fn is None:
        return missing or (
            f"unknown task {env.task!r}: this worker has no task registered by that name"
        )
    signature = task.signature
    if signature is not None and not (
        arity_checked and not env.kwargs and len(env.args) == task.plain_arity
    ):
        try:
            signature.bind(*env.args, **env.kwargs)
        except TypeError as exc:
            return f"the arguments do not fit task {env.task!r}: {exc}"
    return task


def failure_reason(attempt: int, retries: int, decision: Decision, err: dict[str, str]) -> str:
    """The reason a task that failed for good is dead-lettered with."""
    return (
        f"failed on attempt {attempt} of {retries + 1} ({decision.why_not}): "
        f"{err['type']}: {err['message']}"
    )


@dataclass(slots=True)
class Failure:
    """A failed attempt, named: what it becomes and the error recorded for it."""

    decision: Decision
    err: dict[str, str]
    retries: int

    def reason(self, attempt: int) -> str:
        return failure_reason(attempt, self.retries, self.decision, self.err)


def judge(exc: BaseException, task: RegisteredTask, attempt: int, retries: int) -> Failure:
    """What an attempt that raised ``exc`` becomes: a retry (and when), or a failure."""
    cfg = task.config
    return Failure(
        decide(exc, attempt, retries, cfg.retry_on, cfg.retry_delay), error_fields(exc), retries
    )


def result_error(serializer: Serializer, value: Any, exc: Exception) -> ResultSerializationError:
    """What a task whose result ``serializer`` refused (with ``exc``) fails with."""
    error = ResultSerializationError(
        f"the result ({type(value).__name__}) cannot be serialized by the "
        f"{serializer.name} serializer: {exc}"
    )
    error.__cause__ = exc
    return error


def check_result(serializer: Serializer, value: Any, encode: Callable[[Any], Any]) -> Any:
    """``encode(value)``, or the error a task whose result cannot be serialized fails with."""
    try:
        return encode(value)
    except Exception as exc:
        raise result_error(serializer, value, exc) from exc


class Scopes:
    """The middleware's ``run_scope`` hooks of each run: none is built when no middleware
    defines one (asked again only when the middleware changed)."""

    __slots__ = ("_of", "_scoped")

    def __init__(self) -> None:
        self._of: tuple[Middleware, ...] = ()
        self._scoped = False

    def of(
        self, middleware: tuple[Middleware, ...], ctx: LazyContext, env: Envelope
    ) -> RunScopes | None:
        if not middleware:
            return None
        if middleware is not self._of:
            self._of = middleware
            self._scoped = overrides(middleware, "run_scope")
        if not self._scoped:
            return None
        return RunScopes(middleware, ctx.get(), dict(env.headers) if env.headers else {})


@dataclass(slots=True)
class Ran:
    """How one attempt ended: its value, or the exception it raised."""

    value: Any
    error: BaseException | None
    """The task's exception: any, a ``SystemExit`` or ``KeyboardInterrupt`` included (the
    task's own code ending, never the process); None when it returned."""
    run_ms: float
    retry_headers: dict[str, str] | None
    """What a run scope set for the next attempt (None: the task's headers unchanged)."""


async def run_attempt(
    app: Core,
    task: RegisteredTask,
    env: Envelope,
    ctx: LazyContext,
    timeout: float | None,
    scopes: Scopes,
    call_sync: SyncCall | None,
) -> Ran:
    """One attempt: the ``before_run`` hooks, then the call with ``current_task()`` set,
    inside the run scopes, within ``timeout``. A cancellation propagates.

    Whatever else the task raises is its outcome, ``BaseException`` included: a task that
    calls ``sys.exit()`` or raises ``KeyboardInterrupt`` fails its attempt and the worker
    serves on. Let through, it would end the worker's process with the task still
    "running", to be reclaimed by the next worker and end that one too. A real SIGINT or
    SIGTERM never arrives here as an exception: the worker's signal handlers stop it."""
    middleware = app.middleware
    if middleware:
        await call_hooks(middleware, "before_run", ctx.get())
    token = _current.set(ctx)
    run_scopes = scopes.of(middleware, ctx, env)
    started = time.monotonic()
    try:
        if run_scopes is None:
            if task.is_async and timeout is None:  # the common case: one frame less
                assert task.fn is not None
                value = await task.fn(*env.args, **env.kwargs)
            else:
                value = await call(task, env, timeout, call_sync)
        else:
            with run_scopes:
                value = await call(task, env, timeout, call_sync)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:  # the task's error becomes its outcome (see above)
        retry_headers = None if run_scopes is None else run_scopes.retry_headers
        return Ran(None, exc, (time.monotonic() - started) * 1000, retry_headers)
    finally:
        _current.reset(token)
    return Ran(value, None, (time.monotonic() - started) * 1000, None)


async def call(
    task: RegisteredTask, env: Envelope, timeout: float | None, call_sync: SyncCall | None
) -> Any:
    """Call the task's function: a coroutine function on this loop, a plain one through
    ``call_sync``; past ``timeout`` it raises :class:`~tether.TaskTimeout`."""
    if not task.is_async:
        assert call_sync is not None, "a plain function needs a way off the event loop"
        return await call_sync(task, env, timeout)
    assert task.fn is not None
    coro: Any = task.fn(*env.args, **env.kwargs)
    if timeout is None:
        return await coro
    try:
        return await asyncio.wait_for(_contained(coro), timeout)
    except asyncio.TimeoutError:
        raise TaskTimeout(f"the task ran past its timeout of {timeout}s") from None
    except _Contained as contained:
        raise contained.exc from None


class _Contained(Exception):
    """Carries a task's ``SystemExit`` or ``KeyboardInterrupt`` out of the asyncio task
    that ``wait_for`` runs it in (before Python 3.12): an asyncio task re-raises those two
    out of the event loop itself, past every ``except`` of the worker."""

    def __init__(self, exc: SystemExit | KeyboardInterrupt) -> None:
        super().__init__(repr(exc))
        self.exc = exc


async def _contained(coro: Awaitable[Any]) -> Any:
    try:
        return await coro
    except (SystemExit, KeyboardInterrupt) as exc:
        raise _Contained(exc) from exc


async def after_success(app: Core, ctx: LazyContext, value: Any) -> None:
    if app.middleware:
        await call_hooks(app.middleware, "after_run", ctx.get(), "succeeded", value, None)


async def after_retry(app: Core, ctx: LazyContext, exc: BaseException, delay: float) -> None:
    if app.middleware:
        await call_hooks(app.middleware, "on_retry", ctx.get(), exc, delay)


async def after_failure(
    app: Core, ctx: LazyContext, task_id: str, exc: BaseException, reason: str
) -> None:
    if app.middleware:
        await call_hooks(app.middleware, "after_run", ctx.get(), "failed", None, exc)
        await call_hooks(app.middleware, "on_dead", ctx.get(), task_id, reason)
