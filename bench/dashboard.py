"""The dashboard under load: each page's server time, wall time, size and server commands
with 50 queues, 100,000 queued tasks and 10,000 dead letters, then the commands again with
a tenth of the tasks (the count must not grow with the data; the live refresh's grows with
the queues only).

    .venv/bin/python bench/dashboard.py            # about 3 minutes on 2 cores
    .venv/bin/python bench/dashboard.py --quick    # 20 requests per page
    .venv/bin/python bench/dashboard.py --scale 0.01 --requests 3   # what the smoke test runs

It needs this checkout's Tether with the ``web`` extra. On a fresh embedded Valkey it fills
one namespace with 50 queues holding, between them, 100,000 queued tasks (over the three
priorities), 10,000 dead letters (real failures, run by a worker), 1,000 delayed tasks and
50 entries delivered to workers; 20 live worker records serving every queue (the
heartbeat's format, with their leases); and an hour and a day of statistics for two task
names per queue (the workers' format, ``tether.base._histogram``), so that every chart and every
row of the statistics has data. A second namespace gets a tenth of the tasks, letters and
delayed tasks (the same queues, workers and statistics). Each is served by ``tether web``
(this module's app) in a process of its own; this process sends each page's requests one
at a time over HTTP (httpx).

Per page: p50 and p99 of the server time (the ``Server-Timing`` header the pages send: from
the request reaching the page to its body rendered), p50 of the wall time at the client,
the size of the HTML, and the server commands per request (``INFO commandstats`` delta,
commands inside scripts included, the INFO calls themselves excluded). The table goes to
stdout and, with every number, to ``bench/results/dashboard-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from bench import fleet  # noqa: E402
from tether import Tether  # noqa: E402
from tether.base._embedded import free_port  # noqa: E402
from tether.base._histogram import bucket  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"
QUEUES = [f"q{i:02d}" for i in range(50)]
app = Tether(
    os.environ.get("BENCH_DASH_URL", "redis://127.0.0.1:6379/0"),
    namespace=os.environ.get("BENCH_DASH_NAMESPACE", "bench-dashboard"),
)


@app.task(name="bench.ok", store_result=False)
async def ok(i: int) -> None:
    return None


@app.task(name="bench.fail")
async def fail(i: int) -> None:
    raise ValueError(f"bench failure {i}")


@app.periodic(every=3600, name="bench-hourly")
@app.task(name="bench.hourly")
async def hourly() -> None:
    return None


# -- filling a server ---------------------------------------------------------------------


@dataclass
class Filled:
    queued_id: str
    dead_entry: str
    counts: dict[str, int]


def _history(client: Any, namespace: str) -> None:
    """An hour of minute hashes and a day of hour hashes per queue, two task names each."""
    now_min, now_hour = int(time.time() // 60), int(time.time() // 3600)
    pipe = client.pipeline(transaction=False)
    for q in QUEUES:
        keys = app.keys(q)
        for task, base in (("bench.ok", 40), ("bench.fail", 3)):
            for m in range(now_min - 60, now_min):
                ok_n, bad_n = (base + m % 17, 0) if task == "bench.ok" else (0, base + m % 3)
                fields = {f"{task}|ok": ok_n, f"{task}|fail": bad_n,
                          f"{task}|r{bucket(20 + m % 40)}": ok_n + bad_n,
                          f"{task}|w{bucket(5 + m % 90)}": ok_n + bad_n}  # fmt: skip
                pipe.hset(keys.stats_minute(m), mapping={k: v for k, v in fields.items() if v})
                pipe.expire(keys.stats_minute(m), 7200)
            for h in range(now_hour - 24, now_hour + 1):
                n = base * 60
                pipe.hset(keys.stats_hour(h), mapping={
                    f"{task}|{'ok' if task == 'bench.ok' else 'fail'}": n,
                    f"{task}|r{bucket(30)}": n, f"{task}|w{bucket(40)}": n})  # fmt: skip
                pipe.expire(keys.stats_hour(h), 90000)
        pipe.execute()
        pipe = client.pipeline(transaction=False)


async def fill(url: str, namespace: str, scale: float) -> Filled:
    import logging

    import redis

    logging.getLogger("tether").setLevel(logging.ERROR)
    per_queue = {
        "queued": int(100_000 * scale) // len(QUEUES),
        "dead": max(1, int(10_000 * scale) // len(QUEUES)),
        "delayed": max(1, int(1_000 * scale) // len(QUEUES)),
    }
    app.configure(url=url, namespace=namespace)
    async with app:
        for q in QUEUES:
            await fail.options(queue=q).enqueue_many([(i,) for i in range(per_queue["dead"])])
        await app.worker(queues=tuple(QUEUES), burst=True, concurrency=64, scheduler=False).run()
        first_id = ""
        priorities = ("high", "normal", "low")
        for q in QUEUES:
            n = per_queue["queued"]
            for p, priority in enumerate(priorities):
                share = n // 3 + (1 if p < n % 3 else 0)
                if share:
                    handles = await ok.options(queue=q, priority=priority).enqueue_many(
                        [(i,) for i in range(share)]
                    )
                    first_id = first_id or handles[-1].id
            await ok.options(queue=q, delay=3600).enqueue_many(
                [(i,) for i in range(per_queue["delayed"])]
            )
        client: Any = app.client
        names = [f"bench-worker-{i:02d}" for i in range(20)]
        pipe = client.pipeline(transaction=False)
        fleet.add_workers(
            pipe, app, names, QUEUES, held=1,
            counters=lambda i: {"claimed": 0, "succeeded": 100 * i, "failed": i, "retried": 0},
        )  # fmt: skip
        await pipe.execute()
        # One entry per queue delivered to a worker and left unsettled: 50 running.
        for i, q in enumerate(QUEUES):
            await client.execute_command(
                "XREADGROUP", "GROUP", "tether", names[i % len(names)], "COUNT", 1,
                "STREAMS", app.keys(q).streams[0], ">",
            )  # fmt: skip
        dead = await client.xrange(app.keys(QUEUES[0]).dead, count=1)
    sync = redis.Redis.from_url(url)
    _history(sync, namespace)
    sync.close()
    counts = {k: v * len(QUEUES) for k, v in per_queue.items()}
    return Filled(first_id, dead[0][0].decode(), counts)


# -- the pages ----------------------------------------------------------------------------


def pages(f: Filled) -> list[tuple[str, str]]:
    q = QUEUES[0]
    return [
        ("overview (50 queues)", "/"),
        ("live refresh of the overview", "/fragments/overview"),
        ("queue: running", f"/queues/{q}"),
        ("queue: scheduled", f"/queues/{q}/scheduled"),
        ("queue: dead letters", f"/queues/{q}/dead"),
        ("queue: dead letters of a task", f"/queues/{q}/dead?task=bench.fail"),
        ("a dead letter", f"/queues/{q}/dead/{f.dead_entry}"),
        ("a task", f"/task?id={quote(f.queued_id)}"),
        ("workers", "/workers"),
        ("schedules", "/schedules"),
        ("statistics, every queue", "/stats"),
        ("statistics, one queue", f"/stats?queue={q}"),
    ]


def server_ms(header: str) -> float:
    found = re.search(r"dur=([\d.]+)", header)
    if found is None:
        raise SystemExit(f"no Server-Timing in the answer: {header!r}")
    return float(found.group(1))


async def measure(base: str, url: str, f: Filled, n: int) -> dict[str, dict[str, float]]:
    import httpx
    import redis

    counter = redis.Redis.from_url(url)
    out: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60
    ) as client:
        for name, path in pages(f):
            for _ in range(2):  # warm-up: connections, scripts, templates
                await client.get(path)
            before = fleet.command_calls(counter.info("commandstats"))
            server, wall, size = [], [], 0
            for _ in range(n):
                started = time.perf_counter()
                answer = await client.get(path)
                wall.append((time.perf_counter() - started) * 1000)
                if answer.status_code != 200:
                    raise SystemExit(f"{name}: {answer.status_code} {answer.text[:300]}")
                server.append(server_ms(answer.headers.get("server-timing", "")))
                size = len(answer.content)
            after = fleet.command_calls(counter.info("commandstats"))
            server.sort()
            out[name] = {
                "server_p50_ms": statistics.median(server),
                "server_p99_ms": server[min(len(server) - 1, int(len(server) * 0.99))],
                "wall_p50_ms": statistics.median(wall),
                "kib": size / 1024,
                "commands": (after - before) / n,
                "requests": n,
            }
    counter.close()
    return out


# -- the server process -------------------------------------------------------------------


def start_server(url: str, namespace: str) -> tuple[subprocess.Popen[bytes], str]:
    """``tether web`` serving this module's app (its tasks and schedule) on the namespace."""
    port = free_port()
    env = {**os.environ, "BENCH_DASH_URL": url, "BENCH_DASH_NAMESPACE": namespace,
           "TETHER_WEB_TOKEN": TOKEN, "PYTHONPATH": str(ROOT)}  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "tether", "web", "bench.dashboard:app", "--bind",
         f"127.0.0.1:{port}", "--log-level", "WARNING"],
        env=env, cwd=ROOT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    fleet.wait_answering(proc, base + "/login", "the dashboard")
    return proc, base


async def run_scale(url: str, namespace: str, scale: float, n: int) -> dict[str, Any]:
    started = time.monotonic()
    filled = await fill(url, namespace, scale)
    fill_s = time.monotonic() - started
    proc, base = start_server(url, namespace)
    try:
        figures = await measure(base, url, filled, n)
    finally:
        proc.terminate()
        proc.wait(20)
    return {"scale": scale, "fill_s": fill_s, "counts": filled.counts, "pages": figures}


def table(full: dict[str, Any], tenth: dict[str, Any]) -> str:
    lines = [
        "| page | server p50 ms | server p99 ms | wall p50 ms | KiB | commands / request "
        "| with a tenth of the data |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, fig in full["pages"].items():
        small = tenth["pages"][name]["commands"]
        lines.append(
            f"| {name} | {fig['server_p50_ms']:.1f} | {fig['server_p99_ms']:.1f} "
            f"| {fig['wall_p50_ms']:.1f} | {fig['kib']:.0f} | {fig['commands']:.1f} "
            f"| {small:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100, help="requests per page")
    parser.add_argument("--quick", action="store_true", help="20 requests per page")
    parser.add_argument("--scale", type=float, default=1.0, help="of the full data set")
    parser.add_argument("--results-dir", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    n = 20 if args.quick else args.requests
    from tether.base._embedded import EmbeddedServer

    server = EmbeddedServer().start()
    try:
        full = asyncio.run(run_scale(server.url, "dash-full", args.scale, n))
        tenth = asyncio.run(run_scale(server.url, "dash-tenth", args.scale / 10, n))
    finally:
        server.stop()
    refresh = full["pages"]["live refresh of the overview"]["commands"]
    load = os.getloadavg()
    print(table(full, tenth))
    c, t = full["counts"], tenth["counts"]
    print(
        f"\n{len(QUEUES)} queues; {c['queued']:,} queued, {c['dead']:,} dead letters, "
        f"{c['delayed']:,} delayed (a tenth: {t['queued']:,}, {t['dead']:,}, {t['delayed']:,}). "
        f"A live refresh: {refresh:.0f} commands, {refresh / len(QUEUES):.1f} per queue. "
        f"{n} requests per page, one at a time; filled in {full['fill_s']:.0f} s (a tenth in "
        f"{tenth['fill_s']:.0f} s); load average {load[0]:.1f} / {load[1]:.1f} / "
        f"{load[2]:.1f} at the end"
    )
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"dashboard-{stamp}.json").write_text(json.dumps({"full": full, "tenth": tenth}))


if __name__ == "__main__":
    main()
