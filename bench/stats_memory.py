"""What the statistics cost in server memory: bytes per task name per day.

    .venv/bin/python bench/stats_memory.py

On a fresh embedded Valkey it writes one day of statistics (1,440 minute hashes and 24 hour
hashes of one queue) the way the settle script writes them, from the increments a worker
computes (``tether.worker._stats.StatsKeys``) for attempts whose run and wait times are spread
log-normally (median 20 ms and 5 ms, a factor of about 7 either way), for 1 and for 10 task
names. It prints ``MEMORY USAGE`` summed over the keys, per task name per day.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import redis  # noqa: E402

from tether.base._embedded import EmbeddedServer  # noqa: E402
from tether.protocol._keys import QueueKeys  # noqa: E402
from tether.worker._stats import Observation, StatsKeys  # noqa: E402

PER_MINUTE = 100
"""Attempts per task name per minute."""


def one_day(client: redis.Redis, namespace: str, names: int) -> int:
    keys = QueueKeys.of(namespace, "default")
    writer = StatsKeys(24 * 3600)
    rng = random.Random(7)
    for minute in range(1440):
        observations = [
            Observation(
                f"myapp.tasks.task_{t}",
                "ok" if rng.random() > 0.02 else "fail",
                rng.lognormvariate(3.0, 1.0),
                rng.lognormvariate(1.6, 1.0),
                False,
            )
            for t in range(names)
            for _ in range(PER_MINUTE)
        ]
        write = writer.write(keys, observations)
        assert write is not None
        pipe = client.pipeline(transaction=False)
        for field, amount in write.totals.items():
            pipe.hincrby(keys.stats_minute(minute), field, amount)
            pipe.hincrby(keys.stats_hour(minute // 60), field, amount)
        pipe.execute()
    total = 0
    for minute in range(1440):
        total += int(client.memory_usage(keys.stats_minute(minute), samples=0) or 0)
    for hour in range(24):
        total += int(client.memory_usage(keys.stats_hour(hour), samples=0) or 0)
    return total


def main() -> None:
    server = EmbeddedServer().start()
    try:
        client = redis.Redis.from_url(server.url)
        for names in (1, 10):
            total = one_day(client, f"mem{names}", names)
            print(
                f"{names:>2} task name(s), {PER_MINUTE} attempts each per minute: "
                f"{total / 1024:,.0f} KiB a day in all, {total / names / 1024:,.0f} KiB "
                "per task name per day"
            )
        client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
