"""The outcome policy: what a finished attempt becomes (retry, failure, dead letter) and the
records a settle writes for it. Plain functions of their inputs, testable without a server.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..base._errors import RateLimited, Retry
from ..protocol.scripts._calls import ScheduleRun, SettleItem

if TYPE_CHECKING:
    from ..protocol._envelope import Envelope, Serializer
    from ..protocol._keys import QueueKeys

Outcome = SettleItem
"""One entry's settle instruction (see scripts/settle.lua)."""

BARE_SUCCESS = SettleItem("o")
"""A success with nothing to record: the ack alone."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What a failed attempt becomes."""

    retry: bool
    delay: float = 0.0
    """Seconds before the next attempt (when ``retry``)."""
    why_not: str = ""
    """When not retried: why, in words ('retries used up', 'not in retry_on')."""
    counts: bool = True
    """The attempt counts against the retries (not for RateLimited)."""


def decide(
    exc: BaseException,
    attempt: int,
    retries: int,
    retry_on: tuple[type[BaseException], ...],
    retry_delay: Callable[[int], float],
) -> Decision:
    """Retry when the exception asks for it (``Retry``) or is one of ``retry_on``, and
    attempts remain; the delay is ``Retry.delay`` or the task's backoff. ``RateLimited``
    always runs again after its ``retry_after``, without counting the attempt."""
    if isinstance(exc, RateLimited):
        delay = exc.retry_after if exc.retry_after is not None else retry_delay(1)
        return Decision(True, delay, counts=False)
    wants_retry = isinstance(exc, (Retry, *retry_on))
    if not wants_retry:
        names = ", ".join(e.__name__ for e in retry_on) or "nothing"
        return Decision(False, why_not=f"not retried: {type(exc).__name__} is not in retry_on "
                        f"({names})")  # fmt: skip
    if attempt > retries:
        return Decision(False, why_not="no retries left" if retries else "retries=0")
    if isinstance(exc, Retry) and exc.delay is not None:
        return Decision(True, exc.delay)
    return Decision(True, retry_delay(attempt))


def error_fields(exc: BaseException) -> dict[str, str]:
    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }


def make_record(
    serializer: Serializer,
    status: str,
    env: Envelope,
    *,
    value: Any = None,
    error: dict[str, str] | None = None,
) -> bytes:
    # The times make a finished task's timeline (enqueued, started, finished) readable once
    # its payload is gone.
    record: dict[str, Any] = {
        "status": status,
        "task": env.task,
        "attempt": env.attempt,
        "enqueued_ms": env.enqueued_ms,
        "finished_ms": int(time.time() * 1000),
    }
    if env.started_ms is not None:
        record["started_ms"] = env.started_ms
    if error is not None:
        record["error"] = error
    else:
        record["value"] = value
    return serializer.dumps(record)


@dataclass(frozen=True, slots=True)
class Target:
    """Where an outcome is recorded: the task's id, keys, and what it asked for."""

    task_id: str
    bound: bool
    """The id came in the payload (settle checks the index binds it to this entry)."""
    store: bool
    ttl_ms: int
    keys: QueueKeys
    dedup: str | None
    dedup_hold_ms: int
    schedule_run: ScheduleRun | None = None
    """A run of a schedule: where its outcome is recorded (and moves its backoff)."""
    retried: bool = False
    """An attempt after the first: its final outcome extends its attempt list's expiry (the
    first attempt's has none to extend: its settle passes no key and costs no command)."""

    @classmethod
    def of(cls, keys: QueueKeys, env: Envelope, bound: bool, store: bool, ttl_ms: int) -> Target:
        opts = env.options
        key = opts.get("key")
        hold = opts.get("key_ttl")
        schedule = opts.get("schedule")
        return cls(
            env.id,
            bound,
            store,
            ttl_ms,
            keys,
            keys.dedup(key) if isinstance(key, str) else None,
            int(hold * 1000) if isinstance(hold, (int, float)) and hold > 0 else 0,
            None
            if schedule is None
            else ScheduleRun.of(keys, schedule, opts.get("tick"), opts.get("backoff")),
            env.attempt > 1,
        )

    def outcome(self, op: str, record: bytes = b"", **detail: Any) -> Outcome:
        """The settle instruction for this task: records and done list when it stores
        results, its dedup key released or held on."""
        store = self.store
        return SettleItem(
            op,
            task_id=self.task_id,
            bound=self.bound,
            record=record if store else b"",
            ttl_ms=self.ttl_ms,
            result_key=self.keys.result(self.task_id) if store else None,
            done_key=self.keys.done(self.task_id) if store else None,
            dedup_key=self.dedup,
            dedup_hold_ms=self.dedup_hold_ms,
            schedule_run=self.schedule_run,
            attempts_key=self.keys.attempts(self.task_id)
            if store and (self.retried or op == "retry")
            else None,
            **detail,
        )


def success(target: Target, serializer: Serializer, env: Envelope, value: Any) -> Outcome:
    """A success; its record holds the value. A value the serializer refuses is not a
    success: raises the serializer's error (the caller fails the attempt with it)."""
    if not target.store and target.dedup is None:
        return target.outcome("ok") if target.bound else BARE_SUCCESS
    record = b""
    if target.store:
        record = make_record(serializer, "succeeded", env, value=value)
    return target.outcome("ok", record)


def retry(
    target: Target,
    serializer: Serializer,
    env: Envelope,
    error: dict[str, str],
    delay: float,
    next_payload: bytes,
) -> Outcome:
    record = make_record(serializer, "retrying", env, error=error)
    return target.outcome(
        "retry", record, retry_delay_ms=int(delay * 1000), next_payload=next_payload
    )


def failure(
    target: Target, serializer: Serializer, env: Envelope, error: dict[str, str], reason: str
) -> Outcome:
    record = make_record(serializer, "failed", env, error=error)
    return target.outcome("fail", record, reason=reason, error=serializer.dumps(error))


def dead(
    target: Target | None,
    serializer: Serializer,
    env: Envelope | None,
    reason: str,
    task_id: str = "",
) -> Outcome:
    """To the dead-letter stream, with its record when the task is known."""
    err = {"type": "tether.Dead", "message": reason, "traceback": ""}
    if target is None or env is None:
        return SettleItem("dead", task_id=task_id, reason=reason, error=serializer.dumps(err))
    record = make_record(serializer, "dead", env, error=err)
    # The dead record is written even for tasks that do not store results: waiters must
    # learn that it will never run.
    return replace(target, store=True).outcome(
        "dead", record, reason=reason, error=serializer.dumps(err)
    )


def cancelled(target: Target | None, serializer: Serializer, env: Envelope | None) -> Outcome:
    if target is None or env is None:
        return SettleItem("cancel")
    err = {"type": "asyncio.CancelledError", "message": "cancelled on request", "traceback": ""}
    record = make_record(serializer, "cancelled", env, error=err)
    return replace(target, store=True).outcome("cancel", record)
