"""What the web benches (``api.py``, ``dashboard.py``) share: a fleet of worker records
written as the heartbeat writes them, the server's command count, and waiting for the
served app to answer."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from tether import Tether
from tether.base._version import __version__
from tether.protocol._keys import known_queues_key, registry_keys


def add_workers(
    pipe: Any,
    app: Tether,
    names: Sequence[str],
    queues: Sequence[str],
    *,
    held: int,
    counters: Callable[[int], dict[str, int]],
) -> None:
    """Queue on ``pipe`` a live record and a lease on every queue for each of ``names``
    (an hour long), as 20 real workers would have them, without workers that would consume
    the queues. ``counters(i)`` gives worker ``i``'s counters."""
    index, prefix = registry_keys(app.namespace)
    now_ms = int(time.time() * 1000)
    for i, name in enumerate(names):
        record = {
            "name": name, "host": "bench", "pid": 1000 + i, "version": __version__,
            "queues": list(queues), "concurrency": 16, "max_pending": 16,
            "started_ms": now_ms, "heartbeat_ms": now_ms, "held": held, "running": held,
            "counters": counters(i),
        }  # fmt: skip
        pipe.set(prefix + name, json.dumps(record), px=3_600_000)
        pipe.zadd(index, {name: now_ms})
        for q in queues:
            pipe.set(app.keys(q).lease(name), "bench", px=3_600_000)
    pipe.zadd(known_queues_key(app.namespace), dict.fromkeys(queues, 0))


def command_calls(info: dict[str, Any]) -> int:
    """Commands the server ran (``INFO commandstats``, those inside scripts included), the
    INFO calls themselves left out."""
    return sum(
        int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_") and k != "cmdstat_info"
    )


def wait_answering(proc: subprocess.Popen[bytes], url: str, what: str) -> None:
    """Poll ``url`` until the server process answers (any status); exit naming ``what`` if
    it dies or takes over a minute."""
    import httpx

    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{what} did not start") from None
            time.sleep(0.1)
