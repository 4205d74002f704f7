"""A periodic task whose runs keep failing rests for growing delays: its ticks are skipped
(and recorded as such) until the delay ends, a success ends the backoff, a reset ends it, and
a run triggered by hand goes through it. Real scheduler, real worker, real server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import redis

from tether import ScheduleBackoff, Tether
from tether.protocol._envelope import Envelope
from tether.protocol._keys import QueueKeys
from tether.scheduler import Scheduler, TickRecord
from tether.scheduler._control import tick_record

from ..helpers import WorkerProcess, eventually, running_worker, wait_until
from .test_scheduler import SchedulerProcess

pytestmark = pytest.mark.compat  # the tick and settle scripts, on every server kind

FAILING = ScheduleBackoff(initial=1, factor=2, cap=4)
"""Delays of 1 s, 2 s, then 4 s (the cap) after one, two, three failures in a row."""


@contextlib.asynccontextmanager
async def scheduling(app: Tether) -> AsyncIterator[Scheduler]:
    """The app's scheduler, leading on this event loop, checking for due ticks every 50 ms."""
    scheduler = Scheduler(app, loop_interval=0.05, leader_ttl=5.0)
    stop = asyncio.Event()
    task = asyncio.create_task(scheduler.run(stop))
    try:
        yield scheduler
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def runs(records: list[TickRecord]) -> list[TickRecord]:
    return [r for r in records if r.outcome in ("succeeded", "failed", "dead")]


def check_rests(records: list[TickRecord]) -> list[int]:
    """Check every skipped tick against the rest it fell in: each 'backoff' tick is due
    before the end of the rest of the failure before it, and the first tick run after a
    failure is due at or after that end. Returns the number of ticks skipped per rest."""
    oldest_first = list(reversed(records))
    skipped: list[int] = []
    rest_end: datetime | None = None
    for record in oldest_first:
        if record.outcome == "failed":
            assert record.until is not None
            rest_end = record.until
            skipped.append(0)
        elif record.outcome == "backoff":
            assert rest_end is not None and record.tick is not None
            assert record.tick < rest_end, record
            assert record.until == rest_end
            skipped[-1] += 1
        elif record.outcome == "enqueued" and rest_end is not None:
            assert record.tick is not None and record.tick >= rest_end, record
            rest_end = None
    return skipped


async def test_failing_runs_rest_for_growing_delays_and_a_success_ends_it(
    app: Tether, rds: redis.Redis
) -> None:
    healthy = asyncio.Event()

    @app.periodic(every=0.25, name="flaky-report", backoff=FAILING)
    @app.task(retries=0)
    async def report() -> None:
        if not healthy.is_set():
            raise ConnectionError("the reporting service is down")

    async with running_worker(app, scheduler=False), scheduling(app):

        async def failures_recorded(n: int) -> bool:
            return len([r for r in await app.schedules.ticks("flaky-report", 100)
                        if r.outcome == "failed"]) >= n  # fmt: skip

        await eventually(lambda: failures_recorded(3), timeout=20)
        state = await app.schedules.backoff("flaky-report")
        assert state is not None and state.failures == 3 and state.resting()
        (info,) = await app.schedules.list()
        assert info.backoff == state
        # The next run is the first tick at or after the end of the rest.
        assert info.next_run is not None and info.next_run >= state.until
        healthy.set()
        await eventually(
            lambda: _outcomes_include(app, "succeeded"), timeout=state.failures * 4 + 5
        )
        assert await app.schedules.backoff("flaky-report") is None
        # After the success, every tick runs again.
        await asyncio.sleep(1.0)
    records = await app.schedules.ticks("flaky-report", 100)
    failed = [r for r in runs(records) if r.outcome == "failed"]
    failed.reverse()
    assert [r.failures for r in failed[:3]] == [1, 2, 3]
    # The rests grow 1 s, 2 s, 4 s from the failure that starts each.
    for record, delay in zip(failed, (1.0, 2.0, 4.0), strict=False):
        assert record.until is not None
        assert abs((record.until - record.at).total_seconds() - delay) < 0.1, record
    skipped = check_rests(records)
    # Four ticks a second: about 4, 8 and 16 ticks skipped by the three rests (one less
    # when a run took its time to fail).
    assert skipped[0] >= 3 and skipped[1] >= 7 and skipped[2] >= 15, skipped
    after_success = list(reversed(records))
    first_ok = next(i for i, r in enumerate(after_success) if r.outcome == "succeeded")
    later = [r.outcome for r in after_success[first_ok:]]
    assert "backoff" not in later and later.count("enqueued") >= 3, later
    keys = QueueKeys.of(app.namespace, "default")
    assert rds.hget(keys.backoff, "flaky-report") is None


async def _outcomes_include(app: Tether, outcome: str) -> bool:
    return any(r.outcome == outcome for r in await app.schedules.ticks("flaky-report", 100))


async def test_reset_and_trigger_during_backoff_and_pause_stays_apart(
    app: Tether, rds: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    outcome = {"fail": True}

    @app.periodic(every=0.25, name="nightly", backoff=ScheduleBackoff(initial=3600, cap=3 * 3600))
    @app.task(retries=0)
    async def nightly() -> str:
        if outcome["fail"]:
            raise ValueError("bad input file")
        return "done"

    async with running_worker(app, scheduler=False), scheduling(app):
        await eventually(lambda: app.schedules.backoff("nightly"), timeout=10)
        state = await app.schedules.backoff("nightly")
        assert state is not None and state.failures == 1
        assert (
            timedelta(minutes=59) < state.until - datetime.now(timezone.utc) < timedelta(minutes=61)
        )
        # Pausing and resuming leave the backoff alone.
        await app.schedules.pause("nightly")
        await app.schedules.resume("nightly")
        assert await app.schedules.backoff("nightly") == state
        # A run triggered by hand goes through the backoff, says so, and its failure
        # counts: the rest grows.
        with caplog.at_level("WARNING", logger="tether.scheduler"):
            handle = await app.schedules.trigger("nightly")
        assert "during its backoff (1 failed run in a row" in caplog.text
        assert handle.id in caplog.text
        await eventually(lambda: _failures_at_least(app, "nightly", 2), timeout=10)
        state = await app.schedules.backoff("nightly")
        assert state is not None and state.until - datetime.now(timezone.utc) > timedelta(
            minutes=119
        )
        # A reset ends it: the next tick runs (and fails again: one failure in a row).
        before = len([r for r in await app.schedules.ticks("nightly", 100)
                      if r.outcome == "enqueued"])  # fmt: skip
        assert await app.schedules.reset_backoff("nightly") is True
        assert await app.schedules.reset_backoff("nightly") is False

        async def ran_again() -> bool:
            enqueued = [r for r in await app.schedules.ticks("nightly", 100)
                        if r.outcome == "enqueued"]  # fmt: skip
            return len(enqueued) > before

        await eventually(ran_again, timeout=5)
        await eventually(lambda: _failures_at_least(app, "nightly", 1), timeout=10)
        # A triggered run that succeeds ends the backoff.
        outcome["fail"] = False
        handle = await app.schedules.trigger("nightly")
        assert await handle.result(timeout=10) == "done"
        await eventually(lambda: _no_backoff(app, "nightly"), timeout=5)
    manual = [r for r in await app.schedules.ticks("nightly", 100) if r.tick is None]
    assert {r.outcome for r in manual} == {"failed", "succeeded"}


async def _failures_at_least(app: Tether, name: str, n: int) -> bool:
    state = await app.schedules.backoff(name)
    return state is not None and state.failures >= n


async def _no_backoff(app: Tether, name: str) -> bool:
    return await app.schedules.backoff(name) is None


async def test_backoff_off_fires_every_tick_and_the_state_is_forgotten(
    app: Tether, rds: redis.Redis
) -> None:
    @app.periodic(every=0.25, name="plain", backoff=False)
    @app.periodic(every=0.25, name="forgetful",
                  backoff=ScheduleBackoff(initial=30, forget_after=1.5))  # fmt: skip
    @app.task(retries=0)
    async def broken() -> None:
        raise RuntimeError("always")

    async with running_worker(app, scheduler=False), scheduling(app):
        await eventually(lambda: app.schedules.backoff("forgetful"), timeout=10)
        await asyncio.sleep(1.0)
        plain = await app.schedules.ticks("plain", 100)
        assert "backoff" not in {r.outcome for r in plain}
        assert [r.outcome for r in plain].count("failed") >= 3
        assert all(r.failures is None for r in plain)  # no state kept for it
        assert await app.schedules.backoff("plain") is None
        # A day without failure in production; 1.5 s here: the rest ends with it.
        await eventually(lambda: _no_backoff(app, "forgetful"), timeout=5)
        started = time.monotonic()

        async def ran_again() -> bool:
            records = await app.schedules.ticks("forgetful", 100)
            return [r.outcome for r in records if r.outcome != "backoff"][:1] == ["failed"] and (
                len([r for r in records if r.outcome == "failed"]) >= 2
            )

        await eventually(ran_again, timeout=5)
        assert time.monotonic() - started < 5


@pytest.mark.primary_kind  # timed, with processes; its scripts run on both kinds above
def test_a_leader_killed_mid_backoff_leaves_the_rest_to_the_next_leader(
    url: str, namespace: str, rds: redis.Redis, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """Two scheduler processes and a worker process: the schedule fails and rests 4 s; the
    leader is SIGKILLed during the rest; the new leader skips the rest's remaining ticks and
    the next failure counts as the second in a row (the rest doubles)."""
    leader_key = f"{{{namespace}:scheduler}}:leader"
    keys = QueueKeys.of(namespace, "default")
    schedulers = [
        SchedulerProcess(url, namespace, tmp_path, n, app="tests.apps.sched_failing:app")
        for n in range(2)
    ]
    try:
        workers.append(
            WorkerProcess(
                url,
                namespace,
                "w1",
                app="tests.apps.sched_failing:app",
                log_dir=tmp_path,
                extra=["--no-scheduler"],
            )
        )
        state = wait_until(lambda: _state(rds, keys), timeout=20)
        assert state[0] == 1
        leader = rds.get(leader_key)
        assert leader is not None
        victim = next(p for p in schedulers if p.holds(leader))
        victim.kill()
        killed_at = datetime.now(timezone.utc)
        wait_until(lambda: rds.get(leader_key) not in (None, leader), timeout=10)
        # The rest ends; the next tick runs, fails, and the rest doubles.
        second = wait_until(lambda: (s := _state(rds, keys)) and s[0] == 2 and s, timeout=20)
        assert second[1] - second[2] == pytest.approx(8000, abs=100)
    finally:
        for proc in schedulers:
            proc.close()
    log = rds.xrevrange(keys.tick_log("failing-beat"))
    records = [tick_record(entry_id, fields) for entry_id, fields in log]  # newest first
    skipped = check_rests(records)
    assert skipped[0] >= 6, skipped  # a 4 s rest of half-second ticks
    after_kill = [r for r in records if r.outcome == "backoff" and r.at > killed_at]
    assert after_kill, "the new leader skipped none of the rest's ticks"
    assert all(r.failures == 1 for r in after_kill)


def _state(rds: redis.Redis, keys: QueueKeys) -> tuple[int, int, int] | None:
    """(failures, until ms, when it was written in ms) of the schedule's backoff."""
    raw = rds.hget(keys.backoff, "failing-beat")
    if raw is None:
        return None
    failures, until, forget = (int(p) for p in raw.split(b"|"))
    return failures, until, forget - 86_400_000


async def test_a_malformed_state_or_policy_loses_no_tick_and_no_task(
    app: Tether, rds: redis.Redis
) -> None:
    """A backoff state no Tether wrote is dropped (the ticks run), and a run whose envelope
    carries a malformed policy goes to the dead letters naming it."""

    @app.periodic(every=0.25, name="tidy")
    @app.task(retries=0)
    async def tidy() -> str:
        return "ok"

    keys = QueueKeys.of(app.namespace, "default")
    rds.hset(keys.backoff, "tidy", "3|not-a-time")
    async with running_worker(app, scheduler=False), scheduling(app):

        async def succeeded() -> bool:
            records = await app.schedules.ticks("tidy", 100)
            return any(r.outcome == "succeeded" for r in records)

        await eventually(succeeded, timeout=10)
        assert rds.hget(keys.backoff, "tidy") is None
        # A run of the schedule with a policy no Tether writes (by hand, or a bug).
        forged = Envelope("", tidy.name, [], {}, int(time.time() * 1000), 1,
                          {"schedule": "tidy", "backoff": "1|2|3"})  # fmt: skip
        payload = forged.encode(app.serializer)
        rds.xadd(keys.streams[1], {"m": payload})

        async def dead() -> bool:
            return rds.xlen(keys.dead) == 1

        await eventually(dead, timeout=10)
    (entry,) = rds.xrange(keys.dead)
    assert b"backoff='1|2|3'" in entry[1][b"reason"], entry[1][b"reason"]
    assert rds.hget(keys.backoff, "tidy") is None
