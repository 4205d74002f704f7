"""What a run is told: the server, the run's unique tag, the bench's own keys.

The driver builds a :class:`Config` and passes it to the worker processes through the
environment, so every system's task module reads the same settings the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

CONCURRENCY = 32
"""Tasks one worker process runs at once, for every system."""

BATCH = 1000
"""Tasks per call in the batched enqueue phase, for every system that has a batch call."""


def counter_url(url: str) -> str:
    """The same server, the next database: the bench's counters stay out of the queue's
    database (INFO commandstats and used_memory are server-wide, so they are corrected for
    the bench's own commands and keys instead)."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    db = int(path) if path.isdigit() else 0
    return urlunsplit(parts._replace(path=f"/{(db + 1) % 16}"))


@dataclass(frozen=True)
class Config:
    url: str
    """The queue's server and database."""
    tag: str
    """Unique per run: every system puts it in its queue names, so runs never meet."""
    concurrency: int = CONCURRENCY

    @property
    def counter_url(self) -> str:
        return counter_url(self.url)

    @property
    def done_key(self) -> str:
        """Counter the task body increments; the driver polls it."""
        return f"bench:{self.tag}:done"

    @property
    def starts_key(self) -> str:
        """List of '<probe> <start time>' written by the latency probes."""
        return f"bench:{self.tag}:starts"

    @property
    def ready_key(self) -> str:
        """Counter a worker's start-up hook increments once it is about to consume."""
        return f"bench:{self.tag}:ready"

    def env(self) -> dict[str, str]:
        return {
            "BENCH_URL": self.url,
            "BENCH_TAG": self.tag,
            "BENCH_CONCURRENCY": str(self.concurrency),
        }

    @classmethod
    def from_env(cls) -> Config:
        return cls(
            url=os.environ.get("BENCH_URL", "redis://127.0.0.1:6379/0"),
            tag=os.environ.get("BENCH_TAG", "bench"),
            concurrency=int(os.environ.get("BENCH_CONCURRENCY", CONCURRENCY)),
        )
