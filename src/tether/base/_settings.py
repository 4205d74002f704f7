"""Settings: frozen keyword-only dataclasses, validated once, with clear errors.

Durations accept ``float`` seconds or ``timedelta`` at the edge and are stored as float
seconds. Every error names the setting and the value that was refused.
"""

from __future__ import annotations

import ipaddress
import os
import random
import re
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any

from ._errors import ConfigError

PRIORITIES: tuple[str, ...] = ("high", "normal", "low")
"""Priority names, highest first. Each queue has one stream per priority."""

ABANDONED = "abandoned"
"""The reserved consumer that holds entries handed off at shutdown; always claimable."""

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")
_CONSUMER_RE = re.compile(r"^[^\s{}]{1,200}$")

Duration = float | int | timedelta


def seconds(value: Duration | None, name: str, *, allow_zero: bool = False) -> float:
    """Normalise a duration setting to float seconds, refusing negatives (and zero)."""
    if value is None:
        raise ConfigError(f"{name} must be a duration in seconds, not None")
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name}={value!r}: expected seconds (a number) or a timedelta")
    if value < 0 or (value == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "more than zero"
        raise ConfigError(f"{name}={value!r}: must be {bound} seconds")
    return float(value)


def check_name(kind: str, value: str) -> str:
    """Queue and namespace names end up inside Redis keys and hash tags."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise ConfigError(
            f"{kind} {value!r} is not a valid name: use 1 to 100 letters, digits, '_', '.' "
            "or '-', starting with a letter or digit"
        )
    return value


def check_priority(value: str) -> str:
    if value not in PRIORITIES:
        raise ConfigError(f"priority {value!r} is unknown: use one of {', '.join(PRIORITIES)}")
    return value


_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9\-.]{0,252})?$")


def check_host(name: str, value: object) -> str:
    """An address to listen on: an IPv4 or IPv6 address, or a host name (no port)."""
    if isinstance(value, str) and value:
        try:
            ipaddress.ip_address(value)
            return value
        except ValueError:
            if _HOST_RE.match(value):
                return value
    raise ConfigError(
        f"{name}={value!r}: expected an address to listen on (127.0.0.1, 0.0.0.0, ::1 or a "
        "host name), without a port"
    )


def default_consumer_name() -> str:
    """host-pid-random: unique among live workers, readable in XINFO CONSUMERS."""
    host = socket.gethostname().split(".")[0] or "host"
    return f"{host}-{os.getpid()}-{secrets.token_hex(3)}"


def _positive_int(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name}={value!r}: expected a whole number")
    if value < minimum:
        raise ConfigError(f"{name}={value!r}: must be {minimum} or more")
    return value


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """How one worker process fetches, runs and recovers tasks.

    Attributes:
        queues: the queues served, in the order they are read.
        concurrency: tasks run at once (async tasks on the loop, sync ones in threads).
        max_pending: entries delivered to this worker and not yet acknowledged, across all
            its queues and priorities (running plus buffered). Defaults to ``concurrency``.
        name: the consumer name; set a stable one (the pod name) so that a restart resumes
            its predecessor's entries at once. Defaults to host-pid-random.
        burst: exit once the queues hold nothing that is due.
        heartbeat_interval: how often the heartbeat thread renews this worker's leases.
        heartbeat_ttl: the lease expiry; a worker silent this long is presumed dead.
        reclaim_interval: how often maintenance (reclaim, promotion of due tasks) runs,
            jittered by up to 20 percent.
        stall_timeout: the heartbeat stops renewing when the event loop has not ticked
            for this long, so a deadlocked worker releases its tasks.
        max_deliveries: a reclaimed entry delivered this many times already goes to the
            dead-letter stream instead of running again.
        shutdown_grace: on SIGTERM, how long running tasks may take before they are
            cancelled and handed off.
        reclaim_page_size: pending entries examined per page of XPENDING.
        housekeeping_interval: how often dead consumers are removed from the groups.
        reconnect_max_delay: the cap of the backoff between reconnection attempts.
        scheduler: also run the periodic-task scheduler (one leader among all workers).
        connect_timeout: give up with an error when the server cannot be reached for this
            long at start or, in burst mode, at any time; default: keep retrying (30 s in
            burst mode).
        health_file: a file whose modification time the heartbeat updates after each
            successful lease renewal, for liveness probes.
        metrics_port: serve Prometheus metrics on this port at /metrics while the worker
            runs (needs the metrics extra; 0 picks a free port). Default: no metrics.
        metrics_bind: the address the metrics server listens on.
    """

    queues: tuple[str, ...] = ("default",)
    concurrency: int = 16
    max_pending: int | None = None
    name: str | None = None
    burst: bool = False
    heartbeat_interval: float = 2.0
    heartbeat_ttl: float = 10.0
    reclaim_interval: float = 1.0
    stall_timeout: float = 120.0
    max_deliveries: int = 3
    shutdown_grace: float = 30.0
    reclaim_page_size: int = 100
    housekeeping_interval: float = 60.0
    reconnect_max_delay: float = 5.0
    scheduler: bool = True
    connect_timeout: float | None = None
    health_file: str | None = None
    metrics_port: int | None = None
    metrics_bind: str = "127.0.0.1"

    def __post_init__(self) -> None:
        queues = self.queues
        if isinstance(queues, str):
            queues = tuple(q for q in queues.split(",") if q)
        if not queues:
            raise ConfigError("queues: a worker must serve at least one queue")
        queues = tuple(check_name("queue", q.strip()) for q in queues)
        if len(set(queues)) != len(queues):
            raise ConfigError(f"queues={list(queues)!r}: a queue is listed twice")
        object.__setattr__(self, "queues", queues)
        _positive_int("concurrency", self.concurrency)
        max_pending = self.concurrency if self.max_pending is None else self.max_pending
        _positive_int("max_pending", max_pending)
        if max_pending < self.concurrency:
            raise ConfigError(
                f"max_pending={max_pending} is below concurrency={self.concurrency}: the worker "
                "could never fill its slots"
            )
        object.__setattr__(self, "max_pending", max_pending)
        name = self.name or default_consumer_name()
        if not _CONSUMER_RE.match(name) or name == ABANDONED:
            raise ConfigError(
                f"name={name!r}: use 1 to 200 characters without spaces or braces; "
                f"{ABANDONED!r} is reserved"
            )
        object.__setattr__(self, "name", name)
        for key in (
            "heartbeat_interval",
            "heartbeat_ttl",
            "reclaim_interval",
            "stall_timeout",
            "housekeeping_interval",
            "reconnect_max_delay",
        ):
            object.__setattr__(self, key, seconds(getattr(self, key), key))
        object.__setattr__(
            self, "shutdown_grace", seconds(self.shutdown_grace, "shutdown_grace", allow_zero=True)
        )
        if self.heartbeat_ttl <= self.heartbeat_interval:
            raise ConfigError(
                f"heartbeat_ttl={self.heartbeat_ttl} must exceed "
                f"heartbeat_interval={self.heartbeat_interval}, or a live worker's lease "
                "expires between two renewals"
            )
        if self.stall_timeout < self.heartbeat_ttl:
            raise ConfigError(
                f"stall_timeout={self.stall_timeout} must be at least "
                f"heartbeat_ttl={self.heartbeat_ttl}"
            )
        _positive_int("max_deliveries", self.max_deliveries)
        _positive_int("reclaim_page_size", self.reclaim_page_size)
        if self.connect_timeout is not None:
            object.__setattr__(
                self, "connect_timeout", seconds(self.connect_timeout, "connect_timeout")
            )
        if self.health_file is not None and (
            not isinstance(self.health_file, str) or not self.health_file
        ):
            raise ConfigError(f"health_file={self.health_file!r}: expected a file path")
        self._check_metrics()

    def _check_metrics(self) -> None:
        if self.metrics_port is not None:
            port = _positive_int("metrics_port", self.metrics_port, 0)
            if port > 65535:
                raise ConfigError(f"metrics_port={port}: a port is 0 to 65535")
        check_host("metrics_bind", self.metrics_bind)

    @property
    def give_up_after(self) -> float | None:
        """How long the server may stay unreachable before the worker stops with an error."""
        if self.connect_timeout is not None:
            return self.connect_timeout
        return 30.0 if self.burst else None

    @property
    def consumer(self) -> str:
        assert self.name is not None  # set in __post_init__
        return self.name

    @property
    def pending_limit(self) -> int:
        assert self.max_pending is not None  # set in __post_init__
        return self.max_pending

    @property
    def outage_grace(self) -> float:
        """How long after an outage reclaim waits: two heartbeats, so every live worker
        renews its lease (which may have expired while the server was away) before anyone
        judges it dead."""
        return 2 * self.heartbeat_interval + self.reclaim_interval

    def reconnect_delay(self, attempt: int) -> float:
        """The pause before try ``attempt`` (1, 2, ...) to reach the server again:
        exponential from 0.1 s, capped at ``reconnect_max_delay``, with jitter."""
        cap = self.reconnect_max_delay
        return float(min(cap, 0.1 * 2 ** min(attempt, 10)) * random.uniform(0.5, 1.0))

    @classmethod
    def from_env(
        cls, prefix: str = "TETHER_", environ: Mapping[str, str] | None = None, **overrides: Any
    ) -> WorkerSettings:
        """Read ``TETHER_CONCURRENCY``, ``TETHER_HEARTBEAT_TTL`` and so on; overrides win."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(prefix + f.name.upper())
            if raw is None:
                continue
            values[f.name] = _parse_env_value(f.name, raw, f.type)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def _parse_env_value(name: str, raw: str, kind: object) -> Any:
    text = str(kind)
    try:
        if "bool" in text:
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if "tuple" in text:
            return tuple(q.strip() for q in raw.split(",") if q.strip())
        if "float" in text:
            return float(raw)
        if "int" in text:
            return int(raw)
    except ValueError:
        raise ConfigError(f"{name}: the environment value {raw!r} cannot be parsed") from None
    return raw


@dataclass(frozen=True, kw_only=True)
class AppSettings:
    """Settings of a :class:`~tether.Tether` app shared by producers and workers.

    Attributes:
        url: the Redis URL (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
            ``redis+sentinel://``).
        namespace: prefix of every key, so several apps can share one server.
        result_ttl: how long results and outcomes are kept (default one hour).
        dead_letter_maxlen: the approximate cap of each queue's dead-letter stream.
        socket_timeout: how long one command may wait for the server before it fails.
        connect_timeout: how long opening a connection may take.
        max_connections: connections each client of the app keeps to a server (to each node
            of a Cluster) at most (100). Calls made while all are in use wait for one.
        pool_timeout: how long such a call waits for a free connection before it fails with
            an error that says so (10 s).
        enqueue_replicas: when above zero, each enqueue waits until this many replicas
            acknowledged it (``WAIT``), so a failover cannot lose it.
        enqueue_replicas_timeout: how long such an enqueue waits for the replicas.
        stats: workers record per-task statistics (counts by outcome, run and wait time
            distributions) in per-minute and per-hour buckets.
        stats_window: how long statistics are kept (24 h by default).
    """

    url: str
    namespace: str = "tether"
    result_ttl: float = 3600.0
    dead_letter_maxlen: int = 10_000
    socket_timeout: float = 10.0
    connect_timeout: float = 5.0
    max_connections: int = 100
    pool_timeout: float = 10.0
    enqueue_replicas: int = 0
    enqueue_replicas_timeout: float = 1.0
    stats: bool = True
    stats_window: float = 24 * 3600.0

    def __post_init__(self) -> None:
        check_name("namespace", self.namespace)
        for key in (
            "result_ttl",
            "socket_timeout",
            "connect_timeout",
            "pool_timeout",
            "enqueue_replicas_timeout",
            "stats_window",
        ):
            object.__setattr__(self, key, seconds(getattr(self, key), key))
        _positive_int("dead_letter_maxlen", self.dead_letter_maxlen, 10)
        _positive_int("max_connections", self.max_connections, 2)
        _positive_int("enqueue_replicas", self.enqueue_replicas, 0)
        if not isinstance(self.stats, bool):
            raise ConfigError(f"stats={self.stats!r}: expected True or False")
        if self.stats_window < 3600:
            raise ConfigError(f"stats_window={self.stats_window!r}: must be one hour or more")
