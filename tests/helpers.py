"""Helpers for behaviour tests: in-process workers, worker processes, polling."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import redis

from tether import Tether, Worker, WorkerSettings
from tether.base._embedded import EmbeddedServer

ROOT = Path(__file__).resolve().parent.parent

FAST = {
    "heartbeat_interval": 0.1,
    "heartbeat_ttl": 0.5,
    "reclaim_interval": 0.2,
    "stall_timeout": 5.0,
}
"""Lease and reclaim settings for tests: 100 ms heartbeats."""


@dataclass
class ServerInfo:
    kind: str
    url: str
    process: EmbeddedServer


@contextlib.asynccontextmanager
async def running_worker(app: Tether, **settings: Any) -> AsyncIterator[Worker]:
    """A worker on this event loop, stopped gracefully at the end of the block."""
    options = {**FAST, **settings}
    worker = Worker(app, WorkerSettings(**options), handle_signals=False)
    task = asyncio.create_task(worker.run())
    while not worker.ready.is_set():
        if task.done():
            task.result()
        await asyncio.sleep(0.005)
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def eventually(
    check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01
) -> Any:
    """Poll ``check`` (sync or async) until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        await asyncio.sleep(interval)


def wait_until(check: Callable[[], Any], timeout: float = 10.0, interval: float = 0.01) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        time.sleep(interval)


class LoggedProcess:
    """A process a test started, its output in ``log_path`` (subclasses start it)."""

    process: subprocess.Popen[bytes]
    pid: int
    log_path: Path
    _log: BinaryIO

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float = 30.0) -> int:
        return self.process.wait(timeout)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")


class WorkerProcess(LoggedProcess):
    """``tether worker`` in its own process, with the test's URL and namespace."""

    def __init__(
        self,
        url: str,
        namespace: str,
        name: str,
        *,
        app: str = "tests.apps.tasks:app",
        queues: str = "default",
        log_dir: Path,
        extra: list[str] | None = None,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        **settings: Any,
    ) -> None:
        self.url, self.namespace, self.name = url, namespace, name
        self.queues = queues.split(",")
        options = {**FAST, **settings}
        args = [python, "-m", "tether", "worker", app, "--queues", queues, "--name", name]
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is not False:
                args += [flag, str(value)]
        args += extra or []
        env = {
            **os.environ,
            "TETHER_URL": url,
            "TETHER_NAMESPACE": namespace,
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            **(env or {}),
        }
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in kill_now
        self.process = subprocess.Popen(
            args, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT
        )
        self.pid = self.process.pid

    def lease_key(self, queue: str = "default") -> str:
        return f"{{{self.namespace}:{queue}}}:lease:{self.name}"

    def wait_ready(self, client: redis.Redis | Any, timeout: float = 20.0) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited early:\n{self.log()}")
            return bool(client.exists(self.lease_key(self.queues[0])))

        wait_until(ready, timeout)

    def kill_now(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
                os.kill(self.pid, signal.SIGKILL)
            self.process.wait(10)
        self._log.close()


@dataclass(frozen=True)
class Run:
    tag: str
    pid: int
    deliveries: int
    at: float


def read_runs(client: redis.Redis | Any, key: str) -> list[Run]:
    out = []
    for raw in client.lrange(key, 0, -1):
        tag, pid, deliveries, at = raw.decode().split("|")
        out.append(Run(tag, int(pid), int(deliveries), float(at)))
    return out
