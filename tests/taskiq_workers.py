"""``taskiq worker`` processes (taskiq's own CLI) on a TetherBroker, for the taskiq tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from taskiq.kicker import AsyncKicker

from tether.contrib.taskiq import TetherBroker

from .helpers import FAST, ROOT, LoggedProcess, wait_until

APP = "tests.apps.taskiq_tasks:broker"
TASKIQ = str(Path(sys.executable).parent / "taskiq")


class TaskiqWorker(LoggedProcess):
    """``taskiq worker tests.apps.taskiq_tasks:broker`` in a session of its own: taskiq's
    process manager and its worker process(es). ``name`` is the broker's stable name, so
    worker process N is consumer ``<name>-N``."""

    def __init__(
        self,
        url: str,
        namespace: str,
        name: str,
        *,
        log_dir: Path,
        max_async_tasks: int = 8,
        processes: int = 1,
        cli: tuple[str, ...] = (),
        **broker: Any,
    ) -> None:
        self.url, self.namespace, self.name = url, namespace, name
        options = {**FAST, "max_pending": max_async_tasks, **broker, "name": name}
        options.setdefault("url", url)
        options.setdefault("namespace", namespace)
        args = [
            TASKIQ, "worker", APP, "--workers", str(processes),
            "--max-async-tasks", str(max_async_tasks), "--log-level", "INFO", *cli,
        ]  # fmt: skip
        env = {
            **os.environ,
            "TQ_BROKER": json.dumps(options),
            "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        self.log_path = log_dir / f"taskiq-{name}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in kill_now
        self.process = subprocess.Popen(
            args,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        self.pid = self.process.pid

    def consumer(self, index: int = 0) -> str:
        return f"{self.name}-{index}"

    def lease_key(self, index: int = 0, queue: str = "taskiq") -> str:
        return f"{{{self.namespace}:{queue}}}:lease:{self.consumer(index)}"

    def wait_ready(self, client: Any, timeout: float = 20.0) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"taskiq worker {self.name} exited early:\n{self.log()}")
            return bool(client.exists(self.lease_key()))

        wait_until(ready, timeout)

    def children(self) -> list[int]:
        """The worker processes taskiq's process manager runs now."""
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def child(self) -> int:
        return wait_until(lambda: (self.children() or [None])[0], timeout=10)

    def kill_all(self) -> None:
        """SIGKILL the manager and its workers at once (the machine died)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(10)

    def kill_now(self) -> None:
        if self.process.poll() is None:
            self.kill_all()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # children left by a manager that exited
        self._log.close()


def kiq(
    url: str, namespace: str, task: str, *calls: tuple[object, ...], **labels: object
) -> list[str]:
    """Kick ``task`` by name once per call, through a producer's TetherBroker; returns the
    taskiq task ids."""

    async def send() -> list[str]:
        broker = TetherBroker(url, namespace=namespace)
        await broker.startup()
        try:
            kicker: AsyncKicker[Any, Any] = AsyncKicker(task, broker, dict(labels))
            return [(await kicker.kiq(*args)).task_id for args in calls]
        finally:
            await broker.shutdown()

    return asyncio.run(send())


def timed(label: str, seconds: float) -> None:
    """Print a measured recovery time (``pytest -s`` shows them; the report quotes them)."""
    print(f"\n[measured] {label}: {seconds:.3f}s", flush=True)
