"""States a healthy server passes through, with work in flight: another client's script
past ``busy-reply-threshold`` (every command answered BUSY for seconds) and a failed RDB
save under ``stop-writes-on-bgsave-error`` (every write answered MISCONF).

Before one classification of replies existed, both stopped every worker ("unexpected error
from Redis; stopping the worker"), and nothing ran once the server recovered. The promises:
no worker exits, each says once what the server is doing, every task runs, none twice (the
windows are shorter than a lease), and everything is settled afterwards.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ..helpers import WorkerProcess, wait_until
from ..server_states import busy_script, failed_save
from ..taskiq_workers import TaskiqWorker, kiq
from ._harness import GATED, Chaos

pytestmark = [pytest.mark.chaos, pytest.mark.compat]

WINDOW_S = 3.0


def hold_gated(chaos: Chaos, tags: list[str], held: int) -> list[str]:
    """Enqueue gated tasks and wait until the workers hold ``held`` of them."""
    chaos.close_gate()
    sent = chaos.enqueue(tags, task=GATED)
    wait_until(lambda: chaos.pending() >= held, timeout=20)
    return sent


def test_busy_and_misconf_windows_with_settles_in_flight_stop_no_worker(
    chaos: Chaos, fresh: object
) -> None:
    proc = fresh("--enable-protected-configs", "yes")  # type: ignore[operator]
    chaos.attach(proc.url)
    fleet = [
        chaos.worker(f"w{i}", concurrency=8, max_pending=16, heartbeat_ttl=6.0, stall_timeout=10.0)
        for i in range(2)
    ]
    for w in fleet:
        w.wait_ready(chaos.admin)

    # BUSY: the tasks the workers hold finish inside the window, so their settles (and the
    # heartbeats, fetches and maintenance) are answered BUSY.
    first = hold_gated(chaos, [f"busy{i}" for i in range(40)], held=16)
    more = chaos.enqueue([f"after-busy{i}" for i in range(200)])
    with busy_script(proc.url):
        chaos.open_gate()
        time.sleep(WINDOW_S)
        for w in fleet:
            assert w.alive(), f"a BUSY window stopped {w.name}:\n{w.log()}"
    chaos.wait_all(first + more, timeout=60)

    # MISCONF: reads pass, every write (settles, lease renewals, reclaim) is refused.
    second = hold_gated(chaos, [f"misconf{i}" for i in range(40)], held=16)
    with failed_save(chaos.admin):
        chaos.open_gate()
        time.sleep(WINDOW_S)
        for w in fleet:
            assert w.alive(), f"a MISCONF window stopped {w.name}:\n{w.log()}"
    tally = chaos.wait_all(first + more + second, timeout=60)

    # Afterwards: work flows as before.
    last = chaos.enqueue([f"last{i}" for i in range(50)])
    tally = chaos.wait_all(first + more + second + last, timeout=60)
    chaos.wait_settled()
    print(f"\nBUSY and MISCONF windows of {WINDOW_S:g}s: {tally}")
    assert tally.duplicates == 0, tally
    assert chaos.dead_letters() == []
    logs = chaos.logs()
    for w in fleet:
        assert w.alive(), w.log()
    assert "busy running another client's script" in logs, logs
    assert "refuses writes after a failed save" in logs, logs
    for bad in ("stopping the worker", "crashed in", "handing off and stopping", "Traceback"):
        assert bad not in logs, logs


def test_a_taskiq_worker_outlives_busy_and_misconf_windows(
    chaos: Chaos, fresh: object, tmp_path: Path, workers: list[WorkerProcess]
) -> None:
    """The TetherBroker's consumer shares the worker's loops: before the classification, a
    BUSY window made taskiq's worker processes exit, and its process manager started them
    again and again."""
    proc = fresh("--enable-protected-configs", "yes")  # type: ignore[operator]
    chaos.attach(proc.url)
    worker = TaskiqWorker(
        proc.url, chaos.namespace, "tq", log_dir=tmp_path, heartbeat_ttl=6.0, stall_timeout=10.0
    )
    workers.append(worker)  # type: ignore[arg-type]
    worker.wait_ready(chaos.admin)
    child = worker.child()
    runs = f"{chaos.namespace}:runs"

    def ran() -> list[str]:
        return [line.decode().split("|")[0] for line in chaos.admin.lrange(runs, 0, -1)]

    windows: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
        "busy": lambda: busy_script(proc.url),
        "misconf": lambda: failed_save(chaos.admin),
    }
    for window, enter in windows.items():
        # Tasks running across the window: they start before it and finish after it.
        tags = [f"{window}{i}" for i in range(6)]
        kiq(proc.url, chaos.namespace, "slow", *[(t, WINDOW_S + 1.5) for t in tags])
        wait_until(lambda: chaos.admin.llen(f"{chaos.namespace}:starts") >= 6, 20)
        with enter():
            time.sleep(WINDOW_S)
        assert worker.alive() and worker.children() == [child], worker.log()
        wait_until(lambda t=tags: set(t) <= set(ran()), 30)  # type: ignore[misc]
        chaos.admin.delete(f"{chaos.namespace}:starts")
    after = [f"after{i}" for i in range(20)]
    kiq(proc.url, chaos.namespace, "record", *[(t,) for t in after])
    wait_until(lambda: set(after) <= set(ran()), 30)
    counted = ran()
    assert len(counted) == len(set(counted)) == 32, counted
    assert worker.children() == [child], "taskiq's worker process was started again"
    log = worker.log()
    assert "busy running another client's script" in log, log
    for bad in ("Traceback", "stops:", "crashed in"):
        assert bad not in log, log
