"""Capacity under load: more concurrent calls than a client has connections wait for one,
instead of failing at once with redis-py's "Too many connections" (its default pool holds
100 connections and raises on the 101st: 400 of 500 concurrent enqueues failed, and 201 of
400 concurrent API requests got 503). When the wait runs out, the error says so."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redis

from tether import EnqueueError, TaskStatus, Tether
from tether.web import create_app

from ..web_helpers import serving

TOKEN = "capacity-token-0123456789"


def connections_named(rds: redis.Redis, name: str) -> int:
    return sum(1 for c in rds.client_list() if c.get("name") == name)


async def test_five_hundred_concurrent_enqueues_and_status_calls_all_succeed(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    app = Tether(f"{url}?client_name={namespace}", namespace=namespace)

    @app.task
    async def job(i: int) -> int:
        return i

    async with app:
        handles = await asyncio.gather(*(job.enqueue(i) for i in range(500)))
        assert len({h.id for h in handles}) == 500
        statuses = await asyncio.gather(*(h.status() for h in handles))
        assert set(statuses) == {TaskStatus.QUEUED}
        # The calls shared the pool: never more connections than it holds.
        assert connections_named(rds, namespace) <= app.settings.max_connections


async def test_a_small_pool_makes_callers_wait_not_fail(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    app = Tether(f"{url}?client_name={namespace}", namespace=namespace, max_connections=4)

    @app.task
    async def job(i: int) -> int:
        return i

    async with app:
        handles = await asyncio.gather(*(job.enqueue(i) for i in range(300)))
        assert len(handles) == 300
        assert connections_named(rds, namespace) <= 4


async def test_a_wait_that_runs_out_says_the_pool_is_exhausted(url: str, namespace: str) -> None:
    app = Tether(url, namespace=namespace, max_connections=2, pool_timeout=0.3)

    @app.task
    async def job(i: int) -> int:
        return i

    async with app:
        # Both connections busy for a second (blocking reads on an empty list).
        holders = [asyncio.create_task(app.client.blpop([f"{namespace}:none"], 1)) for _ in "ab"]
        await asyncio.sleep(0.1)
        with pytest.raises(EnqueueError) as refused:
            await job.enqueue(1)
        await asyncio.gather(*holders)
        message = str(refused.value)
        assert "every connection" in message and "in use" in message, message
        assert "max_connections" in message
        assert "cannot reach" not in message  # the server is fine
        assert "nothing was enqueued" in message
        await job.enqueue(2)  # and the pool serves again


def test_blocking_producers_in_many_threads_share_the_pool(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    app = Tether(f"{url}?client_name={namespace}", namespace=namespace, max_connections=5)

    @app.task
    async def job(i: int) -> int:
        return i

    try:
        with ThreadPoolExecutor(40) as pool:
            handles = list(pool.map(job.enqueue_sync, range(400)))
        assert len({h.id for h in handles}) == 400
        assert connections_named(rds, namespace) <= 5
    finally:
        app.close_sync()


async def test_four_hundred_concurrent_api_requests_get_no_503(url: str, namespace: str) -> None:
    app = Tether(url, namespace=namespace)

    @app.task
    async def job(i: int) -> int:
        return i

    async with app:
        handles = await asyncio.gather(*(job.enqueue(i) for i in range(20)))
    web = create_app(app, token=TOKEN)
    with serving(web) as base:
        limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
        async with httpx.AsyncClient(
            base_url=base,
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=60,
            limits=limits,
        ) as http:
            paths = ["/api/queues", "/api/workers"] + [f"/api/tasks/{h.id}" for h in handles]

            async def get(i: int) -> Any:
                return await http.get(paths[i % len(paths)])

            answers = await asyncio.gather(*(get(i) for i in range(400)))
    codes = [a.status_code for a in answers]
    assert codes.count(200) == 400, {c: codes.count(c) for c in set(codes)}
