"""The blocking producer API: the same commands and scripts as the asyncio one, from plain
threads (Django, Flask, scripts), thread-safe, refused on an event loop's thread."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis

from tether import (
    BlockingCallError,
    CancelResult,
    SerializationError,
    TaskFailed,
    TaskStatus,
    Tether,
)
from tether._keys import QueueKeys

from .helpers import ROOT, running_worker


@pytest.fixture
def sync_app(url: str, namespace: str) -> Tether:
    app = Tether(url, namespace=namespace)
    yield app
    app.close_sync()


def test_blocking_enqueue_runs_the_same_paths(sync_app: Tether, rds: redis.Redis) -> None:
    @sync_app.task
    async def add(x: int, y: int) -> int:
        return x + y

    keys = QueueKeys.of(sync_app.namespace, "default")
    plain = add.enqueue_sync(1, 2)  # one XADD: the id is derived from the entry
    assert plain.id.startswith("default:2-")
    batch = add.enqueue_many_sync([(3, 4), add.call(5, y=6)])
    urgent = add.options(priority="high").enqueue_sync(7, 8)
    delayed = add.options(delay=60).enqueue_sync(1, 1)
    first = add.options(key="once").enqueue_sync(9, 9)
    again = add.options(key="once").enqueue_sync(9, 9)
    assert again.duplicate and again.id == first.id
    assert rds.xlen(keys.stream("normal")) == 4 and rds.xlen(keys.stream("high")) == 1
    assert delayed.status_sync() is TaskStatus.SCHEDULED
    assert plain.status_sync() is TaskStatus.QUEUED
    assert delayed.cancel_sync() is CancelResult.CANCELLED

    async def work() -> list[int]:
        async with sync_app, running_worker(sync_app):
            return [await h.result(timeout=10) for h in (plain, *batch, urgent, first)]

    assert asyncio.run(work()) == [3, 7, 11, 15, 18]
    assert plain.result_sync(timeout=5) == 3
    assert plain.status_sync() is TaskStatus.SUCCEEDED
    assert plain.cancel_sync() is CancelResult.FINISHED


def test_blocking_calls_are_thread_safe(sync_app: Tether) -> None:
    @sync_app.task
    async def echo(i: int) -> int:
        return i

    with ThreadPoolExecutor(8) as pool:
        handles = list(pool.map(echo.enqueue_sync, range(400)))
    assert len({h.id for h in handles}) == 400

    async def work() -> None:
        async with sync_app, running_worker(sync_app, concurrency=32):
            # Waiting in threads while the loop runs the worker in this one.
            results = await asyncio.gather(
                *(asyncio.to_thread(h.result_sync, 10) for h in handles[:40])
            )
            assert results == list(range(40))

    asyncio.run(work())


def test_a_bad_argument_writes_nothing(sync_app: Tether, rds: redis.Redis) -> None:
    @sync_app.task
    async def takes(value: object) -> None:
        return None

    with pytest.raises(SerializationError, match=r"argument 'value' \(lock\) cannot be"):
        takes.enqueue_sync(threading.Lock())
    assert rds.xlen(QueueKeys.of(sync_app.namespace, "default").stream("normal")) == 0


async def test_a_blocking_call_on_the_loop_thread_is_refused(app: Tether) -> None:
    @app.task
    async def job() -> int:
        return 1

    with pytest.raises(BlockingCallError, match=r"enqueue_sync\(\) blocks.*await \.\.\.enqueue"):
        job.enqueue_sync()
    handle = await job.enqueue()
    with pytest.raises(BlockingCallError, match="result_sync"):
        handle.result_sync(timeout=1)
    # From a thread of this process (no loop there) it works while the loop runs.
    other = await asyncio.to_thread(job.enqueue_sync)
    async with running_worker(app):
        assert await asyncio.to_thread(other.result_sync, 10) == 1


def test_a_failure_reaches_the_blocking_caller(sync_app: Tether) -> None:
    @sync_app.task
    async def boom() -> None:
        raise ValueError("nope")

    handle = boom.enqueue_sync()

    async def work() -> None:
        async with sync_app, running_worker(sync_app):
            with pytest.raises(TaskFailed):
                await handle.result(timeout=10)

    asyncio.run(work())
    with pytest.raises(TaskFailed, match="ValueError: nope"):
        handle.result_sync(timeout=1)


def test_the_blocking_api_is_typed_like_the_asyncio_one(tmp_path: Path) -> None:
    """A wrong argument to enqueue_sync is a type error, and result_sync is typed."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        textwrap.dedent(
            """
            from tether import Tether

            app = Tether()

            @app.task
            async def add(x: int, y: int) -> int:
                return x + y

            handle = add.enqueue_sync(1, 2)
            total: int = handle.result_sync()
            add.enqueue_sync(1, "two")
            name: str = handle.result_sync()
            """
        )
    )
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(sample)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, result.stdout
    assert 'Argument 2 to "enqueue_sync"' in errors[0]
    assert "Incompatible types in assignment" in errors[1]
