"""The server is unreachable at start or lost mid-run: the worker waits and resumes."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest

from tether import ServerError, Tether
from tether.base._embedded import EmbeddedServer, free_port
from tether.worker._server import _per_node, check_version

from ..conftest import start_server
from ..helpers import eventually, running_worker

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py


async def test_worker_waits_for_an_unreachable_server_and_then_runs(
    server: object, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    from ..helpers import ServerInfo

    assert isinstance(server, ServerInfo)
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    app = Tether(url, namespace=namespace, connect_timeout=0.5)
    done: list[int] = []

    @app.task
    async def job(i: int) -> None:
        done.append(i)

    caplog.set_level(logging.WARNING, "tether")
    worker = app.worker(
        heartbeat_interval=0.1, heartbeat_ttl=0.5, reclaim_interval=0.2, stall_timeout=5
    )
    run = asyncio.create_task(worker.run())
    await eventually(lambda: "cannot reach the server at" in caplog.text, timeout=10)
    proc = EmbeddedServer(server.process.binary, port=port).start()
    try:
        async with app:
            await job.enqueue(1)
            await eventually(lambda: done == [1], timeout=20)
        worker.stop()
        await asyncio.wait_for(run, 20)
    finally:
        proc.cleanup()


async def test_worker_survives_a_restart_of_its_server(
    server: object, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    from ..helpers import ServerInfo

    assert isinstance(server, ServerInfo)
    proc = start_server(server.kind)
    app = Tether(proc.url, namespace=namespace, connect_timeout=0.5)
    done: list[int] = []

    @app.task
    async def job(i: int) -> None:
        done.append(i)

    caplog.set_level(logging.INFO, "tether")
    try:
        async with app, running_worker(app):
            await job.enqueue(1)
            await eventually(lambda: done == [1])
            proc.stop(kill=True)
            await eventually(lambda: "cannot reach the server" in caplog.text, timeout=10)
            await asyncio.sleep(0.5)  # a few failed attempts, without a busy loop
            proc.start()
            await eventually(lambda: "reachable again" in caplog.text, timeout=20)
            # The restarted server is empty: groups are recreated and new work runs.
            await job.enqueue(2)
            await eventually(lambda: done == [1, 2], timeout=20)
    finally:
        proc.cleanup()
    attempts = caplog.text.count("Redis still unreachable") + 1
    assert attempts < 30, "the worker retried in a busy loop"


def test_servers_older_than_6_2_are_refused() -> None:
    async def fake_info(section: str) -> dict[str, str]:
        return {"redis_version": "6.0.16"}

    class Old:
        info = staticmethod(fake_info)

    with pytest.raises(ServerError, match=r"Redis 6\.0\.16 is too old: Tether needs Redis 6\.2"):
        asyncio.run(check_version(Old()))  # type: ignore[arg-type]
    assert _per_node({"n1": {"redis_version": "7"}, "n2": {"redis_version": "7"}}) == [
        {"redis_version": "7"},
        {"redis_version": "7"},
    ]


async def test_eviction_policy_warning(
    server: object, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    from ..helpers import ServerInfo

    assert isinstance(server, ServerInfo)
    proc = start_server(server.kind, ["--maxmemory-policy", "allkeys-lru"])
    try:
        app = Tether(proc.url, namespace=namespace)
        caplog.set_level(logging.WARNING, "tether")
        async with app, running_worker(app):
            pass
        assert "maxmemory-policy is 'allkeys-lru', not 'noeviction'" in caplog.text
    finally:
        proc.cleanup()


async def test_evicted_streams_are_named_as_eviction_in_the_log_and_by_tether_check(
    server: object, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Under an evicting policy a full server drops Tether's streams, and the tasks in them,
    silently: the worker blamed "server restarted empty?". It names the eviction (with the
    server's count of evicted keys), and ``tether check`` warns about the policy."""
    import redis.asyncio
    from click.testing import CliRunner

    from tether.cli import main

    from ..helpers import ServerInfo

    assert isinstance(server, ServerInfo)
    proc = start_server(server.kind, ["--maxmemory-policy", "allkeys-lru"])
    done: list[int] = []
    try:
        app = Tether(proc.url, namespace=namespace)

        @app.task
        async def job(i: int) -> None:
            done.append(i)

        caplog.set_level(logging.INFO, "tether")
        admin = redis.asyncio.Redis.from_url(proc.url)
        async with app, running_worker(app, name="evicted") as worker:
            await job.enqueue(1)
            await eventually(lambda: done == [1])
            await admin.config_set("maxmemory", 1)  # the next write evicts every key
            with contextlib.suppress(redis.exceptions.ResponseError):
                await admin.set(f"{namespace}:filler", "x" * 1000)
            await eventually(lambda: "EVICTED keys" in caplog.text, timeout=10)
            await admin.config_set("maxmemory", 0)
            await job.enqueue(2)  # the groups come back and work resumes
            await eventually(lambda: done == [1, 2], timeout=20)
            checked = await asyncio.to_thread(
                CliRunner().invoke,
                main,
                ["check", "--name", worker.name, "--url", proc.url, "--namespace", namespace],
            )
        await admin.aclose()
        line = next(r.getMessage() for r in caplog.records if "EVICTED keys" in r.getMessage())
        assert "maxmemory-policy 'allkeys-lru'" in line and "restarted" not in line, line
        assert checked.exit_code == 0, checked.output
        assert "maxmemory-policy is 'allkeys-lru', not 'noeviction'" in checked.output
    finally:
        proc.cleanup()


async def test_a_worker_whose_streams_vanish_mid_task_carries_on(
    app: Tether, caplog: pytest.LogCaptureFixture
) -> None:
    """A server restarted without its data (or a deleted stream) while a task runs: its ack
    has nothing left to acknowledge, and the worker goes on serving."""
    import redis.asyncio

    from tether.protocol._keys import QueueKeys

    release = asyncio.Event()
    done: list[str] = []

    @app.task
    async def job(tag: str) -> None:
        if tag == "first":
            await release.wait()
        done.append(tag)

    caplog.set_level(logging.WARNING, "tether")
    await job.enqueue("first")
    async with running_worker(app) as worker:
        await eventually(lambda: worker.held == 1)
        raw = redis.asyncio.Redis.from_url(app.settings.url)
        await raw.delete(*QueueKeys.of(app.namespace, "default").streams)
        await raw.aclose()
        release.set()
        # its ack finds no group (dropped) or, once the groups are back, no entry (lost lease)
        await eventually(lambda: worker.held == 0)
        assert "crashed" not in caplog.text
        await job.enqueue("second")
        await eventually(lambda: done == ["first", "second"], timeout=10)


@pytest.mark.parametrize("loss", ["streams deleted", "flushall"])
async def test_tasks_the_server_lost_are_counted_as_lost_by_it_not_as_lost_leases(
    server: object, namespace: str, caplog: pytest.LogCaptureFixture, loss: str
) -> None:
    """Running tasks whose entries vanish with the server's data: their outcomes are
    discarded as lost by the server. No other worker took them, so no lease was lost and no
    task ran twice: the worker must not say so (it used to count each as a lost lease)."""
    import redis.asyncio

    from tether.protocol._keys import QueueKeys

    from ..helpers import ServerInfo

    assert isinstance(server, ServerInfo)
    own = start_server(server.kind)  # a FLUSHALL must not reach the other tests' data
    try:
        app = Tether(own.url, namespace=namespace)
        release = asyncio.Event()
        done: list[str] = []

        @app.task
        async def job(tag: str) -> None:
            if tag.startswith("held"):
                await release.wait()
            done.append(tag)

        caplog.set_level(logging.WARNING, "tether")
        async with app:
            await job.enqueue_many([(f"held{i}",) for i in range(3)])
            async with running_worker(app) as worker:
                await eventually(lambda: worker.running == 3)
                raw = redis.asyncio.Redis.from_url(own.url)
                if loss == "flushall":
                    await raw.flushall()
                else:
                    await raw.delete(*QueueKeys.of(namespace, "default").streams)
                await raw.aclose()
                # The fetcher finds the groups gone and creates them again before the acks.
                await eventually(lambda: worker.counters.groups_recreated >= 1, timeout=10)
                release.set()
                await eventually(lambda: worker.held == 0)
                counters = worker.counters
                assert (counters.lost_by_server, counters.lost_leases) == (3, 0), counters
                assert "lost lease" not in caplog.text and "crashed" not in caplog.text
                await job.enqueue("after")
                await eventually(lambda: "after" in done, timeout=10)
    finally:
        own.cleanup()
