"""A concurrency-limited task that can kill its worker, for the flow-control tests of slots
left by a dead incarnation of a worker name. The app reads TETHER_URL and TETHER_NAMESPACE."""

from __future__ import annotations

import os
import signal

from tether import Tether

app = Tether()


@app.task(concurrency_limit=1)
async def fragile(tag: str, crash: bool) -> str:
    """Kills the worker that runs it when ``crash`` (a poison task), else returns ``tag``."""
    if crash:
        os.kill(os.getpid(), signal.SIGKILL)
    return tag
