"""Worker behaviour a new user trips over, and the edges of the core: signals, cancelling a
thread, wrong passwords, unreachable servers in burst mode, results that cannot be stored,
malformed options, forged entries, tasks known by name, the health file."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import time
from pathlib import Path

import pytest
import redis

from tether import (
    CancelResult,
    EnqueueError,
    ServerError,
    TaskFailed,
    TaskNotFound,
    TaskStatus,
    Tether,
)
from tether.base._embedded import EmbeddedServer, free_port
from tether.protocol._keys import QueueKeys

from ..helpers import FAST, ServerInfo, eventually, running_worker

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py


def dead_reasons(rds: redis.Redis, keys: QueueKeys) -> list[str]:
    return [fields[b"reason"].decode() for _, fields in rds.xrange(keys.dead)]


# -- library code never owns the process -------------------------------------------------


async def test_a_worker_leaves_no_signal_handler_behind(app: Tether) -> None:
    """The README's burst run used to leave SIGINT/SIGTERM handlers on the loop, and a later
    Ctrl-C ended in os._exit(130)."""

    @app.task
    async def job() -> None:
        return None

    loop = asyncio.get_running_loop()
    before = signal.getsignal(signal.SIGINT)
    await job.enqueue()
    await app.worker(burst=True, **FAST).run()
    assert signal.getsignal(signal.SIGINT) is before
    assert not getattr(loop, "_signal_handlers", {})
    # Asked to handle signals, it removes its handlers when it returns.
    await job.enqueue()
    worker = app.worker(burst=True, **FAST)
    worker._handle_signals = True
    await worker.run()
    assert signal.getsignal(signal.SIGINT) is before
    assert not getattr(loop, "_signal_handlers", {})


async def test_with_signal_handling_a_second_signal_stops_at_once_without_exiting(
    app: Tether,
) -> None:
    started = asyncio.Event()

    @app.task
    async def long() -> None:
        started.set()
        await asyncio.sleep(60)

    await long.enqueue()
    worker = app.worker(shutdown_grace=60, **FAST)
    worker._handle_signals = True
    run = asyncio.create_task(worker.run())
    await asyncio.wait_for(started.wait(), 10)
    signal.raise_signal(signal.SIGTERM)
    await asyncio.sleep(0.2)
    assert not run.done()  # waiting out the grace for the running task
    signal.raise_signal(signal.SIGINT)
    await asyncio.wait_for(run, 10)  # returned: the process is still ours
    assert worker.counters.handed_off == 1


# -- cancel ------------------------------------------------------------------------------


async def test_cancelling_a_running_sync_task_says_it_cannot_be_cancelled(
    app: Tether,
) -> None:
    """It used to answer True and do nothing."""
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    @app.task
    def blocking(seconds: float) -> str:
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(timeout=seconds)
        return "done"

    handle = await blocking.enqueue(30)
    async with running_worker(app):
        await eventually(
            lambda: _is_running(handle.status()),
            timeout=5,
        )
        assert await handle.cancel() is CancelResult.NOT_CANCELLABLE
        assert not await handle.cancel()
        release.set()
        assert await handle.result(timeout=10) == "done"
    assert await handle.cancel() is CancelResult.FINISHED


async def _is_running(status: object) -> bool:
    assert asyncio.iscoroutine(status)
    return await status is TaskStatus.RUNNING


# -- servers that refuse -----------------------------------------------------------------


@pytest.fixture
def locked_server(server: ServerInfo) -> object:
    proc = EmbeddedServer(server.process.binary, args=["--requirepass", "s3cret"]).start()
    yield proc
    proc.cleanup()


async def test_a_wrong_password_stops_the_worker_with_a_clear_error(
    locked_server: EmbeddedServer, namespace: str
) -> None:
    """It used to log "unreachable" and retry forever."""
    url = f"redis://:wrong@127.0.0.1:{locked_server.port}/0"
    app = Tether(url, namespace=namespace)
    started = time.monotonic()
    with pytest.raises(ServerError, match="authentication failed"):
        await asyncio.wait_for(app.worker(**FAST).run(), 20)
    assert time.monotonic() - started < 10
    assert "wrong" not in str(app)  # the password is not shown
    good = Tether(f"redis://:s3cret@127.0.0.1:{locked_server.port}/0", namespace=namespace)

    @good.task
    async def job() -> int:
        return 1

    async with good:
        handle = await job.enqueue()
        async with running_worker(good):
            assert await handle.result(timeout=10) == 1


async def test_a_burst_worker_gives_up_on_an_unreachable_server(namespace: str) -> None:
    """It used to retry for as long as it was left running."""
    app = Tether(f"redis://127.0.0.1:{free_port()}/0", namespace=namespace, connect_timeout=0.2)
    started = time.monotonic()
    with pytest.raises(ServerError, match="gave up after 1s"):
        await asyncio.wait_for(app.worker(burst=True, give_up_after=1, **FAST).run(), 20)
    assert time.monotonic() - started < 10


async def test_enqueue_on_a_full_server_raises_a_clear_error(
    server: ServerInfo, namespace: str
) -> None:
    proc = EmbeddedServer(
        server.process.binary, args=["--maxmemory", "2mb", "--maxmemory-policy", "noeviction"]
    ).start()
    try:
        filler = redis.Redis.from_url(proc.url)

        def fill() -> None:
            for i in range(10_000):
                filler.set(f"fill:{i}", b"x" * 10_000)

        with pytest.raises(redis.exceptions.OutOfMemoryError):
            fill()
        app = Tether(proc.url, namespace=namespace)

        @app.task
        async def job(i: int) -> None:
            return None

        async with app:
            with pytest.raises(EnqueueError, match="out of memory") as caught:
                await job.enqueue(1)
            assert "nothing was enqueued" in str(caught.value)
            assert isinstance(caught.value.cause, redis.exceptions.OutOfMemoryError)
        with pytest.raises(EnqueueError, match="out of memory"):
            await asyncio.to_thread(job.enqueue_sync, 2)
        filler.close()
    finally:
        proc.cleanup()


# -- failures that used to hide ----------------------------------------------------------


async def test_a_result_that_cannot_be_stored_is_a_failure(app: Tether, rds: redis.Redis) -> None:
    """It used to be counted as a success, with no warning and no dead letter."""

    @app.task
    async def odd() -> object:
        return object()

    handle = await odd.enqueue()
    async with running_worker(app) as worker:
        with pytest.raises(TaskFailed, match="cannot be serialized") as failed:
            await handle.result(timeout=10)
        assert failed.value.status == "failed"
        assert worker.counters.succeeded == 0
        assert worker.counters.failed == worker.counters.dead_lettered == 1
    keys = QueueKeys.of(app.namespace, "default")
    (reason,) = dead_reasons(rds, keys)
    assert "SerializationError" in reason


def _raw_envelope(task: str, **fields: object) -> bytes:
    return json.dumps({"v": 1, "task": task, "args": [], "enq": 0, **fields}).encode()


@pytest.mark.parametrize(
    ("opts", "reason"),
    [
        ({"retries": "lots"}, "option retries='lots' must be a whole number, 0 or more"),
        ({"timeout": -5}, "option timeout=-5 must be a number of seconds above zero"),
        ({"store_result": "yes"}, "option store_result='yes' must be true or false"),
    ],
    ids=["retries", "timeout", "store_result"],
)
async def test_malformed_options_are_dead_lettered_with_a_reason(
    app: Tether, rds: redis.Redis, opts: dict[str, object], reason: str
) -> None:
    """``retries: "lots"`` used to end in an internal TypeError; ``timeout: -5`` ran."""
    ran: list[str] = []

    @app.task
    async def job() -> None:
        ran.append("job")

    keys = QueueKeys.of(app.namespace, "default")
    rds.xadd(keys.stream("normal"), {"m": _raw_envelope(job.name, opts=opts)})
    await job.enqueue()
    async with running_worker(app):
        await eventually(lambda: rds.xlen(keys.dead) == 1 and ran == ["job"])
    (found,) = dead_reasons(rds, keys)
    assert reason in found


async def test_a_payload_that_is_not_utf8_is_named_as_such(app: Tether, rds: redis.Redis) -> None:
    keys = QueueKeys.of(app.namespace, "default")
    rds.xadd(keys.stream("normal"), {"m": '{"v": 1}'.encode("utf-16")})
    async with running_worker(app):
        await eventually(lambda: rds.xlen(keys.dead) == 1)
    (reason,) = dead_reasons(rds, keys)
    assert "the payload is not UTF-8 text" in reason


async def test_an_entry_cannot_write_another_tasks_records(app: Tether, rds: redis.Redis) -> None:
    """An injected entry naming an existing task's id used to overwrite its stored result."""

    @app.task
    async def value(x: int) -> int:
        return x

    keys = QueueKeys.of(app.namespace, "default")
    original = await value.options(key="k1").enqueue(1)  # an indexed task, with its own id
    async with running_worker(app) as worker:
        assert await original.result(timeout=10) == 1
        rds.xadd(
            keys.stream("normal"),
            {"m": _raw_envelope(value.name, id=original.id, args=[666])},
        )
        await eventually(lambda: rds.xlen(keys.dead) == 1)
        await eventually(lambda: worker.counters.dead_lettered == 1)  # counted, and logged
    assert await original.result(timeout=1) == 1
    assert await original.status() is TaskStatus.SUCCEEDED
    (reason,) = dead_reasons(rds, keys)
    assert f"its task id {original.id} belongs to another entry" in reason


async def test_a_forged_entry_is_told_apart_from_its_twin_id_in_another_stream(
    app: Tether, rds: redis.Redis
) -> None:
    """The same entry id can exist in two streams of a queue. A forged entry in one stream
    once made the worker report (and count) its innocent twin in another as forged too."""
    ran: list[int] = []

    @app.task
    async def value(x: int) -> int:
        ran.append(x)
        return x

    keys = QueueKeys.of(app.namespace, "default")
    original = await value.options(key="k1").enqueue(1)
    twin = "9999999999999-0"  # written before the worker starts: one fetch, one settle
    rds.xadd(keys.stream("high"), {"m": _raw_envelope(value.name, id=original.id, args=[666])},
             id=twin)  # fmt: skip
    rds.xadd(keys.stream("normal"), {"m": _raw_envelope(value.name, args=[7])}, id=twin)
    async with running_worker(app) as worker:
        assert await original.result(timeout=10) == 1
        await eventually(lambda: rds.xlen(keys.dead) == 1 and 7 in ran)
        await eventually(lambda: rds.xlen(keys.stream("normal")) == 0)
        await asyncio.sleep(0.2)
        assert worker.counters.dead_lettered == 1
        assert sorted(ran) == [1, 7, 666]  # a forged entry runs; its records are refused
    assert await app.handle(f"default:2-{twin}").status() is TaskStatus.SUCCEEDED
    (reason,) = dead_reasons(rds, keys)
    assert f"its task id {original.id} belongs to another entry" in reason


async def test_arguments_that_do_not_fit_are_dead_lettered(app: Tether, rds: redis.Redis) -> None:
    @app.task
    async def add(x: int, y: int) -> int:
        return x + y

    keys = QueueKeys.of(app.namespace, "default")
    producer = Tether(app.settings.url, namespace=app.namespace)
    async with producer:
        bad = await producer.enqueue_by_name(add.name, 1)
        good = await producer.by_name(add.name).options(priority="high").enqueue(1, 2)
    async with running_worker(app):
        assert await app.handle(good.id).result(timeout=10) == 3
        with pytest.raises(TaskFailed, match="the arguments do not fit"):
            await app.handle(bad.id).result(timeout=10)
    (reason,) = dead_reasons(rds, keys)
    assert "missing a required argument: 'y'" in reason


async def test_a_task_known_by_name_only_cannot_be_called_here(app: Tether) -> None:
    remote = app.by_name("billing.render_invoice", queue="billing")
    assert remote.plan.queue == "billing"
    with pytest.raises(Exception, match="known here by name only"):
        remote()
    unknown = await remote.enqueue(42)
    with pytest.raises(TaskNotFound):
        await app.handle(unknown.id.replace("billing:", "billing:ff")).status()


# -- wording -----------------------------------------------------------------------------


async def test_log_lines_say_what_will_happen(
    app: Tether, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(retries=3, retry_on=(ValueError,))
    async def picky(kind: str) -> None:
        raise (ValueError if kind == "value" else TypeError)(kind)

    caplog.set_level(logging.DEBUG, "tether")
    not_listed = await picky.enqueue("type")
    async with running_worker(app, burst=True) as worker:
        with pytest.raises(TaskFailed):
            await not_listed.result(timeout=10)
        await eventually(lambda: rds.xlen(QueueKeys.of(app.namespace, "default").dead) == 1)
    assert (
        "failed on attempt 1 of 4 (not retried: TypeError is not in retry_on (ValueError))"
        in caplog.text
    )
    assert worker.counters.failed == worker.counters.dead_lettered == 1
    assert "failed=1" in caplog.text and "dead_lettered=1" in caplog.text
    caplog.clear()
    retried = await picky.options(retries=1).enqueue("value")
    async with running_worker(app):
        with pytest.raises(TaskFailed):
            await retried.result(timeout=20)
    assert "attempt 1 of 2 failed with ValueError; retry due in" in caplog.text
    for record in caplog.records:
        if "dead consumers" in record.getMessage():
            assert record.levelno == logging.DEBUG


# -- health file -------------------------------------------------------------------------


async def test_the_heartbeat_touches_the_health_file(app: Tether, tmp_path: Path) -> None:
    health = tmp_path / "alive"
    async with running_worker(app, health_file=str(health)):
        await eventually(health.exists, timeout=5)
        first = health.stat().st_mtime_ns
        await eventually(lambda: health.stat().st_mtime_ns > first, timeout=5)


# -- the delayed set ---------------------------------------------------------------------


async def test_a_malformed_delayed_member_is_dead_lettered_and_the_queue_goes_on(
    app: Tether, rds: redis.Redis
) -> None:
    """One bad member used to stop every worker of the queue, fresh ones too."""

    @app.task
    async def later(tag: str) -> str:
        return tag

    keys = QueueKeys.of(app.namespace, "default")
    rds.zadd(keys.delayed, {"default:bad1": 0, "default:bad2": 0})
    rds.hset(keys.scheduled_payloads, "default:bad1", b"9garbage")  # no stream 9
    handle = await later.options(delay=0.3).enqueue("fine")
    async with running_worker(app) as worker:
        assert await handle.result(timeout=10) == "fine"
        await eventually(lambda: rds.xlen(keys.dead) == 2)
        assert worker.counters.dead_lettered == 2
    reasons = sorted(dead_reasons(rds, keys))
    assert reasons == [
        "malformed delayed task: its payload does not start with a stream index 1..3",
        "malformed delayed task: no payload",
    ]
    assert rds.zcard(keys.delayed) == 0
