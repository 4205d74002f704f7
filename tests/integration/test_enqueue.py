"""Enqueue: the typed round trip, batches, per-call options, and refusals that write nothing."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from tether import (
    EnqueueError,
    InvalidArguments,
    SerializationError,
    SyncTask,
    TaskStatus,
    Tether,
)
from tether.base._embedded import free_port
from tether.protocol._keys import QueueKeys

from ..chaos._proxy import Proxy
from ..helpers import running_worker

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py


async def test_typed_round_trip(app: Tether) -> None:
    @app.task
    async def add(x: int, y: int) -> int:
        return x + y

    handle = await add.enqueue(1, 2)
    assert handle.id.startswith("default:")
    async with running_worker(app):
        assert await handle.result(timeout=10) == 3
    assert await handle.status() is TaskStatus.SUCCEEDED


async def test_sync_tasks_run_in_threads_not_on_the_loop(app: Tether) -> None:
    seen: list[str] = []

    @app.task
    def where() -> str:
        seen.append(threading.current_thread().name)
        return threading.current_thread().name

    handle = await where.enqueue()
    async with running_worker(app):
        name = await handle.result(timeout=10)
    assert name.startswith("tether-task")
    assert seen == [name]


async def test_enqueue_many_is_one_round_trip(app: Tether, rds: redis.Redis) -> None:
    @app.task
    async def square(x: int) -> int:
        return x * x

    def enqueue_calls() -> int:
        stats = rds.info("commandstats")
        return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))

    await square.enqueue_many([(0,), (1,)])  # the server learns the script (EVAL once)
    before = enqueue_calls()
    handles = await square.enqueue_many([(i,) for i in range(200)] + [square.call(x=7)])
    assert enqueue_calls() - before == 1
    assert len({h.id for h in handles}) == 201
    async with running_worker(app, concurrency=8):
        assert [await h.result(timeout=10) for h in handles[-3:]] == [198 * 198, 199 * 199, 49]


async def test_options_never_collide_with_task_arguments(app: Tether) -> None:
    @app.task
    async def echo(queue: str, priority: str, delay: int) -> list[object]:
        return [queue, priority, delay]

    handle = await echo.options(queue="urgent", priority="high").enqueue("q", "p", 5)
    assert handle.queue == "urgent"
    async with running_worker(app, queues=("urgent",)):
        assert await handle.result(timeout=10) == ["q", "p", 5]


async def test_unserializable_argument_names_task_and_argument_and_writes_nothing(
    app: Tether, rds: redis.Redis
) -> None:
    @app.task(name="store")
    async def store(key: str, payload: object) -> None: ...

    with pytest.raises(SerializationError, match=r"task 'store': argument 'payload' \(set\)"):
        await store.enqueue("k", {1, 2})
    with pytest.raises(SerializationError, match="argument 'payload'"):
        await store.enqueue_many([("a", 1), ("b", object())])
    keys = QueueKeys.of(app.namespace, "default")
    assert rds.exists(*keys.streams, keys.index) == 0


async def test_arguments_that_do_not_fit_the_signature_are_refused(
    app: Tether, rds: redis.Redis
) -> None:
    @app.task(name="pair")
    async def pair(x: int, y: int) -> int:
        return x + y

    # InvalidArguments: a call that cannot succeed as it is, caught apart from a server that
    # failed the call; still an EnqueueError (and a TypeError, as a wrong call is in Python).
    with pytest.raises(InvalidArguments, match="task 'pair': missing a required argument: 'y'"):
        await pair.enqueue(1)  # type: ignore[call-arg]
    with pytest.raises(InvalidArguments, match="unexpected keyword argument 'z'") as caught:
        await asyncio.to_thread(pair.enqueue_sync, 1, 2, z=3)  # type: ignore[call-arg]
    assert isinstance(caught.value, EnqueueError) and isinstance(caught.value, TypeError)
    with pytest.raises(InvalidArguments, match="enqueue_many takes tuples of arguments"):
        await pair.enqueue_many([[1, 2]])  # type: ignore[list-item]
    with pytest.raises(InvalidArguments, match=r"argument 'y' \(set\)"):
        await pair.enqueue(1, {2})  # type: ignore[arg-type]
    assert rds.exists(*QueueKeys.of(app.namespace, "default").streams) == 0


async def test_enqueue_without_open_app_is_a_clear_error(url: str, namespace: str) -> None:
    from tether import NotOpen

    app = Tether(url, namespace=namespace)

    @app.task
    async def nop() -> None: ...

    with pytest.raises(NotOpen, match="async with app"):
        await nop.enqueue()


async def test_enqueue_to_an_unreachable_server_raises_a_clear_error(namespace: str) -> None:
    """Producers used to get raw redis-py errors. A refused connection sent nothing, so the
    error says nothing was enqueued (it said "may or may not have been enqueued")."""
    app = Tether(f"redis://127.0.0.1:{free_port()}/0", namespace=namespace, connect_timeout=0.2)

    @app.task
    async def job(i: int) -> None: ...

    async with app:
        with pytest.raises(EnqueueError, match="cannot reach the server at") as caught:
            await job.enqueue(1)
    assert str(caught.value).endswith("; no connection was made, so nothing was enqueued")
    assert "may or may not" not in str(caught.value)
    assert caught.value.cause is not None
    assert not isinstance(caught.value, InvalidArguments)  # the server failed the call
    # The blocking path, its one-XADD fast path and a batch say the same.
    for enqueue in (
        lambda: job.enqueue_sync(1),
        lambda: job.options(delay=60).enqueue_sync(1),
        lambda: job.enqueue_many_sync([(1,), (2,)]),
    ):
        with pytest.raises(EnqueueError, match="no connection was made, so nothing was enqueued"):
            await asyncio.to_thread(enqueue)
    app.close_sync()


class StopsListeningOnACut(Proxy):
    """A proxy that stops accepting connections when it cuts one (as a server that dies
    does): the client's retries after the cut are refused."""

    def _drop(self, pair: Any) -> None:
        self.stop_listening()
        super()._drop(pair)

    def stop_listening(self) -> None:
        self._stopped = True
        # shutdown() wakes the thread blocked in accept(); close() alone leaves the socket
        # listening until that accept() returns, and it would take the retry's connection.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


async def enqueue(task: SyncTask[[int], None], i: int, blocking: bool) -> None:
    """``task.enqueue_sync(i)`` from a thread (this one runs the test's loop), or the
    asyncio ``task.enqueue(i)``."""
    if blocking:
        await asyncio.to_thread(task.enqueue_sync, i)
    else:
        await task.enqueue(i)


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


@pytest.mark.parametrize("blocking", [False, True], ids=["asyncio", "blocking"])
async def test_a_reply_lost_then_refused_retries_may_have_enqueued(
    url: str, namespace: str, rds: redis.Redis, blocking: bool
) -> None:
    """The command reached the server and its reply was lost; the client's retries were
    refused. The last error is "connection refused" as for a server never reached, but the
    task was written, so the error must not say nothing was enqueued."""
    proxy = StopsListeningOnACut(_port(url))
    app = Tether(proxy.url(), namespace=namespace, connect_timeout=0.5)

    @app.task(name="job")
    def job(i: int) -> None: ...

    try:
        async with app:
            await enqueue(job, 0, blocking)  # the pool holds a connection through the proxy
            proxy.cut_on(b"XADD", lose="reply")
            with pytest.raises(EnqueueError, match=r"Connection refused|Connect call failed") as e:
                await enqueue(job, 1, blocking)
    finally:
        app.close_sync()
        proxy.close()
    assert str(e.value).endswith(
        "; it may or may not have been enqueued (give a dedup key to retry safely)"
    )
    stream = QueueKeys.of(namespace, "default").streams[1]
    assert rds.xlen(stream) == 2  # it was: the hedge is the truth


@pytest.mark.parametrize("blocking", [False, True], ids=["asyncio", "blocking"])
async def test_a_server_gone_after_connecting_refuses_with_nothing_enqueued(
    url: str, namespace: str, rds: redis.Redis, blocking: bool
) -> None:
    """The pooled connection is dead and a new one is refused: the client finds out while
    renewing the connection, before it sends the command."""
    proxy = StopsListeningOnACut(_port(url))
    app = Tether(proxy.url(), namespace=namespace, connect_timeout=0.5)

    @app.task(name="job")
    def job(i: int) -> None: ...

    try:
        async with app:
            await enqueue(job, 0, blocking)
            proxy.stop_listening()
            proxy.cut()
            await asyncio.sleep(0.2)  # the loop learns the pooled connection ended (a while ago)
            with pytest.raises(EnqueueError) as caught:
                await enqueue(job, 1, blocking)
    finally:
        app.close_sync()
        proxy.close()
    assert str(caught.value).endswith("; no connection was made, so nothing was enqueued")
    assert rds.xlen(QueueKeys.of(namespace, "default").streams[1]) == 1


async def test_the_scripts_write_the_value_formats_the_codecs_read(app: Tether) -> None:
    """The index value and the scheduled payload, as the enqueue script writes them on the
    server, read back with ``tether.protocol._codecs``: one format, one reader."""
    from tether.protocol._codecs import parse_index_value, parse_scheduled

    @app.task(name="codec.t")
    async def t(x: int) -> int:
        return x

    keys = app.keys("default")
    queued = await t.options(key="k1", priority="high").enqueue(1)
    delayed = await t.options(delay=3600, priority="low").enqueue(2)
    client: Any = app.client
    sidx, entry = parse_index_value(await client.hget(keys.index, queued.id)) or (0, "")
    assert sidx == 1
    assert [e.decode() for e, _ in await client.xrange(keys.streams[0], entry, entry)] == [entry]
    scheduled = await client.hget(keys.scheduled_payloads, delayed.id)
    sidx, payload = parse_scheduled(scheduled)
    assert sidx == 3 and b'"codec.t"' in payload
