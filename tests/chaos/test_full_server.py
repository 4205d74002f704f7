"""A full server: ``maxmemory`` reached under ``noeviction`` (the policy Tether asks for)
while two workers hold running and buffered tasks, delayed tasks fall due, a task fails
for good and another asks for a retry.

The promises: enqueue raises an EnqueueError that names the cause; live workers keep
their leases (nobody takes their tasks, nothing runs twice, nothing is quarantined); they
keep settling what they hold, dead letters and retries included; no worker exits; and
everything resumes once memory frees.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis

from tether import EnqueueError

from ..helpers import wait_until
from ._harness import DOOMED, FLAKY, GATED, Chaos, named

pytestmark = [pytest.mark.chaos, pytest.mark.compat]


def fill(client: redis.Redis) -> int:
    """Write until the server refuses; returns the keys written. Large values first, then
    small ones: a refused large write leaves the memory just under the limit (its request
    buffer is freed), a refused small one leaves it over."""
    n = 0
    for size in (65536, 64):
        try:
            while True:
                client.set(f"filler:{n}", b"x" * size)
                n += 1
        except redis.exceptions.OutOfMemoryError:
            pass
    return n


class LeaseWatch:
    """Checks, every 20 ms, that every live worker's lease exists."""

    def __init__(self, chaos: Chaos, leases: list[str]) -> None:
        self._client = redis.Redis.from_url(named(chaos.url, "chaos-leases"))
        self._leases = leases
        self.missing: list[str] = []
        self.checks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LeaseWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for lease in self._leases:
                if not self._client.exists(lease):
                    self.missing.append(lease)
            self.checks += 1


def test_a_full_server_refuses_enqueues_clearly_and_robs_no_worker(
    chaos: Chaos, fresh: object
) -> None:
    proc = fresh("--maxmemory", "16mb", "--maxmemory-policy", "noeviction")  # type: ignore[operator]
    chaos.attach(proc.url)
    chaos.close_gate()
    # Leases of 2 s: a worker starved of CPU on a loaded machine must not lose its lease
    # for that reason (a lapsed lease cannot be written again while the server is full).
    fleet = [
        chaos.worker(f"w{i}", concurrency=8, max_pending=16, heartbeat_ttl=2.0) for i in range(2)
    ]
    for w in fleet:
        w.wait_ready(chaos.admin)
    held = chaos.enqueue([f"held{i}" for i in range(26)], task=GATED)
    doomed = chaos.enqueue(["doomed"], task=DOOMED)
    flaky = chaos.enqueue(["flaky"], task=FLAKY)
    delayed = chaos.enqueue([f"later{i}" for i in range(20)], delay=1.5)
    wait_until(lambda: chaos.pending() == 28, timeout=20)  # the workers hold everything due
    with LeaseWatch(chaos, [w.lease_key() for w in fleet]) as watch:
        filled = fill(chaos.admin)
        full_at = time.monotonic()
        # A producer is told why, and that nothing was written.
        with pytest.raises(EnqueueError, match="out of memory") as refused:
            chaos.enqueue(["refused"])
        assert "nothing was enqueued" in str(refused.value)
        # The workers finish and settle what they hold, dead letter and retry included,
        # while the delayed tasks fall due and cannot be promoted.
        chaos.open_gate()
        wait_until(lambda: chaos.pending() == 0, timeout=30)
        # Past the delayed tasks' due time, and longer than a lease: a lease renewed by a
        # write the full server refuses would be gone by then.
        while time.monotonic() < full_at + 3.0:
            time.sleep(0.1)
        assert chaos.admin.zcard(chaos.keys.delayed) == 21  # 20 delayed and the retry
        for w in fleet:
            assert w.alive(), w.log()
    assert watch.checks > 20 and not watch.missing, f"a live worker lost its lease: {watch}"
    tally = chaos.tally(held + doomed + flaky + delayed)
    assert set(tally.runs) == set(held), tally.runs
    (letter,) = chaos.dead_letters()
    assert b"doomed fails on purpose" in letter[b"reason"]
    # Memory frees: everything resumes.
    chaos.admin.config_set("maxmemory", "0")
    tally = chaos.wait_all(held + flaky + delayed, timeout=30)
    chaos.enqueue(["after"])
    chaos.wait_all(["after"], timeout=30)
    chaos.wait_settled()
    print(f"\nfull server ({filled} filler keys): {tally}")
    assert tally.duplicates == 0, tally
    assert len(chaos.dead_letters()) == 1  # nothing quarantined beside the doomed task
    for w in fleet:
        assert w.alive(), w.log()
        log = w.log()
        assert "server is full" in log
        assert "cannot reach" not in log, "a full server was reported as unreachable"
        assert "lost lease" not in log and "quarantined" not in log
