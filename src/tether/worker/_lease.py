"""The heartbeat: a thread with its own connection that keeps this worker's leases alive and
publishes its record in the worker registry.

A thread, not a coroutine, so a task that blocks the event loop with CPU work does not cost
the worker its lease (and its tasks). The loop proves it is alive by ticking; when it has not
ticked for ``stall_timeout``, the thread stops renewing, so a deadlocked worker releases
its tasks to the fleet instead of holding them forever.

The keeper also tells the worker whether its lease is *known to be held*: renewed within the
lease's time to live without finding it lapsed. A worker starts buffered entries and claims
other workers' entries only while it is; when a renewal finds the lease lapsed (the process
was frozen, the server was away or full), the worker drops what it buffered, since others
may have claimed it, and takes up again what is still its own.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from redis.exceptions import RedisError

from ..base._faults import Fault, classify, describe_error, is_out_of_memory
from ..base._redis import SyncClient, close_sync
from ..protocol import scripts
from ..protocol._keys import KNOWN_QUEUES_TTL_MS
from ._state import WorkerCounters

log = logging.getLogger("tether.worker")


class LeaseKeeper:
    def __init__(
        self,
        *,
        client_factory: Callable[[], SyncClient],
        leases: Sequence[tuple[str, str]],
        token: str,
        interval: float,
        ttl: float,
        stall_timeout: float,
        last_tick: Callable[[], float],
        on_cancel: Callable[[list[str]], None],
        on_lapse: Callable[[float], None],
        counters: WorkerCounters,
        where: str,
        registry: tuple[str, str] | None = None,
        record: Callable[[], dict[str, Any]] | None = None,
        health_file: str | None = None,
        known_queues: str | None = None,
    ) -> None:
        self._client_factory = client_factory
        self._client: SyncClient | None = None
        self._leases = tuple(leases)
        self._token = token
        self._interval = interval
        self._ttl = ttl
        self._ttl_ms = int(ttl * 1000)
        self._stall_timeout = stall_timeout
        self._last_tick = last_tick
        self._on_cancel = on_cancel
        self._on_lapse = on_lapse
        self._counters = counters
        self._where = where
        self._registry = registry
        self._record = record
        self._known_queues = known_queues
        self._health_file = Path(health_file) if health_file else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stalled = False
        self._failing = False
        self._full = False
        self._registry_failing = False
        self.confirmed_at = float("-inf")
        """Monotonic time a renewal was sent that found every lease still ours."""
        self.renewals = 0
        self.fatal: BaseException | None = None
        """An error no retry can fix (a wrong password): the worker stops on it."""

    def held(self) -> bool:
        """The lease is known to be held: renewed within its ttl and found unbroken."""
        return time.monotonic() - self.confirmed_at < self._ttl

    def confirm(self, sent_at: float) -> None:
        """The worker has dealt with a lapse found by the renewal sent at ``sent_at``."""
        self.confirmed_at = max(self.confirmed_at, sent_at)

    def _conn(self) -> SyncClient:
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    def renew(self) -> bool:
        """Renew every lease once. Returns False when the server did not take it."""
        with self._lock:
            sent_at = time.monotonic()
            lapsed = False
            try:
                client = self._conn()
                for lease_key, cancel_key in self._leases:
                    reply = scripts.renew(
                        lease_key, cancel_key, self._token, self._ttl_ms
                    ).run_sync(client)
                    lapsed = self._check_previous(lease_key, reply.previous) or lapsed
                    if reply.cancels:
                        self._on_cancel(reply.cancels)
            except (RedisError, OSError) as exc:
                # Every reply but a fatal one is retried on the next beat, an unknown one
                # too: the heartbeat never stops on its own, the worker decides (``fatal``).
                if classify(exc, self._where) is Fault.FATAL:
                    self.fatal = exc
                    log.error("heartbeat: %s", describe_error(exc, self._where))
                else:
                    self._failed(exc)
                return False
            self.renewals += 1
            if lapsed:
                # Drop the buffer first (on the loop), then count the lease as held.
                self._on_lapse(sent_at)
            else:
                self.confirmed_at = sent_at
            if self._failing or self._full:
                log.info("heartbeat: leases renewed again")
            self._failing = self._full = False
        self._publish()
        self._touch_health_file()
        return True

    def _failed(self, exc: RedisError | OSError) -> None:
        if is_out_of_memory(exc):
            # Only a lapsed lease is written anew (SET), which a full server refuses: the
            # lease is gone and others may claim this worker's entries.
            self.confirmed_at = float("-inf")
            if not self._full:
                log.warning(
                    "heartbeat: this worker's lease lapsed and the server is full (maxmemory "
                    "reached with noeviction), so it cannot be written again; the worker "
                    "starts nothing new and claims nothing until memory frees"
                )
            self._full = True
            return
        if not self._failing:
            log.warning(
                "heartbeat: %s; retrying every %.1fs",
                describe_error(exc, self._where),
                self._interval,
            )
        self._failing = True

    def _check_previous(self, lease_key: str, previous: str | None) -> bool:
        """True when the lease had lapsed since the last renewal."""
        if self.renewals == 0:
            if previous is not None and previous != self._token:
                log.warning(
                    "lease %s was held by an earlier process with this worker's name; taking over",
                    lease_key,
                )
            return False
        if previous is None:
            self._counters.lease_lapses += 1
            log.warning(
                "lease %s had expired before it was renewed: other workers may have claimed "
                "this worker's entries; entries not yet started are dropped and this worker's "
                "own are taken up again",
                lease_key,
            )
            return True
        if previous != self._token:
            log.error("lease %s is held by another live process with this worker's name", lease_key)
        return False

    def _publish(self) -> None:
        """Write this worker's registry record; a failure here never affects the lease."""
        if self._registry is None or self._record is None:
            return
        index, prefix = self._registry
        record = self._record()
        name = str(record["name"])
        now_ms = int(time.time() * 1000)
        try:
            pipe: Any = self._conn().pipeline(transaction=False)
            pipe.set(prefix + name, json.dumps(record, separators=(",", ":")), px=self._ttl_ms)
            pipe.zadd(index, {name: now_ms})
            pipe.zremrangebyscore(index, "-inf", now_ms - 10 * self._ttl_ms)
            # Once no worker beats, the index empties within ten lease lifetimes anyway.
            pipe.pexpire(index, 10 * self._ttl_ms)
            if self._known_queues is not None:
                # In every beat, not once: a server restarted empty learns them again.
                pipe.zadd(self._known_queues, dict.fromkeys(record["queues"], 0))
                pipe.pexpire(self._known_queues, KNOWN_QUEUES_TTL_MS)
            pipe.execute()
            self._registry_failing = False
        except RedisError as exc:
            if not self._registry_failing:
                log.debug("cannot publish the registry record (%s)", exc)
            self._registry_failing = True

    def unpublish(self) -> None:
        if self._registry is None or self._record is None:
            return
        index, prefix = self._registry
        name = str(self._record()["name"])
        try:
            pipe: Any = self._conn().pipeline(transaction=False)
            pipe.delete(prefix + name)
            pipe.zrem(index, name)
            pipe.execute()
        except RedisError as exc:
            log.debug("cannot remove the registry record (%s); it expires", exc)

    def _touch_health_file(self) -> None:
        if self._health_file is None:
            return
        try:
            self._health_file.touch()
            os.utime(self._health_file)
        except OSError as exc:
            log.warning("cannot touch the health file %s (%s)", self._health_file, exc)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="tether-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_beat = time.monotonic() + self._interval
        while not self._stop.wait(max(0.0, next_beat - time.monotonic())):
            next_beat += self._interval
            now = time.monotonic()
            if now > next_beat:  # fell behind (suspended process): do not burst
                next_beat = now + self._interval
            silent = now - self._last_tick()
            if silent > self._stall_timeout:
                if not self._stalled:
                    log.error(
                        "event loop has not ticked for %.1fs (stall_timeout=%.1fs): stopping lease "
                        "renewal so other workers can take this worker's tasks",
                        silent,
                        self._stall_timeout,
                    )
                self._stalled = True
                continue
            if self._stalled:
                log.warning("event loop ticks again; renewing leases")
                self._stalled = False
            self.renew()

    def stop(self, release: bool) -> None:
        """Stop renewing; with ``release`` delete the leases (compare-and-delete) too."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._interval + 5)
        with self._lock:
            if release:
                self.unpublish()
                try:
                    client = self._conn()
                    for lease_key, _ in self._leases:
                        scripts.release(lease_key, self._token).run_sync(client)
                except RedisError as exc:
                    log.warning("could not delete the leases (%s); they expire on their own", exc)
            if self._client is not None:
                close_sync(self._client)
                self._client = None
