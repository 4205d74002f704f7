"""Statistics count what settled: the increments ride on the fenced ack, entry by entry.

A worker frozen past its lease wakes and settles tasks that another worker took and ran
meanwhile; its outcomes are discarded by the fence, and so must its statistics be. They
were the batch's sum, applied whenever the call settled anything, so a batch mixing
discarded and settled entries counted all of them (10 successes reported for 8 tasks).
"""

from __future__ import annotations

import pytest
import redis

from tether.protocol import scripts
from tether.protocol._keys import GROUP, QueueKeys
from tether.protocol.scripts import SettleItem
from tether.worker._stats import Observation, StatsKeys

pytestmark = pytest.mark.compat  # on every server kind: see tests/compat.py


def test_a_settle_counts_the_statistics_of_the_entries_it_settles_only(
    rds: redis.Redis, namespace: str
) -> None:
    keys = QueueKeys.of(namespace, "default")
    stream = keys.streams[0]
    rds.xgroup_create(stream, GROUP, "0", mkstream=True)
    ids = [rds.xadd(stream, {"m": b"{}"}) for _ in range(5)]
    rds.xreadgroup(GROUP, "frozen", {stream: ">"}, count=5)
    # While 'frozen' was frozen past its lease, another worker claimed three of them.
    rds.xclaim(stream, GROUP, "other", 0, ids[:3])
    observations = [
        Observation("jobs.ok", "ok", 12.0, 3.0, False),
        Observation("jobs.ok", "ok", 12.0, 3.0, False),
        Observation("jobs.slow", "ok", 900.0, None, True),
        None,  # an entry that never ran (a malformed payload) adds nothing
        Observation("jobs.slow", "ok", 900.0, None, True),
    ]
    stats = StatsKeys(3600).write(keys, observations)
    assert stats is not None
    call = scripts.settle(
        keys, "frozen", 1000, [(1, entry, SettleItem("o")) for entry in ids], stats
    )
    reply = call.run_sync(rds)
    assert reply.settled == 2 and len(reply.taken) == 3
    counted = {k.decode(): int(v) for k, v in rds.hgetall(stats.minute_key).items()}
    # Settled: ids[3] (never ran) and ids[4] (a slow run that timed out).
    assert counted.get("jobs.ok|ok", 0) == 0, counted
    assert counted["jobs.slow|ok"] == 1 and counted["jobs.slow|timeout"] == 1, counted
    assert sum(v for k, v in counted.items() if "|r" in k) == 1, counted
    assert rds.hgetall(stats.hour_key) == rds.hgetall(stats.minute_key)
    assert 0 < rds.pttl(stats.minute_key) <= 2 * 3_600_000
    # The same call sent again (its reply lost) settles nothing and counts nothing.
    again = call.run_sync(rds)
    assert again.settled == 0
    assert {k.decode(): int(v) for k, v in rds.hgetall(stats.minute_key).items()} == counted
