"""The ledger alone: capacity is derived from what is held and reserved, so no path can
release a slot twice or leak one (the two prefetch-bound defects of the first review)."""

from __future__ import annotations

import asyncio

import pytest

from tether.protocol._keys import QueueKeys
from tether.worker._ledger import Ledger
from tether.worker._state import Delivery, QueueState

QUEUE = QueueState(QueueKeys.of("ns", "q"))


def delivery(n: int) -> Delivery:
    return Delivery(QUEUE, 2, f"{n}-0".encode(), b"{}", 1)


def test_a_failed_read_gives_its_reservation_back() -> None:
    """A claim or fetch that raises (a cut connection) must not keep its slots: repeated
    outages used to shrink a worker to zero capacity."""
    ledger = Ledger(4)

    def claim_cut_mid_way() -> None:
        with ledger.reserve(ledger.free) as taken:
            assert taken == 4 and ledger.free == 0
            raise ConnectionError("cut mid-claim")

    for _ in range(10):
        with pytest.raises(ConnectionError):
            claim_cut_mid_way()
    assert ledger.free == 4 and ledger.reserved == 0


def test_entries_accepted_during_a_read_are_held_once_the_read_returns() -> None:
    ledger = Ledger(4)
    with ledger.reserve(3) as taken:
        assert taken == 3
        for n in range(2):
            assert ledger.accept(delivery(n))
        assert ledger.held == 2 and ledger.free == -1  # conservative while in flight
    assert ledger.held == 2 and ledger.free == 2


def test_a_reservation_never_exceeds_the_free_capacity() -> None:
    ledger = Ledger(2)
    ledger.accept(delivery(1))
    with ledger.reserve(10) as taken:
        assert taken == 1
        assert ledger.held + ledger.reserved == ledger.limit


def test_releasing_twice_frees_a_slot_once() -> None:
    """A settle sent again after a partial failure used to release its entries again, so
    the worker went over max_pending."""
    ledger = Ledger(2)
    a, b = delivery(1), delivery(2)
    assert ledger.accept(a) and ledger.accept(b)
    assert ledger.release([a]) == 1
    assert ledger.release([a]) == 0
    assert ledger.release([a, b]) == 1
    assert ledger.free == 2 and ledger.held == 0


def test_the_same_entry_is_held_once() -> None:
    ledger = Ledger(3)
    assert ledger.accept(delivery(1))
    assert not ledger.accept(delivery(1))
    assert ledger.held == 1


def test_releases_during_a_read_are_seen_by_its_watcher() -> None:
    ledger = Ledger(3)
    a = delivery(1)
    ledger.accept(a)
    with ledger.watch_releases() as seen:
        ledger.release([a])
    assert seen == {a.key}
    ledger.release([a])  # after the block: nobody watches, nothing fails


async def test_waiting_for_a_free_slot_wakes_on_release() -> None:
    ledger = Ledger(1)
    a = delivery(1)
    ledger.accept(a)
    waiter = asyncio.create_task(ledger.wait_for_free(5))
    await asyncio.sleep(0.01)
    assert not waiter.done()
    ledger.release([a])
    await asyncio.wait_for(waiter, 1)
