"""The scheduler: one leader among all instances enqueues each schedule's ticks.

Every worker runs one by default (``tether worker --no-scheduler`` opts out), or it runs
alone (``tether scheduler myapp:app``). Leadership is a lease with an expiry, extended only by
its holder and released only by its holder; a follower takes over within the lease TTL after
the leader dies. Leadership is an optimisation, not the guarantee: each tick is enqueued by the
``tick`` script, which refuses a tick already handled, so two instances that both believe they
lead still enqueue each tick once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..base._faults import Fault, classify, describe_error
from ..base._redis import text
from ..base._settings import PRIORITIES
from ..protocol import scripts
from ..protocol._envelope import Envelope
from ..protocol._keys import SchedulerKeys
from ._control import load_runtime, parse_marker, run_options, unreadable_marker

if TYPE_CHECKING:
    from ..base._redis import AsyncClient
    from ..base._schedule import Schedule
    from ..producer._core import Core

_SERVER_FAULTS = (Fault.TRANSIENT, Fault.FATAL, Fault.LOST)
"""Faults of the server as a whole: an unknown reply may be one schedule's (a key of the
wrong type), so it is reported against that schedule."""

log = logging.getLogger("tether.scheduler")


class Scheduler:
    """Runs the periodic schedules of an app; safe to run in many processes at once.

    ``loop_interval`` is how often the leader looks for due ticks (and the most a runtime
    change waits to be seen); ``leader_ttl`` how long a dead leader keeps the role.
    """

    def __init__(
        self,
        app: Core,
        *,
        loop_interval: float = 0.5,
        leader_ttl: float = 10.0,
        identity: str | None = None,
        clock: Callable[[], float] = time.time,
        client: AsyncClient | None = None,
    ) -> None:
        if not 0 < loop_interval < leader_ttl / 2:
            raise ValueError("loop_interval must be above zero and below half of leader_ttl")
        self.app = app
        self.loop_interval = loop_interval
        self.leader_ttl = leader_ttl
        host = socket.gethostname().split(".")[0]
        self.holder = f"{identity or f'{host}-{os.getpid()}'}:{secrets.token_hex(4)}"
        self.keys = SchedulerKeys.of(app.namespace)
        self._clock = clock
        self._client = client
        self.is_leader = False
        self._renew_at = 0.0
        self._version: Any = b"-"
        self._schedules: list[Schedule] = []
        self._paused: set[str] = set()
        self._markers: dict[str, int | None] = {}
        self._next: dict[str, int] = {}
        # What has been logged as broken (name -> reason), so each problem is logged once
        # and cleared when the schedule works again.
        self._reported: dict[str, str] = {}
        self.fired = 0

    @property
    def client(self) -> AsyncClient:
        """The connection it uses: its own when given one, else the app's."""
        return self._client if self._client is not None else self.app.client

    # -- running ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set, then give up the leadership."""
        failures = 0
        try:
            while not stop.is_set():
                try:
                    await self.run_once()
                    failures = 0
                except Exception as exc:
                    if classify(exc) is Fault.INTERNAL:
                        # A bug here must not stop the worker that hosts the scheduler, nor
                        # pass unnoticed: log it, step down, and try again on the next pass.
                        log.exception("scheduler pass failed; retrying")
                        await self.resign()
                    else:
                        # The server, not the schedules (a lost connection, a failover, a
                        # BUSY script): said once; the leadership lapses and is taken again.
                        failures += 1
                        if failures == 1:
                            log.warning(
                                "scheduler: %s; retrying",
                                describe_error(exc, self.app.target.redacted),
                            )
                        self._lose("the server is unavailable")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.loop_interval)
        finally:
            await self.resign()

    async def run_once(self, now: float | None = None) -> None:
        """One pass: keep or take the leadership, then fire what is due (as the leader).
        ``now`` (unix seconds) lets tests inject time."""
        wall = self._clock() if now is None else now
        mono = time.monotonic()
        if mono >= self._renew_at or not self.is_leader:
            await self._lead()
            self._renew_at = mono + min(self.leader_ttl / 3, 1.0)
        if self.is_leader:
            await self._reload()
            await self._fire_due(int(wall * 1000))

    async def resign(self) -> None:
        """Give up the leadership (compare-and-delete), so a follower takes over at once."""
        if self.is_leader:
            try:
                await scripts.release(self.keys.leader, self.holder).run(self.client)
            except Exception as exc:
                if classify(exc) is Fault.INTERNAL:
                    raise
                # the leadership expires on its own
            self._lose("resigned")

    async def _lead(self) -> None:
        leads = await scripts.lead(self.keys.leader, self.holder, int(self.leader_ttl * 1000)).run(
            self.client
        )
        if leads and not self.is_leader:
            log.info("scheduler %s is now the leader", self.holder)
            self._version = b"-"  # reload everything and re-read the markers
            self._markers.clear()
            self._next.clear()
            # Problems recorded by an earlier leader are cleared by this one when they heal.
            recorded: Any = await self.client.hgetall(self.keys.errors)
            self._reported = {text(k): text(v) for k, v in recorded.items()}
        elif not leads and self.is_leader:
            self._lose("another instance holds the leadership")
        self.is_leader = leads

    def _lose(self, why: str) -> None:
        if self.is_leader:
            log.info("scheduler %s is no longer the leader: %s", self.holder, why)
        self.is_leader = False
        self._markers.clear()
        self._next.clear()

    async def _reload(self) -> None:
        version: Any = await self.client.get(self.keys.version)
        if version == self._version:
            return
        runtime = await load_runtime(self.app, self.keys, self.client)
        for name, reason in runtime.invalid.items():
            await self._report(name, reason)
        declared = list(self.app.declared_schedules)
        names = {s.name for s in declared}
        self._schedules = declared + [s for s in runtime.schedules if s.name not in names]
        self._paused = runtime.paused
        self._version = version
        self._next.clear()

    # -- ticks --------------------------------------------------------------------------

    async def _fire_due(self, now_ms: int) -> None:
        for schedule in self._schedules:
            if now_ms < self._next.get(schedule.name, 0):
                continue
            try:
                if schedule.name not in self._markers:
                    self._markers[schedule.name] = await self._read_marker(schedule)
                await self._handle(schedule, now_ms)
                marker = self._markers.get(schedule.name)
                if marker is not None:
                    # Inside the try: a tick no datetime holds is this schedule's problem,
                    # not a failed pass that stops every schedule after it.
                    self._next[schedule.name] = next(schedule.ticks_after(max(marker, now_ms)))
            except Exception as exc:
                if classify(exc) in _SERVER_FAULTS:
                    raise  # the server, not the schedule: the pass is retried as a whole
                # One broken schedule (a task this process does not know, a bad argument)
                # must not stop the others: name it, once, and try it again next tick.
                await self._report(schedule.name, f"{type(exc).__name__}: {exc}", exc)
                self._next[schedule.name] = now_ms + int(self.loop_interval * 1000)
                continue
            if schedule.name in self._reported:
                del self._reported[schedule.name]
                await self.client.hdel(self.keys.errors, schedule.name)
                log.info("schedule %s works again", schedule.name)

    async def _report(self, name: str, reason: str, exc: BaseException | None = None) -> None:
        if self._reported.get(name) == reason:
            return
        self._reported[name] = reason
        log.error("schedule %s: %s", name, reason, exc_info=exc)
        # Shown by `tether schedules`; written only when a new problem appears.
        await self.client.hset(self.keys.errors, name, reason[:1000])

    async def _read_marker(self, schedule: Schedule) -> int | None:
        """The last tick handled. A marker no Tether writes (a time past the year 9999, not
        UTF-8, no tick) raises: the schedule is reported and waits, rather than firing
        from a made-up time or never again without a word, and the others fire on."""
        key = self.app.keys(schedule.queue).schedules
        raw = await self.client.hget(key, schedule.name)
        if raw is None:
            return None
        try:
            return parse_marker(raw)[0]
        except ValueError as exc:
            raise ValueError(unreadable_marker(key, schedule.name, exc)) from None

    async def _handle(self, schedule: Schedule, now_ms: int) -> None:
        marker = self._markers.get(schedule.name)
        if marker is None:
            # First sight (a first deploy, an empty Redis): do not fire every past tick.
            if schedule.run_at_startup:
                await self._tick(schedule, [(now_ms, True)])
            else:
                latest = schedule.latest_tick_at_or_before(now_ms)
                await self._tick(schedule, [(latest if latest is not None else now_ms, False)])
            return
        limit = schedule.catchup_limit if schedule.missed == "catchup" else 1
        ticks, more = schedule.due(marker, now_ms, limit)
        if not ticks:
            return
        if schedule.name in self._paused:
            await self._tick(schedule, [(ticks[-1], False)], why="paused")
            return
        if more or len(ticks) > 1:
            log.warning(
                "schedule %s missed ticks while no scheduler ran; policy %r",
                schedule.name,
                schedule.missed,
            )
        if schedule.missed == "skip" and now_ms - ticks[-1] > schedule.grace * 1000:
            await self._tick(schedule, [(ticks[-1], False)], why="missed")
            return
        await self._tick(schedule, [(t, True) for t in ticks])

    async def _tick(
        self, schedule: Schedule, ticks: list[tuple[int, bool]], why: str = "missed"
    ) -> None:
        """Hand ``ticks`` (tick ms, whether to fire it) to the tick script; a tick not
        fired is recorded as skipped for ``why`` ('paused', 'missed')."""
        keys = self.app.keys(schedule.queue)
        prepared: list[tuple[int, str, bytes, str]] = []
        for tick, fire in ticks:
            task_id = schedule.task_id(self.app.namespace, tick)
            payload = b""
            if fire:
                env = Envelope(
                    task_id,
                    schedule.task,
                    list(schedule.args),
                    dict(schedule.kwargs),
                    int(self._clock() * 1000),
                    1,
                    run_options(schedule, tick),
                )
                payload = env.encode(self.app.serializer)
            prepared.append((tick, task_id, payload, "" if fire else why))
        results = await scripts.tick(
            keys,
            schedule.name,
            schedule.overlap,
            PRIORITIES.index(schedule.priority) + 1,
            schedule.backoff is not None,
            prepared,
        ).run(self.client)
        for (tick, _), state in zip(ticks, results, strict=True):
            if state.startswith("backoff:"):
                _, failures, until = state.split(":")
                log.info(
                    "schedule %s skipped tick %d: in backoff after %s failed run%s in a row, "
                    "until %s",
                    schedule.name,
                    tick,
                    failures,
                    "" if failures == "1" else "s",
                    _utc(int(until)),
                )
            elif state == "enqueued":
                self.fired += 1
                log.info("schedule %s fired for tick %d", schedule.name, tick)
            elif state == "overlap":
                log.info(
                    "schedule %s skipped tick %d: its previous run is still active",
                    schedule.name,
                    tick,
                )
        self._markers[schedule.name] = max(t for t, _ in ticks)


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
