"""Connections: one URL, three deployments (standalone, Cluster, Sentinel).

URL forms::

    redis://[user:password@]host:port/db          rediss:// for TLS, unix:///path.sock?db=0
    redis+cluster://[user:password@]host:port[,host:port...]      rediss+cluster:// for TLS
    redis+sentinel://[user:password@]host:port[,host:port...]/master-name[/db]
        ?sentinel_password=...&sentinel_username=...              rediss+sentinel:// for TLS

TLS options (``ssl_ca_certs``, ``ssl_cert_reqs``, ``ssl_certfile``, ``ssl_keyfile``) and ACL
users work through the URL as redis-py reads them. A user name or password holding ``@``,
``#``, ``/``, ``?`` or ``%`` must be percent-encoded (``urllib.parse.quote(password, safe="")``);
a URL where that was forgotten is refused, and no message or log line ever shows a password,
however the URL is malformed (:func:`redact`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.exceptions
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.retry import Retry

from ._errors import ConfigError

AsyncClient: TypeAlias = "redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster"
SyncClient: TypeAlias = "redis.Redis | redis.cluster.RedisCluster"

_PLAIN = ("redis", "rediss", "unix", "valkey", "valkeys")


@dataclass(frozen=True)
class Target:
    """A parsed Redis URL."""

    kind: Literal["standalone", "cluster", "sentinel"]
    url: str
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    tls: bool = False
    username: str | None = None
    password: str | None = None
    options: dict[str, str] = field(default_factory=dict)

    @property
    def redacted(self) -> str:
        """The URL with its secrets hidden, for logs."""
        return redact(self.url)


_ENCODE_HINT = (
    "percent-encode the user name and password (in Python: urllib.parse.quote(password, "
    "safe='')): '@' is %40, '#' %23, '/' %2F, '?' %3F, ':' %3A, '%' %25"
)


def redact(url: str) -> str:
    """``url`` with every secret hidden, for messages and logs: whatever stands before the
    last ``@`` (the user's password, and any part of it a parser took for a host, a path or
    a fragment when an ``@``, ``#``, ``/`` or ``?`` in it was not percent-encoded), and the
    values of query parameters whose name holds ``password``. A user name is kept when a
    ``:`` separates it from the password."""
    scheme, sep, rest = url.partition("://") if "://" in url else ("", "", url)
    at = rest.rfind("@")
    if at >= 0:
        user, colon, _ = rest[:at].partition(":")
        shown = f"{user}:***" if colon and not set(user) & set("/?#") else "***"
        rest = f"{shown}@{rest[at + 1 :]}"
    head, qmark, query = rest.partition("?")
    if qmark:
        pairs = []
        for pair in query.split("&"):
            name, eq, _ = pair.partition("=")
            pairs.append(f"{name}=***" if eq and "password" in name.lower() else pair)
        rest = f"{head}?{'&'.join(pairs)}"
    return f"{scheme}{sep}{rest}"


def _check_delimiters(url: str) -> None:
    """Refuse a URL whose credentials hold an unencoded delimiter: the parser would read part
    of the password as the host, the path or a fragment, and connect somewhere else."""
    if "#" in url:
        raise ConfigError(
            f"url {redact(url)!r} holds a '#', which no Redis URL has: {_ENCODE_HINT}"
        )
    scheme, _, rest = url.partition("://")
    if scheme.lower() == "unix":
        return
    host_end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    if "@" in rest[host_end:]:
        raise ConfigError(
            f"url {redact(url)!r} holds an '@' after its host part (a '/' or '?' in the "
            f"password, or an '@' in the path or query?): {_ENCODE_HINT}"
        )


def parse_url(url: str) -> Target:
    """Parse and validate a Redis URL; a malformed one raises :class:`ConfigError`."""
    if not isinstance(url, str) or "://" not in url:
        shown = redact(url) if isinstance(url, str) else url
        raise ConfigError(f"url={shown!r}: expected a URL such as redis://localhost:6379/0")
    _check_delimiters(url)
    scheme = url.split("://", 1)[0].lower()
    if scheme in _PLAIN:
        return _parse_plain(url, scheme)
    if scheme in ("redis+cluster", "rediss+cluster"):
        return _parse_multi(url, "cluster", tls=scheme.startswith("rediss"))
    if scheme in ("redis+sentinel", "rediss+sentinel"):
        return _parse_multi(url, "sentinel", tls=scheme.startswith("rediss"))
    raise ConfigError(
        f"url scheme {scheme!r} is unknown: use redis://, rediss://, unix://, "
        "redis+cluster:// or redis+sentinel://"
    )


def _parse_plain(url: str, scheme: str) -> Target:
    if scheme.startswith("valkey"):
        url = "redis" + url[len("valkey") :]
        scheme = "redis" + scheme[len("valkey") :]
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(f"url {redact(url)!r} is malformed: {exc}") from None
    if scheme != "unix" and not parts.hostname:
        raise ConfigError(f"url {redact(url)!r} has no host")
    if scheme == "unix" and not parts.path:
        raise ConfigError(f"url {redact(url)!r} has no socket path")
    db = 0
    path = parts.path.strip("/") if scheme != "unix" else ""
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    raw_db = path or query.get("db", "0")
    try:
        db = int(raw_db)
    except ValueError:
        raise ConfigError(f"url {redact(url)!r}: database {raw_db!r} is not a number") from None
    return Target(
        kind="standalone",
        url=url,
        nodes=((parts.hostname or "", port or 6379),) if scheme != "unix" else (),
        db=db,
        tls=scheme == "rediss",
        username=unquote(parts.username) if parts.username else None,
        password=unquote(parts.password) if parts.password else None,
        options=query,
    )


def _parse_multi(url: str, kind: Literal["cluster", "sentinel"], tls: bool) -> Target:
    rest = url.split("://", 1)[1]
    auth, _, hosts_and_path = rest.rpartition("@")
    hosts_part, _, path_query = hosts_and_path.partition("/")
    path, _, query_text = path_query.partition("?")
    if "?" in hosts_part:
        hosts_part, _, query_text = hosts_part.partition("?")
    nodes: list[tuple[str, int]] = []
    for item in hosts_part.split(","):
        host, _, port_text = item.strip().rpartition(":")
        if not host:
            host, port_text = port_text, "26379" if kind == "sentinel" else "6379"
        try:
            nodes.append((host.strip("[]"), int(port_text)))
        except ValueError:
            raise ConfigError(f"url {redact(url)!r}: bad host:port {item!r}") from None
    if not nodes or not nodes[0][0]:
        raise ConfigError(f"url {redact(url)!r} names no host")
    username = password = None
    if auth:
        user, _, pw = auth.partition(":")
        username, password = unquote(user) or None, unquote(pw) or None
    query = {k: v[-1] for k, v in parse_qs(query_text).items()}
    service, db = "", 0
    segments = [s for s in path.split("/") if s]
    if kind == "sentinel":
        if not segments:
            raise ConfigError(
                f"url {redact(url)!r} names no master: use redis+sentinel://host:26379/mymaster"
            )
        service = segments[0]
        if len(segments) > 1:
            try:
                db = int(segments[1])
            except ValueError:
                raise ConfigError(f"url {redact(url)!r}: database {segments[1]!r}") from None
    elif segments and segments != ["0"]:
        raise ConfigError(f"url {redact(url)!r}: a cluster has only database 0")
    return Target(
        kind=kind,
        url=url,
        nodes=tuple(nodes),
        service=service,
        db=db,
        tls=tls,
        username=username,
        password=password,
        options=query,
    )


def _retry(retries: int, asynchronous: bool) -> Retry | AsyncRetry:
    """redis-py re-sends a command after a lost connection this many times (async and
    sync clients need their own Retry classes)."""
    backoff = ExponentialWithJitterBackoff(base=0.05, cap=1.0) if retries else NoBackoff()
    return AsyncRetry(backoff, retries) if asynchronous else Retry(backoff, retries)


def _common_kwargs(
    target: Target,
    socket_timeout: float | None,
    connect_timeout: float,
    retries: int,
    asynchronous: bool = True,
) -> dict[str, Any]:
    retry = _retry(retries, asynchronous)
    kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "socket_keepalive": True,
        "retry": retry,
    }
    if target.username:
        kwargs["username"] = target.username
    if target.password:
        kwargs["password"] = target.password
    if target.tls:
        kwargs["ssl"] = True
        for key in ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            if key in target.options:
                kwargs[key] = target.options[key]
        if "ssl_check_hostname" in target.options:
            flag = target.options["ssl_check_hostname"].lower()
            kwargs["ssl_check_hostname"] = flag in ("1", "true", "yes", "on")
    return kwargs


DEFAULT_MAX_CONNECTIONS = 100
"""Connections a client keeps to each server (each node of a Cluster) at most."""
DEFAULT_POOL_TIMEOUT = 10.0
"""Seconds a call waits for a free connection when all of them are in use."""


class _WaitForConnection(redis.asyncio.ConnectionPool):
    """redis-py's asyncio pool fails at once ("Too many connections") when every connection
    is in use; its blocking pool waits, but takes a condition, a timeout and a lock for every
    command (one-at-a-time enqueues ran 15 % slower through it). This pool takes the plain
    pool's path, and only when that finds every connection in use waits for a release, up
    to ``timeout`` seconds (named as the blocking pool names it), then fails as it does."""

    def __init__(self, *args: Any, timeout: float | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout = timeout
        self._waiters: list[asyncio.Future[None]] = []

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
        except redis.exceptions.MaxConnectionsError:
            pass
        loop = asyncio.get_running_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        while True:
            # A release wakes the first waiter; the short cap covers the releases redis-py
            # finishes in the background, which do not pass through release() below.
            wait = 0.1 if deadline is None else min(0.1, deadline - loop.time())
            if wait <= 0:
                raise redis.exceptions.ConnectionError("No connection available.")
            freed = loop.create_future()
            self._waiters.append(freed)
            try:
                await asyncio.wait_for(asyncio.shield(freed), wait)
            except asyncio.TimeoutError:
                pass
            finally:
                if freed in self._waiters:
                    self._waiters.remove(freed)
            try:
                return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]
            except redis.exceptions.MaxConnectionsError:
                continue

    async def release(self, connection: Any) -> None:
        await super().release(connection)
        while self._waiters:
            freed = self._waiters.pop(0)
            if not freed.done():
                freed.set_result(None)
                break


class _WaitingSentinelPool(_WaitForConnection, redis.asyncio.sentinel.SentinelConnectionPool):
    """Sentinel's pool (it finds the master) that waits for a free connection."""


class _BlockingSyncSentinelPool(
    redis.sentinel.SentinelConnectionPool, redis.BlockingConnectionPool
):
    """The same for blocking clients."""


def _pool_kwargs(max_connections: int, pool_timeout: float | None) -> dict[str, Any]:
    """For the pools that wait for a free connection: redis-py's blocking (sync) ones and
    :class:`_WaitForConnection`."""
    return {"max_connections": max_connections, "timeout": pool_timeout}


def async_client(
    target: Target,
    *,
    socket_timeout: float | None,
    connect_timeout: float,
    retries: int = 3,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    pool_timeout: float | None = DEFAULT_POOL_TIMEOUT,
) -> AsyncClient:
    """An asyncio client for ``target``. ``retries`` re-sends a command after a lost
    connection. At most ``max_connections`` connections per server: a call made while all
    are in use waits up to ``pool_timeout`` seconds for one (redis-py's default pool fails
    at once, so a burst of concurrent calls failed with "Too many connections"). A Cluster
    client cannot wait: past ``max_connections`` per node a call fails, and the message
    says so."""
    if target.kind == "standalone":
        pool = _WaitForConnection.from_url(
            target.url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            socket_keepalive=True,
            retry=_retry(retries, asynchronous=True),
            **_pool_kwargs(max_connections, pool_timeout),
        )
        return redis.asyncio.Redis.from_pool(pool)
    kwargs = _common_kwargs(target, socket_timeout, connect_timeout, retries)
    if target.kind == "cluster":
        nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in target.nodes]
        return redis.asyncio.cluster.RedisCluster(
            startup_nodes=nodes, max_connections=max_connections, **kwargs
        )
    sentinel = redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        list(target.nodes),
        sentinel_kwargs=_sentinel_auth(target, socket_timeout, connect_timeout),
        **kwargs,
    )
    master: redis.asyncio.Redis = sentinel.master_for(
        target.service,
        db=target.db,
        connection_pool_class=_WaitingSentinelPool,
        **_pool_kwargs(max_connections, pool_timeout),
    )
    return master


def sync_client(
    target: Target,
    *,
    socket_timeout: float | None,
    connect_timeout: float,
    retries: int = 0,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    pool_timeout: float | None = DEFAULT_POOL_TIMEOUT,
) -> SyncClient:
    """A blocking client for ``target``, for the heartbeat thread, the CLI and blocking
    producers (several threads share it: the pool waits for a free connection as the
    asyncio one does)."""
    if target.kind == "standalone":
        pool = redis.BlockingConnectionPool.from_url(
            target.url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            socket_keepalive=True,
            retry=_retry(retries, asynchronous=False),
            **_pool_kwargs(max_connections, pool_timeout),
        )
        return redis.Redis.from_pool(pool)
    kwargs = _common_kwargs(target, socket_timeout, connect_timeout, retries, asynchronous=False)
    if target.kind == "cluster":
        nodes = [
            redis.cluster.ClusterNode(h, p)  # type: ignore[no-untyped-call, unused-ignore]
            for h, p in target.nodes
        ]
        return redis.cluster.RedisCluster(
            startup_nodes=nodes, max_connections=max_connections, **kwargs
        )
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        list(target.nodes),
        sentinel_kwargs=_sentinel_auth(target, socket_timeout, connect_timeout),
        **kwargs,
    )
    master: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call, unused-ignore]
        target.service,
        db=target.db,
        connection_pool_class=_BlockingSyncSentinelPool,
        **_pool_kwargs(max_connections, pool_timeout),
    )
    return master


def _sentinel_auth(
    target: Target, socket_timeout: float | None, connect_timeout: float
) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
    }
    if "sentinel_password" in target.options:
        kwargs["password"] = target.options["sentinel_password"]
    if "sentinel_username" in target.options:
        kwargs["username"] = target.options["sentinel_username"]
    return kwargs


async def close_async(client: AsyncClient) -> None:
    """Close a client, and for Sentinel the clients it keeps to the sentinels too."""
    await client.aclose()
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        await sentinel.aclose()


def close_sync(client: SyncClient) -> None:
    client.close()
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    for sentinel in getattr(manager, "sentinels", ()):
        sentinel.close()


def text(value: Any) -> str:
    """A reply value as str: replies are bytes unless the client decodes them."""
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_version(version: str) -> tuple[int, ...]:
    out: list[int] = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)
