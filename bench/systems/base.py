"""The interface every system's adapter implements, so the driver treats all alike."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import redis.asyncio

from ..config import Config


class Adapter:
    """A producer (the system's normal enqueue API) and a worker command (its documented
    entry point). One instance lives in the driver; the worker runs in its own process."""

    batch = False
    """The system offers a batch enqueue call."""

    def __init__(self, config: Config) -> None:
        self.config = config

    async def open(self) -> None:
        """Connect the producer."""

    async def close(self) -> None:
        """Disconnect the producer (its connections count in used_memory)."""

    async def enqueue(self, i: int) -> None:
        raise NotImplementedError

    async def enqueue_many(self, items: Sequence[int]) -> None:
        raise NotImplementedError

    def worker_argv(self, name: str) -> list[str]:
        """The command that runs one worker process; ``name`` is unique in the run."""
        raise NotImplementedError

    async def ready(self, counters: redis.asyncio.Redis, names: Sequence[str]) -> bool:
        """True once every worker in ``names`` is ready to consume. By default, each worker's
        start-up hook has incremented the ready counter (see bench/body.py)."""
        return int(await counters.get(self.config.ready_key) or 0) >= len(names)

    @staticmethod
    def script(name: str) -> str:
        """A console script installed beside this interpreter (the peer's documented CLI)."""
        return str(Path(sys.executable).parent / name)
