"""`tether demo`: a server, worker processes, a batch of tasks, and the throughput; with
``--web``, the dashboard of the demo's namespace while it runs, and after the batch until
it is interrupted (a trickle of tasks keeps its charts moving)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typing_extensions import Self

from ..base._embedded import EmbeddedServer, stop_process
from ..base._errors import TetherError
from ..protocol._keys import QueueKeys

console = Console(stderr=False)


@dataclass(frozen=True)
class WebOptions:
    """Where ``tether demo --web`` serves the dashboard, and its token."""

    host: str
    port: int
    token: str
    fallback: bool = True
    """Take a free port when ``port`` is in use (the default address, not one asked for)."""


def run_demo(
    *,
    url: str | None,
    workers: int,
    tasks: int,
    concurrency: int,
    timeout: float,
    web: WebOptions | None = None,
) -> int:
    server: EmbeddedServer | None = None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if not url:
            try:
                server = DetachedServer().start()
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
                        "tether.cli.demo_app:app",
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
                    start_new_session=True,  # Ctrl-C is the demo's to hand on: see DetachedServer
                )
            )
        console.print(
            f"started {workers} worker processes: pids {', '.join(str(p.pid) for p in procs)}"
        )
        if web is None:
            return asyncio.run(_drive(url, namespace, tasks, procs, timeout))
        with _dashboard(url, namespace, web):
            code = asyncio.run(_drive(url, namespace, tasks, procs, timeout))
            if code == 0:
                console.print(
                    "the dashboard stays up, with a trickle of tasks: press Ctrl-C to stop"
                )
                with contextlib.suppress(KeyboardInterrupt):
                    asyncio.run(_trickle(url, namespace, procs))
            return code
    finally:
        for proc in procs:
            stop_process(proc, wait=15)
        if server is not None:
            pid = server.pid  # cleanup() forgets the process
            server.cleanup()
            console.print(f"stopped the embedded server (pid {pid})")


class DetachedServer(EmbeddedServer):
    """The demo's server, in a session of its own as the workers are. Ctrl-C on a terminal
    signals its whole foreground process group: the server exited at once while the workers
    were still stopping, and each of them warned three times that it could not reach it. Out
    of that group, the children are stopped by the demo: the workers first, the server last."""

    def start(self, timeout: float = 15.0) -> Self:
        self.process = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.directory,
            start_new_session=True,
        )
        atexit.register(self.cleanup)  # as EmbeddedServer: the server does not outlive the demo
        self.wait_ready(timeout)
        return self


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
    leases = [
        QueueKeys.of(namespace, "demo").lease(f"{namespace}-worker-{i}") for i in range(len(procs))
    ]
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


# -- --web: the dashboard of the demo's namespace --------------------------------------------


def _listen(web: WebOptions) -> socket.socket:
    family = socket.AF_INET6 if ":" in web.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((web.host, web.port))
    except OSError:
        if not web.fallback:
            sock.close()
            raise
        sock.bind((web.host, 0))  # the default port is taken: any free one
    return sock


@contextlib.contextmanager
def _dashboard(url: str, namespace: str, web: WebOptions) -> Iterator[None]:
    """Serve the dashboard with uvicorn in a thread of this process until the block ends."""
    import uvicorn

    from .. import Tether
    from ..web import create_app

    sock = _listen(web)
    app = Tether(url, namespace=namespace)
    config = uvicorn.Config(create_app(app, token=web.token), log_level="warning")
    server = uvicorn.Server(config)
    # A thread, not the main one: uvicorn leaves the signals to the demo.
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="dashboard", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    console.print(f"dashboard: http://{shown}:{port}/", soft_wrap=True)
    console.print(f"dashboard token: {web.token}", soft_wrap=True)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


async def _trickle(url: str, namespace: str, procs: list[subprocess.Popen[bytes]]) -> None:
    """A few tasks a second (some of them for later), until interrupted or a worker exits."""
    from .. import Tether
    from . import demo_app

    app = Tether(url, namespace=namespace)  # the batch's app is closed: one for this loop
    greet = app.by_name(demo_app.greet.name, queue="demo")
    async with app:
        n = 0
        while all(p.poll() is None for p in procs):
            await greet.enqueue_many([(f"visitor-{n + i}",) for i in range(20)])
            if n % 200 == 0:
                await greet.options(delay=120).enqueue(f"later-{n}")
            n += 20
            await asyncio.sleep(1)
