"""A schedule: when a periodic task fires, and what to do with ticks that were missed.

Cron expressions go through croniter and time zones through zoneinfo, DST included. A
fixed-time schedule (its hour field is not ``*``) fires once on the day clocks go back, at the
first of the two occurrences, and a time skipped when clocks go forward fires at the change, as
cron does; schedules with ``*`` hours fire at every real hour.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from ._errors import ConfigError
from ._settings import PRIORITIES, check_name

Missed = Literal["skip", "latest", "catchup"]
MISSED_POLICIES: tuple[str, ...] = ("skip", "latest", "catchup")
YEAR_MS = 366 * 24 * 3600 * 1000
MAX_TICKS_WALKED = 500_000
"""A bound on ticks examined at once (a seconds-level cron after a long outage)."""


def cron_problem(expr: object) -> str | None:
    """Why croniter refuses ``expr`` (its own words), or None when it is a valid expression."""
    if not isinstance(expr, str):
        return f"expected a string, not {type(expr).__name__}"
    try:
        croniter(expr)
    except Exception as exc:  # croniter raises several types; its message is the reason
        return str(exc) or type(exc).__name__
    return None


@dataclass(frozen=True)
class ScheduleBackoff:
    """How long a periodic task whose runs keep failing rests before its next run.

    When a run ends in final failure (dead-lettered after its retries), the schedule skips
    its ticks for ``initial`` seconds, then ``initial * factor``, ``initial * factor**2``...
    with each further failure in a row, up to ``cap``. A success ends the backoff; so does
    a day (``forget_after``) without a new failure. Times are seconds or timedeltas.
    """

    initial: float = 60.0
    factor: float = 2.0
    cap: float = 3600.0
    forget_after: float = 86400.0

    if TYPE_CHECKING:

        def __init__(
            self,
            initial: float | timedelta = 60.0,
            factor: float = 2.0,
            cap: float | timedelta = 3600.0,
            forget_after: float | timedelta = 86400.0,
        ) -> None: ...

    def __post_init__(self) -> None:
        for name in ("initial", "cap", "forget_after"):
            value = getattr(self, name)
            if isinstance(value, timedelta):
                value = value.total_seconds()
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(
                    f"ScheduleBackoff({name}={getattr(self, name)!r}): give seconds above zero"
                )
            if not math.isfinite(value):
                raise ConfigError(
                    f"ScheduleBackoff({name}={value!r}): give a finite number of seconds"
                )
            object.__setattr__(self, name, float(value))
        factor = self.factor
        if (
            isinstance(factor, bool)
            or not isinstance(factor, (int, float))
            or not (1 <= factor <= 100)
        ):
            raise ConfigError(f"ScheduleBackoff(factor={factor!r}): give a number from 1 to 100")
        object.__setattr__(self, "factor", float(factor))
        if self.cap < self.initial:
            raise ConfigError(
                f"ScheduleBackoff(cap={self.cap:g}) is below initial={self.initial:g}: the cap "
                "bounds the growing delay"
            )

    def delay(self, failures: int) -> float:
        """Seconds of rest after ``failures`` final failures in a row (1 or more)."""
        exponent = min(max(failures, 1) - 1, 64)  # a bound: the cap is reached long before
        return float(min(self.cap, self.initial * self.factor**exponent))

    @property
    def spec(self) -> str:
        """The policy as the settle script reads it (see scripts/settle.lua):
        ``<initial ms>|<factor>|<cap ms>|<forget ms>``."""
        return (
            f"{round(self.initial * 1000)}|{self.factor:g}|{round(self.cap * 1000)}|"
            f"{round(self.forget_after * 1000)}"
        )

    def to_dict(self) -> dict[str, float]:
        return {
            "initial": self.initial,
            "factor": self.factor,
            "cap": self.cap,
            "forget_after": self.forget_after,
        }


DEFAULT_BACKOFF = ScheduleBackoff()
"""On by default: a job that fails every run should not hit a struggling downstream system
on every tick. A schedule slower than its delay never skips a tick, and a success ends it."""


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """When and how a task fires periodically.

    Attributes:
        name: unique among the app's schedules; the key of its state in Redis.
        task: the registered task name.
        queue, priority: where its runs are enqueued.
        cron: a cron expression (5 fields, or 6 with seconds), read in ``tz``.
        every: a fixed interval instead of ``cron``; ticks are multiples of it since the epoch.
        tz: an IANA time zone name for ``cron`` (default UTC).
        args, kwargs: the task's arguments.
        missed: ticks missed while no scheduler ran: ``"latest"`` runs the latest one once
            (the default), ``"skip"`` runs none, ``"catchup"`` runs up to ``catchup_limit``.
        overlap: when False, a tick is skipped while the previous run is still queued,
            retrying or running.
        run_at_startup: fire once when the schedule is first seen (a first deploy, an empty
            Redis) instead of waiting for its next tick.
        grace: a tick later than this when the scheduler handles it counts as missed.
        backoff: after a run ends in final failure, skip the ticks of the next
            :class:`ScheduleBackoff` delay, growing with each failure in a row (on by default);
            ``False`` (or None) turns it off, ``True`` is the default policy.
    """

    name: str
    task: str
    queue: str = "default"
    priority: str = "normal"
    cron: str | None = None
    every: float | None = None
    tz: str = "UTC"
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    missed: Missed = "latest"
    catchup_limit: int = 10
    overlap: bool = True
    run_at_startup: bool = False
    grace: float = 5.0
    backoff: ScheduleBackoff | None = DEFAULT_BACKOFF

    if TYPE_CHECKING:
        # ``every`` is read as float seconds but given as seconds or a timedelta
        # (__post_init__ converts it): this is the constructor type checkers see, as the one
        # derived from the fields would refuse a timedelta. A test keeps it in step with the
        # fields (``...`` stands for the default factory of ``kwargs``).
        def __init__(
            self,
            *,
            name: str,
            task: str,
            queue: str = "default",
            priority: str = "normal",
            cron: str | None = None,
            every: float | timedelta | None = None,
            tz: str = "UTC",
            args: tuple[Any, ...] = (),
            kwargs: Mapping[str, Any] = ...,
            missed: Missed = "latest",
            catchup_limit: int = 10,
            overlap: bool = True,
            run_at_startup: bool = False,
            grace: float = 5.0,
            backoff: ScheduleBackoff | bool | None = ...,
        ) -> None: ...

    def __post_init__(self) -> None:
        if (
            not isinstance(self.name, str)
            or not self.name
            or len(self.name) > 200
            or "|" in self.name
        ):
            raise ConfigError(f"schedule name {self.name!r}: use 1 to 200 characters without '|'")
        check_name("queue", self.queue)
        if self.priority not in PRIORITIES:
            raise ConfigError(f"schedule {self.name!r}: priority {self.priority!r} is unknown")
        if (self.cron is None) == (self.every is None):
            raise ConfigError(f"schedule {self.name!r}: give exactly one of cron= or every=")
        if self.cron is not None:
            problem = cron_problem(self.cron)
            if problem:
                raise ConfigError(
                    f"schedule {self.name!r}: invalid cron expression {self.cron!r}: {problem}"
                )
        else:
            every = self.every
            if isinstance(every, timedelta):
                every = every.total_seconds()
            if isinstance(every, bool) or not isinstance(every, (int, float)) or not every > 0:
                raise ConfigError(
                    f"schedule {self.name!r}: every={self.every!r} must be an interval above zero"
                )
            object.__setattr__(self, "every", float(every))
        try:
            ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError, TypeError):
            raise ConfigError(f"schedule {self.name!r}: unknown time zone {self.tz!r}") from None
        if self.missed not in MISSED_POLICIES:
            raise ConfigError(
                f"schedule {self.name!r}: missed={self.missed!r}; "
                f"use one of {', '.join(MISSED_POLICIES)}"
            )
        if (
            isinstance(self.catchup_limit, bool)
            or not isinstance(self.catchup_limit, int)
            or self.catchup_limit < 1
        ):
            raise ConfigError(f"schedule {self.name!r}: catchup_limit must be 1 or more")
        try:
            json.dumps([list(self.args), dict(self.kwargs)])
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"schedule {self.name!r}: arguments must be JSON-serializable: {exc}"
            ) from None
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "kwargs", dict(self.kwargs))
        object.__setattr__(self, "backoff", _backoff_policy(self.name, self.backoff))

    # -- description ------------------------------------------------------------------

    @property
    def spec(self) -> str:
        """When it fires, as text: ``cron 0 * * * * (UTC)`` or ``every 30s``."""
        if self.cron is not None:
            return f"cron {self.cron} ({self.tz})"
        return f"every {_format_seconds(self.every or 0)}"

    def to_json(self) -> str:
        """The definition as stored for a runtime schedule (``from_json`` reads it)."""
        return json.dumps(
            {
                "name": self.name, "task": self.task, "queue": self.queue,
                "priority": self.priority, "cron": self.cron, "every": self.every,
                "tz": self.tz, "args": list(self.args), "kwargs": dict(self.kwargs),
                "missed": self.missed, "catchup_limit": self.catchup_limit,
                "overlap": self.overlap, "run_at_startup": self.run_at_startup,
                "grace": self.grace,
                "backoff": self.backoff.to_dict() if self.backoff else False,
            },
            sort_keys=True,
        )  # fmt: skip

    @classmethod
    def from_json(cls, text: str | bytes) -> Schedule:
        data = json.loads(text)
        data["args"] = tuple(data.get("args", ()))
        backoff = data.get("backoff", True)  # definitions stored before backoff existed
        if isinstance(backoff, dict):
            data["backoff"] = ScheduleBackoff(**backoff)
        return cls(**data)

    def task_id(self, namespace: str, tick_ms: int) -> str:
        """Deterministic per (schedule, tick): the same tick always has the same task id."""
        digest = hashlib.sha256(f"{namespace}|{self.name}|{tick_ms}".encode()).hexdigest()
        return f"{self.queue}:{digest[:32]}"

    # -- time ---------------------------------------------------------------------------

    def ticks_after(self, after_ms: int) -> Iterator[int]:
        """Tick instants (unix ms) strictly after ``after_ms``, in order, forever."""
        if self.every is not None:
            step = round(self.every * 1000)
            tick = (after_ms // step + 1) * step
            while True:
                yield tick
                tick += step
        zone = ZoneInfo(self.tz)
        start = datetime.fromtimestamp(after_ms / 1000, tz=timezone.utc).astimezone(zone)
        it = croniter(self.cron, start)
        fixed_hour = self._fixed_hour()
        previous_wall: datetime | None = None
        while True:
            moment: datetime = it.get_next(datetime)
            tick = math.floor(moment.timestamp() * 1000)
            if tick <= after_ms:
                continue
            wall = moment.replace(tzinfo=None)
            if fixed_hour and _repeated_wall_time(moment, zone) and wall == previous_wall:
                continue  # clocks went back: a fixed-time job fires once, at the first occurrence
            if fixed_hour and _repeated_wall_time(moment, zone) and previous_wall is None:
                first = _first_occurrence_ms(wall, zone)
                if first is not None and first <= after_ms < tick:
                    previous_wall = wall
                    continue
            previous_wall = wall
            yield tick

    def latest_tick_at_or_before(self, now_ms: int) -> int | None:
        """The last tick at or before ``now_ms``, or None if there is none within a year."""
        ticks, _ = self.due(now_ms - YEAR_MS, now_ms, 1)
        return ticks[-1] if ticks else None

    def due(self, marker_ms: int, now_ms: int, limit: int) -> tuple[list[int], bool]:
        """The latest ``limit`` ticks in ``(marker_ms, now_ms]``, and whether older ones in
        that span were left out."""
        start = marker_ms
        more = False
        if self.every is not None:
            step = round(self.every * 1000)
            if (now_ms - start) // step > limit + 1:  # a long outage: jump close to now
                start, more = now_ms - step * (limit + 1), True
        ticks: deque[int] = deque(maxlen=limit)
        for n, tick in enumerate(self.ticks_after(start)):
            if tick > now_ms or n > MAX_TICKS_WALKED:
                break
            if len(ticks) == limit:
                more = True
            ticks.append(tick)
        return list(ticks), more

    def _fixed_hour(self) -> bool:
        fields = (self.cron or "").split()
        hour = fields[1] if len(fields) == 5 else fields[2] if len(fields) == 6 else "*"
        return "*" not in hour


def _backoff_policy(name: str, backoff: object) -> ScheduleBackoff | None:
    """The policy a schedule's ``backoff=`` names: True is the default one, False none."""
    if backoff is True:
        return DEFAULT_BACKOFF
    if backoff is False or backoff is None:
        return None
    if not isinstance(backoff, ScheduleBackoff):
        raise ConfigError(
            f"schedule {name!r}: backoff={backoff!r}; give a ScheduleBackoff(...), True "
            "(the default policy) or False (none)"
        )
    return backoff


def _repeated_wall_time(moment: datetime, zone: ZoneInfo) -> bool:
    """True when this wall-clock time occurs twice that day (the hour clocks go back)."""
    wall = moment.replace(tzinfo=None)
    a = wall.replace(tzinfo=zone, fold=0).utcoffset()
    b = wall.replace(tzinfo=zone, fold=1).utcoffset()
    return a != b and a is not None and b is not None and a > b


def _first_occurrence_ms(wall: datetime, zone: ZoneInfo) -> int | None:
    return math.floor(wall.replace(tzinfo=zone, fold=0).timestamp() * 1000)


def _format_seconds(value: float) -> str:
    if value % 3600 == 0:
        return f"{int(value // 3600)}h"
    if value % 60 == 0:
        return f"{int(value // 60)}m"
    return f"{value:g}s"
