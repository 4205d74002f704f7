"""Sizing figures: the server memory a task holds while it waits, and after it ran, and the
Redis commands a task costs, measured on a fresh embedded server (persistence off).

    python3 bench/sizing.py               # N=20,000 tasks per row: about a minute
    python3 bench/sizing.py --quick       # N=2,000
    python3 bench/sizing.py --url redis://host:6379/0   # your server (see below)

Each row enqueues N tasks in a namespace of its own and reads ``INFO memory`` (used_memory)
before and after; the figure is the difference over N. Rows that run the tasks do so with a
burst worker in this process (concurrency 64, no scheduler), then read memory again. Commands
are ``INFO commandstats`` deltas (commands inside scripts counted, as the server counts
them) over the enqueue and over the run, over N: the run includes the worker's start,
its maintenance passes and its lease renewals, spread over N tasks.

Every row is measured with ``Tether(stats=False)``: the per-task statistics are kept in
buckets per task name and minute, not per task, so they would skew a per-task memory figure
(``bench/stats_memory.py`` measures them). The rows that run tasks are run once more with
statistics on (the default), in a namespace of their own, for the run's commands with them.

With ``--url`` the figures are server-wide, so anything else using the server skews them,
and the server's version, encoding thresholds (``stream-node-max-bytes``, listpack limits)
and allocator decide the bytes: measure on the server you size for. The namespaces are
deleted at the end. Figures, never assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import envs  # standard library only

envs.run_with_this_tether(__file__)

import redis.asyncio  # noqa: E402

from tether import Task, Tether  # noqa: E402
from tether.base._embedded import EmbeddedServer  # noqa: E402
from tether.testing import delete_namespace  # noqa: E402

PAYLOAD = "x" * 200
"""A 200-character argument: an order id, an e-mail address and some options, say."""


@dataclass
class Row:
    what: str
    bytes_per_task: float
    enqueue_cmds: float
    run_cmds: float | None = None
    """Commands per task of the run, statistics off."""
    run_cmds_stats: float | None = None
    """The same run with statistics on (the default)."""


async def used_memory(client: redis.asyncio.Redis) -> int:
    return int((await client.info("memory"))["used_memory"])


async def command_count(client: redis.asyncio.Redis) -> int:
    stats = await client.info("commandstats")
    # The measurement's own INFO calls are the only ones this script adds.
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def declare(app: Tether) -> dict[str, Task[..., Any]]:
    @app.task(store_result=False)
    async def plain(i: int) -> None: ...

    @app.task(store_result=False)
    async def with_payload(i: int, note: str) -> None: ...

    @app.task
    async def with_result(i: int) -> int:
        return i

    @app.task(retries=0)
    async def failing(i: int) -> None:
        raise ValueError(f"row {i} is malformed")

    return {
        "plain": plain,
        "payload": with_payload,
        "result": with_result,
        "failing": failing,
        "delayed": plain.options(delay=3600),
    }


async def measure(url: str, n: int) -> list[Row]:
    client = redis.asyncio.Redis.from_url(url)
    rows: list[Row] = []
    namespaces: list[str] = []

    async def row(what: str, kind: str, *, count: int = n, run: bool = False) -> None:
        left, enqueued, ran = await one(kind, count, run, stats=False)
        with_stats = (await one(kind, count, run, stats=True))[2] if run else None
        rows.append(Row(what, left / count, enqueued / count, ran, with_stats))

    async def one(kind: str, count: int, run: bool, stats: bool) -> tuple[int, int, float | None]:
        """Memory left and enqueue commands (totals), and run commands per task."""
        namespace = f"sizing-{len(namespaces)}"
        namespaces.append(namespace)
        app = Tether(url, namespace=namespace, stats=stats)
        tasks = declare(app)
        memory = await used_memory(client)  # before the app connects: its buffers not counted
        async with app:
            commands = await command_count(client)
            if kind == "dedup":  # a key per task: one enqueue script call each
                for start in range(0, count, 50):
                    await asyncio.gather(
                        *(
                            tasks["plain"].options(key=f"order:{i}").enqueue(i)
                            for i in range(start, min(count, start + 50))
                        )
                    )
            else:
                args = [(i, PAYLOAD) if kind == "payload" else (i,) for i in range(count)]
                for start in range(0, count, 1000):
                    await tasks[kind].enqueue_many(args[start : start + 1000])
            enqueued = await command_count(client) - commands
            ran = None
            if run:
                commands = await command_count(client)
                await app.worker(burst=True, concurrency=64, scheduler=False).run()
                ran = (await command_count(client) - commands) / count
        left = await used_memory(client) - memory  # the app closed: what its keys hold
        return left, enqueued, ran

    # A first row on a fresh server grows its internal tables once (a few hundred KiB that
    # stay and do not grow with the tasks): run one untimed, so the rows measure tasks.
    await row("warm-up", "plain", run=True)
    rows.clear()
    await row("queued: a plain task, one int argument", "plain")
    await row("queued: the same with a 200-character argument", "payload")
    await row("queued: delayed by an hour (delayed set + payload hash)", "delayed")
    await row("queued: with a dedup key (index + key)", "dedup")
    await row("ran, no result stored: what stays", "plain", run=True)
    await row("ran, result stored (kept result_ttl, 1 h): what stays", "result", run=True)
    # Below the dead-letter stream's cap (dead_letter_maxlen, 10,000), so none is trimmed.
    dead = min(n, 5_000)
    await row("failed: a dead letter (error and traceback)", "failing", count=dead, run=True)
    cleaner = Tether(url)
    for namespace in namespaces:
        delete_namespace(cleaner, namespace)
    cleaner.close_sync()
    await client.aclose()
    return rows


def render(rows: list[Row], n: int, server: str) -> str:
    lines = [
        f"N = {n:,} tasks per row, {server}",
        "",
        "statistics off (Tether(stats=False)) except the last column",
        "",
        "| row | bytes per task | commands per task, enqueue | commands per task, run "
        "| commands per task, run, statistics on |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        run = f"{r.run_cmds:.1f}" if r.run_cmds is not None else ""
        stats = f"{r.run_cmds_stats:.1f}" if r.run_cmds_stats is not None else ""
        lines.append(
            f"| {r.what} | {r.bytes_per_task:,.0f} | {r.enqueue_cmds:.1f} | {run} | {stats} |"
        )
    return "\n".join(lines)


async def server_name(url: str) -> str:
    client = redis.asyncio.Redis.from_url(url)
    info = await client.info("server")
    await client.aclose()
    name = "valkey" if "valkey_version" in info else "redis"
    return f"{name} {info.get('valkey_version') or info.get('redis_version')}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=None, help="tasks per row (default 20,000)")
    parser.add_argument("--quick", action="store_true", help="N=2,000")
    parser.add_argument("--url", default=None, help="use this server instead of a fresh one")
    options = parser.parse_args()
    n = options.n or (2_000 if options.quick else 20_000)
    logging.getLogger("tether").setLevel(logging.CRITICAL)  # the failing row logs every failure
    if options.url:
        url = options.url
        print(render(asyncio.run(measure(url, n)), n, asyncio.run(server_name(url))))
        return
    server = EmbeddedServer()
    server.start()
    try:
        rows = asyncio.run(measure(server.url, n))
        print(render(rows, n, "fresh " + asyncio.run(server_name(server.url))))
    finally:
        server.stop()


if __name__ == "__main__":
    main()
