"""Flow-control limits: what a task declares, how a rate is written, and where each limit
keeps its state in Redis.

A task may declare, with ``@app.task(...)``:

- ``rate_limit="60/m"`` (and ``rate_burst=``): at most that many starts per period across
  every worker, a token bucket (GCRA) in the queue's hash slot on the server's clock;
- ``concurrency_limit=N``: at most N running at once across the deployment;
- ``key_rate_limit=``, ``key_rate_burst=`` and ``key_concurrency_limit=``: the same, per
  limit key (``task.options(limit_key="tenant:42")``).

Declared values are the defaults; :mod:`tether.limits` changes them at runtime (an override
per queue and task, stored in Redis and read by the admission script at every admission).

Every key of a limit lives under the queue's hash tag, so each admission, release and
reclaim runs in one cluster slot. Task names and limit keys are arbitrary text, so the task
name is written with its length in front: no two (task, key) pairs give the same key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ._errors import ConfigError

_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}
_RATE_RE = re.compile(
    r"^\s*(?P<count>\d+)\s*/\s*(?P<mult>\d+(?:\.\d+)?)?\s*(?P<unit>[a-z]+)\s*$", re.I
)
MAX_LIMIT_KEY = 200
"""The longest limit key, in characters (it becomes part of Redis key names)."""


@dataclass(frozen=True, slots=True)
class Rate:
    """``count`` starts per ``period_s`` seconds."""

    count: int
    period_s: float

    @property
    def interval_ms(self) -> float:
        """Milliseconds between two starts at the steady rate."""
        return self.period_s * 1000 / self.count

    def __str__(self) -> str:
        for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
            if self.period_s == size:
                return f"{self.count}/{unit}"
        for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
            multiple = self.period_s / size
            if multiple >= 1 and multiple == int(multiple):
                return f"{self.count}/{int(multiple)}{unit}"
        return f"{self.count}/{self.period_s * 1000:g}ms"


def parse_rate(task: str, name: str, value: object) -> Rate:
    """``"60/m"``, ``"100/s"``, ``"5/10s"``, ``"1000/h"``, ``"3/day"`` as a :class:`Rate`;
    anything else is a :class:`ConfigError` naming the task and the value."""
    if isinstance(value, Rate):
        return value
    if not isinstance(value, str):
        raise ConfigError(
            f"task {task!r}: {name}={value!r} must be a rate such as '60/m' or '100/s'"
        )
    match = _RATE_RE.match(value)
    unit = _unit(match.group("unit")) if match else None
    if match is None or unit is None:
        raise ConfigError(
            f"task {task!r}: {name}={value!r} is not a rate: write '<count>/<period>' such as "
            "'60/m', '100/s', '5/10s' (units ms, s, m, h, d)"
        )
    count = int(match.group("count"))
    multiple = float(match.group("mult") or 1)
    period = multiple * unit
    if count <= 0 or period <= 0:
        raise ConfigError(f"task {task!r}: {name}={value!r} must allow at least one start")
    if period * 1000 / count < 0.001:
        raise ConfigError(f"task {task!r}: {name}={value!r} is above a million starts a second")
    return Rate(count, period)


def _unit(name: str) -> float | None:
    name = name.lower()
    if name in _UNITS:
        return _UNITS[name]
    return _UNITS.get(name[:-1]) if name.endswith("s") else None  # plurals: mins, hours


def check_limit(task: str, name: str, value: object) -> int:
    """A concurrency limit or a burst: a whole number, 1 or more."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"task {task!r}: {name}={value!r} must be a whole number, 1 or more")
    return value


def check_limit_key(task: str, value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_LIMIT_KEY:
        raise ConfigError(
            f"task {task!r}: limit_key={value!r} must be text of 1 to {MAX_LIMIT_KEY} characters"
        )
    return value


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskLimits:
    """A task's flow-control limits (each ``None`` when not limited)."""

    rate_limit: Rate | None = None
    rate_burst: int = 1
    """How many may start at once after the limit has been idle (the bucket's size)."""
    concurrency_limit: int | None = None
    key_rate_limit: Rate | None = None
    key_rate_burst: int = 1
    key_concurrency_limit: int | None = None

    @classmethod
    def declare(
        cls,
        task: str,
        *,
        rate_limit: object = None,
        rate_burst: object = None,
        concurrency_limit: object = None,
        key_rate_limit: object = None,
        key_rate_burst: object = None,
        key_concurrency_limit: object = None,
    ) -> TaskLimits | None:
        """Validate a declaration; None when it limits nothing."""
        rate = None if rate_limit is None else parse_rate(task, "rate_limit", rate_limit)
        key_rate = (
            None if key_rate_limit is None else parse_rate(task, "key_rate_limit", key_rate_limit)
        )
        if rate_burst is not None and rate is None:
            raise ConfigError(f"task {task!r}: rate_burst={rate_burst!r} needs a rate_limit")
        if key_rate_burst is not None and key_rate is None:
            raise ConfigError(
                f"task {task!r}: key_rate_burst={key_rate_burst!r} needs a key_rate_limit"
            )
        limits = cls(
            rate_limit=rate,
            rate_burst=1 if rate_burst is None else check_limit(task, "rate_burst", rate_burst),
            concurrency_limit=None
            if concurrency_limit is None
            else check_limit(task, "concurrency_limit", concurrency_limit),
            key_rate_limit=key_rate,
            key_rate_burst=1
            if key_rate_burst is None
            else check_limit(task, "key_rate_burst", key_rate_burst),
            key_concurrency_limit=None
            if key_concurrency_limit is None
            else check_limit(task, "key_concurrency_limit", key_concurrency_limit),
        )
        return limits if limits.any else None

    @property
    def any(self) -> bool:
        return any(
            v is not None
            for v in (
                self.rate_limit,
                self.concurrency_limit,
                self.key_rate_limit,
                self.key_concurrency_limit,
            )
        )

    @property
    def keyed(self) -> bool:
        """Whether a limit key means anything for this task."""
        return self.key_rate_limit is not None or self.key_concurrency_limit is not None

    def wire(self) -> list[float]:
        """The eight numbers the scripts read (see scripts/limit_lib.lua): rate count,
        period ms, burst, concurrency, then the same per key; 0 means no such limit."""
        return [*_wire_rate(self.rate_limit, self.rate_burst), self.concurrency_limit or 0,
                *_wire_rate(self.key_rate_limit, self.key_rate_burst),
                self.key_concurrency_limit or 0]  # fmt: skip

    def summary(self) -> str:
        """One line for logs: 'rate 50/s (burst 5), 3 at once; per key: 2 at once'."""

        def part(rate: Rate | None, burst: int, concurrency: int | None) -> str:
            bits = []
            if rate is not None:
                bits.append(f"rate {rate}" + (f" (burst {burst})" if burst > 1 else ""))
            if concurrency is not None:
                bits.append(f"{concurrency} at once")
            return ", ".join(bits)

        task = part(self.rate_limit, self.rate_burst, self.concurrency_limit)
        key = part(self.key_rate_limit, self.key_rate_burst, self.key_concurrency_limit)
        return "; ".join(p for p in (task, key and f"per key: {key}") if p)

    def describe(self) -> dict[str, Any]:
        """Readable form (rates as text), for logs, the API and the CLI."""
        return {
            "rate_limit": None if self.rate_limit is None else str(self.rate_limit),
            "rate_burst": self.rate_burst if self.rate_limit is not None else None,
            "concurrency_limit": self.concurrency_limit,
            "key_rate_limit": None if self.key_rate_limit is None else str(self.key_rate_limit),
            "key_rate_burst": self.key_rate_burst if self.key_rate_limit is not None else None,
            "key_concurrency_limit": self.key_concurrency_limit,
        }


NO_LIMITS = TaskLimits()

WIRE_FIELDS = ("rc", "rp", "rb", "c", "krc", "krp", "krb", "kc")
"""Field names of an override in the limits hash, in :meth:`TaskLimits.wire` order."""


def _wire_rate(rate: Rate | None, burst: int) -> tuple[float, float, int]:
    if rate is None:
        return (0, 0, 0)
    return (rate.count, rate.period_s * 1000, burst)


def _rate_of(count: Any, period_ms: Any) -> Rate | None:
    if not count or not period_ms:
        return None
    return Rate(int(count), float(period_ms) / 1000)


def merge(declared: TaskLimits | None, override: dict[str, Any] | None) -> TaskLimits:
    """The effective limits: each field of the override wins over the declared value."""
    base = dict(zip(WIRE_FIELDS, (declared or NO_LIMITS).wire(), strict=True))
    for name in WIRE_FIELDS:
        value = (override or {}).get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            base[name] = value
    return TaskLimits(
        rate_limit=_rate_of(base["rc"], base["rp"]),
        rate_burst=int(base["rb"]) or 1,
        concurrency_limit=int(base["c"]) or None,
        key_rate_limit=_rate_of(base["krc"], base["krp"]),
        key_rate_burst=int(base["krb"]) or 1,
        key_concurrency_limit=int(base["kc"]) or None,
    )


def decode_override(raw: bytes | str | None) -> dict[str, Any] | None:
    """An override read from the limits hash; None when absent or unreadable."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested past the parser
        return None
    return value if isinstance(value, dict) else None
