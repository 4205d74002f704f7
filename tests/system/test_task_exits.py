"""A task that tries to end the process (``sys.exit()``, ``raise KeyboardInterrupt``, another
``BaseException``) fails its attempt with the exception recorded, and the worker serves on.

Before, such a task took the `tether worker` process down with it: the task stayed
"running", was reclaimed, and took down the next worker, up to ``max_deliveries`` workers.
A real SIGTERM or SIGINT to the worker still stops it gracefully."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis

from tether import TaskFailed, Tether

from ..helpers import WorkerProcess, read_runs

EXITS = [
    pytest.param("exits", "exit", "SystemExit", "3", id="async-sys.exit"),
    pytest.param("exits", "interrupt", "KeyboardInterrupt", "", id="async-KeyboardInterrupt"),
    pytest.param("exits", "base", "tests.apps.tasks._Escape", "left", id="async-BaseException"),
    pytest.param("exits_sync", "exit", "SystemExit", "3", id="sync-sys.exit"),
    pytest.param("exits_sync", "interrupt", "KeyboardInterrupt", "", id="sync-KeyboardInterrupt"),
]


@pytest.mark.parametrize(("task", "how", "error_type", "message"), EXITS)
@pytest.mark.parametrize("timeout", [None, 30.0], ids=["no-timeout", "timeout"])
async def test_a_task_that_exits_fails_and_the_worker_serves_on(
    url: str,
    namespace: str,
    rds: redis.Redis,
    tmp_path: Path,
    workers: list[WorkerProcess],
    task: str,
    how: str,
    error_type: str,
    message: str,
    timeout: float | None,
) -> None:
    # A timeout runs an async task under asyncio.wait_for, which (before Python 3.12) runs
    # it in a task of its own, where SystemExit and KeyboardInterrupt escape the event loop.
    worker = WorkerProcess(url, namespace, "exiter", log_dir=tmp_path)
    workers.append(worker)
    worker.wait_ready(rds)
    producer = Tether(url, namespace=namespace)
    async with producer:
        leaver = producer.by_name(f"tests.apps.tasks.{task}").options(retries=1, timeout=timeout)
        handle = await leaver.enqueue("leaver", how)
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=20)
        # The worker outlived the task and runs the next one.
        after = await producer.enqueue_by_name("tests.apps.tasks.record", "after")
        assert await after.result(timeout=20) == "after"
    assert worker.process.poll() is None, worker.log()
    error = failed.value
    assert error.status == "failed", error
    assert error.error_type == error_type
    assert message in error.error_message
    # Not in the default retry_on (Exception): one attempt, on the one worker.
    starts = read_runs(rds, f"{namespace}:starts")
    assert [(r.tag, r.pid) for r in starts] == [("leaver", worker.pid)]
    assert [r.pid for r in read_runs(rds, f"{namespace}:runs")] == [worker.pid]
    assert f"{error_type}" in worker.log()


async def test_retry_on_can_retry_a_task_that_exits(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """``retry_on=(SystemExit,)`` retries it like any other exception."""
    worker = WorkerProcess(url, namespace, "exiter", log_dir=tmp_path)
    workers.append(worker)
    worker.wait_ready(rds)
    producer = Tether(url, namespace=namespace)
    async with producer:
        retried = producer.by_name("tests.apps.tasks.exits_retried").options(retries=2)
        handle = await retried.enqueue("again")
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=20)
    assert failed.value.error_type == "SystemExit"
    starts = read_runs(rds, f"{namespace}:starts")
    assert [r.tag for r in starts] == ["again"] * 3
    assert {r.pid for r in starts} == {worker.pid}
    assert worker.process.poll() is None, worker.log()


def test_a_real_signal_still_stops_the_worker(
    url: str, rds: redis.Redis, namespace: str, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """The worker contains a task's KeyboardInterrupt, not the process's SIGINT."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        worker = WorkerProcess(url, namespace, f"stopped-{sig.name}", log_dir=tmp_path)
        workers.append(worker)
        worker.wait_ready(rds)
        worker.process.send_signal(sig)
        assert worker.process.wait(20) == 0, worker.log()
