"""The worker loop: priorities, the prefetch bound, deletes on ack, groups created at 0."""

from __future__ import annotations

import asyncio

import pytest
import redis

from tether import Tether
from tether.protocol._keys import GROUP, QueueKeys

from ..helpers import eventually, running_worker

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py


def pending_total(rds: redis.Redis, keys: QueueKeys) -> int:
    total = 0
    for stream in keys.streams:
        if rds.exists(stream):
            total += int(rds.xpending(stream, GROUP)["pending"])
    return total


async def test_higher_priority_first_with_concurrency_one(app: Tether) -> None:
    order: list[str] = []

    @app.task
    async def note(tag: str) -> None:
        order.append(tag)

    for i in range(3):
        await note.options(priority="low").enqueue(f"low{i}")
    for i in range(3):
        await note.enqueue(f"normal{i}")
    for i in range(3):
        await note.options(priority="high").enqueue(f"high{i}")
    async with running_worker(app, concurrency=1):
        await eventually(lambda: len(order) == 9)
    assert order == [f"{p}{i}" for p in ("high", "normal", "low") for i in range(3)]


async def test_high_priority_task_at_an_idle_worker_starts_at_once(app: Tether) -> None:
    started = asyncio.Event()

    @app.task
    async def ping() -> None:
        started.set()

    # A long maintenance interval proves the worker blocks on a read instead of polling.
    async with running_worker(app, reclaim_interval=5.0, heartbeat_ttl=10.0, stall_timeout=20.0):
        await asyncio.sleep(0.3)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await ping.options(priority="high").enqueue()
        await asyncio.wait_for(started.wait(), 2)
        assert loop.time() - t0 < 0.5


async def test_no_fetch_beyond_max_pending_across_queues_and_priorities(
    app: Tether, rds: redis.Redis
) -> None:
    release = asyncio.Event()
    running = 0

    @app.task
    async def block() -> None:
        nonlocal running
        running += 1
        await release.wait()

    for priority in ("high", "normal", "low"):
        await block.options(priority=priority).enqueue_many([() for _ in range(6)])
        await block.options(priority=priority, queue="second").enqueue_many([() for _ in range(6)])
    keys, second = QueueKeys.of(app.namespace, "default"), QueueKeys.of(app.namespace, "second")
    async with running_worker(app, queues=("default", "second"), concurrency=2, max_pending=5):
        await eventually(lambda: running == 2)
        await asyncio.sleep(0.5)  # several maintenance and fetch cycles
        assert running == 2
        assert pending_total(rds, keys) + pending_total(rds, second) == 5
        release.set()
        await eventually(lambda: running == 36)
    assert pending_total(rds, keys) + pending_total(rds, second) == 0


async def test_a_worker_at_capacity_fetches_nothing(app: Tether, rds: redis.Redis) -> None:
    release = asyncio.Event()
    running = 0

    @app.task
    async def block() -> None:
        nonlocal running
        running += 1
        await release.wait()

    await block.enqueue_many([() for _ in range(10)])
    keys = QueueKeys.of(app.namespace, "default")
    async with running_worker(app, concurrency=3):
        await eventually(lambda: running == 3)
        await asyncio.sleep(0.5)
        assert pending_total(rds, keys) == 3
        assert rds.xlen(keys.stream("normal")) == 10
        release.set()
        await eventually(lambda: running == 10)


async def test_ack_deletes_entries_so_memory_does_not_grow(app: Tether, rds: redis.Redis) -> None:
    @app.task(store_result=False)
    async def nop(i: int) -> None: ...

    keys = QueueKeys.of(app.namespace, "default")
    await nop.enqueue_many([(i,) for i in range(500)])
    assert rds.xlen(keys.stream("normal")) == 500
    async with running_worker(app, concurrency=16):
        await eventually(
            lambda: rds.xlen(keys.stream("normal")) == 0 and pending_total(rds, keys) == 0
        )
    assert rds.hlen(keys.index) == 0
    assert [k for k in rds.scan_iter(f"{keys.tag}:result:*")] == []


async def test_tasks_enqueued_before_any_worker_or_group_run(app: Tether, rds: redis.Redis) -> None:
    done: list[int] = []

    @app.task
    async def early(i: int) -> None:
        done.append(i)

    keys = QueueKeys.of(app.namespace, "default")
    await early.enqueue_many([(i,) for i in range(5)])
    assert rds.xinfo_groups(keys.stream("normal")) == []
    async with running_worker(app):
        await eventually(lambda: len(done) == 5)
    assert sorted(done) == list(range(5))


async def test_burst_worker_exits_when_the_queues_are_empty(app: Tether) -> None:
    done: list[int] = []

    @app.task
    async def job(i: int) -> None:
        done.append(i)

    await job.enqueue_many([(i,) for i in range(20)])
    worker = app.worker(
        burst=True, heartbeat_interval=0.1, heartbeat_ttl=0.5, reclaim_interval=0.2, stall_timeout=5
    )
    await asyncio.wait_for(worker.run(), 20)
    assert sorted(done) == list(range(20))
    assert worker.counters.succeeded == 20
