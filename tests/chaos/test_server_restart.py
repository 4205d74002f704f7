"""The server SIGKILLed mid-run and started again on the same data directory, while a
producer keeps enqueueing and two workers keep running.

With AOF and ``appendfsync always`` every acknowledged enqueue completes. With ``everysec``
the AOF is written before each reply and flushed to disk every second: a *process* kill
loses nothing written (the kernel keeps it), and only a machine crash can lose the last
second or so; the test measures what a process kill costs. Without persistence the server
comes back empty: what it held is gone (not protected), and the workers must live on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from ..helpers import wait_until
from ._harness import Chaos, Producer, Sampler

pytestmark = [pytest.mark.chaos, pytest.mark.compat]


BACKLOG = [f"b{i}" for i in range(300)]


@dataclass
class Outage:
    producer: Producer
    """What was acknowledged (the backlog counts as acknowledged just before the kill)."""
    killed_at: float
    restarted_at: float
    resumed_s: float
    """From the restart until a task enqueued after it had run."""


def outage(chaos: Chaos, proc: object, *, down: float = 0.5) -> Outage:
    """Run a producer and two workers; with a backlog of 300 tasks queued, SIGKILL the
    server, start it again after ``down`` seconds."""
    fleet = [chaos.worker(f"w{i}", concurrency=8, max_pending=16) for i in range(2)]
    for w in fleet:
        w.wait_ready(chaos.admin)
    with Producer(chaos) as producer:
        wait_until(lambda: len(chaos.tally(()).runs) >= 300, timeout=30)
        chaos.enqueue(BACKLOG, 0.05)
        killed_at = time.monotonic()
        producer.acked.update(dict.fromkeys(BACKLOG, killed_at))
        proc.stop(kill=True)  # type: ignore[attr-defined]
        time.sleep(down)
        proc.start()  # type: ignore[attr-defined]
        restarted = time.monotonic()
        chaos.attach(chaos.url)  # fresh admin connection, scripts loaded again
        acked_before = len(producer.acked)

        def resumed() -> bool:
            after = [t for t, at in list(producer.acked.items()) if at > restarted]
            return bool(after) and any(chaos.tally(after[:1]).runs.values())

        wait_until(resumed, timeout=30)
        resumed = time.monotonic() - restarted
        wait_until(lambda: len(producer.acked) > acked_before + 200, timeout=30)
    for w in fleet:
        assert w.alive(), w.log()
        assert "cannot reach the server" in w.log(), "the worker never saw the outage"
    return Outage(producer, killed_at, restarted, resumed)


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_a_server_sigkilled_and_restarted_with_aof_loses_no_acknowledged_task(
    chaos: Chaos, fresh: object, fsync: str
) -> None:
    proc = fresh("--appendonly", "yes", "--appendfsync", fsync)  # type: ignore[operator]
    chaos.attach(proc.url)
    with Sampler(proc.url, chaos.namespace) as sampler:
        fault = outage(chaos, proc)
        tally = chaos.wait_all(fault.producer.acked, timeout=60)
        drained = time.monotonic() - fault.restarted_at
        chaos.wait_settled()
    print(
        f"\nSIGKILL + restart, appendfsync {fsync}: {tally}; new tasks ran "
        f"{fault.resumed_s:.2f}s after the restart, every task within {drained:.1f}s"
    )
    assert not tally.lost, tally
    # Nobody died and the outage was short: only a lease that lapsed meanwhile lets another
    # worker take a task, and then only one a worker held.
    assert tally.duplicates <= 2 * 16, tally
    assert chaos.dead_letters() == []
    sampler.assert_bounded()


def test_a_server_restarted_empty_loses_what_it_held_and_the_workers_live_on(
    chaos: Chaos, fresh: object
) -> None:
    """Not protected: without persistence a restart loses every task the server held. The
    workers (holding entries of streams that no longer exist) must carry on; they used to
    exit when a settle found no consumer group."""
    proc = fresh()  # type: ignore[operator]
    chaos.attach(proc.url)
    fault = outage(chaos, proc)
    chaos.wait_settled()
    tally = chaos.tally(fault.producer.acked)
    print(
        f"\nSIGKILL + restart without persistence: {tally}; new tasks ran "
        f"{fault.resumed_s:.2f}s after the restart"
    )
    assert tally.lost, "an empty restart lost nothing: was the server really restarted?"
    after = {t for t, at in fault.producer.acked.items() if at > fault.killed_at}
    assert not tally.lost & after, "a task enqueued after the restart was lost"
