"""Checks a worker makes of the server at start: version, eviction policy, groups; and
the connect loop every consumer (the worker, the taskiq consumer) starts with."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from ..base._errors import ServerError
from ..base._faults import Fault, UnknownReplies, classify, describe_error
from ..base._redis import AsyncClient, parse_version, text
from ..protocol._keys import GROUP

if TYPE_CHECKING:
    from ..base._settings import WorkerSettings

log = logging.getLogger("tether.worker")

MIN_VERSION = (6, 2)


def _per_node(reply: Any) -> list[dict[str, Any]]:
    """INFO/CONFIG replies: one dict from a server, or a dict of dicts from a cluster."""
    if isinstance(reply, dict) and reply and all(isinstance(v, dict) for v in reply.values()):
        return list(reply.values())
    if isinstance(reply, dict):
        return [reply]
    if isinstance(reply, list):  # CONFIG GET as a flat list
        return [{text(reply[i]): reply[i + 1] for i in range(0, len(reply), 2)}]
    return []


def _every_primary(client: AsyncClient) -> dict[str, Any]:
    """On a Cluster, ask every primary, not just one node."""
    if isinstance(client, RedisCluster):
        return {"target_nodes": RedisCluster.PRIMARIES}
    return {}


async def check_version(client: AsyncClient) -> str:
    """Refuse servers older than 6.2; return a description such as 'Valkey 9.1.2'."""
    names: set[str] = set()
    for info in _per_node(await client.info("server", **_every_primary(client))):
        version = text(info.get("redis_version", "0"))
        if parse_version(version) < MIN_VERSION:
            raise ServerError(
                f"Redis {version} is too old: Tether needs Redis 6.2 or newer (or Valkey), "
                "for XPENDING ranges, XCLAIM and SET ... GET"
            )
        if "valkey_version" in info:
            names.add(f"Valkey {text(info['valkey_version'])}")
        else:
            names.add(f"Redis {version}")
    return ", ".join(sorted(names))


EVICTION_WARNING = (
    "the server's maxmemory-policy is {policy!r}, not 'noeviction': under memory pressure "
    "Redis may evict leases (tasks then run twice) or streams (tasks are LOST, silently). "
    "Set maxmemory-policy noeviction on the servers Tether uses."
)


async def eviction_policy(client: AsyncClient) -> str | None:
    """The first policy other than ``noeviction`` a primary runs with; None when every
    primary runs ``noeviction`` or the policy cannot be read (CONFIG refused by an ACL or
    renamed by a managed service)."""
    try:
        reply = await client.config_get("maxmemory-policy", **_every_primary(client))
    except ResponseError as exc:
        log.debug("cannot read maxmemory-policy (%s); skipping the eviction check", exc)
        return None
    for node in _per_node(reply):
        policy = text(node.get("maxmemory-policy", "noeviction"))
        if policy != "noeviction":
            return policy
    return None


async def check_eviction_policy(client: AsyncClient) -> None:
    """Warn when keys may be evicted: an evicted lease means a false reclaim (a task runs
    twice); an evicted stream means lost tasks."""
    policy = await eviction_policy(client)
    if policy is not None:
        log.warning(EVICTION_WARNING.format(policy=policy))


async def why_groups_vanished(client: AsyncClient) -> str:
    """The likely reason the consumer groups are gone, for the log: eviction when the
    server evicts keys (and says it evicted some), else a restart without its data or a
    flush. Never raises: it only words a warning."""
    try:
        policy = await eviction_policy(client)
        if policy is not None:
            evicted = sum(
                int(node.get("evicted_keys", 0))
                for node in _per_node(await client.info("stats", **_every_primary(client)))
            )
            return (
                f"the server EVICTED keys (maxmemory-policy {policy!r}, {evicted} keys "
                "evicted since it started): the tasks in those streams are lost; set "
                "maxmemory-policy noeviction"
            )
    except Exception as exc:
        log.debug("cannot tell why the groups vanished (%s)", exc)
    return "the server restarted without its data, or was flushed"


class Connected(NamedTuple):
    server: str
    """The server's description, such as 'Valkey 9.1.2'."""
    after_outage: bool
    """The first tries failed: live workers may not have renewed their leases meanwhile."""


async def connect(
    client: AsyncClient,
    streams: Iterable[str],
    settings: WorkerSettings,
    where: str,
    *,
    stopping: Callable[[], bool],
    sleep: Callable[[float], Awaitable[None]],
) -> Connected | None:
    """Check the server and create the groups of ``streams``, retrying with backoff on
    transient faults (up to ``give_up_after`` when set). A fault no retry can fix stops
    here with one line naming it. None when ``stopping()`` turned true first."""
    streams = list(streams)
    attempt = 0
    started = time.monotonic()
    give_up = settings.give_up_after
    unknown = UnknownReplies()
    while not stopping():
        try:
            server = await check_version(client)
            await check_eviction_policy(client)
            await create_groups(client, streams)
            if attempt:
                log.info("connected to %s", where)
            return Connected(server, after_outage=attempt > 0)
        except Exception as exc:
            fault = classify(exc, where)
            if fault is Fault.INTERNAL:
                raise
            if fault is Fault.FATAL or (
                fault is Fault.UNKNOWN and unknown.failed(exc, "connecting")
            ):
                raise ServerError(describe_error(exc, where)) from None
            attempt += 1
            if give_up is not None and time.monotonic() - started >= give_up:
                raise ServerError(
                    f"{describe_error(exc, where)}; gave up after {give_up:g}s (give_up_after)"
                ) from None
            delay = settings.reconnect_delay(attempt)
            log.warning("%s; retrying in %.1fs", describe_error(exc, where), delay)
            await sleep(delay)
    return None


async def create_groups(client: AsyncClient, streams: Iterable[str]) -> None:
    """Create the consumer group on each stream at id 0, so tasks enqueued before any worker
    existed are delivered. Idempotent."""
    for stream in streams:
        try:
            await client.execute_command("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
