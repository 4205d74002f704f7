"""Crash-proof delivery, proven with real worker processes: SIGKILL, SIGSTOP, SIGTERM.

Workers run with 100 ms heartbeats, a 500 ms lease and a 200 ms reclaim interval unless a
test says otherwise (helpers.FAST).
"""

from __future__ import annotations

import random
import re
import signal
import time
from pathlib import Path

import pytest
import redis

from tether.protocol._keys import GROUP, QueueKeys

from ..helpers import FAST, WorkerProcess, read_runs, wait_until

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py

TTL = FAST["heartbeat_ttl"]
INTERVAL = FAST["heartbeat_interval"]
RECLAIM = FAST["reclaim_interval"]
MARGIN = 1.0
"""Slack for process scheduling on a loaded 2-core machine."""


def enqueue(
    url: str, namespace: str, task: str, *calls: tuple[object, ...], **options: object
) -> list[str]:
    """Enqueue through the public API, from this (test) process."""
    import asyncio

    from tests.apps import tasks
    from tether import Task, Tether

    async def send() -> list[str]:
        app = Tether(url, namespace=namespace)
        source = tasks.app.tasks[f"tests.apps.tasks.{task}"]
        fn: Task[..., object] = Task(app, source.fn, source.config)
        if options:
            fn = fn.options(**options)  # type: ignore[arg-type]
        async with app:
            return [h.id for h in await fn.enqueue_many(list(calls))]

    return asyncio.run(send())


def starts(rds: redis.Redis, ns: str) -> list:  # type: ignore[type-arg]
    return read_runs(rds, f"{ns}:starts")


def runs(rds: redis.Redis, ns: str) -> list:  # type: ignore[type-arg]
    return read_runs(rds, f"{ns}:runs")


def pending(rds: redis.Redis, ns: str, queue: str = "default") -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    for stream in QueueKeys.of(ns, queue).streams:
        if rds.exists(stream):
            out += rds.xpending_range(stream, GROUP, "-", "+", 1000)
    return out


def test_sigkill_on_an_idle_stream_recovers_after_the_lease_and_not_before(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    a = WorkerProcess(url, namespace, "a", log_dir=tmp_path)
    workers.append(a)
    a.wait_ready(rds)
    enqueue(url, namespace, "slow", ("job", 30.0))
    wait_until(lambda: len(starts(rds, namespace)) == 1)
    b = WorkerProcess(url, namespace, "b", log_dir=tmp_path)
    workers.append(b)
    b.wait_ready(rds)
    time.sleep(0.3)  # b is idle, blocked on its read; no traffic from here on
    lease_left = rds.pttl(a.lease_key()) / 1000
    killed_at = time.time()
    a.signal(signal.SIGKILL)
    wait_until(lambda: len(starts(rds, namespace)) == 2, timeout=10)
    restart = starts(rds, namespace)[1]
    assert restart.pid == b.pid
    assert restart.deliveries == 2
    elapsed = restart.at - killed_at
    assert elapsed >= lease_left - 0.05, (
        f"reclaimed {elapsed:.3f}s after the kill, lease had {lease_left:.3f}s"
    )
    assert elapsed <= TTL + RECLAIM + MARGIN, f"took {elapsed:.3f}s"


def test_a_long_task_on_a_live_worker_that_blocks_its_loop_is_never_robbed(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    a = WorkerProcess(url, namespace, "a", log_dir=tmp_path)
    b = WorkerProcess(url, namespace, "b", log_dir=tmp_path)
    workers += [a, b]
    a.wait_ready(rds)
    b.wait_ready(rds)
    # Runs five lease lifetimes, two of them with the event loop blocked by CPU work.
    enqueue(url, namespace, "hog", ("long", 5 * TTL, 2 * TTL))
    wait_until(lambda: starts(rds, namespace), timeout=10)
    owner = starts(rds, namespace)[0].pid
    deadline = time.monotonic() + 10
    seen: set[tuple[object, object]] = set()
    while not runs(rds, namespace) and time.monotonic() < deadline:
        for row in pending(rds, namespace):
            seen.add((row["consumer"], row["times_delivered"]))
        time.sleep(0.02)
    (done,) = runs(rds, namespace)
    assert done.pid == owner
    assert len(starts(rds, namespace)) == 1
    owner_name = b"a" if owner == a.pid else b"b"
    assert seen == {(owner_name, 1)}, f"the entry changed hands or was redelivered: {seen}"
    wait_until(lambda: not pending(rds, namespace))


def test_many_workers_claim_each_orphan_exactly_once(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    tags = [(f"orphan{i}",) for i in range(300)]
    enqueue(url, namespace, "record", *tags)
    keys = QueueKeys.of(namespace, "default")
    stream = keys.stream("normal")
    rds.xgroup_create(stream, GROUP, "0")
    # A consumer that died holding every entry: it has no lease.
    rds.xreadgroup(GROUP, "ghost", {stream: ">"}, count=1000)
    fleet = [
        WorkerProcess(
            url, namespace, f"w{i}", log_dir=tmp_path, concurrency=64, reclaim_page_size=50
        )
        for i in range(4)
    ]
    workers += fleet
    wait_until(lambda: len(runs(rds, namespace)) >= 300, timeout=30)
    time.sleep(0.5)
    done = runs(rds, namespace)
    assert sorted(r.tag for r in done) == sorted(t for (t,) in tags)
    assert all(r.deliveries == 2 for r in done)
    for w in fleet:
        w.signal(signal.SIGTERM)
    claimed = 0
    for w in fleet:
        assert w.wait(20) == 0
        line = next(x for x in w.log().splitlines() if "stopped:" in x)
        # A worker that claimed nothing leaves the field out of its stop line.
        found = re.search(r"\bclaimed=(\d+)", line)
        claimed += int(found.group(1)) if found else 0
    assert claimed == 300


def test_sigterm_hands_buffered_entries_to_another_worker_at_once(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    slow_lease = {"heartbeat_ttl": 5.0, "stall_timeout": 10.0}
    a = WorkerProcess(
        url, namespace, "a", log_dir=tmp_path, concurrency=1, max_pending=5, **slow_lease
    )
    workers.append(a)
    a.wait_ready(rds)
    # The first runs until the test opens its gate (a starts no second one before its
    # SIGTERM, however slow the machine); the other four wait in a's buffer.
    enqueue(url, namespace, "gated", ("t0",))
    enqueue(url, namespace, "slow", *[(f"t{i}", 1.0) for i in range(1, 5)])
    wait_until(lambda: len(starts(rds, namespace)) == 1)
    wait_until(lambda: len(pending(rds, namespace)) == 5)
    b = WorkerProcess(url, namespace, "b", log_dir=tmp_path, concurrency=4, **slow_lease)
    workers.append(b)
    b.wait_ready(rds)
    sent_at = time.time()
    a.signal(signal.SIGTERM)
    wait_until(lambda: len(starts(rds, namespace)) == 5, timeout=5)
    picked = [s for s in starts(rds, namespace) if s.pid == b.pid]
    assert len(picked) == 4
    latest = max(s.at for s in picked) - sent_at
    assert latest < RECLAIM + MARGIN < slow_lease["heartbeat_ttl"], f"pickup took {latest:.3f}s"
    # they never started on a: the handoff gave back the delivery they used
    assert all(s.deliveries == 1 for s in picked)
    rds.set(f"{namespace}:gate:t0", 1)
    assert a.wait(20) == 0  # the running task finished within shutdown_grace
    wait_until(lambda: len(runs(rds, namespace)) == 5, timeout=10)
    assert len({r.tag for r in runs(rds, namespace)}) == 5
    assert rds.exists(a.lease_key()) == 0
    assert "handed off 4 entries (buffered) to other workers" in a.log()


def test_a_restart_with_the_same_name_resumes_its_entries_at_once(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    long_lease = {"heartbeat_ttl": 30.0, "stall_timeout": 60.0}
    first = WorkerProcess(url, namespace, "pod-0", log_dir=tmp_path, concurrency=2, **long_lease)
    workers.append(first)
    first.wait_ready(rds)
    enqueue(url, namespace, "slow", ("x", 20.0), ("y", 20.0))
    wait_until(lambda: len(starts(rds, namespace)) == 2)
    first.signal(signal.SIGKILL)
    first.wait()
    restarted_at = time.time()
    second = WorkerProcess(url, namespace, "pod-0", log_dir=tmp_path, concurrency=2, **long_lease)
    workers.append(second)
    wait_until(lambda: len(starts(rds, namespace)) == 4, timeout=10)
    resumed = starts(rds, namespace)[2:]
    assert {s.tag for s in resumed} == {"x", "y"}
    assert all(s.pid == second.pid for s in resumed)
    assert max(s.at for s in resumed) - restarted_at < 10 < long_lease["heartbeat_ttl"]


def test_a_task_that_kills_every_worker_ends_in_the_dead_letters(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    fleet = [WorkerProcess(url, namespace, f"w{i}", log_dir=tmp_path) for i in range(2)]
    workers += fleet
    for w in fleet:
        w.wait_ready(rds)
    enqueue(url, namespace, "suicide", ("poison",))
    enqueue(url, namespace, "record", *[(f"ok{i}",) for i in range(30)])
    dead_key = QueueKeys.of(namespace, "default").dead
    spawned = 2
    deadline = time.monotonic() + 40
    # at least once: a task whose worker died before its ack may run again
    while not (rds.xlen(dead_key) and len({r.tag for r in runs(rds, namespace)}) == 30):
        assert time.monotonic() < deadline, "the poison task was not quarantined"
        for i, w in enumerate(fleet):
            if not w.alive():  # a supervisor (Kubernetes, systemd) starts a replacement
                fleet[i] = WorkerProcess(url, namespace, f"w{spawned}", log_dir=tmp_path)
                workers.append(fleet[i])
                spawned += 1
        time.sleep(0.05)
    assert len([s for s in starts(rds, namespace) if s.tag == "poison"]) == 3
    ((_, entry),) = rds.xrange(dead_key)
    assert entry[b"reason"] == b"delivered 3 times; its workers died"
    assert b'"task":"tests.apps.tasks.suicide"' in entry[b"m"]
    assert {r.tag for r in runs(rds, namespace)} == {f"ok{i}" for i in range(30)}
    assert rds.xlen(dead_key) == 1, "an innocent task was quarantined with the poison"


def test_a_frozen_worker_that_wakes_after_losing_its_lease_cannot_ack(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    a = WorkerProcess(url, namespace, "a", log_dir=tmp_path)
    workers.append(a)
    a.wait_ready(rds)
    # a's run ends within 1.5 s of its resumption; b's (a second delivery) takes 6 s, so b
    # surely holds the entry when a tries to ack it, however slow the machine.
    (task_id,) = enqueue(url, namespace, "slow_then_slower", ("fenced", 1.5, 6.0))
    wait_until(lambda: len(starts(rds, namespace)) == 1)
    a.signal(signal.SIGSTOP)
    b = WorkerProcess(url, namespace, "b", log_dir=tmp_path)
    workers.append(b)
    wait_until(lambda: len(starts(rds, namespace)) == 2, timeout=10)  # b claimed it
    assert starts(rds, namespace)[1].pid == b.pid
    a.signal(signal.SIGCONT)
    try:
        wait_until(lambda: "lost lease" in a.log(), timeout=10)
    except AssertionError:
        raise AssertionError(f"a did not report the lost lease:\n{a.log()}\n{b.log()}") from None
    wait_until(lambda: len(runs(rds, namespace)) == 2, timeout=10)
    keys = QueueKeys.of(namespace, "default")
    wait_until(lambda: rds.exists(keys.result(task_id)), timeout=10)
    import json

    record = json.loads(rds.get(keys.result(task_id)))
    assert record["status"] == "succeeded"
    assert record["value"] == f"fenced|{b.pid}", "the late worker's outcome was recorded"
    assert not pending(rds, namespace)
    assert rds.xlen(keys.dead) == 0
    # the worker that lost its lease carries on serving
    enqueue(url, namespace, "record", ("after",))
    wait_until(lambda: any(r.tag == "after" for r in runs(rds, namespace)))


def test_random_sigkills_lose_no_task_and_leave_no_lock_without_expiry(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    rng = random.Random(1234)
    settings = {"concurrency": 8, "max_deliveries": 100}
    fleet = [WorkerProcess(url, namespace, f"w{i}", log_dir=tmp_path, **settings) for i in range(3)]
    workers += fleet
    total = 0
    for round_no in range(12):
        enqueue(url, namespace, "record", *[(f"r{round_no}-{i}",) for i in range(40)])
        enqueue(url, namespace, "slow", *[(f"s{round_no}-{i}", 0.05) for i in range(10)])
        total += 50
        time.sleep(rng.uniform(0.0, 0.4))
        victim = rng.randrange(len(fleet))
        fleet[victim].signal(signal.SIGKILL)
        fleet[victim].wait()
        fleet[victim] = WorkerProcess(
            url, namespace, f"w{3 + round_no}", log_dir=tmp_path, **settings
        )
        workers.append(fleet[victim])
    wait_until(lambda: len({r.tag for r in runs(rds, namespace)}) == total, timeout=60)
    wait_until(lambda: not pending(rds, namespace), timeout=20)
    assert rds.xlen(QueueKeys.of(namespace, "default").dead) == 0
    for key in rds.scan_iter(f"*{namespace}*", count=1000):
        name = key.decode()
        if ":lease:" in name or ":dedup:" in name or ":cancel:" in name:
            assert rds.pttl(key) > 0, f"{name} acts as a lock and has no expiry"


def test_a_dead_consumers_entry_on_an_idle_stream_is_recovered_without_new_traffic(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    enqueue(url, namespace, "record", ("stranded",))
    stream = QueueKeys.of(namespace, "default").stream("normal")
    rds.xgroup_create(stream, GROUP, "0")
    rds.xreadgroup(GROUP, "dead-consumer", {stream: ">"}, count=1)
    w = WorkerProcess(url, namespace, "w", log_dir=tmp_path)
    workers.append(w)
    wait_until(lambda: runs(rds, namespace), timeout=10)
    assert runs(rds, namespace)[0].tag == "stranded"


def test_a_worker_killed_while_reclaiming_does_not_stop_the_others(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    enqueue(url, namespace, "record", *[(f"o{i}",) for i in range(400)])
    stream = QueueKeys.of(namespace, "default").stream("normal")
    rds.xgroup_create(stream, GROUP, "0")
    rds.xreadgroup(GROUP, "ghost", {stream: ">"}, count=1000)
    reclaimer = WorkerProcess(
        url, namespace, "reclaimer", log_dir=tmp_path, concurrency=200, reclaim_page_size=10
    )
    workers.append(reclaimer)
    wait_until(lambda: "claimed entry" in reclaimer.log(), timeout=15)
    reclaimer.signal(signal.SIGKILL)
    reclaimer.wait()
    other = WorkerProcess(url, namespace, "other", log_dir=tmp_path, concurrency=64)
    workers.append(other)
    wait_until(lambda: len({r.tag for r in runs(rds, namespace)}) == 400, timeout=30)
    wait_until(lambda: not pending(rds, namespace), timeout=10)


def test_a_deadlocked_worker_stops_renewing_and_releases_its_tasks(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    stall = 1.5
    health = tmp_path / "alive"  # what a liveness probe of an orchestrator would look at
    a = WorkerProcess(
        url, namespace, "a", log_dir=tmp_path, stall_timeout=stall,
        extra=["--health-file", str(health)],
    )  # fmt: skip
    workers.append(a)
    a.wait_ready(rds)
    wait_until(health.exists, timeout=5)
    touched = health.stat().st_mtime_ns
    wait_until(lambda: health.stat().st_mtime_ns > touched, timeout=5)  # every renewal
    enqueue(url, namespace, "deadlock", ("stuck",))
    wait_until(lambda: len(starts(rds, namespace)) == 1)
    stuck_at = starts(rds, namespace)[0].at
    b = WorkerProcess(url, namespace, "b", log_dir=tmp_path)
    workers.append(b)
    wait_until(lambda: len(starts(rds, namespace)) == 2, timeout=15)
    again = starts(rds, namespace)[1]
    assert again.pid == b.pid
    # released once the loop was silent for stall_timeout and the lease then expired
    assert stall <= again.at - stuck_at <= stall + TTL + RECLAIM + MARGIN
    assert "event loop has not ticked" in a.log()
    # The stalled worker's health file is no longer touched: the probe sees it go stale.
    stale = health.stat().st_mtime_ns
    time.sleep(5 * FAST["heartbeat_interval"])
    assert health.stat().st_mtime_ns == stale
    assert time.time() - stale / 1e9 > FAST["heartbeat_ttl"]


def test_a_second_signal_exits_at_once_and_the_lease_brings_the_tasks_back(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    a = WorkerProcess(url, namespace, "a", log_dir=tmp_path, shutdown_grace=60)
    workers.append(a)
    a.wait_ready(rds)
    enqueue(url, namespace, "slow", ("long", 30.0))
    wait_until(lambda: len(starts(rds, namespace)) == 1)
    a.signal(signal.SIGTERM)
    wait_until(lambda: "stopping gracefully" in a.log())
    t0 = time.monotonic()
    a.signal(signal.SIGTERM)
    assert a.wait(10) == 130
    assert time.monotonic() - t0 < 2
    assert "exiting at once" in a.log()
    b = WorkerProcess(url, namespace, "b", log_dir=tmp_path)
    workers.append(b)
    wait_until(lambda: len(starts(rds, namespace)) == 2, timeout=10)
    assert starts(rds, namespace)[1].pid == b.pid


def test_dead_consumers_are_pruned_only_without_pending_entries(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    enqueue(url, namespace, "record", ("held",))
    stream = QueueKeys.of(namespace, "default").stream("normal")
    rds.xgroup_create(stream, GROUP, "0")
    rds.xreadgroup(GROUP, "gone-empty", {stream: ">"}, count=1)  # takes the entry...
    rds.xack(stream, GROUP, rds.xpending_range(stream, GROUP, "-", "+", 1)[0]["message_id"])
    enqueue(url, namespace, "slow", ("busy", 30.0))
    rds.xreadgroup(GROUP, "gone-busy", {stream: ">"}, count=1)  # ...and this one keeps one
    rds.set(QueueKeys.of(namespace, "default").lease("gone-busy"), "x", px=60_000)  # alive
    w = WorkerProcess(url, namespace, "w", log_dir=tmp_path, housekeeping_interval=0.5)
    workers.append(w)
    w.wait_ready(rds)

    def consumers() -> set[str]:
        return {c["name"].decode() for c in rds.xinfo_consumers(stream, GROUP)}

    wait_until(lambda: "gone-empty" not in consumers(), timeout=10)
    assert "gone-busy" in consumers()  # alive, and it holds an entry
    # Without a lease but with a pending entry, prune refuses (DELCONSUMER would drop it).
    from tether.protocol import scripts

    keys = QueueKeys.of(namespace, "default")
    rds.delete(keys.lease("gone-busy"))
    w.signal(signal.SIGSTOP)  # keep the worker from reclaiming it meanwhile
    try:
        call = scripts.prune(keys.streams, keys.lease("gone-busy"), "gone-busy")
        assert call.run_sync(rds) is False
        assert "gone-busy" in consumers()
    finally:
        w.signal(signal.SIGCONT)
