"""`tether demo`: a server, worker processes, a batch of tasks, and the throughput."""

from __future__ import annotations

import asyncio
import importlib
import os
import secrets
import subprocess
import sys
import time

import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ._embedded import EmbeddedServer, stop_process
from ._errors import TetherError

console = Console(stderr=False)


def run_demo(*, url: str | None, workers: int, tasks: int, concurrency: int, timeout: float) -> int:
    server: EmbeddedServer | None = None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if not url:
            try:
                server = EmbeddedServer().start()
            except TetherError as exc:
                console.print(f"[red]{exc}[/red]")
                return 1
            url = server.url
            console.print(f"started an embedded server (pid {server.pid}) at {url}")
        namespace = f"demo-{secrets.token_hex(4)}"
        env = {**os.environ, "TETHER_URL": url, "TETHER_NAMESPACE": namespace}
        for i in range(workers):
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tether",
                        "worker",
                        "tether.demo_app:app",
                        "--queues",
                        "demo",
                        "--concurrency",
                        str(concurrency),
                        "--name",
                        f"{namespace}-worker-{i}",
                        "--log-level",
                        "WARNING",
                        "--no-scheduler",
                    ],
                    env=env,
                )
            )
        console.print(
            f"started {workers} worker processes: pids {', '.join(str(p.pid) for p in procs)}"
        )
        return asyncio.run(_drive(url, namespace, tasks, procs, timeout))
    finally:
        for proc in procs:
            stop_process(proc, wait=15)
        if server is not None:
            server.cleanup()
            console.print(f"stopped the embedded server (pid {server.pid or 'gone'})")


async def _drive(
    url: str, namespace: str, total: int, procs: list[subprocess.Popen[bytes]], timeout: float
) -> int:
    # The demo's app reads its URL and namespace from the environment, as the workers' does.
    os.environ["TETHER_URL"], os.environ["TETHER_NAMESPACE"] = url, namespace
    from . import demo_app

    if demo_app.app.namespace != namespace:  # a second demo in this process
        importlib.reload(demo_app)
    app, done_key = demo_app.app, demo_app._done_key()
    checksum, greet, urgent_ping = demo_app.checksum, demo_app.greet, demo_app.urgent_ping
    deadline = time.monotonic() + timeout
    counter = redis.Redis.from_url(url)
    leases = [f"{{{namespace}:demo}}:lease:{namespace}-worker-{i}" for i in range(len(procs))]
    while counter.exists(*leases) < len(leases):  # time the work, not the workers' start-up
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            console.print("[red]the workers did not start[/red]")
            return 1
        await asyncio.sleep(0.05)
    deadline = time.monotonic() + timeout
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        enq = progress.add_task("enqueued", total=total)
        ran = progress.add_task("completed", total=total)
        started = time.perf_counter()
        async with app:
            sent = 0
            batch = 250
            while sent < total:
                n = min(batch, total - sent)
                third = n // 10
                await urgent_ping.enqueue_many([(i,) for i in range(third)])
                await checksum.enqueue_many([(f"blob-{i}", 200) for i in range(third)])
                await greet.enqueue_many([(f"user-{sent + i}",) for i in range(n - 2 * third)])
                sent += n
                progress.update(enq, completed=sent)
                progress.update(ran, completed=int(counter.get(done_key) or 0))
            enqueued_at = time.perf_counter()
            while True:
                done = int(counter.get(done_key) or 0)
                progress.update(ran, completed=done)
                if done >= total:
                    break
                if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                    console.print(
                        "[red]the demo did not finish: a worker exited or time ran out[/red]"
                    )
                    return 1
                await asyncio.sleep(0.05)
        finished = time.perf_counter()
    counter.close()
    table = Table(title="Tether demo")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("tasks", f"{total:,}")
    table.add_row("worker processes", str(len(procs)))
    table.add_row("enqueue rate", f"{total / (enqueued_at - started):,.0f} tasks/s")
    table.add_row("end-to-end time", f"{finished - started:.2f} s")
    table.add_row("throughput", f"{total / (finished - started):,.0f} tasks/s")
    console.print(table)
    return 0
