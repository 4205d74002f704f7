"""Whether the server answers, what it is, and who leads the schedulers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from ..base._faults import TRANSIENT_ERRORS, describe_error
from ..base._redis import text
from ..protocol._keys import SchedulerKeys
from ..scheduler._control import leader_text
from ._models import Health, utc
from ._replies import server_ms

if TYPE_CHECKING:
    from ..producer._core import Core

_UNREACHABLE: tuple[type[BaseException], ...] = (RedisError, *TRANSIENT_ERRORS)


def _server_info(info: Any) -> tuple[str, str]:
    """(server, version) from an INFO reply (on a Cluster, a reply per node)."""
    if isinstance(info, dict) and "redis_version" not in info and info:
        first = next(iter(info.values()))
        info = first if isinstance(first, dict) else {}
    if not isinstance(info, dict):
        return "", ""
    if info.get("valkey_version") or info.get("server_name") == "valkey":
        return "valkey", text(info.get("valkey_version") or info.get("redis_version", ""))
    return "redis", text(info.get("redis_version", ""))


async def health(core: Core) -> Health:
    """Never raises for an unreachable server: says so, with the reason."""
    client: Any = core.client
    try:
        info = await client.info("server")
        now = await client.time()
        leader = await client.get(SchedulerKeys.of(core.namespace).leader)
    except _UNREACHABLE as exc:
        return Health(
            reachable=False, server="", version="", mode=core.target.kind,
            namespace=core.namespace, scheduler_leader=None, time=None,
            error=describe_error(exc, core.target.redacted),
        )  # fmt: skip
    server, version = _server_info(info)
    if isinstance(now, dict):  # a Cluster answers per node
        now = next(iter(now.values()))
    return Health(
        reachable=True,
        server=server,
        version=version,
        mode=core.target.kind,
        namespace=core.namespace,
        scheduler_leader=leader_text(SchedulerKeys.of(core.namespace).leader, leader),
        time=utc(server_ms(now)),
    )
