"""Runtime control of flow-control limits: ``app.limits``.

Limits are declared in code (``@app.task(rate_limit="60/m", concurrency_limit=5, ...)``);
this API changes them at runtime, per queue and task, for every worker at once: the
override is stored in the queue's ``limits`` hash and read by the admission script at every
admission, and workers that did not check a task before (a limit added to a task declared
without one) start checking it within one ``reclaim_interval``.

A change lets the tasks already waiting (for a rate token or a slot) be admitted again
under the new limits, in their order, and starts every rate bucket of the task afresh.

The management API calls these methods (all async): :meth:`Limits.list`,
:meth:`Limits.get`, :meth:`Limits.set`, :meth:`Limits.reset`, :meth:`Limits.usage` and
:meth:`Limits.held`; each result has ``as_dict()`` for a JSON reply.
"""

from __future__ import annotations

import builtins
import json
import math
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from .base._errors import ConfigError
from .base._histogram import split_field
from .base._limits import (
    WIRE_FIELDS,
    Rate,
    TaskLimits,
    check_limit,
    check_limit_key,
    merge,
    parse_rate,
)
from .base._redis import text
from .base._settings import check_name
from .base._unreadable import parsed, text_or_none
from .protocol._keys import TaskLimitKeys, overrides_key
from .protocol.scripts import _limits as calls

if TYPE_CHECKING:
    from .producer._core import Core
    from .protocol._keys import QueueKeys

__all__ = ["KEEP", "HeldCounts", "KeyUsage", "LimitInfo", "Limits"]


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep()
"""The default of every :meth:`Limits.set` argument: leave that limit as it is."""

HELD = ("held_rate", "held_key_rate", "held_concurrency", "held_key_concurrency")
"""Statistics fields counted by admissions (see tether.base._histogram for the format)."""
BACKPRESSURE = "held_backpressure"
"""Statistics field counted when a task raised RateLimited."""
RELEASE_BUDGET = 1000
MINUTE_WINDOW_MAX = 3 * 3600.0


@dataclass(frozen=True)
class LimitInfo:
    """A task's limits on one queue and what waits for them now."""

    queue: str
    task: str
    declared: TaskLimits | None
    """As declared in code; None when this process does not know the task, or it declares
    no limits."""
    override: dict[str, Any] | None
    """The runtime override in readable form (only the limits it changes), or None."""
    effective: TaskLimits
    """What the workers apply: the override over the declared limits."""
    generation: int
    """Raised by every runtime change."""
    running: int
    """Slots of the task's concurrency limit in use: tasks running, woken to run, or waiting
    for their rate token (such a task keeps its slot, so it is never parked after it took a
    token; it is counted in ``waiting_for_rate`` too)."""
    waiting_for_rate: int
    """Tasks in the delayed set until their reserved rate token."""
    waiting_for_slot: int
    """Tasks parked until a slot of the task's concurrency limit frees."""
    keys_waiting: int
    """Limit keys with tasks parked until a slot of their key frees."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "task": self.task,
            "declared": None if self.declared is None else self.declared.describe(),
            "override": self.override,
            "effective": self.effective.describe(),
            "generation": self.generation,
            "running": self.running,
            "waiting_for_rate": self.waiting_for_rate,
            "waiting_for_slot": self.waiting_for_slot,
            "keys_waiting": self.keys_waiting,
        }


@dataclass(frozen=True)
class KeyUsage:
    """One limit key of a task: its slots in use and the tasks parked for them."""

    queue: str
    task: str
    key: str
    running: int
    """The key's slots in use: tasks running, woken to run, or waiting for a rate token."""
    waiting_for_slot: int
    """Parked tasks (counting, until they are skipped, entries of tasks cancelled while
    they waited)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "task": self.task,
            "key": self.key,
            "running": self.running,
            "waiting_for_slot": self.waiting_for_slot,
        }


@dataclass(frozen=True)
class HeldCounts:
    """How often a task was held back, by limit, over a window."""

    queue: str
    task: str
    rate: int = 0
    key_rate: int = 0
    concurrency: int = 0
    key_concurrency: int = 0
    backpressure: int = 0
    """Attempts that raised RateLimited."""

    @property
    def total(self) -> int:
        return self.rate + self.key_rate + self.concurrency + self.key_concurrency

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "task": self.task,
            "rate": self.rate,
            "key_rate": self.key_rate,
            "concurrency": self.concurrency,
            "key_concurrency": self.key_concurrency,
            "backpressure": self.backpressure,
        }


def readable(override: dict[str, Any] | None) -> dict[str, Any] | None:
    """An override's fields as the arguments of :meth:`Limits.set` that would write them."""
    if override is None:
        return None
    out: dict[str, Any] = {}
    for prefix, short in (("", ""), ("key_", "k")):
        count = override.get(f"{short}rc")
        if isinstance(count, (int, float)):
            period = override.get(f"{short}rp") or 0
            rate = Rate(int(count), float(period) / 1000) if count and period else None
            out[f"{prefix}rate_limit"] = None if rate is None else str(rate)
        burst = override.get(f"{short}rb")
        if isinstance(burst, (int, float)):
            out[f"{prefix}rate_burst"] = int(burst)
        concurrency = override.get(f"{short}c")
        if isinstance(concurrency, (int, float)):
            out[f"{prefix}concurrency_limit"] = int(concurrency) or None
    return out


_COUNTS = frozenset({"rc", "rb", "c", "krc", "krb", "kc", "gen"})
"""Override fields that hold a whole number (the others are periods in milliseconds)."""
_LARGEST = float(2**53)
"""Past this a number is no limit Tether writes (nor one a float holds exactly)."""


def _override(where: str, raw: bytes | str) -> dict[str, Any] | None:
    """The override stored at ``where``, or None (reported) when it is not one Tether
    writes: what the readers make of it (limits, rates, their text) must not overflow or
    fail on an infinity, a NaN or a count in words, which Python's JSON reader accepts."""
    return parsed("limit", where, partial(_checked_override, raw))


def _checked_override(raw: bytes | str) -> dict[str, Any]:
    value = json.loads(raw)  # any error: reported by the caller (RecursionError too)
    if not isinstance(value, dict):
        raise ValueError(f"a {type(value).__name__}, not an object")
    for name in (*WIRE_FIELDS, "gen"):
        number = value.get(name)
        if number is None:
            continue
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise ValueError(f"{name}={number!r:.50} is not a number")
        if not (math.isfinite(number) and 0 <= number <= _LARGEST):
            raise ValueError(f"{name}={number!r} is not a limit (0 to 2**53)")
        if name in _COUNTS and number != int(number):
            raise ValueError(f"{name}={number!r} is not a whole number")
    return value


class Limits:
    """``app.limits``: read and change flow-control limits at runtime.

    An override in Redis that no Tether writes (not JSON, an infinity, a count in words, a
    task name that is not text) reads as no override: it is left out of the listings and
    reported (``tether_unreadable_records_total{kind="limit"}``), never an error."""

    def __init__(self, app: Core) -> None:
        self.app = app

    # -- reading --------------------------------------------------------------------------

    async def get(self, task: object, *, queue: str | None = None) -> LimitInfo:
        """A task's declared, overridden and effective limits on ``queue`` (default: the
        task's declared queue, else 'default'), with what waits for them now."""
        name, keys = self._where(task, queue)
        key = overrides_key(keys.tag)
        raw = await self.app.client.hget(key, name)
        override = None if raw is None else _override(f"{key} field {name[:100]!r}", raw)
        return await self._info(name, keys, override)

    async def list(self, queue: str = "default") -> list[LimitInfo]:
        """Every task with limits on ``queue``: declared by this app's tasks of that queue,
        or set at runtime there. Sorted by task name."""
        keys = self.app.keys(check_name("queue", queue))
        key = overrides_key(keys.tag)
        raw: Any = await self.app.client.hgetall(key)
        overrides: dict[str, dict[str, Any]] = {}
        for field, value in raw.items():
            name = text_or_none("limit", f"{key} field", field)
            found = None if name is None else _override(f"{key} field {name[:100]!r}", value)
            if name is not None and found is not None:
                overrides[name] = found
        names = {
            name
            for name, t in self.app.tasks.items()
            if t.config.limits is not None and t.config.queue == queue
        }
        names.update(overrides)
        infos = [await self._info(n, keys, overrides.get(n)) for n in sorted(names)]
        return [i for i in infos if i.effective.any or i.override is not None]

    async def usage(self, task: object, key: str, *, queue: str | None = None) -> KeyUsage:
        """The slots in use and parked tasks of one limit key of a task."""
        name, keys = self._where(task, queue)
        scope = TaskLimitKeys.of(keys.tag, name).key_scope(check_limit_key(name, key))
        pipe: Any = self.app.client.pipeline(transaction=False)
        pipe.hlen(scope.running)
        pipe.llen(scope.waiting)
        running, waiting = await pipe.execute()
        return KeyUsage(keys.queue, name, key, int(running), int(waiting))

    async def held(
        self, queue: str = "default", *, window: float = 3600.0
    ) -> builtins.list[HeldCounts]:
        """How often each task of ``queue`` was held back, by limit, over the last
        ``window`` seconds (read from the statistics hashes: a window up to three hours
        is read per minute, a longer one per hour, rounded out to whole buckets)."""
        keys = self.app.keys(check_name("queue", queue))
        limit = self.app.settings.stats_window
        if isinstance(window, bool) or not isinstance(window, (int, float)):
            raise ConfigError(f"window={window!r}: expected seconds")
        if not 60 <= window <= limit:
            raise ConfigError(
                f"window={window!r}: must be between 60 seconds and the statistics window "
                f"({limit:g} s)"
            )
        now = time.time()
        if window <= MINUTE_WINDOW_MAX:
            first, last = int((now - window) // 60), int(now // 60)
            buckets = [keys.stats_minute(m) for m in range(first, last + 1)]
        else:
            first, last = int((now - window) // 3600), int(now // 3600)
            buckets = [keys.stats_hour(h) for h in range(first, last + 1)]
        pipe: Any = self.app.client.pipeline(transaction=False)
        for bucket in buckets:
            pipe.hgetall(bucket)
        sums: dict[str, dict[str, int]] = {}
        for bucket, fields in zip(buckets, await pipe.execute(), strict=True):
            for field, amount in fields.items():
                where = f"{bucket} field {field[:100]!r}"
                read = parsed("statistics", where, partial(_held_field, field, amount))
                if read is None:
                    continue
                task, counter, count = read
                if task and (counter in HELD or counter == BACKPRESSURE):
                    per_task = sums.setdefault(task, {})
                    per_task[counter] = per_task.get(counter, 0) + count
        return [
            HeldCounts(
                queue,
                task,
                c.get("held_rate", 0),
                c.get("held_key_rate", 0),
                c.get("held_concurrency", 0),
                c.get("held_key_concurrency", 0),
                c.get(BACKPRESSURE, 0),
            )
            for task, c in sorted(sums.items())
        ]

    # -- changing -------------------------------------------------------------------------

    async def set(
        self,
        task: object,
        *,
        queue: str | None = None,
        rate_limit: object = KEEP,
        rate_burst: object = KEEP,
        concurrency_limit: object = KEEP,
        key_rate_limit: object = KEEP,
        key_rate_burst: object = KEEP,
        key_concurrency_limit: object = KEEP,
    ) -> LimitInfo:
        """Change some of a task's limits on ``queue`` for every worker; ``None`` removes
        a limit, an argument left out keeps it. Tasks waiting for the task's limits are
        admitted again under the new ones. Bad values raise :class:`ConfigError`."""
        name, keys = self._where(task, queue)
        fields: dict[str, float] = {}
        for prefix, rate, burst, concurrency in (
            ("", rate_limit, rate_burst, concurrency_limit),
            ("key_", key_rate_limit, key_rate_burst, key_concurrency_limit),
        ):
            short = "k" if prefix else ""
            if rate is not KEEP:
                parsed = None if rate is None else parse_rate(name, f"{prefix}rate_limit", rate)
                fields[f"{short}rc"] = 0 if parsed is None else parsed.count
                fields[f"{short}rp"] = 0 if parsed is None else parsed.period_s * 1000
            if burst is not KEEP:
                fields[f"{short}rb"] = (
                    1 if burst is None else check_limit(name, f"{prefix}rate_burst", burst)
                )
            if concurrency is not KEEP:
                fields[f"{short}c"] = (
                    0
                    if concurrency is None
                    else check_limit(name, f"{prefix}concurrency_limit", concurrency)
                )
        if not fields:
            raise ConfigError(f"task {name!r}: limits.set() was given no limit to change")
        return await self._change(name, keys, "merge", fields)

    async def reset(self, task: object, *, queue: str | None = None) -> LimitInfo:
        """Drop the runtime override: the task's declared limits apply again."""
        name, keys = self._where(task, queue)
        return await self._change(name, keys, "replace", {})

    # -- helpers --------------------------------------------------------------------------

    def _where(self, task: object, queue: str | None) -> tuple[str, QueueKeys]:
        name = getattr(task, "name", task)
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{task!r} is not a task or a task name")
        if queue is None:
            known = self.app.tasks.get(name)
            queue = known.config.queue if known is not None else "default"
        return name, self.app.keys(check_name("queue", queue))

    def _declared(self, name: str) -> TaskLimits | None:
        known = self.app.tasks.get(name)
        return None if known is None else known.config.limits

    async def _change(
        self, name: str, keys: QueueKeys, mode: str, fields: dict[str, float]
    ) -> LimitInfo:
        client = self.app.client
        task_keys = TaskLimitKeys.of(keys.tag, name)
        payload = json.dumps(fields, separators=(",", ":"))
        while True:
            waiting: Any = await client.smembers(task_keys.waiting_keys)
            call = calls.set_limits(
                keys, name, mode, payload, RELEASE_BUDGET, sorted(text(k) for k in waiting)
            )
            reply = await call.run(client)
            mode = ""  # the override is written; later calls only release
            if not reply.more:
                break
        return await self.get(name, queue=keys.queue)

    async def _info(self, name: str, keys: QueueKeys, override: dict[str, Any] | None) -> LimitInfo:
        task_keys = TaskLimitKeys.of(keys.tag, name)
        pipe: Any = self.app.client.pipeline(transaction=False)
        pipe.hlen(task_keys.scope.running)
        pipe.zcard(task_keys.reservations)
        pipe.llen(task_keys.scope.waiting)
        pipe.scard(task_keys.waiting_keys)
        running, reserved, parked, keys_waiting = await pipe.execute()
        declared = self._declared(name)
        fields = {k: v for k, v in (override or {}).items() if k in WIRE_FIELDS}
        gen = (override or {}).get("gen", 0)
        return LimitInfo(
            queue=keys.queue,
            task=name,
            declared=declared,
            override=readable(fields) or None,
            effective=merge(declared, override),
            generation=int(gen) if isinstance(gen, (int, float)) else 0,
            running=int(running),
            waiting_for_rate=int(reserved),
            waiting_for_slot=int(parked),
            keys_waiting=int(keys_waiting),
        )


def _held_field(field: bytes, amount: bytes) -> tuple[str, str, int]:
    """A statistics field as (task, counter, count); raises for one no worker writes."""
    task, counter = split_field(text(field))
    return task, counter, int(amount)
