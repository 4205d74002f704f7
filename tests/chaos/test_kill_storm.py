"""CLIENT KILL storms: the server drops every connection of every worker (found by the name
each worker gives its connections) again and again while thousands of tasks run.

The bounds: none lost; duplicates (a task whose run finished but whose ack was cut, then
claimed by another worker after a lease lapsed) at most what the workers hold at once,
``max_pending`` x workers, per fault; and every worker within ``max_pending`` throughout.
"""

from __future__ import annotations

import random
import threading
import time

import pytest

from ..helpers import wait_until
from ._harness import Chaos, Sampler

pytestmark = pytest.mark.chaos


def storm(
    chaos: Chaos, tasks: int, workers: int, pace: tuple[float, float], ttl: float = 2.0
) -> None:
    server_url = chaos.url
    concurrency, limit = 16, 32
    fleet = [
        chaos.worker(f"w{i}", concurrency=concurrency, max_pending=limit, heartbeat_ttl=ttl)
        for i in range(workers)
    ]
    for proc in fleet:
        proc.wait_ready(chaos.admin)
    tags = [f"t{i}" for i in range(tasks)]
    stop = threading.Event()
    kills: list[int] = []
    rng = random.Random(10)

    def killer() -> None:
        while not stop.wait(rng.uniform(*pace)):
            kills.append(chaos.kill_worker_connections())

    with Sampler(server_url, chaos.namespace) as sampler:
        started = time.monotonic()
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            # Tasks go in waves, each after a storm that hit the workers, so the storms land
            # while tasks flow however fast the machine runs them.
            waves = 10
            for wave in range(waves):
                chaos.enqueue(tags[wave * tasks // waves : (wave + 1) * tasks // waves])
                hits = sum(1 for k in kills if k)
                wait_until(lambda hits=hits: sum(1 for k in kills if k) > hits, timeout=10)
            tally = chaos.wait_all(tags, timeout=max(60.0, tasks / 100))
        finally:
            stop.set()
            thread.join()
        elapsed = time.monotonic() - started
        chaos.wait_settled()
        counters = [chaos.record_of(proc)["counters"] for proc in fleet]  # type: ignore[index]
    storms = sum(1 for k in kills if k)
    claimed = sum(c["claimed"] for c in counters)
    lapses = sum(c["lease_lapses"] for c in counters)
    print(
        f"\nCLIENT KILL storm: {tally}; {storms} storms killed {sum(kills)} connections "
        f"in {elapsed:.1f}s; {lapses} lease lapses, {claimed} entries claimed"
    )
    assert storms >= 5, f"the storm missed the workers: {kills}"
    assert not tally.lost, tally
    # A task runs twice only if another worker claimed it after a lease lapsed.
    assert tally.duplicates <= claimed, tally
    assert tally.duplicates <= limit * workers, tally
    assert not tally.extra
    sampler.assert_bounded()
    assert chaos.dead_letters() == []
    for proc in fleet:
        assert proc.alive(), proc.log()


def test_client_kill_storm_during_5000_tasks(chaos: Chaos, fresh: object) -> None:
    chaos.attach(fresh().url)  # type: ignore[operator]
    storm(chaos, tasks=5000, workers=2, pace=(0.1, 0.4), ttl=1.0)


@pytest.mark.long
def test_client_kill_storm_during_50000_tasks(chaos: Chaos, fresh: object) -> None:
    chaos.attach(fresh().url)  # type: ignore[operator]
    storm(chaos, tasks=50_000, workers=3, pace=(0.05, 0.5), ttl=0.5)
