"""Runtime control of schedules, stored in Redis and seen by every replica within one
scheduler pass: add, remove, pause, resume, trigger, list, and who leads."""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from ..base._errors import ConfigError
from ..base._redis import text
from ..base._schedule import Missed, Schedule, ScheduleBackoff
from ..base._unreadable import parsed, skip, text_or_none
from ..producer import _lifecycle
from ..producer._enqueue import Plan, enqueue
from ..producer._task import Task
from ..protocol._envelope import plain_encoder
from ..protocol._keys import SchedulerKeys, queue_of_task_id

log = logging.getLogger("tether.scheduler")

if TYPE_CHECKING:
    from ..base._redis import AsyncClient
    from ..producer._core import Core
    from ..producer._handle import TaskHandle


@dataclass(frozen=True)
class BackoffState:
    """A schedule whose runs failed: how many in a row, and until when its ticks rest."""

    failures: int
    """Runs in a row that ended in final failure (dead-lettered after their retries)."""
    until: datetime
    """Ticks due before this time are skipped ('backoff' in the tick log)."""
    forget_at: datetime
    """Without a new failure, the state is forgotten then (a success ends it at once)."""

    def resting(self, now: datetime | None = None) -> bool:
        """Whether ticks are skipped now."""
        return self.until > (now or datetime.now(timezone.utc))


@dataclass(frozen=True)
class TickRecord:
    """One record of a schedule's tick log: a tick and how it ended, or how a run ended."""

    at: datetime
    """When it was recorded."""
    tick: datetime | None
    """The tick it is about (None for a run triggered by hand)."""
    outcome: str
    """A tick: 'enqueued', 'backoff', 'overlap', 'paused', 'missed'; a run: 'succeeded',
    'failed', 'dead'."""
    task_id: str | None
    failures: int | None = None
    """'backoff', 'failed', 'dead': failures in a row then."""
    until: datetime | None = None
    """'backoff', 'failed', 'dead': the end of the rest then."""


class TriggeredRun(NamedTuple):
    """A run triggered by hand, and the backoff it went through (None when the schedule
    was not resting)."""

    handle: TaskHandle[Any]
    backoff: BackoffState | None


@dataclass(frozen=True)
class ScheduleInfo:
    """One schedule as ``tether schedules`` shows it."""

    schedule: Schedule
    source: str
    """'code' (declared with @app.periodic) or 'runtime' (added with Schedules.add)."""
    paused: bool
    next_run: datetime | None
    last_run: datetime | None
    last_task_id: str | None
    last_outcome: str | None
    error: str | None = None
    """The last error the scheduler met firing it, until a tick succeeds again."""
    backoff: BackoffState | None = None
    """Set while its runs fail (see :class:`ScheduleBackoff`)."""


@dataclass(frozen=True)
class RuntimeSchedules:
    """What Redis holds for schedules added at runtime."""

    schedules: list[Schedule]
    paused: set[str]
    invalid: dict[str, str]
    """name -> why its stored definition cannot be used (it is not run)"""


MAX_TICK_MS = 253_402_300_799_999
"""The last instant a datetime holds (9999-12-31T23:59:59.999Z): no tick marker is later."""


def parse_marker(raw: bytes | str) -> tuple[int, str | None]:
    """A schedule's tick marker, ``<tick ms>|<task id of its last run>`` (the id empty
    after a tick that enqueued nothing), as (tick, task id or None). ValueError naming the
    problem for anything else: the marker sits in Redis, where anything may have written
    it, and the scheduler and every listing read it."""
    marker = raw.decode() if isinstance(raw, bytes) else raw  # UnicodeDecodeError: ValueError
    tick_text, sep, last_id = marker.partition("|")
    if not sep or not (tick_text.isascii() and tick_text.isdigit()):
        raise ValueError(f"{marker[:100]!r} is not <tick ms>|<task id>")
    tick = int(tick_text[:20])
    if len(tick_text) > 20 or tick > MAX_TICK_MS:
        raise ValueError(f"tick {tick_text[:30]} ms is past the year 9999")
    if last_id:
        queue_of_task_id(last_id)  # ValueError for an id no Tether makes
    return tick, last_id or None


def leader_text(key: str, raw: bytes | None) -> str | None:
    """The leader key's value as text. One that is not UTF-8 is reported and shown with
    its bad bytes replaced, not as no leader: whatever it says, it holds the role (no
    scheduler leads until it expires)."""
    if raw is None:
        return None
    return text_or_none("schedule", key, raw) or raw.decode(errors="replace")


def unreadable_marker(key: str, name: str, exc: BaseException) -> str:
    """Why a schedule does not fire, as shown in ``tether schedules``: with the way out."""
    return (
        f"malformed tick marker in {key} ({exc}); Tether wrote no such marker: "
        f"delete it (HDEL {key} {name}) and the schedule starts afresh, from its next tick"
    )


async def load_runtime(
    app: Core, keys: SchedulerKeys, client: AsyncClient | None = None
) -> RuntimeSchedules:
    client = client if client is not None else app.client
    raw: Any = await client.hgetall(keys.definitions)
    schedules = []
    invalid: dict[str, str] = {}
    for raw_name, value in raw.items():
        name = text_or_none("schedule", f"{keys.definitions} field", raw_name)
        if name is None:
            continue  # not a name any schedule has: nothing could run or show it
        try:
            schedules.append(Schedule.from_json(value))
        except Exception as exc:  # any: RecursionError for JSON nested too deep, too
            invalid[name] = f"invalid definition: {type(exc).__name__}: {str(exc)[:300]}"
            skip("schedule", f"{keys.definitions} field {name[:100]!r}", exc)
    paused: Any = await client.smembers(keys.paused)
    names = (text_or_none("schedule", f"{keys.paused} member", p) for p in paused)
    return RuntimeSchedules(schedules, {n for n in names if n is not None}, invalid)


class Schedules:
    """``app.schedules``: declare-time list plus runtime control."""

    def __init__(self, app: Core) -> None:
        self.app = app
        self.keys = SchedulerKeys.of(app.namespace)

    def build(
        self,
        task: Task[Any, Any],
        *,
        cron: str | None = None,
        every: float | timedelta | None = None,
        tz: str = "UTC",
        args: tuple[Any, ...] | list[Any] = (),
        kwargs: dict[str, Any] | None = None,
        name: str | None = None,
        missed: Missed = "latest",
        catchup_limit: int = 10,
        overlap: bool = True,
        run_at_startup: bool = False,
        grace: float = 5.0,
        backoff: ScheduleBackoff | bool = True,
    ) -> Schedule:
        """The :class:`Schedule` these options make for ``task``, checked but stored nowhere
        (what ``@app.periodic`` and :meth:`add` record)."""
        if not isinstance(task, Task):
            raise ConfigError(
                f"{task!r} is not a task: apply @app.periodic on top of @app.task, or pass a task"
            )
        if self.app.tasks.get(task.name) is None:
            raise ConfigError(f"schedule names task {task.name!r}, which this app does not know")
        if isinstance(every, timedelta):
            every = every.total_seconds()
        spec = cron if cron is not None else f"every {every}s"
        opts = task.call_options
        return Schedule(
            name=name or f"{task.name}@{spec}",
            task=task.name,
            queue=opts.queue or task.config.queue,
            priority=opts.priority or task.config.priority,
            cron=cron,
            every=every,
            tz=tz,
            args=tuple(args),
            kwargs=dict(kwargs or {}),
            missed=missed,
            catchup_limit=catchup_limit,
            overlap=overlap,
            run_at_startup=run_at_startup,
            grace=grace,
            backoff=backoff,
        )

    async def add(self, task: Task[Any, Any], **options: Any) -> Schedule:
        """Add a schedule at runtime (same options as ``@app.periodic``)."""
        schedule = self.build(task, **options)
        if schedule.name in {s.name for s in self.app.declared_schedules}:
            raise ConfigError(f"schedule {schedule.name!r} is declared in code already")
        client = self.app.client
        await client.hset(self.keys.definitions, schedule.name, schedule.to_json())
        await client.incr(self.keys.version)
        return schedule

    async def remove(self, name: str) -> bool:
        """Remove a schedule added at runtime; declared ones are removed from the code."""
        if name in {s.name for s in self.app.declared_schedules}:
            raise ConfigError(
                f"schedule {name!r} is declared in code: pause it, or delete it there"
            )
        client = self.app.client
        removed = bool(await client.hdel(self.keys.definitions, name))
        await client.srem(self.keys.paused, name)
        await client.hdel(self.keys.errors, name)
        await client.incr(self.keys.version)
        return removed

    async def pause(self, name: str) -> None:
        """Skip the schedule's ticks until it is resumed (paused ticks are not replayed)."""
        await self._get(name)
        await self.app.client.sadd(self.keys.paused, name)
        await self.app.client.incr(self.keys.version)

    async def resume(self, name: str) -> None:
        """Let a paused schedule fire again, from its next tick."""
        await self._get(name)
        await self.app.client.srem(self.keys.paused, name)
        await self.app.client.incr(self.keys.version)

    async def trigger(self, name: str) -> TaskHandle[Any]:
        """Enqueue a run now, outside the schedule's ticks, in backoff or paused too (a
        backoff is logged as overridden). The run counts as one of the schedule's: its
        success ends a backoff, its final failure extends it."""
        return (await self.trigger_run(name)).handle

    async def trigger_run(self, name: str) -> TriggeredRun:
        """:meth:`trigger`, saying whether the run went through a backoff (what the CLI,
        the API and the dashboard tell whoever triggered it)."""
        schedule = await self._get(name)
        task = self.app.tasks.get(schedule.task)
        if not isinstance(task, Task):
            raise ConfigError(f"schedule {name!r} names task {schedule.task!r}, unknown here")
        bound = task.options(queue=schedule.queue, priority=schedule.priority)
        # Through this app (the one the caller opened), whichever app declared the task.
        plan = Plan.of(self.app, bound)
        options = {**plan.options, **run_options(schedule, None)}
        plan = replace(
            plan,
            options=options,
            encode_plain=plain_encoder(self.app.serializer, bound.name, options)
            if plan.encode_plain is not None
            else None,
        )
        now = datetime.now(timezone.utc)
        (state,) = await self._backoff_states([schedule], now)
        handles = await enqueue(self.app, bound, plan, [(schedule.args, schedule.kwargs)])
        if state is None or not state.resting(now):
            return TriggeredRun(handles[0], None)
        log.warning(
            "schedule %s triggered by hand during its backoff (%d failed run%s in a row, "
            "resting until %s): task %s runs now",
            name, state.failures, "" if state.failures == 1 else "s",
            state.until.isoformat(), handles[0].id,
        )  # fmt: skip
        return TriggeredRun(handles[0], state)

    async def backoff(self, name: str) -> BackoffState | None:
        """The schedule's backoff state: None when its last run did not fail (or a day
        passed since its last failure)."""
        (state,) = await self._backoff_states([await self._get(name)])
        return state

    async def resting(self) -> dict[str, BackoffState]:
        """The schedules whose ticks are skipped now, after failed runs: name -> state."""
        schedules = await self.all()
        now = datetime.now(timezone.utc)
        states = await self._backoff_states(schedules, now)
        return {
            schedule.name: state
            for schedule, state in zip(schedules, states, strict=True)
            if state is not None and state.resting(now)
        }

    async def _backoff_states(
        self, schedules: Sequence[Schedule], now: datetime | None = None
    ) -> builtins.list[BackoffState | None]:
        """Each schedule's backoff state, in one round trip (None for a schedule without
        a backoff policy: a state left from when it had one gates nothing)."""
        now = now or datetime.now(timezone.utc)
        client = self.app.client
        raw: builtins.list[Any] = await asyncio.gather(
            *(client.hget(self.app.keys(s.queue).backoff, s.name) for s in schedules)
        )
        return [
            _backoff_state(value, now) if schedule.backoff else None
            for schedule, value in zip(schedules, raw, strict=True)
        ]

    async def reset_backoff(self, name: str) -> bool:
        """End the schedule's backoff now: its next tick runs. False when it had none."""
        schedule = await self._get(name)
        return bool(await self.app.client.hdel(self.app.keys(schedule.queue).backoff, name))

    async def ticks(self, name: str, limit: int = 20) -> builtins.list[TickRecord]:
        """The schedule's latest tick records, newest first: each tick and how it ended
        (enqueued, or skipped: in backoff, overlapping, paused, missed), and how each run
        ended (up to 100 kept, for a month)."""
        schedule = await self._get(name)
        key = self.app.keys(schedule.queue).tick_log(name)
        raw: Any = await self.app.client.xrevrange(key, count=max(1, min(limit, 1000)))
        records = (
            parsed("schedule", f"{key} entry {text(entry_id)}", partial(tick_record, entry_id, f))
            for entry_id, f in raw
        )
        return [r for r in records if r is not None]

    async def leader(self) -> str | None:
        """The instance that leads now (``host-pid:token``), or None."""
        raw: Any = await self.app.client.get(self.keys.leader)
        return leader_text(self.keys.leader, raw)

    async def all(self) -> list[Schedule]:
        """Every schedule: those declared in code, then those added at runtime."""
        runtime = (await load_runtime(self.app, self.keys)).schedules
        declared = list(self.app.declared_schedules)
        names = {s.name for s in declared}
        return declared + [s for s in runtime if s.name not in names]

    async def list(self, now: datetime | None = None) -> list[ScheduleInfo]:
        """Every schedule with its next run, last run and last outcome."""
        return await self._infos(await self.all(), now)

    async def page(
        self, cursor: str | None = None, limit: int = 50, now: datetime | None = None
    ) -> tuple[builtins.list[ScheduleInfo], str | None]:
        """Schedules in name order, ``limit`` after ``cursor`` (a name), and the cursor of
        the next page (None at the end). The definitions are read whole (schedules are
        few); the state of the page's schedules only."""
        ordered = sorted(await self.all(), key=lambda s: s.name)
        if cursor is not None:
            ordered = [s for s in ordered if s.name > cursor]
        chosen = ordered[:limit]
        more = len(ordered) > limit
        return await self._infos(chosen, now), chosen[-1].name if chosen and more else None

    async def get(self, name: str) -> Schedule | None:
        """The schedule named ``name`` (declared or added at runtime), or None."""
        for schedule in await self.all():
            if schedule.name == name:
                return schedule
        return None

    async def _infos(
        self, schedules: Sequence[Schedule], now: datetime | None
    ) -> builtins.list[ScheduleInfo]:
        from ..base._errors import TaskNotFound

        now = now or datetime.now(timezone.utc)
        now_ms = int(now.timestamp() * 1000)
        declared = {s.name for s in self.app.declared_schedules}
        paused = (await load_runtime(self.app, self.keys)).paused
        raw_errors: Any = await self.app.client.hgetall(self.keys.errors)
        backoffs = await self._backoff_states(schedules, now)
        errors = {
            k: v
            for k, v in (
                parsed("schedule", f"{self.keys.errors} field {k[:100]!r}", partial(_texts, k, v))
                or (None, None)
                for k, v in raw_errors.items()
            )
            if k is not None and v is not None
        }
        client = self.app.client
        # The page's markers, then the outcomes of their last runs: each read is sent at
        # once, so a page costs two round trips however many schedules it holds.
        markers: list[Any] = await asyncio.gather(
            *(client.hget(self.app.keys(s.queue).schedules, s.name) for s in schedules)
        )
        lasts: list[tuple[int | None, str | None]] = []
        for schedule, raw in zip(schedules, markers, strict=True):
            key = self.app.keys(schedule.queue).schedules
            where = f"{key} field {schedule.name[:100]!r}"
            # A malformed marker shows as no last run (the scheduler reports it as the
            # schedule's error, with how to clear it).
            read = parsed("schedule", where, partial(parse_marker, raw)) if raw else None
            lasts.append(read or (None, None))

        async def outcome_of(task_id: str | None) -> str | None:
            if not task_id:
                return None
            try:
                return (await _lifecycle.status(self.app, task_id)).value
            except TaskNotFound:
                return "expired"

        outcomes = await asyncio.gather(*(outcome_of(last_id) for _, last_id in lasts))
        out: builtins.list[ScheduleInfo] = []
        for schedule, (last_tick, last_id), outcome, backoff in zip(
            schedules, lasts, outcomes, backoffs, strict=True
        ):
            after = max(now_ms, last_tick or 0)
            if backoff is not None:  # its first tick at or after the end of the rest
                after = max(after, int(backoff.until.timestamp() * 1000) - 1)
            # A definition written by hand may pass its checks and still have no next tick
            # a datetime holds (an interval of a microsecond, a cron past the year 9999).
            next_ms = parsed(
                "schedule",
                f"{self.keys.definitions} field {schedule.name[:100]!r}",
                partial(_next_tick, schedule, after),
            )
            out.append(
                ScheduleInfo(
                    schedule=schedule,
                    source="code" if schedule.name in declared else "runtime",
                    paused=schedule.name in paused,
                    next_run=_dt(next_ms),
                    last_run=_dt(last_tick) if last_id else None,
                    last_task_id=last_id,
                    last_outcome=outcome,
                    error=errors.get(schedule.name),
                    backoff=backoff,
                )
            )
        return out

    async def invalid(self) -> dict[str, str]:
        """Runtime schedules whose stored definition cannot be used: name -> why."""
        return (await load_runtime(self.app, self.keys)).invalid

    async def _get(self, name: str) -> Schedule:
        schedule = await self.get(name)
        if schedule is None:
            raise ConfigError(f"no schedule named {name!r}")
        return schedule


def run_options(schedule: Schedule, tick: int | None) -> dict[str, Any]:
    """The envelope options of a run of ``schedule``: which schedule and tick it is (None
    for a run triggered by hand), and its failure backoff, which the settle of the run
    applies (scripts/settle.lua)."""
    options: dict[str, Any] = {"schedule": schedule.name}
    if tick is not None:
        options["tick"] = tick
    if schedule.backoff is not None:
        options["backoff"] = schedule.backoff.spec
    return options


def _backoff_state(raw: bytes | None, now: datetime) -> BackoffState | None:
    """A stored backoff state ('<failures>|<until ms>|<forget at ms>'), None when absent,
    forgotten or unreadable (the tick script ignores and deletes such a state too)."""
    if raw is None:
        return None
    parts = raw.split(b"|")
    if len(parts) != 3 or not all(p.isdigit() and len(p) <= 16 for p in parts):
        return None
    failures, until, forget = (int(p) for p in parts)
    forget_at = _dt(forget)
    if forget_at is None or forget_at <= now or until > MAX_TICK_MS:
        return None
    return BackoffState(failures, _dt(until) or now, forget_at)


def tick_record(entry_id: Any, fields: Any) -> TickRecord:
    values = {text(k): text(v) for k, v in fields.items()}
    at_ms = int(text(entry_id).partition("-")[0])
    tick = values.get("tick") or ""
    failures = values.get("failures")
    until = values.get("until")
    return TickRecord(
        at=_dt(at_ms) or datetime.now(timezone.utc),
        tick=_dt(int(tick)) if tick else None,
        outcome=values["outcome"],
        task_id=values.get("id") or None,
        failures=int(failures) if failures else None,
        until=_dt(int(until)) if until else None,
    )


def _dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _next_tick(schedule: Schedule, after_ms: int) -> int:
    """The schedule's next tick after ``after_ms``, checked to be a time a datetime holds."""
    tick = next(schedule.ticks_after(after_ms))
    _dt(tick)
    return tick


def _texts(field: Any, reply: Any) -> tuple[str, str]:
    return text(field), text(reply)


def describe(info: ScheduleInfo) -> dict[str, Any]:
    return {
        "name": info.schedule.name,
        "task": info.schedule.task,
        "spec": info.schedule.spec,
        "source": info.source,
        "paused": info.paused,
        "next_run": info.next_run.isoformat() if info.next_run else None,
        "last_run": info.last_run.isoformat() if info.last_run else None,
        "last_task_id": info.last_task_id,
        "last_outcome": info.last_outcome,
        "error": info.error,
        "backoff": None
        if info.backoff is None
        else {
            "failures": info.backoff.failures,
            "until": info.backoff.until.isoformat(),
            "resting": info.backoff.resting(),
        },
    }
