"""Frozen, then thawed: a worker (SIGSTOP) past its lease, and the server itself.

A server frozen past ``heartbeat_ttl`` expires every lease at once when it wakes (its clock
kept running); the promises that remain: no task lost, no crash loop, a task runs twice
only if its lease lapsed and another worker claimed it, and no worker reports a lost lease
that nobody took.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from ..helpers import FAST, wait_until
from ._harness import GATED, Chaos, Sampler

pytestmark = pytest.mark.chaos

TTL = FAST["heartbeat_ttl"]


def test_a_worker_thawed_after_its_lease_runs_none_of_its_buffered_entries(
    chaos: Chaos, fresh: object
) -> None:
    """Frozen holding 32 entries with 2 running, it used to wake and run the 30 buffered
    ones although another worker had claimed and finished them."""
    chaos.attach(fresh().url)  # type: ignore[operator]
    chaos.close_gate()
    sleeper = chaos.worker("sleeper", concurrency=2, max_pending=32)
    sleeper.wait_ready(chaos.admin)
    tags = chaos.enqueue([f"t{i}" for i in range(32)], task=GATED)
    wait_until(lambda: chaos.pending() == 32, timeout=20)
    wait_until(lambda: sum(chaos.tally(tags).starts.values()) == 2, timeout=20)
    sleeper.signal(signal.SIGSTOP)
    heir = chaos.worker("heir", concurrency=32)
    chaos.open_gate()
    tally = chaos.wait_all(tags, timeout=30)  # the heir ran everything
    sleeper.signal(signal.SIGCONT)
    wait_until(lambda: "lease" in sleeper.log() and "expired" in sleeper.log(), timeout=10)
    chaos.wait_settled()
    time.sleep(1.0)  # time to run what it should not
    tally = chaos.tally(tags)
    print(f"\nworker frozen past its lease: {tally}")
    assert not tally.lost
    # The two that were running when it froze finish after the thaw; nothing else.
    assert tally.duplicates <= 2, tally
    assert sum(tally.starts.values()) == 32 + 2, tally.starts  # the heir 32, the sleeper 2
    assert sleeper.alive() and heir.alive()
    assert "dropped" in sleeper.log()


@pytest.mark.parametrize(
    ("fleet_size", "socket_timeout"),
    [(1, 10.0), (1, 1.0), (2, 1.0)],
    ids=["one-worker-waits", "one-worker-times-out", "two-workers-time-out"],
)
def test_a_server_frozen_past_the_lease_loses_nothing_and_reports_no_false_loss(
    chaos: Chaos,
    fresh: object,
    fleet_size: int,
    socket_timeout: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a socket timeout longer than the freeze, the workers' calls wait it out; with
    a shorter one they time out mid-freeze (a settle whose reply never came is sent again
    and finds its entries already settled, which used to be reported as a lost lease)."""
    monkeypatch.setenv("CHAOS_SOCKET_TIMEOUT", str(socket_timeout))
    proc = fresh()  # type: ignore[operator]
    chaos.attach(proc.url)
    limit = 16
    fleet = [chaos.worker(f"w{i}", concurrency=8, max_pending=limit) for i in range(fleet_size)]
    for w in fleet:
        w.wait_ready(chaos.admin)
    tags = [f"t{i}" for i in range(300)]
    with Sampler(proc.url, chaos.namespace) as sampler:
        chaos.enqueue(tags, 0.02)
        wait_until(lambda: len(chaos.tally(tags).runs) >= 100, timeout=30)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(3 * TTL)
        os.kill(proc.pid, signal.SIGCONT)
        thawed = time.monotonic()
        tally = chaos.wait_all(tags, timeout=60)
        drained = time.monotonic() - thawed
        chaos.wait_settled()
    counters = {w.name: chaos.record_of(w)["counters"] for w in fleet}  # type: ignore[index]
    claimed = sum(c["claimed"] for c in counters.values())
    print(
        f"\nserver frozen {3 * TTL:.1f}s, {fleet_size} workers, socket timeout {socket_timeout}s: "
        f"{tally}; {claimed} entries "
        f"claimed after the thaw; every task done {drained:.1f}s after it"
    )
    assert not tally.lost, tally
    assert tally.duplicates <= claimed, tally  # only tasks taken from a lapsed lease
    assert tally.duplicates <= limit * fleet_size, tally
    assert chaos.dead_letters() == []
    sampler.assert_bounded()
    for w in fleet:
        assert w.alive(), w.log()
    if fleet_size == 1:
        # Nobody else could claim anything: a lost lease would be a false alarm.
        (only,) = fleet
        assert counters[only.name]["lost_leases"] == 0, only.log()
        assert "lost lease" not in only.log()
        assert tally.duplicates == 0
