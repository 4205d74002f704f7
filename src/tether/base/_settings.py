"""Settings: frozen keyword-only dataclasses, validated once, with clear errors.

Each setting is typed, defaulted and described once, by its field: a duration is a
:class:`Seconds` (or :class:`OptionalSeconds`) field, given as float seconds or a
``timedelta`` and read as float seconds; the help text is the field's ``metadata["help"]``,
which ``tether worker --help`` shows and the class docstring lists (a test keeps the list in
step). Every error names the setting and the value that was refused; a name that is not a
setting fails with the name, the closest setting, or what it is called now.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import random
import re
import secrets
import socket
from collections.abc import Iterable, Mapping
from dataclasses import Field, dataclass, field, fields
from datetime import timedelta
from typing import Any, ClassVar, overload

from typing_extensions import Self

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


class _Duration:
    """A duration setting, the default of its field (``field(default=Seconds(2.0))``): given
    as seconds (a number) or a ``timedelta``, checked as it is set, stored and read as float
    seconds."""

    __slots__ = ("allow_zero", "default", "name")

    def __init__(self, default: float | None, *, allow_zero: bool = False) -> None:
        self.default = default
        self.allow_zero = allow_zero
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.default!r})"

    def _store(self, obj: object, value: Any, *, optional: bool) -> None:
        if isinstance(value, _Duration):  # the dataclass's __init__ gives the field's default
            value = value.default
        if value is not None or not optional:
            value = seconds(value, self.name, allow_zero=self.allow_zero)
        obj.__dict__[self.name] = value

    def _load(self, obj: object) -> Any:
        try:
            return obj.__dict__[self.name]
        except KeyError:
            raise AttributeError(self.name) from None


class Seconds(_Duration):
    """A duration setting: given as seconds or a ``timedelta``, read as float seconds."""

    __slots__ = ()

    def __init__(self, default: float, *, allow_zero: bool = False) -> None:
        super().__init__(default, allow_zero=allow_zero)

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> float: ...
    def __get__(self, obj: object, owner: type | None = None) -> float | Self:
        if obj is None:
            return self
        value: float = self._load(obj)
        return value

    def __set__(self, obj: object, value: float | timedelta) -> None:
        self._store(obj, value, optional=False)


class OptionalSeconds(_Duration):
    """A duration setting that may be unset (None)."""

    __slots__ = ()

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> float | None: ...
    def __get__(self, obj: object, owner: type | None = None) -> float | Self | None:
        if obj is None:
            return self
        value: float | None = self._load(obj)
        return value

    def __set__(self, obj: object, value: float | timedelta | None) -> None:
        self._store(obj, value, optional=True)


def default_of(setting: Field[Any]) -> Any:
    """The default value of a settings field (a duration's seconds)."""
    default = setting.default
    return default.default if isinstance(default, _Duration) else default


def help_of(setting: Field[Any]) -> str:
    """The help text of a settings field."""
    return str(setting.metadata.get("help", ""))


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to a misspelt one, if one is close."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return close[0] if close else None


def unknown_setting(where: str, name: str, known: Iterable[str]) -> ConfigError:
    """The error for a name that is not a setting, with the closest one when there is one."""
    near = closest(name, known)
    hint = f": did you mean {near}?" if near else ""
    return ConfigError(f"{where} has no setting {name!r}{hint}")


def refuse_unknown(
    cls: type, given: Iterable[str], *, where: str | None = None, also: Iterable[str] = ()
) -> None:
    """Raise ConfigError for the first of ``given`` that is neither a field of ``cls`` nor in
    ``also``: with its new name if it is an old one, else with the closest name."""
    known = {f.name for f in fields(cls)} | set(also)
    renamed: Mapping[str, tuple[str, str]] = getattr(cls, "_renamed", {})
    where = where or cls.__name__
    for name in given:
        if name in known:
            continue
        if name in renamed:
            new, meaning = renamed[name]
            raise ConfigError(f"{where} has no setting {name!r}: it is {new!r} now ({meaning})")
        raise unknown_setting(where, name, known)


@dataclass(frozen=True, kw_only=True)
class WorkerSettings:
    """How one worker process fetches, runs and recovers tasks.

    A duration (``Seconds``) is given as seconds or a ``timedelta`` and read as float
    seconds. ``tether worker`` has an option for each setting (``--heartbeat-ttl``) with the
    help below, which is the field's ``metadata["help"]``.

    Attributes:
        queues: the queues served, in the order they are read.
        concurrency: tasks run at once (async tasks on the loop, sync ones in threads).
        max_pending: entries delivered to this worker and not yet acknowledged, across all its
            queues and priorities (running plus buffered). Defaults to ``concurrency``.
        name: the consumer name; set a stable one (the pod name) so that a restart resumes its
            predecessor's entries at once. Defaults to host-pid-random.
        burst: exit once the queues hold nothing that is due.
        heartbeat_interval: how often the heartbeat thread renews this worker's leases.
        heartbeat_ttl: the lease expiry; a worker silent this long is presumed dead.
        reclaim_interval: how often maintenance (reclaim, promotion of due tasks) runs, jittered
            by up to 20 percent.
        stall_timeout: the heartbeat stops renewing when the event loop has not ticked for this
            long, so a deadlocked worker releases its tasks.
        max_deliveries: a reclaimed entry delivered this many times already goes to the
            dead-letter stream instead of running again.
        shutdown_grace: on SIGTERM, how long running tasks may take before they are cancelled
            and handed off.
        reclaim_page_size: pending entries examined per page of XPENDING.
        housekeeping_interval: how often dead consumers are removed from the groups.
        reconnect_max_delay: the cap of the backoff between reconnection attempts.
        scheduler: also run the periodic-task scheduler (one leader among all workers).
        give_up_after: stop with an error when the server cannot be reached for this long, at
            start or, in burst mode, at any time. Default: keep retrying (30 s in burst mode).
            Not the connect timeout of one connection, which is the app's.
        health_file: a file whose modification time the heartbeat updates after each successful
            lease renewal, for liveness probes.
        metrics_port: serve Prometheus metrics on this port at /metrics while the worker runs
            (needs the metrics extra; 0 picks a free port). Default: no metrics.
        metrics_bind: the address the metrics server listens on.
    """

    queues: tuple[str, ...] = field(
        default=("default",), metadata={"help": "the queues served, in the order they are read."}
    )
    concurrency: int = field(
        default=16,
        metadata={"help": "tasks run at once (async tasks on the loop, sync ones in threads)."},
    )
    max_pending: int | None = field(
        default=None,
        metadata={
            "help": "entries delivered to this worker and not yet acknowledged, across all its "
            "queues and priorities (running plus buffered). Defaults to ``concurrency``."
        },
    )
    name: str | None = field(
        default=None,
        metadata={
            "help": "the consumer name; set a stable one (the pod name) so that a restart "
            "resumes its predecessor's entries at once. Defaults to host-pid-random."
        },
    )
    burst: bool = field(
        default=False, metadata={"help": "exit once the queues hold nothing that is due."}
    )
    heartbeat_interval: Seconds = field(
        default=Seconds(2.0),
        metadata={"help": "how often the heartbeat thread renews this worker's leases."},
    )
    heartbeat_ttl: Seconds = field(
        default=Seconds(10.0),
        metadata={"help": "the lease expiry; a worker silent this long is presumed dead."},
    )
    reclaim_interval: Seconds = field(
        default=Seconds(1.0),
        metadata={
            "help": "how often maintenance (reclaim, promotion of due tasks) runs, jittered by "
            "up to 20 percent."
        },
    )
    stall_timeout: Seconds = field(
        default=Seconds(120.0),
        metadata={
            "help": "the heartbeat stops renewing when the event loop has not ticked for this "
            "long, so a deadlocked worker releases its tasks."
        },
    )
    max_deliveries: int = field(
        default=3,
        metadata={
            "help": "a reclaimed entry delivered this many times already goes to the "
            "dead-letter stream instead of running again."
        },
    )
    shutdown_grace: Seconds = field(
        default=Seconds(30.0, allow_zero=True),
        metadata={
            "help": "on SIGTERM, how long running tasks may take before they are cancelled and "
            "handed off."
        },
    )
    reclaim_page_size: int = field(
        default=100, metadata={"help": "pending entries examined per page of XPENDING."}
    )
    housekeeping_interval: Seconds = field(
        default=Seconds(60.0),
        metadata={"help": "how often dead consumers are removed from the groups."},
    )
    reconnect_max_delay: Seconds = field(
        default=Seconds(5.0),
        metadata={"help": "the cap of the backoff between reconnection attempts."},
    )
    scheduler: bool = field(
        default=True,
        metadata={"help": "also run the periodic-task scheduler (one leader among all workers)."},
    )
    give_up_after: OptionalSeconds = field(
        default=OptionalSeconds(None),
        metadata={
            "help": "stop with an error when the server cannot be reached for this long, at "
            "start or, in burst mode, at any time. Default: keep retrying (30 s in burst "
            "mode). Not the connect timeout of one connection, which is the app's."
        },
    )
    health_file: str | None = field(
        default=None,
        metadata={
            "help": "a file whose modification time the heartbeat updates after each "
            "successful lease renewal, for liveness probes."
        },
    )
    metrics_port: int | None = field(
        default=None,
        metadata={
            "help": "serve Prometheus metrics on this port at /metrics while the worker runs "
            "(needs the metrics extra; 0 picks a free port). Default: no metrics."
        },
    )
    metrics_bind: str = field(
        default="127.0.0.1", metadata={"help": "the address the metrics server listens on."}
    )

    _renamed: ClassVar[Mapping[str, tuple[str, str]]] = {
        "connect_timeout": (
            "give_up_after",
            "how long the server may stay unreachable before the worker stops with an error; "
            "the timeout of opening one connection is the app's, Tether(connect_timeout=...)",
        )
    }
    """Old names: passing one fails with the new name and what it means."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # Before the dataclass's __init__, whose TypeError would name neither the new name
        # nor the closest one.
        refuse_unknown(cls, kwargs)
        return super().__new__(cls)

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
        if self.give_up_after is None and self.burst:
            object.__setattr__(self, "give_up_after", BURST_GIVE_UP_AFTER)
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
        for old, (new, _) in cls._renamed.items():
            if prefix + old.upper() in env:
                raise ConfigError(
                    f"{prefix}{old.upper()} is not read: the setting is called "
                    f"{prefix}{new.upper()} now"
                )
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(prefix + f.name.upper())
            if raw is None:
                continue
            values[f.name] = _parse_env_value(f, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


BURST_GIVE_UP_AFTER = 30.0
"""How long a burst worker keeps trying to reach the server unless ``give_up_after`` says."""


def _parse_env_value(setting: Field[Any], raw: str) -> Any:
    name, text = setting.name, str(setting.type)
    if isinstance(setting.default, _Duration):
        text = "float"
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
    """Settings of a :class:`~tether.Tether` app shared by producers and workers (the
    keywords of ``Tether(...)``); durations (``Seconds``) are given as seconds or a
    ``timedelta`` and read as float seconds.

    Attributes:
        url: the Redis URL (``redis://``, ``rediss://``, ``unix://``, ``redis+cluster://``,
            ``redis+sentinel://``).
        namespace: prefix of every key, so several apps can share one server.
        result_ttl: how long results and outcomes are kept (default one hour).
        dead_letter_maxlen: the approximate cap of each queue's dead-letter stream.
        socket_timeout: how long one command may wait for the server before it fails.
        connect_timeout: how long opening a connection may take.
        max_connections: connections each client of the app keeps to a server (to each node of a
            Cluster) at most (100). Calls made while all are in use wait for one.
        pool_timeout: how long such a call waits for a free connection before it fails with an
            error that says so (10 s).
        enqueue_replicas: when above zero, each enqueue waits until this many replicas
            acknowledged it (``WAIT``), so a failover cannot lose it.
        enqueue_replicas_timeout: how long such an enqueue waits for the replicas.
        stats: workers record per-task statistics (counts by outcome, run and wait time
            distributions) in per-minute and per-hour buckets.
        stats_window: how long statistics are kept (24 h by default).
    """

    url: str = field(
        metadata={
            "help": "the Redis URL (``redis://``, ``rediss://``, ``unix://``, "
            "``redis+cluster://``, ``redis+sentinel://``)."
        }
    )
    namespace: str = field(
        default="tether",
        metadata={"help": "prefix of every key, so several apps can share one server."},
    )
    result_ttl: Seconds = field(
        default=Seconds(3600.0),
        metadata={"help": "how long results and outcomes are kept (default one hour)."},
    )
    dead_letter_maxlen: int = field(
        default=10_000,
        metadata={"help": "the approximate cap of each queue's dead-letter stream."},
    )
    socket_timeout: Seconds = field(
        default=Seconds(10.0),
        metadata={"help": "how long one command may wait for the server before it fails."},
    )
    connect_timeout: Seconds = field(
        default=Seconds(5.0), metadata={"help": "how long opening a connection may take."}
    )
    max_connections: int = field(
        default=100,
        metadata={
            "help": "connections each client of the app keeps to a server (to each node of a "
            "Cluster) at most (100). Calls made while all are in use wait for one."
        },
    )
    pool_timeout: Seconds = field(
        default=Seconds(10.0),
        metadata={
            "help": "how long such a call waits for a free connection before it fails with an "
            "error that says so (10 s)."
        },
    )
    enqueue_replicas: int = field(
        default=0,
        metadata={
            "help": "when above zero, each enqueue waits until this many replicas acknowledged "
            "it (``WAIT``), so a failover cannot lose it."
        },
    )
    enqueue_replicas_timeout: Seconds = field(
        default=Seconds(1.0),
        metadata={"help": "how long such an enqueue waits for the replicas."},
    )
    stats: bool = field(
        default=True,
        metadata={
            "help": "workers record per-task statistics (counts by outcome, run and wait time "
            "distributions) in per-minute and per-hour buckets."
        },
    )
    stats_window: Seconds = field(
        default=Seconds(24 * 3600.0),
        metadata={"help": "how long statistics are kept (24 h by default)."},
    )

    def __post_init__(self) -> None:
        check_name("namespace", self.namespace)
        _positive_int("dead_letter_maxlen", self.dead_letter_maxlen, 10)
        _positive_int("max_connections", self.max_connections, 2)
        _positive_int("enqueue_replicas", self.enqueue_replicas, 0)
        if not isinstance(self.stats, bool):
            raise ConfigError(f"stats={self.stats!r}: expected True or False")
        if self.stats_window < 3600:
            raise ConfigError(f"stats_window={self.stats_window!r}: must be one hour or more")
