"""The driver's view of the server: INFO snapshots, the done counter, and a tally of the
driver's own commands so they can be taken out of the server-wide command counts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio

from .config import Config


@dataclass
class Snapshot:
    calls: dict[str, int]
    """INFO commandstats: calls per command (script-internal calls included)."""
    cpu: float
    """Server CPU seconds, user + system (INFO cpu)."""
    connections: int
    """Connections accepted so far (INFO stats total_connections_received)."""
    own: Counter[str] = field(default_factory=Counter)
    """The driver's own commands sent before this snapshot's INFO."""


class Probe:
    """One connection to the bench's database; every command it sends is tallied."""

    def __init__(self, config: Config) -> None:
        self.config = config
        # A time limit on every reply, so a server that stops answering cannot hang the run.
        self.client = redis.asyncio.Redis.from_url(config.counter_url, socket_timeout=30)
        self.sent: Counter[str] = Counter()

    async def close(self) -> None:
        await self.client.aclose()

    async def _call(self, name: str, *args: Any) -> Any:
        self.sent[name] += 1
        return await self.client.execute_command(name.upper(), *args)

    async def snapshot(self) -> Snapshot:
        own = self.sent.copy()
        stats = await self._call("info", "commandstats")
        cpu = await self._call("info", "cpu")
        accepted = await self._call("info", "stats")
        calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
        return Snapshot(
            calls,
            float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            int(accepted["total_connections_received"]),
            own,
        )

    async def used_memory(self) -> int:
        return int((await self._call("info", "memory"))["used_memory"])

    async def server_info(self) -> dict[str, str]:
        info = await self._call("info", "server")
        return {
            "server": "valkey" if "valkey_version" in info else "redis",
            "version": str(info.get("valkey_version") or info.get("redis_version")),
        }

    async def done(self) -> int:
        return int(await self._call("get", self.config.done_key) or 0)

    async def starts(self) -> list[bytes]:
        return list(await self._call("lrange", self.config.starts_key, 0, -1))

    async def count_starts(self) -> int:
        return int(await self._call("llen", self.config.starts_key))

    async def delete_bench_keys(self) -> None:
        c = self.config
        await self._call("del", c.done_key, c.starts_key, c.ready_key)


SETUP = frozenset({"hello", "select", "auth", "client|setinfo", "client|setname"})
"""Commands a client sends once per new connection: not work per task, and the bench's own
body client opens up to one connection per concurrent task. They are counted apart."""


def command_delta(
    before: Snapshot, after: Snapshot, body_incrs: int = 0
) -> tuple[dict[str, int], dict[str, int]]:
    """(commands, connection set-up commands) the server ran between two snapshots, less the
    driver's own commands and the task bodies' increments (the bench's, not the system's).
    Commands run inside a Lua script are counted, as INFO commandstats counts them."""
    out: dict[str, int] = {}
    for name, calls in after.calls.items():
        out[name] = calls - before.calls.get(name, 0)
    for name, calls in (after.own - before.own).items():
        out[name] = out.get(name, 0) - calls
    # redis-py sends INCR as INCRBY.
    for name in ("incrby", "incr"):
        taken = min(body_incrs, out.get(name, 0))
        out[name] = out.get(name, 0) - taken
        body_incrs -= taken
    work = {k: v for k, v in sorted(out.items()) if v > 0 and k not in SETUP}
    setup = {k: v for k, v in sorted(out.items()) if v > 0 and k in SETUP}
    return work, setup
