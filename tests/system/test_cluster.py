"""Every delivery promise on a real local Redis Cluster (3 masters, a replica each), and
Sentinel: queues in different slots, SIGKILL recovery on an idle queue, the shutdown handoff,
priorities, the prefetch bound, lifecycle basics, the scheduler, and failover."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.crc import key_slot

from tether import Backoff, TaskStatus, Tether
from tether.base._redis import parse_url, sync_client
from tether.protocol._keys import GROUP, QueueKeys
from tether.scheduler import Scheduler

from ..helpers import FAST, WorkerProcess, eventually, read_runs, running_worker, wait_until
from ..servers import LocalCluster, LocalSentinel
from .test_recovery import enqueue

pytestmark = pytest.mark.cluster


@pytest.fixture
def crds(cluster: LocalCluster) -> Iterator[Any]:
    client = sync_client(parse_url(cluster.url), socket_timeout=5, connect_timeout=5, retries=2)
    yield client
    client.close()


def queues_on_distinct_masters(cluster: LocalCluster, namespace: str, n: int = 3) -> list[str]:
    """Queue names whose hash tags land on ``n`` different masters."""
    chosen: dict[int, str] = {}
    for i in range(1000):
        name = f"q{i}"
        port = cluster.master_for_key(QueueKeys.of(namespace, name).tag).port
        chosen.setdefault(port, name)
        if len(chosen) == n:
            return list(chosen.values())
    raise AssertionError("could not spread queues over the masters")


def pending_total(client: Any, namespace: str, queue: str) -> int:
    total = 0
    for stream in QueueKeys.of(namespace, queue).streams:
        if client.exists(stream):
            total += int(client.xpending(stream, GROUP)["pending"])
    return total


async def test_queues_in_different_slots_enqueue_run_and_respect_the_prefetch_bound(
    cluster: LocalCluster, namespace: str, crds: Any
) -> None:
    queues = queues_on_distinct_masters(cluster, namespace)
    assert len({key_slot(QueueKeys.of(namespace, q).tag.encode()) for q in queues}) == 3
    app = Tether(cluster.url, namespace=namespace)
    release = asyncio.Event()
    ran: list[str] = []

    @app.task
    async def block(queue: str) -> None:
        ran.append(queue)
        await release.wait()

    async with app:
        for q in queues:
            for priority in ("high", "normal", "low"):
                await block.options(queue=q, priority=priority).enqueue_many([(q,)] * 4)
        async with running_worker(app, queues=tuple(queues), concurrency=3, max_pending=5):
            await eventually(lambda: len(ran) == 3)
            await asyncio.sleep(0.5)
            assert sum(pending_total(crds, namespace, q) for q in queues) == 5
            release.set()
            await eventually(lambda: len(ran) == 36, timeout=15)
        assert sorted(set(ran)) == sorted(queues)
        assert sum(pending_total(crds, namespace, q) for q in queues) == 0


async def test_priorities_on_a_cluster(cluster: LocalCluster, namespace: str) -> None:
    app = Tether(cluster.url, namespace=namespace)
    order: list[str] = []

    @app.task
    async def note(tag: str) -> None:
        order.append(tag)

    async with app:
        for priority in ("low", "normal", "high"):
            await note.options(priority=priority).enqueue_many(
                [(f"{priority}{i}",) for i in range(2)]
            )
        async with running_worker(app, concurrency=1):
            await eventually(lambda: len(order) == 6)
    assert order == ["high0", "high1", "normal0", "normal1", "low0", "low1"]


async def test_lifecycle_basics_and_the_scheduler_on_a_cluster(
    cluster: LocalCluster, namespace: str
) -> None:
    app = Tether(cluster.url, namespace=namespace)
    attempts: list[int] = []

    @app.task(retries=1, backoff=Backoff(base=0.05))
    async def flaky(x: int) -> int:
        attempts.append(x)
        if len(attempts) == 1:
            raise RuntimeError("once")
        return x * 2

    @app.periodic(every=1.0, run_at_startup=True, name="beat")
    @app.task
    async def beat() -> None: ...

    async with app:
        retried = await flaky.enqueue(4)
        delayed = await flaky.options(delay=0.3, queue="other").enqueue(5)
        keyed = await flaky.options(key="k").enqueue(6)
        assert (await flaky.options(key="k").enqueue(6)).duplicate
        async with running_worker(app, queues=("default", "other"), scheduler=False):
            assert await retried.result(timeout=10) == 8
            assert await delayed.result(timeout=10) == 10
            assert await keyed.result(timeout=10) == 12
        assert await retried.status() is TaskStatus.SUCCEEDED
        scheduler = Scheduler(app, loop_interval=0.1, leader_ttl=2.0)
        await scheduler.run_once()
        assert scheduler.is_leader and scheduler.fired == 1
        assert await app.schedules.leader() == scheduler.holder


def test_sigkill_recovery_on_an_idle_queue_on_a_cluster(
    cluster: LocalCluster, namespace: str, crds: Any, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    url = cluster.url
    a = WorkerProcess(url, namespace, "a", log_dir=tmp_path)
    workers.append(a)
    a.wait_ready(crds)
    enqueue(url, namespace, "slow", ("job", 30.0))
    wait_until(lambda: len(read_runs(crds, f"{namespace}:starts")) == 1)
    b = WorkerProcess(url, namespace, "b", log_dir=tmp_path)
    workers.append(b)
    b.wait_ready(crds)
    time.sleep(0.3)
    killed_at = time.time()
    a.signal(signal.SIGKILL)
    wait_until(lambda: len(read_runs(crds, f"{namespace}:starts")) == 2, timeout=10)
    restart = read_runs(crds, f"{namespace}:starts")[1]
    assert restart.pid == b.pid
    ttl, reclaim = FAST["heartbeat_ttl"], FAST["reclaim_interval"]
    assert ttl - FAST["heartbeat_interval"] - 0.05 <= restart.at - killed_at <= ttl + reclaim + 1.0


def test_shutdown_handoff_on_a_cluster(
    cluster: LocalCluster, namespace: str, crds: Any, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    url = cluster.url
    slow_lease = {"heartbeat_ttl": 5.0, "stall_timeout": 10.0}
    a = WorkerProcess(
        url, namespace, "a", log_dir=tmp_path, concurrency=1, max_pending=4, **slow_lease
    )
    workers.append(a)
    a.wait_ready(crds)
    # The first runs until the test opens its gate (a starts no second one before its
    # SIGTERM, however slow the machine); the other three wait in a's buffer.
    enqueue(url, namespace, "gated", ("t0",))
    enqueue(url, namespace, "slow", *[(f"t{i}", 1.0) for i in range(1, 4)])
    wait_until(lambda: pending_total(crds, namespace, "default") == 4)
    b = WorkerProcess(url, namespace, "b", log_dir=tmp_path, concurrency=4, **slow_lease)
    workers.append(b)
    b.wait_ready(crds)
    sent = time.time()
    a.signal(signal.SIGTERM)
    wait_until(lambda: len(read_runs(crds, f"{namespace}:starts")) == 4, timeout=5)
    picked = [s for s in read_runs(crds, f"{namespace}:starts") if s.pid == b.pid]
    assert len(picked) == 3
    assert max(s.at for s in picked) - sent < 1.5 < slow_lease["heartbeat_ttl"]
    crds.set(f"{namespace}:gate:t0", 1)
    assert a.wait(20) == 0


def test_failover_keeps_every_task_acknowledged_by_wait(
    namespace: str, tmp_path: Path, workers: list[WorkerProcess], request: pytest.FixtureRequest
) -> None:
    from ..conftest import SERVER_KINDS
    from ..servers import binary_for

    kind = SERVER_KINDS[-1]
    with LocalCluster(binary_for(kind)) as cluster:
        # The tasks note their runs in keys that must survive the failover: pick a namespace
        # whose queue lives on another master than those keys.
        for n in range(100):
            namespace = f"failover{n}"
            queue_master = cluster.master_for_key(QueueKeys.of(namespace, "default").tag)
            if queue_master.port != cluster.master_for_key(f"{namespace}:runs").port:
                break
        client = sync_client(parse_url(cluster.url), socket_timeout=5, connect_timeout=5, retries=3)
        try:
            fleet = [
                WorkerProcess(
                    cluster.url,
                    namespace,
                    f"w{i}",
                    log_dir=tmp_path,
                    concurrency=8,
                    heartbeat_ttl=2.0,
                )
                for i in range(2)
            ]
            workers += fleet
            for w in fleet:
                w.wait_ready(client)
            total = 300
            import asyncio as aio

            async def send() -> list[str]:
                from tests.apps import tasks
                from tether import Task

                app = Tether(cluster.url, namespace=namespace, enqueue_replicas=1)
                src = tasks.app.tasks["tests.apps.tasks.slow"]
                slow: Task[..., Any] = Task(app, src.fn, src.config).options(retries=3)
                async with app:
                    ids = []
                    for i in range(total // 10):
                        ids += [
                            h.id
                            for h in await slow.enqueue_many(
                                [(f"f{i}-{j}", 0.05) for j in range(10)]
                            )
                        ]
                    return ids

            ids = aio.run(send())
            assert len(ids) == total
            victim = cluster.master_for_key(QueueKeys.of(namespace, "default").tag)
            wait_until(lambda: len(read_runs(client, f"{namespace}:runs")) > 0, timeout=10)
            cluster.kill(victim)
            killed = time.monotonic()
            cluster.wait_for_failover(victim, timeout=20)
            promoted = time.monotonic() - killed
            wait_until(
                lambda: len({r.tag for r in read_runs(client, f"{namespace}:runs")}) == total,
                timeout=60,
            )
            assert promoted < 15
        finally:
            client.close()


async def test_sentinel_enqueue_run_and_failover(sentinel: LocalSentinel, namespace: str) -> None:
    app = Tether(sentinel.url, namespace=namespace)
    done: list[int] = []

    @app.task
    async def job(i: int) -> int:
        done.append(i)
        return i

    async with app:
        first = await job.enqueue(1)
        async with running_worker(app, heartbeat_ttl=2.0, stall_timeout=5.0):
            assert await first.result(timeout=10) == 1
            sentinel.kill_master()
            await asyncio.to_thread(sentinel.wait_for_failover, 20)
            # producers and workers reconnect to the promoted replica on their own
            deadline = time.monotonic() + 20
            while True:
                try:
                    second = await job.enqueue(2)
                    break
                except Exception:
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.2)
            assert await second.result(timeout=20) == 2


async def test_replica_waits_on_a_cluster_reuse_the_script_and_survive_a_failing_one(
    cluster: LocalCluster, namespace: str, crds: Any
) -> None:
    """enqueue_replicas on a Cluster used to send the whole script text on every call, and a
    failing script left its WAIT reply unread on a pooled connection, where the next call
    read it as its own."""
    app = Tether(cluster.url, namespace=namespace, enqueue_replicas=1)

    @app.task
    async def job(i: int) -> int:
        return i

    keys = QueueKeys.of(namespace, "default")
    master = cluster.master_for_key(keys.tag)
    node = sync_client(
        parse_url(f"redis://127.0.0.1:{master.port}/0"), socket_timeout=5, connect_timeout=5
    )
    try:
        node.execute_command("SCRIPT", "FLUSH")
        node.execute_command("CONFIG", "RESETSTAT")
        async with app:
            first = await job.options(key="k").enqueue(1)  # the script path, after a flush
            for i in range(20):
                await job.options(key=f"k{i}").enqueue(i)
            stats = node.info("commandstats")
            assert stats.get("cmdstat_eval", {}).get("calls", 0) <= 1
            assert stats["cmdstat_evalsha"]["calls"] >= 20
            # A script that fails on the server: the dedup key holds a list, not a string.
            crds.rpush(keys.dedup("broken"), "x")
            with pytest.raises(Exception, match="WRONGTYPE"):
                await job.options(key="broken").enqueue(0)
            # The pooled connections read their own replies afterwards.
            handles = [await job.options(key=f"after{i}").enqueue(i) for i in range(10)]
            assert len({h.id for h in handles}) == 10 and not any(h.duplicate for h in handles)
            async with running_worker(app):
                assert await first.result(timeout=20) == 1
                assert [await h.result(timeout=20) for h in handles] == list(range(10))
    finally:
        node.close()
