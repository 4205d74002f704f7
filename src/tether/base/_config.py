"""A task's declared defaults, and the backoff between its attempts."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from ._errors import ConfigError
from ._limits import TaskLimits
from ._settings import check_name, check_priority, seconds


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with a cap and jitter: attempt n waits about
    ``min(cap, base * factor ** (n - 1))`` seconds, scaled by a random factor in
    ``[1 - jitter, 1]`` so a fleet of retries does not arrive at once.
    """

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        seconds(self.base, "backoff base", allow_zero=True)
        seconds(self.cap, "backoff cap", allow_zero=True)
        if self.factor < 1:
            raise ConfigError(f"backoff factor={self.factor!r}: must be 1 or more")
        if not 0 <= self.jitter <= 1:
            raise ConfigError(f"backoff jitter={self.jitter!r}: must be between 0 and 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1`` after attempt ``attempt`` failed."""
        raw = min(self.cap, self.base * self.factor ** max(attempt - 1, 0))
        return raw * (1 - self.jitter * random.random())


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """A task's declared defaults."""

    name: str
    queue: str = "default"
    priority: str = "normal"
    retries: int = 0
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    backoff: Backoff | Callable[[int], float] = field(default_factory=Backoff)
    timeout: float | None = None
    store_result: bool = True
    result_ttl: float | None = None
    limits: TaskLimits | None = None
    """Flow-control limits (rate, concurrency, per limit key); None when unlimited."""

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ConfigError(f"task name {self.name!r} must be a non-empty string")
        check_name("queue", self.queue)
        check_priority(self.priority)
        check_retries(self.retries, self.name)
        if self.timeout is not None:
            object.__setattr__(self, "timeout", check_timeout(self.timeout, self.name))
        if self.result_ttl is not None:
            object.__setattr__(self, "result_ttl", seconds(self.result_ttl, "result_ttl"))
        for exc in self.retry_on:
            if not (isinstance(exc, type) and issubclass(exc, BaseException)):
                raise ConfigError(
                    f"task {self.name!r}: retry_on holds {exc!r}, not an exception class"
                )

    def retry_delay(self, attempt: int) -> float:
        if isinstance(self.backoff, Backoff):
            return self.backoff.delay(attempt)
        return max(0.0, float(self.backoff(attempt)))


def check_retries(value: object, task: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"task {task!r}: retries={value!r} must be a whole number, 0 or more")
    return value


def check_timeout(value: float | timedelta, task: str) -> float:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(f"task {task!r}: timeout={value!r} must be more than zero seconds")
    return float(value)
