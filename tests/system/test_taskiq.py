"""taskiq's own worker (``taskiq worker``, the real CLI) on a TetherBroker keeps Tether's
delivery promises: SIGKILL recovery on an idle stream, no robbery of a live worker whose loop
is blocked, recovery by a running worker after a kill mid-reclaim, the delivered-but-unacked
bound, poison quarantine, ``tether dead show|retry`` on a taskiq letter, the shutdown handoff,
a restart that resumes its entries, a Redis Cluster.

Workers run with 100 ms heartbeats, a 500 ms lease and a 200 ms reclaim interval
(helpers.FAST). Recovery times are printed with ``[measured]`` (``pytest -s``).

These run on one server kind, the embedded Valkey (and a Valkey Cluster): the broker adds no
step of its own on the server, and the protocol's scripts run on both kinds in the rest of the
suite (test_recovery.py, test_cluster.py, and the in-process test_taskiq_broker.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from tether.base._redis import parse_url, sync_client
from tether.protocol._keys import GROUP, QueueKeys

from ..conftest import start_server
from ..helpers import FAST, ROOT, ServerInfo, read_runs, wait_until
from ..servers import LocalCluster
from ..taskiq_workers import TaskiqWorker, kiq, timed

TTL = FAST["heartbeat_ttl"]
RECLAIM = FAST["reclaim_interval"]
MARGIN = 1.0
"""Slack for process scheduling on a loaded 2-core machine."""
QUEUE = "taskiq"


def starts(client: Any, ns: str) -> list[Any]:
    return read_runs(client, f"{ns}:starts")


def runs(client: Any, ns: str) -> list[Any]:
    return read_runs(client, f"{ns}:runs")


def pending(client: Any, ns: str) -> list[dict[str, Any]]:
    """The pending entries of the three streams in one snapshot (MULTI/EXEC): read one
    stream after another, an ack on one and a fetch on the next would be counted together."""
    pipe = client.pipeline(transaction=True)
    for stream in QueueKeys.of(ns, QUEUE).streams:
        pipe.xpending_range(stream, GROUP, "-", "+", 1000)
    out: list[dict[str, Any]] = []
    for reply in pipe.execute(raise_on_error=False):
        if isinstance(reply, Exception):  # a stream (or its group) not made yet
            assert "NOGROUP" in str(reply) or "no such key" in str(reply), reply
            continue
        out += reply
    return out


def stream_lengths(client: Any, ns: str) -> list[int]:
    return [int(client.xlen(s)) for s in QueueKeys.of(ns, QUEUE).streams]


@pytest.fixture
def url(_servers: dict[str, ServerInfo]) -> str:
    """The embedded Valkey of the session (conftest's ``server`` fixture, one kind)."""
    if "valkey" not in _servers:
        process = start_server("valkey")
        _servers["valkey"] = ServerInfo("valkey", process.url, process)
    info = _servers["valkey"]
    assert info.process.process is not None and info.process.process.poll() is None, "died"
    return info.url


@pytest.fixture
def taskiq_workers() -> Any:
    started: list[TaskiqWorker] = []
    yield started
    for worker in started:
        worker.kill_now()


def test_sigkill_on_an_idle_stream_runs_the_task_again_after_the_lease_and_not_before(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    a = TaskiqWorker(url, namespace, "a", log_dir=tmp_path)
    taskiq_workers.append(a)
    a.wait_ready(rds)
    kiq(url, namespace, "slow", ("job", 30.0))
    wait_until(lambda: len(starts(rds, namespace)) == 1)
    assert starts(rds, namespace)[0].pid == a.child()
    b = TaskiqWorker(url, namespace, "b", log_dir=tmp_path)
    taskiq_workers.append(b)
    b.wait_ready(rds)
    time.sleep(0.3)  # b is idle, blocked on its read; no traffic from here on
    lease_left = rds.pttl(a.lease_key()) / 1000
    killed_at = time.time()
    a.kill_all()
    wait_until(lambda: len(starts(rds, namespace)) == 2, timeout=10)
    again = starts(rds, namespace)[1]
    assert again.pid == b.child()
    assert again.deliveries == 2
    elapsed = again.at - killed_at
    timed("SIGKILL on an idle stream, task running again after", elapsed)
    assert elapsed >= lease_left - 0.05, (
        f"ran again {elapsed:.3f}s after the kill, lease had {lease_left:.3f}s"
    )
    assert elapsed <= TTL + RECLAIM + MARGIN, f"took {elapsed:.3f}s"


def test_a_task_running_3x_the_lease_on_a_blocked_loop_is_delivered_once(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    """taskiq-redis #101: reclaim by idle time hands a long task to a second worker."""
    # A 1.5 s lease (not the suite's 0.5 s): the renewing thread shares two cores with the
    # whole parallel suite, and a lease shorter than a scheduling stall there lapses for real.
    ttl = 1.5
    a = TaskiqWorker(url, namespace, "a", log_dir=tmp_path, heartbeat_ttl=ttl)
    b = TaskiqWorker(url, namespace, "b", log_dir=tmp_path, heartbeat_ttl=ttl)
    taskiq_workers += [a, b]
    a.wait_ready(rds)
    b.wait_ready(rds)
    # The event loop is blocked by CPU work for the whole run: three lease lifetimes.
    kiq(url, namespace, "hog", ("long", 3 * ttl, 3 * ttl))
    wait_until(lambda: starts(rds, namespace), timeout=10)
    seen: set[tuple[Any, Any]] = set()
    deadline = time.monotonic() + 15
    while not runs(rds, namespace) and time.monotonic() < deadline:
        for row in pending(rds, namespace):
            seen.add((row["consumer"], row["times_delivered"]))
        time.sleep(0.02)
    (done,) = runs(rds, namespace)
    assert len(starts(rds, namespace)) == 1
    owner = a if done.pid in a.children() else b
    assert seen == {(owner.consumer().encode(), 1)}, f"the entry changed hands: {seen}"
    wait_until(lambda: not pending(rds, namespace))
    assert stream_lengths(rds, namespace) == [0, 0, 0]


def test_a_worker_killed_while_reclaiming_leaves_nothing_that_stops_the_others(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    """taskiq-redis #131: a reclaim lock without expiry, left by a SIGKILL, stops the
    recovery of the workers that were running all along. Here a worker runs before, during
    and after the kill; busy until then, it recovers every entry afterwards: the dead
    worker's orphans that were not reclaimed yet and those the reclaimer held when killed."""
    busy = 32
    other = TaskiqWorker(url, namespace, "other", log_dir=tmp_path, max_async_tasks=busy)
    taskiq_workers.append(other)
    other.wait_ready(rds)
    # Its every slot taken by a task that waits for the test: it can reclaim nothing yet.
    kiq(url, namespace, "gated", *[(f"g{i}",) for i in range(busy)])
    wait_until(lambda: len(starts(rds, namespace)) == busy, timeout=15)
    kiq(url, namespace, "record", *[(f"o{i}",) for i in range(300)])
    stream = QueueKeys.of(namespace, QUEUE).stream("normal")
    ((_, orphans),) = rds.xreadgroup(GROUP, "ghost", {stream: ">"}, count=1000)  # died with them
    assert len(orphans) == 300
    reclaimer = TaskiqWorker(
        url, namespace, "reclaimer", log_dir=tmp_path, max_async_tasks=100, reclaim_page_size=10
    )
    taskiq_workers.append(reclaimer)
    wait_until(lambda: "claimed entry" in reclaimer.log(), timeout=15)
    reclaimer.kill_all()
    owners = {row["consumer"] for row in pending(rds, namespace)}
    assert b"ghost" in owners, "the kill came after the reclaim was over"
    assert other.alive() and rds.exists(other.lease_key())
    done_before = {r.tag for r in runs(rds, namespace)}
    opened = time.time()
    rds.mset({f"{namespace}:gate:g{i}": 1 for i in range(busy)})
    everything = {f"o{i}" for i in range(300)} | {f"g{i}" for i in range(busy)}
    wait_until(lambda: {r.tag for r in runs(rds, namespace)} == everything, timeout=30)
    timed("kill mid-reclaim: all 300 recovered by the running worker within", time.time() - opened)
    recovered = {r.tag for r in runs(rds, namespace) if r.pid == other.child()}
    assert recovered >= everything - done_before
    wait_until(lambda: not pending(rds, namespace), timeout=10)
    assert stream_lengths(rds, namespace) == [0, 0, 0]


def test_delivered_but_unacked_never_exceeds_the_bound_and_the_streams_end_empty(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    bound = 4
    # taskiq may run 20 at once; the broker holds at most 4, across the three streams.
    fleet = [
        TaskiqWorker(url, namespace, f"w{i}", log_dir=tmp_path, max_async_tasks=20,
                     max_pending=bound)
        for i in range(2)
    ]  # fmt: skip
    taskiq_workers += fleet
    for w in fleet:
        w.wait_ready(rds)
    for priority in ("high", "normal", "low"):
        kiq(url, namespace, "slow", *[(f"{priority}{i}", 0.02) for i in range(40)],
            priority=priority)  # fmt: skip
    most: dict[bytes, int] = {}
    while len(runs(rds, namespace)) < 120:
        held: dict[bytes, int] = {}
        for row in pending(rds, namespace):
            held[row["consumer"]] = held.get(row["consumer"], 0) + 1
        for consumer, n in held.items():
            most[consumer] = max(most.get(consumer, 0), n)
        time.sleep(0.005)
    assert set(most) == {w.consumer().encode() for w in fleet}
    assert max(most.values()) <= bound, f"a worker held {most}"
    assert max(most.values()) == bound  # the bound, not starvation, limited them
    wait_until(lambda: not pending(rds, namespace))
    assert sorted(r.tag for r in runs(rds, namespace)) == sorted(
        f"{p}{i}" for p in ("high", "normal", "low") for i in range(40)
    )
    assert stream_lengths(rds, namespace) == [0, 0, 0]
    assert not rds.exists(QueueKeys.of(namespace, QUEUE).index)


def test_a_poison_task_that_kills_every_worker_ends_in_the_dead_letters(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    # taskiq's process manager starts a new worker process for each one killed.
    fleet = [TaskiqWorker(url, namespace, f"w{i}", log_dir=tmp_path) for i in range(2)]
    taskiq_workers += fleet
    for w in fleet:
        w.wait_ready(rds)
    kiq(url, namespace, "suicide", ("poison",))
    kiq(url, namespace, "record", *[(f"ok{i}",) for i in range(30)])
    dead_key = QueueKeys.of(namespace, QUEUE).dead
    wait_until(
        lambda: rds.xlen(dead_key) and len({r.tag for r in runs(rds, namespace)}) == 30,
        timeout=40,
    )
    assert len([s for s in starts(rds, namespace) if s.tag == "poison"]) == 3
    assert {r.tag for r in runs(rds, namespace)} == {f"ok{i}" for i in range(30)}
    assert rds.xlen(dead_key) == 1, "an innocent task was quarantined with the poison"
    # Tether's own dead-letter tools read it.
    listed = subprocess.run(
        [sys.executable, "-m", "tether", "dead", "list", "--url", url, "--namespace", namespace,
         "--queue", QUEUE, "--json"],
        capture_output=True, text=True, timeout=30, cwd=ROOT, check=True,
    ).stdout  # fmt: skip
    (letter,) = [json.loads(line) for line in listed.splitlines()]
    assert letter["task"] == "suicide"
    assert letter["reason"] == "delivered 3 times; its workers died"
    assert '"poison"' in json.loads(letter["payload"])["taskiq"]["message"]
    wait_until(lambda: not pending(rds, namespace))


def test_a_task_that_calls_sys_exit_or_is_interrupted_fails_and_the_worker_serves_on(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    """``sys.exit()`` or ``KeyboardInterrupt`` in a task, async or sync (on taskiq's thread
    pool), fails that attempt: taskiq's receiver catches it as any error, the middleware
    sends it to the dead letters with the exception recorded, and the same worker process
    runs the next task. Nothing is left pending to take down the next worker."""
    a = TaskiqWorker(url, namespace, "a", log_dir=tmp_path, max_async_tasks=1)
    taskiq_workers.append(a)
    a.wait_ready(rds)
    child = a.child()
    kiq(url, namespace, "exits", ("async-exit", 3))
    kiq(url, namespace, "exits_sync", ("sync-exit", 4))
    kiq(url, namespace, "interrupted", ("async-interrupt",))
    kiq(url, namespace, "interrupted_sync", ("sync-interrupt",))
    kiq(url, namespace, "record", ("after",))
    wait_until(lambda: runs(rds, namespace), timeout=15)
    assert [(r.tag, r.pid) for r in runs(rds, namespace)] == [("after", child)]
    assert a.alive() and a.children() == [child], "the worker process was replaced"
    dead_key = QueueKeys.of(namespace, QUEUE).dead
    wait_until(lambda: rds.xlen(dead_key) == 4, timeout=10)
    letters = {json.loads(fields[b"m"])["task"]: fields for _, fields in rds.xrange(dead_key)}
    expected = {
        "exits": ("SystemExit", "3"),
        "exits_sync": ("SystemExit", "4"),
        "interrupted": ("KeyboardInterrupt", "async-interrupt"),
        "interrupted_sync": ("KeyboardInterrupt", "sync-interrupt"),
    }
    for task, (kind, message) in expected.items():
        letter = letters[task]
        assert letter[b"status"] == b"failed", letter
        error = json.loads(letter[b"error"])
        assert (error["type"], error["message"]) == (kind, message), error
        assert letter[b"reason"].decode() == (
            f"failed and taskiq did not retry it: {kind}: {message}"
        )
    wait_until(lambda: not pending(rds, namespace))
    assert stream_lengths(rds, namespace) == [0, 0, 0]


def test_tether_dead_show_and_retry_on_a_taskiq_letter(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    """A task that failed its run and taskiq's retry is a dead letter that ``tether dead
    show`` prints (reason, traceback, taskiq's message) and ``tether dead retry`` sends back
    to the taskiq workers."""
    w = TaskiqWorker(url, namespace, "w", log_dir=tmp_path)
    taskiq_workers.append(w)
    w.wait_ready(rds)
    # Kicked by name, so with the labels its decorator gives: one retry, and it fails twice.
    (taskiq_id,) = kiq(url, namespace, "flaky", ("f", 2), retry_on_error=True, max_retries=2)
    dead_key = QueueKeys.of(namespace, QUEUE).dead
    wait_until(lambda: rds.xlen(dead_key) == 1, timeout=20)
    assert [s.tag for s in starts(rds, namespace)] == ["f", "f"]
    ((entry, _),) = rds.xrange(dead_key)

    def tether_dead(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tether", "dead", *args, "--url", url,
             "--namespace", namespace],
            capture_output=True, text=True, timeout=30, cwd=ROOT, check=True,
        )  # fmt: skip

    shown = tether_dead("show", "--queue", QUEUE, entry.decode()).stdout
    lines = dict(line.split(":", 1) for line in shown.splitlines()[:9] if ":" in line)
    assert lines["task"].strip() == "flaky" and lines["status"].strip() == "failed"
    assert lines["reason"].strip() == "failed and taskiq did not retry it: RuntimeError: f fails"
    assert "traceback:" in shown and 'raise RuntimeError(f"{tag} fails")' in shown
    letter = json.loads(tether_dead("show", "--queue", QUEUE, "--json", entry.decode()).stdout)
    message = json.loads(json.loads(letter["payload"])["taskiq"]["message"])
    assert message["task_id"] == taskiq_id and message["args"] == ["f", 2]
    task_id = letter["task_id"]
    assert task_id.startswith(f"{QUEUE}:2-")
    # By task id: it names its queue.
    retried = tether_dead("retry", task_id).stdout
    assert retried.startswith(f"{task_id}: queued again as {task_id}")
    wait_until(lambda: [r.tag for r in runs(rds, namespace)] == ["f"], timeout=20)
    assert rds.xlen(dead_key) == 0
    wait_until(lambda: not pending(rds, namespace))
    assert stream_lengths(rds, namespace) == [0, 0, 0]


def test_sigterm_hands_the_messages_taskiq_never_got_to_another_worker_at_once(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    slow_lease = {"heartbeat_ttl": 5.0, "stall_timeout": 10.0}
    a = TaskiqWorker(url, namespace, "a", log_dir=tmp_path, max_async_tasks=1, max_pending=5,
                     **slow_lease)  # fmt: skip
    taskiq_workers.append(a)
    a.wait_ready(rds)
    # The first runs until the test opens its gate; the other four wait in the broker.
    kiq(url, namespace, "gated", ("t0",))
    kiq(url, namespace, "slow", *[(f"t{i}", 0.5) for i in range(1, 5)])
    wait_until(lambda: len(starts(rds, namespace)) == 1)
    wait_until(lambda: len(pending(rds, namespace)) == 5)
    b = TaskiqWorker(url, namespace, "b", log_dir=tmp_path, max_async_tasks=4, **slow_lease)
    taskiq_workers.append(b)
    b.wait_ready(rds)
    sent_at = time.time()
    a.signal(signal.SIGTERM)
    wait_until(lambda: len(starts(rds, namespace)) == 5, timeout=5)
    picked = [s for s in starts(rds, namespace) if s.pid == b.child()]
    assert len(picked) == 4
    latest = max(s.at for s in picked) - sent_at
    timed("SIGTERM: buffered messages running on another worker after", latest)
    assert latest < 1.0 + RECLAIM + MARGIN < slow_lease["heartbeat_ttl"]
    assert all(s.deliveries == 1 for s in picked), "the handoff did not give the delivery back"
    time.sleep(0.3)
    assert a.alive(), "taskiq's manager exits once its worker process has"
    assert rds.exists(a.lease_key()), "the lease went before the running task ended"
    rds.set(f"{namespace}:gate:t0", 1)  # the running task may finish now
    assert a.wait(20) == 0
    wait_until(lambda: len(runs(rds, namespace)) == 5, timeout=10)
    assert len({r.tag for r in runs(rds, namespace)}) == 5
    # The worker process finished its running task, then deleted its lease last.
    wait_until(lambda: not rds.exists(a.lease_key()), timeout=10)
    wait_until(lambda: "handed off 4 entries (buffered) to other workers" in a.log())
    wait_until(lambda: not pending(rds, namespace))
    assert stream_lengths(rds, namespace) == [0, 0, 0]


def test_a_frozen_worker_that_wakes_after_losing_its_lease_cannot_ack(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    a = TaskiqWorker(url, namespace, "a", log_dir=tmp_path)
    taskiq_workers.append(a)
    a.wait_ready(rds)
    # a's run ends within 1.5 s of its resumption; b's (a second delivery) takes 6 s, so b
    # surely holds the entry when a tries to ack it, however slow the machine.
    kiq(url, namespace, "slow_then_slower", ("fenced", 1.5, 6.0))
    wait_until(lambda: len(starts(rds, namespace)) == 1)
    frozen = a.child()
    os.kill(frozen, signal.SIGSTOP)
    try:
        b = TaskiqWorker(url, namespace, "b", log_dir=tmp_path)
        taskiq_workers.append(b)
        wait_until(lambda: len(starts(rds, namespace)) == 2, timeout=10)  # b claimed it
        _, second = starts(rds, namespace)
        assert second.pid == b.child()
    finally:
        os.kill(frozen, signal.SIGCONT)
    wait_until(lambda: "lost lease" in a.log(), timeout=10)
    wait_until(lambda: len(runs(rds, namespace)) == 2, timeout=10)
    wait_until(lambda: not pending(rds, namespace), timeout=10)
    assert rds.xlen(QueueKeys.of(namespace, QUEUE).dead) == 0
    assert stream_lengths(rds, namespace) == [0, 0, 0]
    # the worker that lost its lease carries on serving
    b.kill_all()
    kiq(url, namespace, "record", ("after",))
    wait_until(lambda: any(r.tag == "after" and r.pid == frozen for r in runs(rds, namespace)))


def test_a_worker_process_restarted_by_taskiq_resumes_its_entries_at_once(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    long_lease = {"heartbeat_ttl": 30.0, "stall_timeout": 60.0}
    pod = TaskiqWorker(url, namespace, "pod", log_dir=tmp_path, **long_lease)
    taskiq_workers.append(pod)
    pod.wait_ready(rds)
    kiq(url, namespace, "slow", ("x", 20.0), ("y", 20.0))
    wait_until(lambda: len(starts(rds, namespace)) == 2)
    first = pod.child()
    killed_at = time.time()
    os.kill(first, signal.SIGKILL)  # taskiq's manager starts worker-0 again: consumer pod-0
    wait_until(lambda: len(starts(rds, namespace)) == 4, timeout=15)
    resumed = starts(rds, namespace)[2:]
    assert {s.tag for s in resumed} == {"x", "y"}
    assert all(s.pid != first for s in resumed)
    took = max(s.at for s in resumed) - killed_at
    timed("restart with the same name: entries running again after", took)
    assert took < 10 < long_lease["heartbeat_ttl"]


@pytest.mark.cluster
@pytest.mark.parametrize("_cluster_session", ["valkey"], indirect=True)
def test_recovery_on_a_redis_cluster(
    cluster: LocalCluster, namespace: str, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    """taskiq-redis #130: no recovery at all on a Cluster."""
    url = cluster.url
    client = sync_client(parse_url(url), socket_timeout=5, connect_timeout=5, retries=2)
    try:
        a = TaskiqWorker(url, namespace, "a", log_dir=tmp_path)
        taskiq_workers.append(a)
        a.wait_ready(client)
        kiq(url, namespace, "slow", ("job", 30.0))
        wait_until(lambda: len(starts(client, namespace)) == 1)
        b = TaskiqWorker(url, namespace, "b", log_dir=tmp_path)
        taskiq_workers.append(b)
        b.wait_ready(client)
        time.sleep(0.3)
        killed_at = time.time()
        a.kill_all()
        wait_until(lambda: len(starts(client, namespace)) == 2, timeout=10)
        again = starts(client, namespace)[1]
        assert again.pid == b.child()
        elapsed = again.at - killed_at
        timed("Redis Cluster: SIGKILL, task running again after", elapsed)
        assert TTL - FAST["heartbeat_interval"] - 0.05 <= elapsed <= TTL + RECLAIM + MARGIN
    finally:
        client.close()


# -- one engine: what the worker does, a taskiq worker does too ----------------------------


def test_a_taskiq_only_deployment_shows_its_queue_in_info_the_overview_and_the_metrics(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, taskiq_workers: list[TaskiqWorker]
) -> None:
    """Nothing but taskiq workers serve or name the queue: it used to be missing from
    ``tether info`` ("no known queues" beside 2 live workers), the overview and the
    deployment metrics, because the taskiq consumer never published its queues."""
    from tether import Tether
    from tether.protocol._keys import known_queues_key
    from tether.web import create_app

    from ..metrics_helpers import scrape
    from ..web_helpers import TOKEN, serving

    for name in ("a", "b"):
        w = TaskiqWorker(url, namespace, name, log_dir=tmp_path)
        taskiq_workers.append(w)
    for w in taskiq_workers:
        w.wait_ready(rds)
    kiq(url, namespace, "record", ("k",))
    wait_until(lambda: [r.tag for r in runs(rds, namespace)] == ["k"], timeout=20)
    wait_until(lambda: rds.zscore(known_queues_key(namespace), QUEUE) is not None)

    shown = subprocess.run(
        [sys.executable, "-m", "tether", "info", "--url", url, "--namespace", namespace,
         "--json"],
        capture_output=True, text=True, timeout=30, cwd=ROOT, check=True,
    )  # fmt: skip
    report = json.loads(shown.stdout)
    assert [q["name"] for q in report["queues"]] == [QUEUE]
    (queue,) = report["queues"]
    assert (queue["workers"], report["workers"]) == (2, 2)
    table = subprocess.run(
        [sys.executable, "-m", "tether", "info", "--url", url, "--namespace", namespace],
        capture_output=True, text=True, timeout=30, cwd=ROOT, check=True,
    ).stdout  # fmt: skip
    assert "no known queues" not in table and QUEUE in table

    async def overview_and_metrics() -> tuple[list[str], Any]:
        app = Tether(url, namespace=namespace)
        async with app:
            overview = await app.stats.overview()
        with serving(create_app(Tether(url, namespace=namespace), token=TOKEN)) as base:
            scraped = await asyncio.to_thread(scrape, f"{base}/metrics", token=TOKEN)
        return [q.name for q in overview.queues], scraped

    names, scraped = asyncio.run(overview_and_metrics())
    assert names == [QUEUE]
    assert scraped.status == 200, scraped.text
    assert scraped.value("tether_queue_workers", queue=QUEUE) == 2
    assert scraped.value("tether_workers") == 2


def test_a_wrong_password_stops_taskiq_worker_at_once(namespace: str, tmp_path: Path) -> None:
    """A refusal no retry fixes stops the worker process, and taskiq's process manager
    with it: it used to restart the process every second, forever, each refused again."""
    locked = start_server("valkey", args=["--requirepass", "s3cret"])
    try:
        wrong = f"redis://:not-it@127.0.0.1:{locked.port}/0"
        started = time.monotonic()
        w = TaskiqWorker(wrong, namespace, "locked-out", log_dir=tmp_path)
        try:
            w.process.wait(timeout=20)
            took = time.monotonic() - started
            log = w.log()
        finally:
            w.kill_now()
        assert "authentication failed at redis://:***@127.0.0.1:" in log, log
        assert "no restart can fix this: stopping taskiq's worker processes" in log, log
        assert "not-it" not in log
        assert log.count("is dead. Scheduling reload.") <= 1, log
        print(f"[measured] taskiq worker stopped {took:.1f}s after start on a wrong password")
    finally:
        locked.cleanup()
