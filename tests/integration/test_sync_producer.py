"""The blocking producer API: the same commands and scripts as the asyncio one, from plain
threads (Django, Flask, scripts), thread-safe, refused on an event loop's thread."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis

from tether import (
    BlockingCallError,
    CancelResult,
    EnqueueError,
    Middleware,
    SerializationError,
    Task,
    TaskFailed,
    TaskStatus,
    Tether,
)
from tether.base._redis import parse_url, sync_client
from tether.protocol._keys import QueueKeys

from ..helpers import ROOT, WorkerProcess, read_runs, running_worker
from ..servers import LocalCluster, LocalSentinel

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py


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
    with pytest.raises(BlockingCallError, match=r"enqueue_by_name_sync\(\).*enqueue_by_name\("):
        app.enqueue_by_name_sync("elsewhere.job")
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


def test_enqueue_replicas_behave_the_same_from_a_thread(url: str, namespace: str) -> None:
    """A server without replicas cannot acknowledge: the blocking call fails as the asyncio
    one does, naming the shortfall, on the XADD path and on the script path alike."""
    app = Tether(url, namespace=namespace, enqueue_replicas=1, enqueue_replicas_timeout=0.05)

    @app.task
    async def job(i: int) -> int:
        return i

    messages = []
    for task in (job, job.options(key="k")):
        with pytest.raises(EnqueueError, match="only 0 of 1 replicas acknowledged") as sync:
            task.enqueue_sync(1)

        async def enqueue(task: Task[[int], int] = task) -> None:
            async with app:
                await task.enqueue(1)

        with pytest.raises(EnqueueError) as asynchronous:
            asyncio.run(enqueue())
        messages.append((str(sync.value), str(asynchronous.value)))
    assert all(a == b for a, b in messages)
    app.close_sync()


def test_enqueue_replicas_wait_for_the_sentinels_replica(
    sentinel: LocalSentinel, namespace: str
) -> None:
    app = Tether(sentinel.url, namespace=namespace, enqueue_replicas=1)

    @app.task
    async def job(i: int) -> int:
        return i

    plain = job.enqueue_sync(1)  # XADD + WAIT on one connection
    keyed = job.options(key="once").enqueue_sync(2)  # the script + WAIT
    assert job.options(key="once").enqueue_sync(3).id == keyed.id
    assert plain.status_sync() is TaskStatus.QUEUED
    assert job.enqueue_many_sync([(4,), (5,)])[1].status_sync() is TaskStatus.QUEUED
    app.close_sync()


def test_the_fast_path_writes_what_the_general_path_writes(
    sync_app: Tether, rds: redis.Redis
) -> None:
    """enqueue_sync of one plain task writes the envelope's fixed parts once; the bytes are
    those of the general path (enqueue_many_sync), whatever the arguments and options."""
    import json
    import re

    @sync_app.task
    async def f(a: object, b: object = None, *, c: int = 0) -> None:
        return None

    stream = QueueKeys.of(sync_app.namespace, "default").stream("normal")
    cases: list[tuple[tuple[object, ...], dict[str, object], dict[str, object]]] = [
        ((1, "é\n"), {}, {}),
        ((1,), {"c": 2}, {}),
        ((1, [2.5, {"x": None, "y": True}]), {"c": 3}, {"timeout": 5, "retries": 2}),
        ((1,), {"b": (3, 4)}, {"store_result": False}),
    ]
    for args, kwargs, options in cases:
        task = f.options(**options) if options else f  # type: ignore[arg-type]
        task.enqueue_sync(*args, **kwargs)
        task.enqueue_many_sync([task.call(*args, **kwargs)])
        (_, fast), (_, general) = rds.xrange(stream)[-2:]
        assert re.sub(rb'"enq":\d+', b"", fast[b"m"]) == re.sub(rb'"enq":\d+', b"", general[b"m"])
        assert json.loads(fast[b"m"])["args"] == json.loads(json.dumps(list(args)))


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

            from tether.testing import recording

            with recording(app) as queue:
                queue.assert_enqueued_once(add.options(delay=5), 1, 2)
                queue.assert_enqueued(add, 1, y="two")
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
    assert len(errors) == 3, result.stdout
    assert 'Argument 2 to "enqueue_sync"' in errors[0]
    assert "Incompatible types in assignment" in errors[1]
    assert 'Argument "y" to "assert_enqueued"' in errors[2]  # the testing kit is typed too


# -- middleware, worker processes, delayed tasks, Cluster ---------------------------------


class Stamp(Middleware):
    """Adds a header to every enqueue call and notes each task Redis accepted."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.accepted: list[str] = []

    def before_enqueue(self, task_name: str, queue: str, headers: dict[str, str]) -> None:
        self.calls.append(task_name)
        headers["stamp"] = f"{queue}/{task_name}"

    async def on_enqueue(self, task_name: str, task_id: str, queue: str) -> None:
        self.accepted.append(task_id)


def test_middleware_surrounds_the_blocking_producers_and_the_worker_sees_its_header(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    stamp = Stamp()
    app = Tether(url, namespace=namespace, middleware=[stamp])

    # The worker process runs tests.apps.tasks.headers; this is the producer's declaration.
    @app.task(name="tests.apps.tasks.headers")
    async def headers(tag: str) -> dict[str, str]:
        raise AssertionError("runs on the worker")

    one = headers.enqueue_sync("one")
    many = headers.enqueue_many_sync([("m1",), ("m2",)])
    keyed = headers.options(key="k").enqueue_sync("keyed")
    duplicate = headers.options(key="k").enqueue_sync("duplicate")
    assert duplicate.duplicate and duplicate.id == keyed.id
    # before_enqueue once per call (the duplicate's too); on_enqueue once per accepted task,
    # none for the duplicate.
    assert stamp.calls == ["tests.apps.tasks.headers"] * 4
    assert stamp.accepted == [one.id, *(h.id for h in many), keyed.id]
    # From many threads at once, each accepted task is noted once.
    with ThreadPoolExecutor(8) as pool:
        threaded = list(pool.map(headers.enqueue_sync, [f"t{i}" for i in range(24)]))
    assert sorted(stamp.accepted[4:]) == sorted(h.id for h in threaded)

    worker = WorkerProcess(url, namespace, "w", log_dir=tmp_path)
    workers.append(worker)
    worker.wait_ready(rds)
    expected = {"stamp": "default/tests.apps.tasks.headers"}
    for handle in (one, *many, keyed, *threaded):
        assert handle.result_sync(timeout=20) == expected
    ran = [r.tag for r in read_runs(rds, f"{namespace}:runs")]
    assert "duplicate" not in ran and len(ran) == 4 + 24
    app.close_sync()


def test_blocking_delayed_and_at_tasks_run_when_due(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    worker = WorkerProcess(url, namespace, "w", log_dir=tmp_path)
    workers.append(worker)
    worker.wait_ready(rds)
    app = Tether(url, namespace=namespace)

    @app.task(name="tests.apps.tasks.record")
    async def record(tag: str) -> str:
        raise AssertionError("runs on the worker")

    sent = time.time()
    later = record.options(delay=1.0).enqueue_sync("later")
    due = datetime.now(timezone.utc) + timedelta(seconds=1.5)
    at = record.options(at=due).enqueue_sync("at")
    assert later.status_sync() is TaskStatus.SCHEDULED and at.status_sync() is TaskStatus.SCHEDULED
    assert rds.zcard(QueueKeys.of(namespace, "default").delayed) == 2
    time.sleep(0.5)
    assert not read_runs(rds, f"{namespace}:runs"), "a delayed task ran early"
    assert later.result_sync(timeout=20) == "later" and at.result_sync(timeout=20) == "at"
    runs = {r.tag: r.at for r in read_runs(rds, f"{namespace}:runs")}
    assert 1.0 - 0.01 <= runs["later"] - sent <= 1.0 + 2.0, runs["later"] - sent
    assert due.timestamp() - 0.01 <= runs["at"] <= due.timestamp() + 2.0, runs["at"] - sent
    app.close_sync()


@pytest.mark.cluster
def test_blocking_enqueue_on_a_cluster_with_and_without_replica_waits(
    cluster: LocalCluster, namespace: str
) -> None:
    """Every blocking path on a Cluster: the one-XADD fast path, the append and enqueue
    scripts, and with enqueue_replicas the script and WAIT sent together to the master of
    the queue's slot (after a SCRIPT FLUSH, and after a script that fails there)."""
    keys = QueueKeys.of(namespace, "default")
    master = cluster.master_for_key(keys.tag)
    node = sync_client(
        parse_url(f"redis://127.0.0.1:{master.port}/0"), socket_timeout=5, connect_timeout=5
    )
    plain_app = Tether(cluster.url, namespace=namespace)
    app = Tether(cluster.url, namespace=namespace, enqueue_replicas=1)

    def declare(on: Tether) -> Task[[int], int]:
        @on.task(name="cluster.job")
        async def job(i: int) -> int:
            return i

        return job

    plain_job, job = declare(plain_app), declare(app)
    try:
        handles = [plain_job.enqueue_sync(0), *plain_job.enqueue_many_sync([(1,), (2,)])]
        handles.append(plain_job.options(key="p").enqueue_sync(3))
        node.execute_command("SCRIPT", "FLUSH")
        node.execute_command("CONFIG", "RESETSTAT")
        handles.append(job.enqueue_sync(4))  # XADD through the append script, then WAIT
        handles += job.enqueue_many_sync([(5,), (6,)])
        keyed = job.options(key="k").enqueue_sync(7)  # the enqueue script, then WAIT
        handles.append(keyed)
        again = job.options(key="k").enqueue_sync(8)
        assert again.duplicate and again.id == keyed.id
        handles.append(job.options(priority="high").enqueue_sync(9))
        stats = node.info("commandstats")
        assert stats["cmdstat_wait"]["calls"] >= 5
        assert stats.get("cmdstat_eval", {}).get("calls", 0) <= 2  # one per script, after the flush
        assert stats["cmdstat_evalsha"]["calls"] >= 5
        # A script that fails on the server (the dedup key holds a list): its WAIT reply is
        # read too, so the pooled connection serves the next calls with their own replies.
        node.rpush(keys.dedup("broken"), "x")
        with pytest.raises(EnqueueError, match="WRONGTYPE"):
            job.options(key="broken").enqueue_sync(0)
        after = [job.options(key=f"after{i}").enqueue_sync(10 + i) for i in range(5)]
        assert len({h.id for h in after}) == 5 and not any(h.duplicate for h in after)
        handles += after
        assert all(h.status_sync() is TaskStatus.QUEUED for h in handles)

        values: list[int] = []

        async def run_all() -> None:
            async with app, running_worker(app):
                for handle in handles:  # waited for in a thread, as a blocking caller
                    values.append(await asyncio.to_thread(handle.result_sync, 20))

        asyncio.run(run_all())
        assert values == [*range(8), 9, *range(10, 15)]
        assert keyed.result_sync(timeout=5) == 7
    finally:
        node.close()
        app.close_sync()
        plain_app.close_sync()
