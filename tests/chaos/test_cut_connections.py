"""Connections cut in the middle of a protocol step, through a proxy between the worker and
the server: the request lost, or (the hard case) carried out with its reply lost.

The bounds: no worker holds more than ``max_pending`` (sampled from its registry record and
from the server's XPENDING), its capacity is whole again after the faults, no task is lost,
and only tasks a killed worker had started run twice.
"""

from __future__ import annotations

import signal
import threading

import pytest

from tether.protocol import scripts

from ..helpers import WorkerProcess, wait_until
from ._harness import GATED, Chaos, Sampler
from ._proxy import Proxy

pytestmark = pytest.mark.chaos


def sha(script: scripts.Script) -> bytes:
    return script.sha.encode()


def assert_capacity_is_whole(
    chaos: Chaos, worker: WorkerProcess, limit: int, concurrency: int
) -> None:
    """The one worker left takes ``limit`` gated tasks at once (``concurrency`` of them
    running, the rest buffered): no slot leaked."""
    chaos.close_gate()
    tags = chaos.enqueue([f"cap{i}" for i in range(limit)], task=GATED)

    def full() -> bool:
        record = chaos.record_of(worker)
        started = sum(chaos.tally(tags).starts.get(t, 0) for t in tags)
        return started == concurrency and record is not None and record["held"] == limit

    try:
        wait_until(full, timeout=20)
    finally:
        chaos.open_gate()
    chaos.wait_all(tags)


def orphans(chaos: Chaos, tags: list[str], *, concurrency: int = 4) -> None:
    """A worker takes every task, starts ``concurrency`` of them (they wait at the gate)
    and is SIGKILLed; the gate opens for the heirs."""
    chaos.close_gate()
    victim = chaos.worker("victim", concurrency=concurrency, max_pending=len(tags))
    victim.wait_ready(chaos.admin)
    chaos.enqueue(tags, task=GATED)
    wait_until(lambda: chaos.pending() == len(tags), timeout=20)
    wait_until(lambda: sum(chaos.tally(tags).starts.values()) == concurrency, timeout=20)
    victim.signal(signal.SIGKILL)
    victim.wait()
    chaos.open_gate()


def test_cuts_mid_claim_and_mid_start_lose_nothing_and_leak_no_slot(
    chaos: Chaos, fresh: object
) -> None:
    """A worker taking over a dead worker's entries loses the connection in each step of the
    takeover: the claim and the start of each reclaimed entry. Before the ledger, a
    failed claim kept its slots for good; a cut start dead-lettered an innocent task."""
    server = fresh()  # type: ignore[operator]
    chaos.attach(server.url)
    proxy = Proxy(server.port)
    tags = [f"t{i}" for i in range(40)]
    orphans(chaos, tags)
    triggers = [
        proxy.cut_on(sha(scripts.CLAIM), times=2, lose="reply"),
        proxy.cut_on(sha(scripts.CLAIM), times=1, lose="request"),
        proxy.cut_on(sha(scripts.START), times=3, lose="reply"),
    ]
    limit = 8
    with Sampler(server.url, chaos.namespace) as sampler:
        heir = chaos.worker("heir", url=proxy.url(), concurrency=limit, max_pending=limit)
        tally = chaos.wait_all(tags, timeout=60)
        chaos.wait_settled()
        assert [t.fired for t in triggers] == [t.times for t in triggers], "faults missed"
        assert_capacity_is_whole(chaos, heir, limit, limit)
    print(
        f"\ncuts mid-claim and mid-start ({sum(t.fired for t in triggers)} cuts): {tally}; "
        f"held at most {sampler.max_held.get('heir')} of {limit}"
    )
    sampler.assert_bounded()
    assert not tally.lost
    # Only what the victim had started could run twice.
    assert tally.duplicates <= 4, tally
    assert chaos.dead_letters() == [], "an innocent task was dead-lettered"
    assert heir.alive(), heir.log()
    proxy.close()


def test_cuts_mid_settle_and_whole_outages_keep_the_bound(chaos: Chaos, fresh: object) -> None:
    """The settle of a batch is cut (request lost, or done with its reply lost) while the
    settle of the other queue's batch goes through, and, beside it, every connection is
    dropped again and again. Before the ledger, the settler sent the whole flush again,
    released the other queue's entries twice, and went over max_pending."""
    server = fresh()  # type: ignore[operator]
    chaos.attach(server.url)
    proxy = Proxy(server.port)
    triggers = [
        proxy.cut_on(sha(scripts.SETTLE), times=6, lose="reply"),
        proxy.cut_on(sha(scripts.SETTLE), times=3, lose="request"),
    ]
    limit, concurrency = 16, 8
    tags = [f"t{i}" for i in range(200)]
    others = [f"o{i}" for i in range(200)]
    stop = threading.Event()

    def outages() -> None:
        while not stop.wait(0.7):
            proxy.cut()

    with Sampler(server.url, chaos.namespace) as sampler:
        worker = chaos.worker(
            "w",
            url=proxy.url(),
            queues="default,other",
            concurrency=concurrency,
            max_pending=limit,
        )
        worker.wait_ready(chaos.admin)
        cutter = threading.Thread(target=outages, daemon=True)
        cutter.start()
        try:
            for i in range(0, len(tags), 50):  # both queues busy at once
                chaos.enqueue(tags[i : i + 50], 0.01)
                chaos.enqueue(others[i : i + 50], 0.01, queue="other")
            tally = chaos.wait_all(tags + others, timeout=60)
        finally:
            stop.set()
            cutter.join()
        chaos.wait_settled()
        assert [t.fired for t in triggers] == [t.times for t in triggers], "faults missed"
        assert proxy.cuts > len(triggers)
        assert_capacity_is_whole(chaos, worker, limit, concurrency)
    print(
        f"\ncuts mid-settle ({sum(t.fired for t in triggers)} settles cut, {proxy.cuts} "
        f"connections cut in all): {tally}; held at most {sampler.max_held.get('w')} of {limit}"
    )
    sampler.assert_bounded()
    assert not tally.lost
    assert tally.duplicates == 0, tally  # nobody died: nothing runs twice
    assert chaos.dead_letters() == []
    assert worker.alive(), worker.log()
    proxy.close()


def test_a_start_cut_twice_neither_quarantines_nor_strands_the_task(
    chaos: Chaos, fresh: object
) -> None:
    """The step that counts a start of a reclaimed entry runs, and its reply is lost, twice.
    The task was started once, by the worker that died: it must run, not be quarantined as
    a task that killed three workers (nor be dead-lettered as an internal error, as it was
    before the first fix)."""
    server = fresh()  # type: ignore[operator]
    chaos.attach(server.url)
    proxy = Proxy(server.port)
    (tag,) = tags = ["only"]
    orphans(chaos, tags, concurrency=1)
    trigger = proxy.cut_on(sha(scripts.START), times=2, lose="reply")
    with Sampler(server.url, chaos.namespace) as sampler:
        heir = chaos.worker("heir", url=proxy.url(), concurrency=2, max_pending=2)
        tally = chaos.wait_all(tags, timeout=30)
        chaos.wait_settled()
    assert trigger.fired == 2
    assert chaos.dead_letters() == [], chaos.dead_letters()
    assert tally.runs[tag] == 1 and tally.starts[tag] == 2, tally.starts
    sampler.assert_bounded()
    assert heir.alive(), heir.log()
    proxy.close()
