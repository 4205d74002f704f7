"""The readers (``app.stats``, ``app.workers()``) and queue pause, against a real server and
real worker processes: figures that match what was enqueued, run, failed and killed; a
registry that forgets a killed worker within its lease; statistics that add up across
processes; pages that cover every entry once."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from tether import Backoff, ConfigError, QueueNotFound, TaskFailed, TaskNotFound, Tether
from tether.admin import Page
from tether.protocol._keys import QueueKeys, known_queues_key

from ..apps import ops
from ..helpers import FAST, ROOT, WorkerProcess, eventually, running_worker

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py

APP = "tests.apps.ops:app"


@pytest.fixture
async def tasks(url: str, namespace: str) -> AsyncIterator[ops.Ops]:
    made = ops.fresh(url, namespace)
    async with made.app:
        yield made


def start(url: str, namespace: str, name: str, log_dir: Path, **settings: object) -> WorkerProcess:
    return WorkerProcess(
        url, namespace, name, app=APP, log_dir=log_dir, extra=["--no-scheduler"], **settings
    )


async def test_queue_figures_count_what_was_enqueued_run_failed_and_delayed(
    tasks: ops.Ops,
) -> None:
    app = tasks.app
    await tasks.ok.options(priority="high").enqueue_many([(i,) for i in range(3)])
    await tasks.ok.enqueue_many([(i,) for i in range(4)])
    await tasks.ok.options(priority="low").enqueue_many([(i,) for i in range(2)])
    await tasks.ok.options(delay=600).enqueue_many([(i,) for i in range(2)])
    before = await app.stats.queue("default")
    assert before.waiting == {"high": 3, "normal": 4, "low": 2}
    assert (before.depth, before.running, before.delayed, before.dead) == (9, 0, 2, 0)
    assert before.oldest_waiting_s is not None and before.oldest_waiting_s >= 0
    assert before.next_due_s is not None and 590 < before.next_due_s <= 600
    assert before.recent.attempts == 0

    await tasks.fail.enqueue_many([(i,) for i in range(3)])
    await tasks.flaky.enqueue_many([(i,) for i in range(2)])
    async with running_worker(app, concurrency=4):

        async def settled() -> bool:
            q = await app.stats.queue("default")
            return q.dead == 5 and q.depth == 0 and q.running == 0 and q.delayed == 2

        await eventually(settled)
    after = await app.stats.queue("default")
    assert after.oldest_waiting_s is None
    assert after.recent.attempts == 9 + 3 + 2 * 2
    assert after.recent.succeeded == 9 and after.recent.errors == 3 + 2 * 2
    by_task = {s.task: s for s in await app.stats.tasks("default", window=600)}
    assert by_task["ops.ok"].counts.succeeded == 9
    assert by_task["ops.fail"].counts.failed == 3
    assert (by_task["ops.flaky"].counts.retried, by_task["ops.flaky"].counts.failed) == (2, 2)
    assert by_task["ops.flaky"].error_rate == 1.0
    for stats in by_task.values():
        assert stats.run.count == stats.attempts == stats.wait.count
        assert stats.run.p50 is not None and stats.run.p99 is not None
        assert stats.run.p50 <= stats.run.p99
    series = await app.stats.throughput("default", minutes=3)
    assert sum(m.counts.attempts for m in series) == 9 + 3 + 4
    assert [m.minute for m in series] == sorted(m.minute for m in series)


async def test_stats_off_writes_none_and_the_window_sets_how_long_they_stay(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    """``stats=False``: the worker writes no statistics, and the queue figures (read from the
    streams) still work; ``stats_window``: every statistics hash expires one hour after it."""
    off = ops.fresh(url, f"{namespace}off", stats=False)
    windowed = ops.fresh(url, f"{namespace}on", stats_window=2 * 3600)
    for made in (off, windowed):
        async with made.app:
            await made.ok.enqueue_many([(i,) for i in range(5)])
            await made.fail.enqueue(0)
            async with running_worker(made.app):

                async def settled(made: ops.Ops = made) -> bool:
                    q = await made.app.stats.queue("default")
                    return q.depth == 0 and q.running == 0 and q.dead == 1

                await eventually(settled)
            by_task = {s.task: s for s in await made.app.stats.tasks("default", window=600)}
            if made is off:
                assert by_task == {}
                assert (await made.app.stats.queue("default")).recent.attempts == 0
            else:
                assert by_task["ops.ok"].counts.succeeded == 5
                assert by_task["ops.fail"].counts.failed == 1
    assert not [k for k in rds.scan_iter(f"*{namespace}off*") if b":stats:" in k]
    kept = [k for k in rds.scan_iter(f"*{namespace}on*") if b":stats:" in k]
    assert kept
    window_ms = (2 + 1) * 3_600_000  # the window, and the hour the last bucket can still fill
    for key in kept:
        assert window_ms - 60_000 < rds.pttl(key) <= window_ms, key


async def test_a_killed_worker_leaves_the_registry_within_its_lease_and_its_task_shows_orphaned(
    tasks: ops.Ops, url: str, namespace: str, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    app = tasks.app
    ttl = 1.0
    settings = {**FAST, "heartbeat_interval": 0.1, "heartbeat_ttl": ttl}
    a = start(url, namespace, "reg-a", tmp_path, **settings)
    b = start(url, namespace, "reg-b", tmp_path, **settings)
    workers += [a, b]

    async def names() -> set[str]:
        return {w.name for w in await app.workers()}

    await eventually(lambda: _is(names(), {"reg-a", "reg-b"}), timeout=20)
    record = await app.stats.worker("reg-a")
    assert record is not None and record.pid == a.pid and record.queues == ["default"]
    assert record.concurrency == 16 and record.max_pending == 16
    assert record.version and record.host and record.started_at and record.heartbeat_at
    assert {"claimed", "handed_off", "lost_leases", "quarantined", "succeeded"} <= set(
        record.counters
    )
    held = await tasks.hold.enqueue(30)
    page = await eventually(lambda: _nonempty(app.stats.running("default")))
    (entry,) = page.items
    assert entry.task == "ops.hold" and entry.task_id == held.id and entry.worker_alive
    holder = a if entry.worker == "reg-a" else b
    other = b if holder is a else a
    holder.signal(9)
    killed_at = time.monotonic()
    await eventually(lambda: _is(names(), {other.name}), timeout=ttl + 5, interval=0.02)
    gone_after = time.monotonic() - killed_at
    assert gone_after < ttl + 1.0, f"the record outlived the lease by {gone_after - ttl:.2f}s"
    # The entry is still the dead worker's until a live one reclaims it (then it runs there).
    await eventually(lambda: _owner_is(app, other.name), timeout=20)
    assert (await app.stats.queue("default")).running == 1


async def test_statistics_add_up_across_two_worker_processes(
    tasks: ops.Ops, url: str, namespace: str, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    app = tasks.app
    for name in ("sum-a", "sum-b"):
        workers.append(start(url, namespace, name, tmp_path, concurrency=4))
    await eventually(lambda: _count(app.workers(), 2), timeout=20)
    await tasks.ok.enqueue_many([(i,) for i in range(60)])
    await tasks.fail.enqueue_many([(i,) for i in range(10)])
    await tasks.flaky.enqueue_many([(i,) for i in range(6)])

    async def done() -> bool:
        q = await app.stats.queue("default")
        return q.dead == 16 and q.depth == 0 and q.running == 0 and q.delayed == 0

    await eventually(done, timeout=30)
    by_task = {s.task: s for s in await app.stats.tasks(window=600)}
    assert by_task["ops.ok"].counts.succeeded == 60
    assert by_task["ops.fail"].counts.failed == 10
    assert by_task["ops.flaky"].counts.retried == 6 and by_task["ops.flaky"].counts.failed == 6

    async def counters_add_up() -> bool:
        fleet = await app.workers()
        total = {k: sum(w.counters[k] for w in fleet) for k in ("succeeded", "failed", "retried")}
        return total == {"succeeded": 60, "failed": 16, "retried": 6} and all(
            w.counters["succeeded"] > 0 for w in fleet
        )

    await eventually(counters_add_up)


async def test_pause_stops_fetching_and_resume_restarts_it(
    tasks: ops.Ops, url: str, namespace: str, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    app = tasks.app
    worker = start(url, namespace, "pauser", tmp_path)
    workers.append(worker)
    await eventually(lambda: _count(app.workers(), 1), timeout=20)
    assert await app.pause("default") is True
    assert await app.pause("default") is False
    queue = await app.stats.queue("default")
    assert queue.paused and queue.paused_at is not None
    await eventually(lambda: "queue default is paused" in worker.log())
    handles = await tasks.ok.enqueue_many([(i,) for i in range(5)])  # still accepted
    await asyncio.sleep(5 * FAST["reclaim_interval"])
    queue = await app.stats.queue("default")
    assert (queue.depth, queue.running) == (5, 0)
    assert await app.resume("default") is True
    assert [await h.result(timeout=10) for h in handles] == list(range(5))
    assert not (await app.stats.queue("default")).paused
    assert await app.resume("default") is False


async def test_running_delayed_and_dead_pages_cover_every_entry_once(
    tasks: ops.Ops, url: str, namespace: str, workers: list[WorkerProcess], tmp_path: Path
) -> None:
    app = tasks.app
    # Delayed: several due at the same time, so the cursor must break ties.
    same = await tasks.ok.options(delay=300).enqueue_many([(i,) for i in range(4)])
    later = await tasks.ok.options(delay=400).enqueue_many([(i,) for i in range(3)])
    seen = await _walk(lambda c: app.stats.delayed("default", cursor=c, limit=3))
    assert len(seen) == 7
    assert {d.task_id for d in seen[:4]} == {h.id for h in same}
    assert {d.task_id for d in seen[4:]} == {h.id for h in later}
    assert all(d.state == "scheduled" and d.task == "ops.ok" for d in seen)
    assert [d.due_at for d in seen] == sorted(d.due_at for d in seen)

    # Running: highest priority first, each entry once.
    workers.append(start(url, namespace, "runner", tmp_path, concurrency=10))
    high = await tasks.hold.options(priority="high").enqueue_many([(5.0,)] * 2)
    normal = await tasks.hold.enqueue_many([(5.0,)] * 3)
    await eventually(lambda: _running(app, 5), timeout=20)
    pages = []
    cursor = None
    while True:
        page = await app.stats.running("default", cursor=cursor, limit=2)
        pages.append(page.items)
        cursor = page.cursor
        if cursor is None:
            break
    running = [r for p in pages for r in p]
    assert [r.task_id for r in running] == [h.id for h in [*high, *normal]]
    assert [r.priority for r in running] == ["high"] * 2 + ["normal"] * 3
    assert all(r.worker == "runner" and r.worker_alive and r.elapsed_s >= 0 for r in running)

    # Dead letters: a page filtered by task, then bulk calls by task.
    await tasks.fail.enqueue_many([(i,) for i in range(5)])
    await tasks.flaky.options(retries=0).enqueue_many([(i,) for i in range(3)])
    await eventually(lambda: _dead(app, 8), timeout=20)
    letters = app.dead_letters("default")
    everything = await _walk(lambda c: letters.page(cursor=c, limit=3))
    assert len(everything) == 8 and len({d.entry_id for d in everything}) == 8
    newest_first = sorted((d.entry_id for d in everything), key=_id_key, reverse=True)
    assert [d.entry_id for d in everything] == newest_first
    flaky = await _walk(lambda c: letters.page(cursor=c, limit=2, task="ops.flaky"))
    assert len(flaky) == 3 and {d.task for d in flaky} == {"ops.flaky"}
    purged = await letters.purge_matching("ops.flaky")
    assert len(purged.done) == 3 and purged.cursor is None
    retried = await letters.retry_matching("ops.fail", limit=2)
    assert len(retried.done) == 2 and retried.cursor is not None
    rest = await letters.retry_matching("ops.fail", cursor=retried.cursor, limit=10)
    assert len(rest.done) == 3 and rest.cursor is None
    assert set(retried.handles.values()) | set(rest.handles.values()) == {
        d.task_id for d in everything if d.task == "ops.fail"
    }
    await eventually(lambda: _dead(app, 5), timeout=20)  # they failed again


async def test_a_task_by_id_shows_its_state_arguments_and_outcome(tasks: ops.Ops) -> None:
    app = tasks.app
    queued = await tasks.ok.enqueue(7)
    info_queued = info = await app.stats.task(queued.id)
    assert (info.status, info.task, info.args, info.attempt) == ("queued", "ops.ok", [7], 1)
    assert info.enqueued_at is not None and info.priority == "normal"
    later = await tasks.ok.options(delay=60).enqueue(8)
    info = await app.stats.task(later.id)
    assert info.status == "scheduled" and info.due_at is not None and info.args == [8]
    failing = await tasks.fail.enqueue(1)
    async with running_worker(app):
        assert await queued.result(timeout=10) == 7
        await eventually(lambda: _status(app, failing.id, "failed"))
    done = await app.stats.task(queued.id)
    assert (done.status, done.result, done.finished_at is not None) == ("succeeded", 7, True)
    # The whole timeline outlives the payload: enqueued <= started <= finished.
    assert done.enqueued_at == info_queued.enqueued_at
    assert done.started_at is not None and done.finished_at is not None
    assert done.enqueued_at is not None
    assert done.enqueued_at <= done.started_at <= done.finished_at
    failed = await app.stats.task(failing.id)
    assert failed.error is not None and failed.error.type == "ValueError"
    assert "fail 1" in failed.error.message and "Traceback" in failed.error.traceback
    with pytest.raises(TaskNotFound):
        await app.stats.task("default:" + "0" * 32)


async def test_a_running_task_cancelled_on_request_counts_as_cancelled(tasks: ops.Ops) -> None:
    app = tasks.app
    handle = await tasks.hold.enqueue(30)
    async with running_worker(app):
        await eventually(lambda: _running(app, 1))
        assert (await handle.cancel()).value == "requested"
        await eventually(lambda: _status(app, handle.id, "cancelled"))

        async def counted() -> bool:
            rows = await app.stats.tasks("default", window=600)
            return [(r.task, r.counts.cancelled, r.run.count) for r in rows] == [("ops.hold", 1, 1)]

        await eventually(counted)


async def test_a_task_that_times_out_counts_as_timed_out_and_as_retried_or_failed(
    tasks: ops.Ops,
) -> None:
    """Each attempt past its timeout counts in ``timed_out`` and also as what became of it:
    retried (a retry is left) or failed; ``attempts`` counts it once."""
    app = tasks.app

    @app.task(name="ops.slow", timeout=0.1, retries=1, backoff=Backoff(base=0.05, jitter=0))
    async def slow() -> None:
        await asyncio.sleep(5)

    @app.task(name="ops.slow_once", timeout=0.1)
    async def slow_once() -> None:
        await asyncio.sleep(5)

    retried, once = await slow.enqueue(), await slow_once.enqueue()
    async with running_worker(app):
        for handle in (retried, once):
            with pytest.raises(TaskFailed, match="past its timeout"):
                await handle.result(timeout=10)

        async def counted() -> bool:
            rows = await app.stats.tasks("default", window=600)
            return {r.task for r in rows} == {"ops.slow", "ops.slow_once"}

        await eventually(counted)
    by_task = {s.task: s for s in await app.stats.tasks("default", window=600)}
    two, one = by_task["ops.slow"].counts, by_task["ops.slow_once"].counts
    assert (two.timed_out, two.retried, two.failed, two.succeeded) == (2, 1, 1, 0), two
    assert (one.timed_out, one.retried, one.failed) == (1, 0, 1), one
    assert (by_task["ops.slow"].attempts, by_task["ops.slow_once"].attempts) == (2, 1)
    assert by_task["ops.slow"].run.count == 2  # each attempt's run time, cut at the timeout
    assert by_task["ops.slow"].run.p99 is not None and by_task["ops.slow"].run.p99 < 1.0


async def test_task_statistics_page_by_queue_and_read_only_their_own_queues(
    app: Tether, rds: redis.Redis, namespace: str
) -> None:
    """Every (queue, task) once, in that order (queue "a" before "ab", though "a|..." sorts
    after "ab|..." as text), and a page reads the buckets of its own queues only."""
    names = ["a", "ab", "b", "c", "d"]
    minute = int(time.time() // 60)
    for queue in names:
        rds.zadd(known_queues_key(namespace), {queue: 0})
        for task in ("x", "y"):
            rds.hincrby(QueueKeys.of(namespace, queue).stats_minute(minute), f"{task}|ok", 1)

    def hgetalls() -> int:
        return int(rds.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0))

    seen: list[tuple[str, str]] = []
    cursor = None
    while True:
        page = await app.stats.tasks_page(window=600, cursor=cursor, limit=3)
        seen += [(r.queue, r.task) for r in page]
        if page.cursor is None:
            break
        cursor = page.cursor
    assert seen == [(q, t) for q in names for t in ("x", "y")]

    before = hgetalls()
    await app.stats.tasks_page("c", window=600)
    one_queue = hgetalls() - before
    assert one_queue > 0
    for cursor, limit, queues in ((None, 2, 1), ("ab|y", 2, 2), ("b|x", 1, 1), ("c|x", 3, 2)):
        before = hgetalls()
        page = await app.stats.tasks_page(window=600, cursor=cursor, limit=limit)
        assert len(page) == limit
        assert hgetalls() - before <= queues * one_queue, (cursor, limit)
    with pytest.raises(ConfigError, match=r"is not <queue>\|<task>"):
        await app.stats.tasks_page(cursor="nobar")


async def test_known_queues_come_from_workers_pauses_and_the_apps_tasks(
    tasks: ops.Ops, url: str, namespace: str
) -> None:
    app = tasks.app
    assert (await app.stats.queue_names()).items == ["default", "ops-b"]  # the app's tasks
    await app.pause("maintenance")
    async with running_worker(app, queues=("default", "served-only")):
        await eventually(lambda: _has_queue(app, "served-only"))
    names = await app.stats.queue_names(limit=2)
    assert names.items == ["default", "maintenance"] and names.cursor == "maintenance"
    rest = await app.stats.queue_names(cursor=names.cursor, limit=2)
    assert rest.items == ["ops-b", "served-only"]
    bare = Tether(url, namespace=namespace)  # knows no task: reads what Redis holds
    async with bare:
        assert set((await bare.stats.queue_names()).items) == {
            "default", "maintenance", "served-only"
        }  # fmt: skip
        with pytest.raises(QueueNotFound):
            await bare.stats.queue("never-used")
        health = await bare.stats.health()
        assert health.reachable and health.server in ("redis", "valkey") and health.version
        assert health.time is not None and health.mode == "standalone"
        assert await bare.stats.forget_queue("maintenance")


def test_the_core_imports_without_the_web_extra() -> None:
    blocked = ("fastapi", "starlette", "uvicorn", "jinja2", "pydantic")
    code = (
        f"import sys\nfor m in {blocked!r}: sys.modules[m] = None\n"
        "import tether, tether.admin, tether.dead, tether.scheduler\n"
        "from tether.cli import main\n"
        "try:\n    import tether.web\nexcept ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'tether-queue[web]'" in done.stdout


# -- helpers ------------------------------------------------------------------------------


async def _is(names: Awaitable[set[str]], expected: set[str]) -> bool:
    return await names == expected


async def _count(listing: Awaitable[list[Any]], n: int) -> bool:
    return len(await listing) == n


async def _nonempty(page: Awaitable[Page[Any]]) -> Page[Any] | None:
    got = await page
    return got if got.items else None


async def _owner_is(app: Tether, name: str) -> bool:
    page = await app.stats.running("default")
    return len(page.items) == 1 and page.items[0].worker == name


async def _running(app: Tether, n: int) -> bool:
    return (await app.stats.queue("default")).running == n


async def _dead(app: Tether, n: int) -> bool:
    q = await app.stats.queue("default")
    return q.dead == n and q.depth == 0


async def _status(app: Tether, task_id: str, status: str) -> bool:
    return (await app.stats.task(task_id)).status == status


async def _has_queue(app: Tether, name: str) -> bool:
    return name in (await app.stats.queue_names()).items


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq)


async def _walk(fetch: Callable[[str | None], Awaitable[Page[Any]]]) -> list[Any]:
    out: list[Any] = []
    cursor = None
    for _ in range(100):
        page = await fetch(cursor)
        out += page.items
        cursor = page.cursor
        if cursor is None:
            return out
    raise AssertionError("the cursor never ended")


@pytest.mark.cluster
async def test_the_readers_work_on_a_cluster_with_queues_on_different_masters(
    cluster: Any, namespace: str
) -> None:
    from ..system.test_cluster import queues_on_distinct_masters

    first, second = queues_on_distinct_masters(cluster, namespace, 2)
    made = ops.fresh(cluster.url, namespace)
    async with made.app as app:
        await made.hold.options(queue=first).enqueue_many([(5.0,)] * 2)
        await made.ok.options(queue=second, delay=600).enqueue(1)
        await made.fail.options(queue=second).enqueue(1)
        async with running_worker(app, queues=(first, second)):
            await eventually(lambda: _queue_is(app, first, running=2), timeout=20)
            await eventually(lambda: _queue_is(app, second, dead=1), timeout=20)
            figures = {q.name: q for q in await app.stats.queues()}
            assert figures[first].workers == figures[second].workers == 1
            assert figures[second].delayed == 1
            running = await app.stats.running(first, limit=1)
            assert len(running) == 1 and running.cursor is not None
            assert len(await app.stats.running(first, cursor=running.cursor)) == 1
            assert len(await app.workers()) == 1
            health = await app.stats.health()
            assert health.reachable and health.mode == "cluster" and health.version
            stats = await app.stats.tasks(second, window=600)
            assert [(s.task, s.counts.failed) for s in stats] == [("ops.fail", 1)]
            assert await app.pause(second) and (await app.stats.queue(second)).paused


async def _queue_is(app: Tether, name: str, **figures: int) -> bool:
    q = await app.stats.queue(name)
    return all(getattr(q, k) == v for k, v in figures.items())
