"""Flow-control limits through the management API: read, change at runtime, reset, and
what they held back, over real HTTP (uvicorn on a free port) against a real server, with a
real worker honouring the change."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest

from tether import RateLimited, Task, Tether, current_task
from tether.web import create_app

from ..helpers import eventually, running_worker
from ..web_helpers import TOKEN, serving, valkey_url  # noqa: F401  (a fixture)

BEARER = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def url(valkey_url: str) -> str:  # noqa: F811  (the fixture of that name)
    return valkey_url


@dataclass
class Limited:
    app: Tether
    narrow: Task[[float], int]
    pushback: Task[[], int]


def declare(app: Tether) -> Limited:
    @app.task(name="lim.narrow", concurrency_limit=1)
    async def narrow(seconds: float) -> int:
        await asyncio.sleep(seconds)
        return 1

    @app.task(name="lim.pushback", key_rate_limit="100/s")
    async def pushback() -> int:
        if current_task().attempt == 1 and not hasattr(pushback, "done"):
            pushback.done = True  # type: ignore[attr-defined]
            raise RateLimited(retry_after=0.05, reason="429")
        return 2

    return Limited(app, narrow, pushback)


@pytest.fixture
async def producer(url: str, namespace: str) -> AsyncIterator[Limited]:
    made = declare(Tether(url, namespace=namespace))
    async with made.app:
        yield made


@pytest.fixture
async def client(url: str, namespace: str) -> AsyncIterator[httpx.AsyncClient]:
    served = declare(Tether(url, namespace=namespace))
    with serving(create_app(served.app, token=TOKEN)) as base:
        async with httpx.AsyncClient(base_url=base, headers=BEARER, timeout=20) as c:
            yield c


async def test_limits_are_read_changed_and_reset_through_the_api(
    producer: Limited, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    # The queue is known once a worker served it.
    async with running_worker(producer.app):
        pass
    listed = (await client.get("/api/queues/default/limits")).json()["items"]
    assert {i["task"] for i in listed} == {"lim.narrow", "lim.pushback"}
    one = (await client.get("/api/queues/default/limits/lim.narrow")).json()
    assert one["declared"]["concurrency_limit"] == 1
    assert one["effective"]["concurrency_limit"] == 1
    assert one["override"] is None

    # A change needs the write permission, is logged, and reaches Python's view at once.
    with caplog.at_level(logging.INFO, logger="tether.web.audit"):
        changed = await client.patch(
            "/api/queues/default/limits/lim.narrow",
            json={"concurrency_limit": 3, "rate_limit": "20/s"},
        )
    assert changed.status_code == 200, changed.text
    body = changed.json()
    assert body["effective"]["concurrency_limit"] == 3
    assert body["effective"]["rate_limit"] == "20/s"
    assert body["declared"]["concurrency_limit"] == 1
    assert any("limits.set" in r.getMessage() and "lim.narrow" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    info = await producer.app.limits.get("lim.narrow")
    assert info.effective.concurrency_limit == 3

    # Three run at once under the new limit, with a real worker.
    handles = await producer.narrow.enqueue_many([(0.4,)] * 3)
    async with running_worker(producer.app, concurrency=8):
        seen = await eventually(
            lambda: _running(client, "lim.narrow", at_least=3), timeout=10, interval=0.02
        )
        assert seen["running"] == 3
        assert [await h.result(timeout=10) for h in handles] == [1, 1, 1]

    # null removes one limit and keeps the others; an empty change is refused.
    removed = (
        await client.patch("/api/queues/default/limits/lim.narrow", json={"rate_limit": None})
    ).json()
    assert removed["effective"]["rate_limit"] is None
    assert removed["effective"]["concurrency_limit"] == 3
    empty = await client.patch("/api/queues/default/limits/lim.narrow", json={})
    assert empty.status_code == 422 and "no limit to change" in empty.text

    # Reset: the declared limits apply again.
    reset = await client.delete("/api/queues/default/limits/lim.narrow")
    assert reset.status_code == 200
    assert reset.json()["override"] is None
    assert reset.json()["effective"]["concurrency_limit"] == 1


async def _running(client: httpx.AsyncClient, task: str, *, at_least: int) -> dict[str, object]:
    info = (await client.get(f"/api/queues/default/limits/{task}")).json()
    return info if info["running"] >= at_least else {}


async def test_bad_limits_answer_422_naming_the_value_and_unknown_queues_404(
    producer: Limited, client: httpx.AsyncClient
) -> None:
    async with running_worker(producer.app):
        pass
    for body, named in (
        ({"rate_limit": "lots"}, "lots"),
        ({"concurrency_limit": 0}, "concurrency_limit"),
        ({"key_rate_burst": -1}, "key_rate_burst"),
        ({"rate_limit": "5/fortnight"}, "5/fortnight"),
    ):
        answer = await client.patch("/api/queues/default/limits/lim.narrow", json=body)
        assert answer.status_code == 422, (body, answer.text)
        assert named in answer.text, answer.text
    extra = await client.patch("/api/queues/default/limits/lim.narrow", json={"limit": 3})
    assert extra.status_code == 422
    assert (await client.get("/api/queues/nowhere/limits")).status_code == 404
    assert (await client.get("/api/queues/default/held?window=5")).status_code == 422
    # Nothing was changed by the refused calls.
    assert (await producer.app.limits.get("lim.narrow")).override is None


async def test_held_back_counts_and_key_usage(producer: Limited, client: httpx.AsyncClient) -> None:
    handle = await producer.pushback.options(limit_key="tenant:42").enqueue()
    async with running_worker(producer.app):
        assert await handle.result(timeout=10) == 2
    held = (await client.get("/api/queues/default/held?window=3600")).json()
    (row,) = [i for i in held["items"] if i["task"] == "lim.pushback"]
    assert row["backpressure"] == 1
    usage = (await client.get("/api/queues/default/limits/lim.pushback/keys/tenant:42")).json()
    assert usage == {
        "queue": "default",
        "task": "lim.pushback",
        "key": "tenant:42",
        "running": 0,
        "waiting_for_slot": 0,
    }
