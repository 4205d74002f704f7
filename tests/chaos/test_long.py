"""Minutes-long chaos, deselected by default: ``pytest -m long tests/chaos``.

Mixed faults at random for a minute under a steady producer, and ten server restarts in a
row; each counts every task.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from ..helpers import WorkerProcess
from ._harness import Chaos, Producer, Sampler
from ._proxy import Proxy

pytestmark = [pytest.mark.chaos, pytest.mark.long]


def test_a_minute_of_mixed_faults_loses_nothing(chaos: Chaos, fresh: object) -> None:
    """Every 0.2 to 1 s one of: all connections cut at the proxy, CLIENT KILL of every
    worker connection, a worker SIGKILLed (and replaced), a worker frozen for a second."""
    proc = fresh()  # type: ignore[operator]
    chaos.attach(proc.url)
    proxy = Proxy(proc.port)
    limit, settings = 16, {"concurrency": 8, "max_pending": 16, "max_deliveries": 100}
    serial = iter(range(1000))
    fleet: list[WorkerProcess] = [
        chaos.worker(f"w{next(serial)}", url=proxy.url(), **settings) for _ in range(3)
    ]
    rng = random.Random(7)
    faults: dict[str, int] = {}
    stop = threading.Event()

    def chaos_monkey() -> None:
        while not stop.wait(rng.uniform(0.2, 1.0)):
            fault = rng.choice(["cut", "kill-connections", "sigkill", "freeze"])
            faults[fault] = faults.get(fault, 0) + 1
            victim = rng.randrange(len(fleet))
            if fault == "cut":
                proxy.cut()
            elif fault == "kill-connections":
                chaos.kill_worker_connections()
            elif fault == "sigkill":
                fleet[victim].signal(signal.SIGKILL)
                fleet[victim].wait()
                fleet[victim] = chaos.worker(f"w{next(serial)}", url=proxy.url(), **settings)
            else:
                fleet[victim].signal(signal.SIGSTOP)
                time.sleep(1.0)
                fleet[victim].signal(signal.SIGCONT)

    with Sampler(proc.url, chaos.namespace) as sampler, Producer(chaos) as producer:
        monkey = threading.Thread(target=chaos_monkey, daemon=True)
        monkey.start()
        time.sleep(60)
        stop.set()
        monkey.join()
    tally = chaos.wait_all(producer.acked, timeout=120)
    chaos.wait_settled(60)
    print(f"\na minute of mixed faults {faults}: {tally}")
    assert not tally.lost, tally
    # Duplicates come from workers killed or frozen past their lease: each can lose what
    # it held, at most max_pending.
    assert tally.duplicates <= limit * (faults.get("sigkill", 0) + faults.get("freeze", 0))
    assert chaos.dead_letters() == []
    sampler.assert_bounded()
    proxy.close()


def test_ten_server_restarts_with_aof_always_lose_no_acknowledged_task(
    chaos: Chaos, fresh: object
) -> None:
    proc = fresh("--appendonly", "yes", "--appendfsync", "always")  # type: ignore[operator]
    chaos.attach(proc.url)
    fleet = [chaos.worker(f"w{i}", concurrency=8, max_pending=16) for i in range(2)]
    for w in fleet:
        w.wait_ready(chaos.admin)
    with Producer(chaos) as producer:
        for _ in range(10):
            time.sleep(random.uniform(0.5, 2.0))
            os.kill(proc.pid, signal.SIGKILL)
            proc.process.wait()
            proc.stop()
            time.sleep(random.uniform(0.1, 1.0))
            proc.start()
        time.sleep(2)
    chaos.attach(proc.url)
    tally = chaos.wait_all(producer.acked, timeout=120)
    chaos.wait_settled(60)
    print(f"\nten SIGKILL + restarts, appendfsync always: {tally}")
    assert not tally.lost, tally
    for w in fleet:
        assert w.alive(), w.log()
