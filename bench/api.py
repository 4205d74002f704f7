"""The management API under load: each endpoint's latency and server command count with a
full server, and the same count with a tenth of the data (the count must not grow).

    .venv/bin/python bench/api.py            # about 2 minutes on 2 cores
    .venv/bin/python bench/api.py --quick    # 50 requests per endpoint
    .venv/bin/python bench/api.py --scale 0.02 --requests 3   # what the smoke test runs

It needs this checkout's Tether with the ``web`` extra (``pip install -e '.[web]'``). On a
fresh embedded Valkey it fills one namespace with 100,000 queued tasks (over the three
priorities), 10,000 dead letters (real failures, run by a worker), 1,000 delayed tasks, 50
entries delivered to workers, and 20 live worker records (written in the format the
heartbeat writes, with their leases: 20 real workers would consume the queue), and another
namespace with a tenth of each (but 2,000 dead letters: the writes use up 1,680). Limits
set at runtime and 40 schedules added at runtime give the limits and schedule endpoints
something to read and remove. It serves each with ``tether.web.create_app`` in a uvicorn
process of its own and sends each endpoint's requests one at a time over HTTP (httpx), in
this process.

Per endpoint: p50 and p99 of the request's wall time at the client, and the server commands
per request (``INFO commandstats`` delta over the requests, commands run inside scripts
included, the INFO calls themselves excluded). The table goes to stdout and, with every
number, to ``bench/results/api-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from bench import fleet  # noqa: E402
from tether import Tether  # noqa: E402
from tether.base._embedded import free_port  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"
QUEUE = "default"
app = Tether(
    os.environ.get("BENCH_API_URL", "redis://127.0.0.1:6379/0"),
    namespace=os.environ.get("BENCH_API_NAMESPACE", "bench"),
)


@app.task(name="bench.noop", store_result=False)
async def noop(i: int) -> None:
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
    queued_ids: list[str]
    dead_ids: list[str]
    workers: list[str]
    delayed_ids: list[str]
    schedules: list[str]
    """Added at runtime: removed one a request."""


async def fill(url: str, namespace: str, scale: float) -> Filled:
    import logging

    logging.getLogger("tether").setLevel(logging.ERROR)
    # The writes use up 1,680 dead letters: the tenth keeps 2,000 of them.
    n_queued, n_dead = int(100_000 * scale), max(2_000, int(10_000 * scale))
    n_delayed, n_workers = max(WRITES, int(1_000 * scale)), max(2, int(20 * scale))
    app.configure(url=url, namespace=namespace)
    async with app:
        for start in range(0, n_dead, 1000):
            await fail.enqueue_many([(i,) for i in range(start, min(n_dead, start + 1000))])
        await app.worker(burst=True, concurrency=64, scheduler=False).run()
        queued: list[str] = []
        priorities = ("high", "normal", "low")
        for start in range(0, n_queued, 1000):
            bound = noop.options(priority=priorities[(start // 1000) % 3])
            handles = await bound.enqueue_many(
                [(i,) for i in range(start, min(n_queued, start + 1000))]
            )
            queued += [h.id for h in handles]
        delayed: list[str] = []
        for start in range(0, n_delayed, 1000):
            count = min(n_delayed, start + 1000) - start
            handles = await noop.options(delay=3600).enqueue_many([(i,) for i in range(count)])
            delayed += [h.id for h in handles]
        # Limits set at runtime on the task (the limits endpoints read and change them), and
        # schedules added at runtime (the remove endpoint takes one each request).
        await app.limits.set(noop, rate_limit="1000/s", key_concurrency_limit=4)
        schedules = [f"bench-added-{i}" for i in range(WRITES)]
        for name in schedules:
            await app.schedules.add(hourly, every=3600, name=name)
        keys = app.keys(QUEUE)
        client: Any = app.client
        names = [f"bench-worker-{i:02d}" for i in range(n_workers)]
        pipe = client.pipeline(transaction=False)
        idle: dict[str, int] = dict.fromkeys(
            ("claimed", "handed_off", "lost_leases", "quarantined", "succeeded", "failed",
             "retried"), 0,
        )  # fmt: skip
        fleet.add_workers(pipe, app, names, [QUEUE], held=0, counters=lambda i: idle)
        await pipe.execute()
        # 50 entries delivered to the first workers (and left unsettled): the running list.
        for i in range(5):
            await client.execute_command(
                "XREADGROUP", "GROUP", "tether", names[i % n_workers], "COUNT", 10,
                "STREAMS", keys.streams[0], ">",
            )  # fmt: skip
        dead_rows = await client.xrange(keys.dead, "-", "+")
        dead_ids = [r[0].decode() for r in dead_rows]
    return Filled(queued[60:], dead_ids, names, delayed, schedules)


# -- the endpoints --------------------------------------------------------------------------

Request = tuple[str, str, Any]
"""(method, path, JSON body or None)."""


WRITES = 40
"""Requests per state-changing endpoint: they use up 1,680 dead letters."""


def endpoints(f: Filled) -> list[tuple[str, Callable[[int], Request]]]:
    """Each endpoint with the request to send as its i-th; writes use fresh ids each time."""
    dead = iter(f.dead_ids)
    retry_one = [next(dead) for _ in range(WRITES)]
    purge_one = [next(dead) for _ in range(WRITES)]
    retry_ten = [[next(dead) for _ in range(10)] for _ in range(WRITES)]
    purge_ten = [[next(dead) for _ in range(10)] for _ in range(WRITES)]
    q = f"/api/queues/{QUEUE}"
    toggle = ("pause", "resume")

    def get(path: str) -> Callable[[int], Request]:
        return lambda i: ("GET", path, None)

    def post(path: Callable[[int], str], body: Any = None) -> Callable[[int], Request]:
        return lambda i: ("POST", path(i), body(i) if callable(body) else body)

    return [
        ("GET /api/health", get("/api/health")),
        ("GET /api/session", get("/api/session")),
        ("GET /api/queues", get("/api/queues")),
        ("GET /api/queues/{q}", get(q)),
        ("GET /api/queues/{q}/running", get(f"{q}/running?limit=50")),
        ("GET /api/queues/{q}/delayed", get(f"{q}/delayed?limit=50")),
        ("GET /api/queues/{q}/throughput (60 min)", get(f"{q}/throughput")),
        ("GET /api/queues/{q}/dead", get(f"{q}/dead?limit=50")),
        ("GET /api/queues/{q}/dead?task=", get(f"{q}/dead?limit=50&task=bench.fail")),
        ("GET /api/queues/{q}/dead/{entry}", get(f"{q}/dead/{f.dead_ids[-1]}")),
        ("GET /api/tasks/{id}", lambda i: ("GET", f"/api/tasks/{f.queued_ids[i]}", None)),
        ("GET /api/workers", get("/api/workers?limit=50")),
        ("GET /api/workers/{name}", get(f"/api/workers/{f.workers[0]}")),
        ("GET /api/schedules", get("/api/schedules")),
        ("GET /api/stats/tasks (1 h)", get("/api/stats/tasks?window=3600")),
        ("GET /api/stats/tasks (24 h)", get("/api/stats/tasks?window=86400")),
        ("POST /api/queues/{q}/pause, …/resume", post(lambda i: f"{q}/{toggle[i % 2]}")),
        ("POST /api/tasks/{id}/cancel",
         post(lambda i: f"/api/tasks/{f.queued_ids[-1 - i]}/cancel")),
        ("POST /api/queues/{q}/dead/{entry}/retry",
         post(lambda i: f"{q}/dead/{retry_one[i]}/retry")),
        ("DELETE /api/queues/{q}/dead/{entry}",
         lambda i: ("DELETE", f"{q}/dead/{purge_one[i]}", None)),
        ("POST /api/queues/{q}/dead/retry (10 ids)",
         post(lambda i: f"{q}/dead/retry", lambda i: {"ids": retry_ten[i]})),
        ("POST /api/queues/{q}/dead/purge (a task, 10)",
         post(lambda i: f"{q}/dead/purge", {"task": "bench.fail", "limit": 10})),
        ("POST /api/schedules/{name}/pause, …/resume",
         post(lambda i: f"/api/schedules/bench-hourly/{toggle[i % 2]}")),
        ("POST /api/schedules/{name}/trigger",
         post(lambda i: "/api/schedules/bench-hourly/trigger")),
        ("POST /api/schedules/{name}/reset-backoff",
         post(lambda i: "/api/schedules/bench-hourly/reset-backoff")),
        ("GET /api/openapi.json", get("/api/openapi.json")),
        ("POST /api/tasks/{id}/run-now",
         post(lambda i: f"/api/tasks/{f.delayed_ids[i]}/run-now")),
        ("DELETE /api/schedules/{name}",
         lambda i: ("DELETE", f"/api/schedules/{f.schedules[i]}", None)),
        ("POST /api/queues/{q}/dead/retry (a task, 10)",
         post(lambda i: f"{q}/dead/retry", {"task": "bench.fail", "limit": 10})),
        ("POST /api/queues/{q}/dead/purge (10 ids)",
         post(lambda i: f"{q}/dead/purge", lambda i: {"ids": purge_ten[i]})),
        ("GET /api/queues/{q}/limits", get(f"{q}/limits")),
        ("GET /api/queues/{q}/limits/{task}", get(f"{q}/limits/bench.noop")),
        ("GET /api/queues/{q}/limits/{task}/keys/{key}",
         get(f"{q}/limits/bench.noop/keys/tenant-1")),
        ("GET /api/queues/{q}/held", get(f"{q}/held")),
        ("PATCH /api/queues/{q}/limits/{task}",
         lambda i: ("PATCH", f"{q}/limits/bench.noop", {"rate_limit": f"{1000 + i}/s"})),
        ("DELETE /api/queues/{q}/limits/{task} (reset)",
         lambda i: ("DELETE", f"{q}/limits/bench.noop", None)),
    ]  # fmt: skip


async def measure(base: str, url: str, f: Filled, n: int) -> dict[str, dict[str, float]]:
    import httpx
    import redis

    counter = redis.Redis.from_url(url)
    out: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(
        base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    ) as client:
        for name, make in endpoints(f):
            reads = name.startswith("GET")
            if reads:  # warm-up: connections, script cache, imports
                for i in range(3):
                    method, path, body = make(i)
                    await client.request(method, path, json=body)
            count = n if reads else min(n, WRITES)
            before = fleet.command_calls(counter.info("commandstats"))
            times = []
            for i in range(count):
                method, path, body = make(i)
                started = time.perf_counter()
                answer = await client.request(method, path, json=body)
                times.append((time.perf_counter() - started) * 1000)
                if answer.status_code >= 400:
                    raise SystemExit(f"{name}: {answer.status_code} {answer.text[:300]}")
            after = fleet.command_calls(counter.info("commandstats"))
            times.sort()
            out[name] = {
                "p50_ms": statistics.median(times),
                "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))],
                "commands": (after - before) / count,
                "requests": count,
            }
    counter.close()
    return out


# -- the server process -------------------------------------------------------------------


def serve(port: int) -> None:
    import uvicorn

    from tether.web import create_app

    web_app = create_app(app, token=TOKEN)
    gc.freeze()  # as `tether web` does once started: full collections skip what never dies
    uvicorn.run(web_app, host="127.0.0.1", port=port, log_level="warning")


def start_server(url: str, namespace: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "BENCH_API_URL": url, "BENCH_API_NAMESPACE": namespace}
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__)), "--serve", str(port)], env=env, cwd=ROOT
    )
    base = f"http://127.0.0.1:{port}"
    fleet.wait_answering(proc, base + "/api/health", "the API server")
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
    return {"scale": scale, "fill_s": fill_s, "endpoints": figures}


def table(full: dict[str, Any], tenth: dict[str, Any]) -> str:
    lines = [
        "| endpoint | p50 ms | p99 ms | commands / request | with a tenth of the data |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, fig in full["endpoints"].items():
        small = tenth["endpoints"][name]["commands"]
        lines.append(
            f"| `{name}` | {fig['p50_ms']:.1f} | {fig['p99_ms']:.1f} | {fig['commands']:.1f} "
            f"| {small:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per endpoint")
    parser.add_argument("--quick", action="store_true", help="50 requests per endpoint")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="the data, as a fraction of the full set (1)"
    )
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--results-dir", default=str(ROOT / "bench" / "results"))
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    n = 50 if args.quick else args.requests
    from tether.base._embedded import EmbeddedServer

    server = EmbeddedServer().start()
    try:
        full = asyncio.run(run_scale(server.url, "bench-full", args.scale, n))
        tenth = asyncio.run(run_scale(server.url, "bench-tenth", args.scale / 10, n))
    finally:
        server.stop()
    text = table(full, tenth)
    load = os.getloadavg()
    print(text)
    print(
        f"\n{n} requests per reading endpoint, {min(n, WRITES)} per writing one, one at a "
        f"time; filled in {full['fill_s']:.0f} s (a tenth in {tenth['fill_s']:.0f} s); load "
        f"average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} at the end"
    )
    out = Path(args.results_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"api-{stamp}.json").write_text(json.dumps({"full": full, "tenth": tenth}, indent=2))


if __name__ == "__main__":
    main()
