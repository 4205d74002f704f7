"""Checks a worker makes of the server at start: version, eviction policy, groups."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ResponseError

from .._errors import ServerError
from .._keys import GROUP
from .._redis import AsyncClient, parse_version, text

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


async def check_eviction_policy(client: AsyncClient) -> None:
    """Warn when keys may be evicted: an evicted lease means a false reclaim (a task runs
    twice); an evicted stream means lost tasks."""
    try:
        reply = await client.config_get("maxmemory-policy", **_every_primary(client))
    except ResponseError as exc:
        log.debug("cannot read maxmemory-policy (%s); skipping the eviction check", exc)
        return
    for node in _per_node(reply):
        policy = text(node.get("maxmemory-policy", "noeviction"))
        if policy != "noeviction":
            log.warning(
                "the server's maxmemory-policy is %r, not 'noeviction': under memory pressure "
                "Redis may evict leases (tasks then run twice) or streams (tasks are lost). Set "
                "maxmemory-policy noeviction on the servers Tether uses.",
                policy,
            )
            return


async def create_groups(client: AsyncClient, streams: Iterable[str]) -> None:
    """Create the consumer group on each stream at id 0, so tasks enqueued before any worker
    existed are delivered. Idempotent."""
    for stream in streams:
        try:
            await client.execute_command("XGROUP", "CREATE", stream, GROUP, "0", "MKSTREAM")
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
