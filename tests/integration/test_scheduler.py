"""Periodic tasks: one enqueue per tick whatever happens, a fenced leader, runtime control."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import redis
from click.testing import CliRunner

from tether import ConfigError, Tether
from tether.protocol._keys import QueueKeys
from tether.scheduler import Schedule, Scheduler

from ..helpers import ROOT, running_worker, wait_until

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py


def enqueued_ticks(
    rds: redis.Redis, namespace: str, schedule: str | None = None, queue: str = "default"
) -> list[int]:
    """Tick times of the schedule runs sitting in the queue's streams, in stream order."""
    out = []
    for stream in QueueKeys.of(namespace, queue).streams:
        for _, fields in rds.xrange(stream):
            opts = json.loads(fields[b"m"]).get("opts", {})
            if "tick" in opts and schedule in (None, opts["schedule"]):
                out.append(opts["tick"])
    return out


class SchedulerProcess:
    def __init__(
        self, url: str, namespace: str, log_dir: Path, n: int, app: str = "tests.apps.sched:app"
    ) -> None:
        import os
        import subprocess

        env = {
            **os.environ,
            "TETHER_URL": url,
            "TETHER_NAMESPACE": namespace,
            "PYTHONPATH": str(ROOT),
        }
        self.log_path = log_dir / f"scheduler-{n}.log"
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in kill
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tether", "scheduler", app,
             "--loop-interval", "0.1", "--leader-ttl", "1.0"],
            env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
        self.pid = self.process.pid

    def holds(self, leader: bytes | None) -> bool:
        return leader is not None and f"-{self.pid}:".encode() in leader

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            if sig == signal.SIGKILL:
                self.process.wait(10)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(10)
        self._log.close()


@pytest.fixture
def schedulers(tmp_path: Path):  # type: ignore[no-untyped-def]
    started: list[SchedulerProcess] = []
    yield started
    for proc in started:
        proc.close()


KILL_STORM_S = 15
KILL_EVERY_S = 2.5
"""Seconds of leader kills, one every 2.5 s (six takeovers, fifteen one-second ticks): a new
leader has taken over within 1.5 s of each kill, so each leads for a second or more."""


@pytest.mark.primary_kind  # long and timed; its scripts run on both kinds elsewhere
def test_killing_the_leader_again_and_again_enqueues_every_tick_once(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, schedulers: list[SchedulerProcess]
) -> None:
    leader_key = f"{{{namespace}:scheduler}}:leader"
    for n in range(3):
        schedulers.append(SchedulerProcess(url, namespace, tmp_path, n))
    spawned = 3
    wait_until(lambda: rds.get(leader_key), timeout=15)
    start = time.time()
    takeovers: list[float] = []
    while time.time() - start < KILL_STORM_S:
        time.sleep(KILL_EVERY_S)
        leader = rds.get(leader_key)
        victim = next(p for p in schedulers if p.holds(leader))
        killed_at = time.monotonic()
        victim.kill()

        def taken_over(previous: bytes | None = leader) -> bytes | None:
            value = rds.get(leader_key)
            return value if value is not None and value != previous else None

        new_leader = wait_until(taken_over, timeout=10)
        takeovers.append(time.monotonic() - killed_at)
        assert not victim.holds(new_leader)
        victim.close()
        schedulers[schedulers.index(victim)] = SchedulerProcess(url, namespace, tmp_path, spawned)
        spawned += 1
    time.sleep(1.5)
    ticks = enqueued_ticks(rds, namespace, "beat")
    assert len(ticks) >= KILL_STORM_S
    assert len(ticks) == len(set(ticks)), "a tick was enqueued twice"
    assert ticks == sorted(ticks)
    assert ticks == list(range(ticks[0], ticks[-1] + 1000, 1000)), "a tick was lost"
    assert max(takeovers) < 1.0 + 0.5, takeovers  # within the lease TTL (plus one pass)


async def test_two_instances_that_both_believe_they_lead_enqueue_each_tick_once(
    app: Tether, rds: redis.Redis
) -> None:
    @app.periodic(every=1.0, missed="catchup", name="tick")
    @app.task
    async def tick() -> None: ...

    a, b = (
        Scheduler(app, loop_interval=0.1, leader_ttl=1.0),
        Scheduler(app, loop_interval=0.1, leader_ttl=1.0),
    )
    t = float(int(time.time()))
    await a.run_once(now=t)
    assert a.is_leader
    for step in range(1, 4):
        await a.run_once(now=t + step)
    # A's lease passes to B while A is frozen: A still believes it leads.
    rds.delete(a.keys.leader)
    await b.run_once(now=t + 4)
    assert a.is_leader and b.is_leader
    for step in range(5, 12):  # both act as leader, on overlapping ticks
        await b.run_once(now=t + step)
        await a.run_once(now=t + step + 0.5)
    ticks = enqueued_ticks(rds, app.namespace)
    assert ticks == [int((t + s) * 1000) for s in range(1, 12)]


def test_a_frozen_leader_resumed_after_losing_its_lease_fires_nothing_twice(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, schedulers: list[SchedulerProcess]
) -> None:
    leader_key = f"{{{namespace}:scheduler}}:leader"
    schedulers += [SchedulerProcess(url, namespace, tmp_path, n) for n in range(2)]
    wait_until(lambda: rds.get(leader_key), timeout=15)
    time.sleep(2)
    first = next(p for p in schedulers if p.holds(rds.get(leader_key)))
    first.kill(signal.SIGSTOP)
    wait_until(lambda: not first.holds(rds.get(leader_key)) and rds.get(leader_key), timeout=10)
    time.sleep(2)
    first.kill(signal.SIGCONT)
    time.sleep(3)
    ticks = enqueued_ticks(rds, namespace, "beat")
    assert len(ticks) == len(set(ticks)), "a tick was enqueued twice"
    assert ticks == list(range(ticks[0], ticks[-1] + 1000, 1000))


async def test_a_cron_schedule_across_dst_changes_fires_at_the_right_instants(
    url: str, namespace: str, rds: redis.Redis
) -> None:
    rome = ZoneInfo("Europe/Rome")
    fired: dict[str, list[str]] = {"hourly": [], "nightly": []}
    days = (datetime(2026, 3, 28, 23, 50, tzinfo=rome), datetime(2026, 10, 24, 23, 50, tzinfo=rome))
    for n, day in enumerate(days):
        app = Tether(url, namespace=f"{namespace}-{n}")

        @app.periodic(cron="0 * * * *", tz="Europe/Rome", name="hourly")
        @app.periodic(cron="30 2 * * *", tz="Europe/Rome", name="nightly")
        @app.task
        async def job() -> None: ...

        async with app:
            scheduler = Scheduler(app, loop_interval=0.1, leader_ttl=5.0)
            for minute in range(0, 26 * 60, 5):  # injected time, five minutes a step
                await scheduler.run_once(now=day.timestamp() + minute * 60)
        for _, fields in rds.xrange(QueueKeys.of(app.namespace, "default").stream("normal")):
            opts = json.loads(fields[b"m"]).get("opts", {})
            moment = datetime.fromtimestamp(opts["tick"] / 1000, tz=rome)
            fired[opts["schedule"]].append(moment.isoformat())
    spring = [t for t in fired["hourly"] if t.startswith("2026-03-29")]
    autumn = [t for t in fired["hourly"] if t.startswith("2026-10-25")]
    assert len(spring) == 23  # 02:00 does not exist that day
    assert len(autumn) == 25  # 02:00 happens twice, an hour apart
    assert "2026-10-25T02:00:00+02:00" in autumn and "2026-10-25T02:00:00+01:00" in autumn
    # a fixed-time job: at the change when its time is skipped, once when it repeats
    nightly = [t for t in fired["nightly"] if t[:10] in ("2026-03-29", "2026-10-25")]
    assert nightly == ["2026-03-29T03:00:00+02:00", "2026-10-25T02:30:00+02:00"]


async def test_missed_tick_policies(app: Tether, rds: redis.Redis) -> None:
    @app.periodic(every=60, missed="latest", name="latest")
    @app.periodic(every=60, missed="skip", name="skip")
    @app.periodic(every=60, missed="catchup", catchup_limit=2, name="catchup")
    @app.task
    async def job() -> None: ...

    scheduler = Scheduler(app, loop_interval=0.1, leader_ttl=5.0)
    t0 = float(int(time.time() // 60 * 60))
    await scheduler.run_once(now=t0 + 1)  # first sight: nothing fires
    assert enqueued_ticks(rds, app.namespace) == []
    await scheduler.run_once(now=t0 + 60 * 4 + 30)  # no scheduler ran for four ticks
    keys = QueueKeys.of(app.namespace, "default")
    by_schedule: dict[str, list[int]] = {}
    for _, fields in rds.xrange(keys.stream("normal")):
        opts = json.loads(fields[b"m"]).get("opts", {})
        by_schedule.setdefault(opts["schedule"], []).append(opts["tick"])
    base = int(t0 * 1000)
    assert by_schedule == {
        "latest": [base + 240_000],
        "catchup": [base + 180_000, base + 240_000],
    }


async def test_first_sight_fires_only_with_run_at_startup(app: Tether, rds: redis.Redis) -> None:
    @app.periodic(cron="0 0 1 1 *", name="yearly", run_at_startup=True)
    @app.periodic(cron="0 0 1 1 *", name="quiet")
    @app.task
    async def job() -> None: ...

    scheduler = Scheduler(app, loop_interval=0.1, leader_ttl=5.0)
    await scheduler.run_once()
    await scheduler.run_once()
    keys = QueueKeys.of(app.namespace, "default")
    fired = [
        json.loads(f[b"m"]).get("opts", {})["schedule"]
        for _, f in rds.xrange(keys.stream("normal"))
    ]
    assert fired == ["yearly"]


async def test_no_overlap_skips_ticks_while_the_previous_run_is_active(
    app: Tether, rds: redis.Redis
) -> None:
    @app.periodic(every=1.0, overlap=False, name="exclusive")
    @app.task
    async def exclusive() -> None: ...

    scheduler = Scheduler(app, loop_interval=0.1, leader_ttl=5.0)
    t = float(int(time.time()))
    for step in range(5):  # no worker: the first run stays queued
        await scheduler.run_once(now=t + step)
    assert len(enqueued_ticks(rds, app.namespace)) == 1
    async with running_worker(app, scheduler=False):
        await asyncio.sleep(0.3)
    await scheduler.run_once(now=t + 6)
    assert len(enqueued_ticks(rds, app.namespace)) == 1  # the next run, once the first ended


async def test_runtime_control_is_seen_by_the_leader_in_another_process(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, schedulers: list[SchedulerProcess]
) -> None:
    from tests.apps import sched

    app = Tether(url, namespace=namespace)
    app.tasks.update(sched.app.tasks)
    app.declared_schedules += sched.app.declared_schedules
    report = sched.report
    schedulers.append(SchedulerProcess(url, namespace, tmp_path, 0))
    async with app:
        with pytest.raises(ConfigError, match="invalid cron expression"):
            await app.schedules.add(report, cron="61 * * * *")
        with pytest.raises(ConfigError, match="unknown time zone"):
            await app.schedules.add(report, cron="* * * * *", tz="Mars/Olympus")
        with pytest.raises(ConfigError, match="every=0"):
            await app.schedules.add(report, every=0)
        assert rds.hlen(f"{{{namespace}:scheduler}}:defs") == 0
        await app.schedules.add(
            report, every=timedelta(milliseconds=500), args=("live",), name="live"
        )
        await asyncio.to_thread(wait_until, lambda: enqueued_ticks(rds, namespace, "live"), 10)
        await app.schedules.pause("live")
        await asyncio.sleep(0.5)
        paused_count = len(enqueued_ticks(rds, namespace, "live"))
        await asyncio.sleep(1.2)
        assert len(enqueued_ticks(rds, namespace, "live")) == paused_count
        handle = await app.schedules.trigger("live")
        assert handle.queue == "default"
        await app.schedules.resume("live")
        await asyncio.to_thread(
            wait_until, lambda: len(enqueued_ticks(rds, namespace)) > paused_count, 10
        )
        leader = await app.schedules.leader()
        assert leader is not None and f"-{schedulers[0].pid}:" in leader
        infos = {i.schedule.name: i for i in await app.schedules.list()}
        assert set(infos) == {"beat", "live"}
        assert infos["live"].source == "runtime" and infos["beat"].source == "code"
        assert infos["live"].last_outcome == "queued"
        assert infos["live"].next_run is not None
        assert await app.schedules.remove("live") is True
        with pytest.raises(ConfigError, match="declared in code"):
            await app.schedules.remove("beat")
    env = {"TETHER_URL": url, "TETHER_NAMESPACE": namespace}
    result = await asyncio.to_thread(
        CliRunner(env=env).invoke,
        __import__("tether.cli").cli.main,
        ["schedules", "tests.apps.sched:app"],
    )
    assert result.exit_code == 0, result.output
    assert "beat" in result.output and "leader:" in result.output


def test_declaration_errors() -> None:
    app = Tether("redis://localhost:1")

    @app.task
    async def job() -> None: ...

    with pytest.raises(ConfigError, match="invalid cron expression"):
        app.periodic(cron="every day")(job)
    with pytest.raises(ConfigError, match="unknown time zone 'Nowhere/Else'"):
        app.periodic(cron="0 * * * *", tz="Nowhere/Else")(job)
    with pytest.raises(ConfigError, match="every=-1"):
        app.periodic(every=-1)(job)
    with pytest.raises(ConfigError, match="exactly one of cron= or every="):
        app.periodic()(job)
    with pytest.raises(ConfigError, match=r"apply @app\.periodic on top of @app\.task"):
        app.periodic(every=1)(lambda: None)  # type: ignore[arg-type]
    other = Tether("redis://localhost:1")

    @other.task(name="elsewhere")
    async def foreign() -> None: ...

    with pytest.raises(ConfigError, match="does not know"):
        app.periodic(every=1)(foreign)
    assert app.declared_schedules == []
    assert Schedule(name="n", task="t", every=timedelta(minutes=5)).spec == "every 5m"


def test_workers_run_the_scheduler_unless_told_not_to(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path
) -> None:
    from ..helpers import WorkerProcess

    leader_key = f"{{{namespace}:scheduler}}:leader"
    quiet = WorkerProcess(
        url, namespace, "quiet", app="tests.apps.sched:app", log_dir=tmp_path, no_scheduler=True
    )
    try:
        quiet.wait_ready(rds)
        time.sleep(1.0)
        assert rds.get(leader_key) is None
        busy = WorkerProcess(url, namespace, "busy", app="tests.apps.sched:app", log_dir=tmp_path)
        try:
            busy.wait_ready(rds)
            wait_until(lambda: (rds.get(leader_key) or b"").startswith(b"busy:"), timeout=10)
            # the worker's scheduler enqueues "beat" every second and the workers run it
            wait_until(
                lambda: (
                    "fired" in busy.log() or rds.hlen(QueueKeys.of(namespace, "default").schedules)
                ),
                10,
            )
            keys = QueueKeys.of(namespace, "default")
            wait_until(lambda: rds.hget(keys.schedules, "beat"), timeout=10)
            busy.signal(signal.SIGTERM)
            assert busy.wait(20) == 0
            assert rds.get(leader_key) is None  # resigned at shutdown
        finally:
            busy.kill_now()
    finally:
        quiet.kill_now()


async def test_a_schedule_that_fails_to_fire_is_named_once_and_the_others_keep_firing(
    app: Tether, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """The scheduler used to swallow every exception: one broken schedule was silent, and
    nothing showed it in `tether schedules`."""

    @app.periodic(every=60, name="good")
    @app.periodic(every=60, name="bad")
    @app.task
    async def job() -> None: ...

    keys = QueueKeys.of(app.namespace, "default")
    rds.hset(keys.schedules, "bad", "garbage")  # a tick marker no release writes
    scheduler = Scheduler(app, loop_interval=0.1, leader_ttl=5.0)
    t0 = float(int(time.time() // 60 * 60))
    with caplog.at_level(logging.ERROR, logger="tether.scheduler"):
        for minute in range(3):
            await scheduler.run_once(now=t0 + 1 + 60 * minute)
    base = int(t0 * 1000)
    assert enqueued_ticks(rds, app.namespace, "good") == [base + 60_000, base + 120_000]
    assert enqueued_ticks(rds, app.namespace, "bad") == []
    reports = [r for r in caplog.records if "schedule bad" in r.getMessage()]
    assert len(reports) == 1, [r.getMessage() for r in reports]
    infos = {i.schedule.name: i for i in await app.schedules.list()}
    assert infos["bad"].error is not None and "ValueError" in infos["bad"].error
    assert infos["good"].error is None
    rds.hdel(keys.schedules, "bad")  # healed
    with caplog.at_level(logging.INFO, logger="tether.scheduler"):
        await scheduler.run_once(now=t0 + 1 + 60 * 3)
    assert "schedule bad works again" in caplog.text
    infos = {i.schedule.name: i for i in await app.schedules.list()}
    assert infos["bad"].error is None
    await scheduler.resign()
