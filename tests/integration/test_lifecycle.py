"""Task lifecycle: retries, delays, timeouts, results, deduplication, cancellation, hooks."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import sys
import time
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
import redis

from tether import (
    Backoff,
    CancelResult,
    ConfigError,
    Middleware,
    ResultTimeout,
    Retry,
    TaskContext,
    TaskFailed,
    TaskNotFound,
    TaskStatus,
    Tether,
    current_task,
)
from tether.protocol._keys import QueueKeys

from ..helpers import ROOT, eventually, running_worker

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py


def server_time(rds: redis.Redis) -> float:
    seconds, micros = rds.time()
    return seconds + micros / 1e6


async def test_failed_attempts_retry_with_exponential_backoff_then_dead_letter(
    app: Tether, rds: redis.Redis
) -> None:
    attempts: list[tuple[int, float]] = []

    @app.task(retries=3, backoff=Backoff(base=0.2, factor=2.0, cap=10, jitter=0))
    async def flaky() -> None:
        attempts.append((current_task().attempt, server_time(rds)))
        raise ValueError(f"boom {current_task().attempt}")

    handle = await flaky.enqueue()
    keys = QueueKeys.of(app.namespace, "default")
    async with running_worker(app):
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=15)
    assert [a for a, _ in attempts] == [1, 2, 3, 4]
    gaps = [b - a for (_, a), (_, b) in itertools.pairwise(attempts)]
    for gap, delay in zip(gaps, (0.2, 0.4, 0.8), strict=True):
        assert delay - 0.01 <= gap < delay + 0.5, gaps
    error = failed.value
    assert (error.status, error.error_type, error.error_message) == (
        "failed",
        "ValueError",
        "boom 4",
    )
    assert "raise ValueError" in error.traceback
    assert await handle.status() is TaskStatus.FAILED
    ((_, entry),) = rds.xrange(keys.dead)
    assert entry[b"status"] == b"failed"
    assert b"failed on attempt 4 of 4 (no retries left): ValueError: boom 4" in entry[b"reason"]
    assert "raise ValueError" in json.loads(entry[b"error"])["traceback"]
    assert rds.zcard(keys.delayed) == 0


async def test_a_retry_waits_in_the_delayed_set_on_the_server_clock(
    app: Tether, rds: redis.Redis
) -> None:
    @app.task(retries=1, backoff=Backoff(base=30, jitter=0))
    async def later() -> None:
        raise RuntimeError("not yet")

    handle = await later.enqueue()
    keys = QueueKeys.of(app.namespace, "default")
    async with running_worker(app) as worker:
        await eventually(lambda: rds.zcard(keys.delayed) == 1)
        due = rds.zscore(keys.delayed, handle.id)
        assert due is not None
        assert 29 < due / 1000 - server_time(rds) <= 30
        assert await handle.status() is TaskStatus.RETRYING
        assert worker.held == 0  # the retry freed the worker's slot
    assert rds.xlen(keys.stream("normal")) == 0


async def test_retry_requested_by_the_task_and_exceptions_not_retried(app: Tether) -> None:
    seen: list[int] = []

    @app.task(retries=2, retry_on=(ConnectionError,))
    async def picky(kind: str) -> int:
        seen.append(current_task().attempt)
        if kind == "explicit" and current_task().attempt == 1:
            raise Retry(delay=0.05)
        if kind == "value":
            raise ValueError("never retried")
        return current_task().attempt

    explicit = await picky.enqueue("explicit")
    value = await picky.enqueue("value")
    async with running_worker(app):
        assert await explicit.result(timeout=10) == 2
        with pytest.raises(TaskFailed, match="never retried"):
            await value.result(timeout=10)
    assert sorted(seen) == [1, 1, 2]


async def test_delayed_task_starts_on_time_on_an_idle_queue(app: Tether, rds: redis.Redis) -> None:
    started: dict[str, float] = {}

    @app.task
    async def tick(tag: str) -> None:
        started[tag] = server_time(rds)

    async with running_worker(app, reclaim_interval=0.5, heartbeat_ttl=5.0):
        await asyncio.sleep(0.2)
        t0 = server_time(rds)
        # Known to the worker at its next maintenance pass, then waited for exactly.
        first = await tick.options(delay=timedelta(milliseconds=1500)).enqueue("delay")
        assert await first.status() is TaskStatus.SCHEDULED
        when = datetime.now(timezone.utc) + timedelta(seconds=2)
        second = await tick.options(at=when).enqueue("at")
        # Due before the next pass: starts within about one reclaim_interval.
        soon = await tick.options(delay=0.1).enqueue("soon")
        for handle in (first, second, soon):
            await handle.result(timeout=5)
    assert 1.5 <= started["delay"] - t0 < 1.5 + 0.15, started["delay"] - t0
    assert when.timestamp() <= started["at"] + 0.01 < when.timestamp() + 0.15
    assert 0.1 <= started["soon"] - t0 < 0.1 + 0.5 + 0.2


async def test_two_workers_racing_to_promote_due_tasks_run_each_once(
    url: str, namespace: str
) -> None:
    ran: list[int] = []
    app = Tether(url, namespace=namespace)

    @app.task(store_result=False)
    async def once(i: int) -> None:
        ran.append(i)

    async with app:
        await once.options(delay=0.5).enqueue_many([(i,) for i in range(300)])
        async with (
            running_worker(app, name="a", concurrency=32, reclaim_interval=0.05),
            running_worker(app, name="b", concurrency=32, reclaim_interval=0.05),
        ):
            await eventually(lambda: len(ran) >= 300, timeout=10)
            await asyncio.sleep(0.3)
    assert sorted(ran) == list(range(300))


async def test_a_timeout_cancels_an_async_task_and_retries_it(app: Tether) -> None:
    attempts: list[int] = []

    @app.task(timeout=0.2, retries=1, backoff=Backoff(base=0.01))
    async def sometimes_slow() -> int:
        attempts.append(current_task().attempt)
        if current_task().attempt == 1:
            await asyncio.sleep(10)
        return current_task().attempt

    handle = await sometimes_slow.enqueue()
    async with running_worker(app):
        t0 = time.monotonic()
        assert await handle.result(timeout=10) == 2
        assert time.monotonic() - t0 < 3
    assert attempts == [1, 2]


async def test_a_sync_task_past_its_timeout_is_recorded_and_keeps_its_slot(app: Tether) -> None:
    release = asyncio.Event()
    loop = asyncio.get_running_loop()
    import threading

    gate = threading.Event()

    @app.task(timeout=0.1)
    def stuck() -> str:
        gate.wait(10)
        loop.call_soon_threadsafe(release.set)
        return "late"

    handle = await stuck.enqueue()
    async with running_worker(app, concurrency=1) as worker:
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=5)
        assert "ran past its timeout of 0.1s" in failed.value.error_message
        assert worker.running == 1  # the thread still runs: its slot stays taken
        gate.set()
        await asyncio.wait_for(release.wait(), 5)
        await eventually(lambda: worker.running == 0)
    assert await handle.status() is TaskStatus.FAILED


async def test_a_result_crosses_processes(app: Tether, url: str, namespace: str) -> None:
    @app.task(name="tests.mul")
    async def mul(x: int, y: int) -> int:
        return x * y

    handle = await mul.enqueue(6, 7)
    code = (
        "import asyncio\n"
        "from tether import Tether\n"
        "async def main():\n"
        f"    async with Tether({url!r}, namespace={namespace!r}) as app:\n"
        f"        print(await app.handle({handle.id!r}).result(timeout=20))\n"
        "asyncio.run(main())\n"
    )
    waiter = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, cwd=ROOT
    )
    await asyncio.sleep(0.5)  # the other process waits (blocked on Redis) before the run
    async with running_worker(app):
        out, _ = await asyncio.wait_for(waiter.communicate(), 30)
    assert waiter.returncode == 0
    assert out.decode().strip() == "42"


async def test_result_waits_are_bounded_and_unknown_ids_are_refused(app: Tether) -> None:
    @app.task
    async def never() -> None: ...

    handle = await never.enqueue()
    t0 = time.monotonic()
    with pytest.raises(ResultTimeout):
        await handle.result(timeout=0.3)
    assert 0.3 <= time.monotonic() - t0 < 1.5
    assert await handle.status() is TaskStatus.QUEUED
    with pytest.raises(TaskNotFound, match="unknown"):
        await app.handle("default:0123456789abcdef").result(timeout=1)
    with pytest.raises(TaskNotFound):
        await app.handle("default:0123456789abcdef").cancel()
    with pytest.raises(ConfigError, match="not a Tether task id"):
        app.handle("nonsense")


async def test_a_dedup_key_yields_one_run_for_many_concurrent_enqueues(
    app: Tether, rds: redis.Redis
) -> None:
    runs: list[int] = []

    @app.task
    async def charge(order: int) -> int:
        await asyncio.sleep(0.2)
        runs.append(order)
        return order

    keyed = charge.options(key="order:42")
    handles = await asyncio.gather(*(keyed.enqueue(42) for _ in range(25)))
    assert len({h.id for h in handles}) == 1
    assert sum(not h.duplicate for h in handles) == 1
    async with running_worker(app):
        assert await handles[0].result(timeout=10) == 42
        again = await keyed.enqueue(42)  # the key was released at the outcome
        assert not again.duplicate
        assert await again.result(timeout=10) == 42
        held = await charge.options(key="order:7", key_ttl=60).enqueue(7)
        await held.result(timeout=10)
        assert (await charge.options(key="order:7").enqueue(7)).id == held.id
        assert 0 < rds.pttl(QueueKeys.of(app.namespace, "default").dedup("order:7")) <= 60_000
    assert runs == [42, 42, 7]


async def test_cancel_queued_delayed_and_running_tasks(app: Tether, rds: redis.Redis) -> None:
    started = asyncio.Event()

    @app.task
    async def work(tag: str) -> str:
        if tag == "running":
            started.set()
            await asyncio.sleep(30)
        return tag

    keys = QueueKeys.of(app.namespace, "default")
    queued = await work.enqueue("queued")
    delayed = await work.options(delay=60).enqueue("delayed")
    assert await queued.cancel() is CancelResult.CANCELLED
    assert await delayed.cancel() is CancelResult.CANCELLED
    assert rds.xlen(keys.stream("normal")) == 0
    assert rds.zcard(keys.delayed) == 0
    for handle in (queued, delayed):
        assert await handle.status() is TaskStatus.CANCELLED
        with pytest.raises(TaskFailed) as failed:
            await handle.result(timeout=1)
        assert failed.value.status == "cancelled"
    running = await work.enqueue("running")
    async with running_worker(app) as worker:
        await asyncio.wait_for(started.wait(), 5)
        assert await running.status() is TaskStatus.RUNNING
        assert await running.cancel() is CancelResult.REQUESTED
        with pytest.raises(TaskFailed) as failed:
            await running.result(timeout=5)
        assert failed.value.status == "cancelled"
        assert worker.counters.cancelled == 1
        done = await work.enqueue("done")
        assert await done.result(timeout=5) == "done"
        assert await done.cancel() is CancelResult.FINISHED


async def test_dead_letter_retry_runs_the_task_again(app: Tether, rds: redis.Redis) -> None:
    calls: list[int] = []

    @app.task
    async def fragile(x: int) -> int:
        calls.append(x)
        if len(calls) == 1:
            raise RuntimeError("first time fails")
        return x * 10

    handle = await fragile.enqueue(5)
    dead = app.dead_letters("default")
    async with running_worker(app):
        with pytest.raises(TaskFailed):
            await handle.result(timeout=5)
        (letter,) = await dead.list()
        assert (letter.task_id, letter.status) == (handle.id, "failed")
        assert letter.error["type"] == "RuntimeError"
        assert "first time fails" in letter.reason
        again = await dead.retry(letter.entry_id)
        assert again.id == handle.id
        assert await again.result(timeout=5) == 50
    assert await dead.count() == 0
    assert calls == [5, 5]


async def test_dead_letter_cli(app: Tether, url: str, namespace: str) -> None:
    from click.testing import CliRunner

    from tether.cli import main

    keys = QueueKeys.of(namespace, "default")
    client = redis.Redis.from_url(url)
    client.xadd(keys.stream("normal"), {"m": b"garbage"})
    async with running_worker(app):
        await eventually(lambda: client.xlen(keys.dead) == 1)
    client.close()
    base = ["--url", url, "--namespace", namespace]
    runner = CliRunner()
    listed = await asyncio.to_thread(runner.invoke, main, ["dead", "list", *base, "--json"])
    assert listed.exit_code == 0, listed.output
    entry = json.loads(listed.output.splitlines()[0])
    assert "cannot be decoded" in entry["reason"]
    show = ["dead", "show", *base, entry["entry_id"]]
    shown = await asyncio.to_thread(runner.invoke, main, [*show, "--json"])
    assert shown.exit_code == 0 and '"payload": "garbage"' in shown.output
    plain = await asyncio.to_thread(runner.invoke, main, show)
    assert plain.exit_code == 0 and plain.output.endswith("payload:\ngarbage\n")
    retried = await asyncio.to_thread(
        runner.invoke, main, ["dead", "retry", *base, entry["entry_id"]]
    )
    assert "cannot be retried" in retried.output
    table = await asyncio.to_thread(runner.invoke, main, ["dead", "list", *base])
    assert "1 in all" in table.output
    purged = await asyncio.to_thread(runner.invoke, main, ["dead", "purge", *base, "--yes"])
    assert purged.exit_code == 0 and "deleted 1 entry" in purged.output


class Recorder(Middleware):
    def __init__(self) -> None:
        self.events: list[str] = []

    async def on_enqueue(self, task_name: str, task_id: str, queue: str) -> None:
        self.events.append("enqueue")

    async def before_run(self, ctx: TaskContext) -> None:
        self.events.append(f"before:{ctx.attempt}")

    async def after_run(
        self, ctx: TaskContext, status: str, value: Any, error: BaseException | None
    ) -> None:
        self.events.append(f"after:{status}")

    async def on_retry(self, ctx: TaskContext, error: BaseException, delay: float) -> None:
        self.events.append("retry")

    async def on_dead(self, ctx: TaskContext | None, task_id: str, reason: str) -> None:
        self.events.append("dead")


class Broken(Middleware):
    async def before_run(self, ctx: TaskContext) -> None:
        raise RuntimeError("hook bug")

    async def after_run(
        self, ctx: TaskContext, status: str, value: Any, error: BaseException | None
    ) -> None:
        raise RuntimeError("hook bug")


async def test_hooks_run_and_a_failing_hook_does_not_stop_the_worker(
    url: str, namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    app = Tether(url, namespace=namespace, middleware=[Broken(), recorder])

    @app.task(retries=1, backoff=Backoff(base=0.01))
    async def job(fail: bool) -> str:
        if fail:
            raise ValueError("no")
        return "ok"

    caplog.set_level(logging.ERROR, "tether")
    async with app:
        good = await job.enqueue(False)
        bad = await job.enqueue(True)
        async with running_worker(app):
            assert await good.result(timeout=5) == "ok"
            with pytest.raises(TaskFailed):
                await bad.result(timeout=5)
    assert recorder.events.count("enqueue") == 2
    assert "retry" in recorder.events and "dead" in recorder.events
    assert "after:succeeded" in recorder.events
    assert "middleware Broken.before_run failed" in caplog.text


async def test_a_task_that_opts_out_of_results_leaves_nothing_behind(
    app: Tether, rds: redis.Redis
) -> None:
    @app.task(store_result=False)
    async def quiet() -> int:
        return 1

    handle = await quiet.enqueue()
    async with running_worker(app):
        await eventually(
            lambda: rds.xlen(QueueKeys.of(app.namespace, "default").stream("normal")) == 0
        )
        await asyncio.sleep(0.1)
    with pytest.raises(TaskNotFound):
        await handle.status()
    # Only the streams, the statistics (which expire after the stats window) and the known
    # queues (which expire a week after the last heartbeat) remain.
    left = set(rds.scan_iter(f"*{app.namespace}*"))
    known = f"{{{app.namespace}:workers}}:queues".encode()
    assert left == {k for k in left if b":stream:" in k or b":stats:" in k or k == known}
    for key in left:
        if key == known:
            assert rds.pttl(key) > 0
        if b":stats:" in key:
            assert rds.pttl(key) > 0


async def test_task_cli_status_result_and_cancel(app: Tether, url: str, namespace: str) -> None:
    from click.testing import CliRunner

    from tether.cli import main

    @app.task
    async def double(x: int) -> int:
        return 2 * x

    @app.task
    async def broken() -> None:
        raise KeyError("missing")

    ok, bad = await double.enqueue(21), await broken.enqueue()
    later = await double.options(delay=60).enqueue(1)
    async with running_worker(app):
        await ok.result(timeout=5)
        with pytest.raises(TaskFailed):
            await bad.result(timeout=5)
    base = ["--url", url, "--namespace", namespace]
    runner = CliRunner()

    async def run(*args: str) -> Any:
        return await asyncio.to_thread(runner.invoke, main, ["task", *args, *base])

    assert (await run("status", ok.id)).output.strip() == "succeeded"
    assert (await run("result", ok.id)).output.strip() == "42"
    failed = await run("result", bad.id)
    assert failed.exit_code == 1 and "failed: KeyError" in failed.output
    assert (await run("status", later.id)).output.strip() == "scheduled"
    assert (await run("cancel", later.id)).output.strip() == "cancelled"
    assert (await run("status", later.id)).output.strip() == "cancelled"
    unknown = await run("status", "default:0123456789abcdef0123456789abcdef")
    assert unknown.exit_code == 1 and "unknown" in unknown.output
