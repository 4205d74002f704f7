"""States a healthy server passes through, with work in flight: another client's script
past ``busy-reply-threshold`` (every command answered BUSY for seconds) and a failed RDB
save under ``stop-writes-on-bgsave-error`` (every write answered MISCONF).

Before one classification of replies existed, both stopped every worker ("unexpected error
from Redis; stopping the worker"), and nothing ran once the server recovered. The promises:
no worker exits, each says once what the server is doing, every task runs, none twice (the
windows are shorter than a lease), and everything is settled afterwards.
"""

from __future__ import annotations

import time

import pytest

from ..helpers import wait_until
from ..server_states import busy_script, failed_save
from ._harness import GATED, Chaos

pytestmark = pytest.mark.chaos

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
