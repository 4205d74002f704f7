"""The heartbeat: a thread with its own connection that keeps this worker's leases alive.

A thread, not a coroutine, so a task that blocks the event loop with CPU work does not cost
the worker its lease (and its tasks). The loop proves it is alive by ticking; when it has not
ticked for ``stall_timeout``, the thread stops renewing, so a deadlocked worker releases
its tasks to the fleet instead of holding them forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from redis.exceptions import RedisError

from .._redis import SyncClient, close_sync
from ..scripts import RELEASE, RENEW
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
        counters: WorkerCounters,
    ) -> None:
        self._client_factory = client_factory
        self._client: SyncClient | None = None
        self._leases = tuple(leases)
        self._token = token
        self._interval = interval
        self._ttl_ms = int(ttl * 1000)
        self._stall_timeout = stall_timeout
        self._last_tick = last_tick
        self._on_cancel = on_cancel
        self._counters = counters
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._stalled = False
        self._failing = False
        self.renewals = 0

    def _conn(self) -> SyncClient:
        if self._client is None:
            self._client = self._client_factory()
        return self._client

    def renew(self) -> bool:
        """Renew every lease once. Returns False when the server could not be reached."""
        with self._lock:
            try:
                client = self._conn()
                for lease_key, cancel_key in self._leases:
                    previous, cancels = RENEW.run_sync(
                        client, [lease_key, cancel_key], [self._token, self._ttl_ms]
                    )
                    self._check_previous(lease_key, previous)
                    if cancels:
                        self._on_cancel([c.decode() for c in cancels])
                self.renewals += 1
            except RedisError as exc:
                if not self._failing:
                    log.warning(
                        "heartbeat cannot reach Redis (%s); retrying every %.1fs",
                        exc,
                        self._interval,
                    )
                self._failing = True
                return False
            if self._failing:
                log.info("heartbeat reconnected; leases renewed")
            self._failing = False
            return True

    def _check_previous(self, lease_key: str, previous: bytes | None) -> None:
        if self.renewals == 0:
            if previous is not None and previous.decode() != self._token:
                log.warning(
                    "lease %s was held by an earlier process with this worker's name; taking over",
                    lease_key,
                )
            return
        if previous is None:
            self._counters.lease_lapses += 1
            log.warning(
                "lease %s had expired before it was renewed: other workers may have claimed "
                "this worker's tasks (their acks here will be refused)",
                lease_key,
            )
        elif previous.decode() != self._token:
            log.error("lease %s is held by another live process with this worker's name", lease_key)

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
                try:
                    client = self._conn()
                    for lease_key, _ in self._leases:
                        RELEASE.run_sync(client, [lease_key], [self._token])
                except RedisError as exc:
                    log.warning("could not delete the leases (%s); they expire on their own", exc)
            if self._client is not None:
                close_sync(self._client)
                self._client = None
