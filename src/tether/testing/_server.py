"""Tests against a real server: an app isolated in a namespace of its own, and ``drain()``,
which runs burst workers until the queues and the delayed sets are empty."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..base._blocking import refuse_on_loop
from ..base._errors import TetherError
from ..base._redis import close_sync, sync_client
from ..base._settings import WorkerSettings
from ..protocol._keys import QueueKeys
from ..worker import Worker, WorkerCounters

if TYPE_CHECKING:
    from ..producer._core import Core

DRAIN_SETTINGS: dict[str, Any] = {
    "heartbeat_interval": 0.1,
    "heartbeat_ttl": 1.0,
    "reclaim_interval": 0.05,
    "scheduler": False,
    "shutdown_grace": 5.0,
}
"""Worker settings of :func:`drain`: short leases and maintenance periods, so a burst starts
and ends in milliseconds. Keyword arguments of :func:`drain` override them."""


class DrainTimeout(TetherError, TimeoutError):
    """:func:`drain` did not empty the queues in time (the message says what is left)."""


def new_namespace() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def isolated(app: Core, url: str, namespace: str | None = None) -> Iterator[Core]:
    """Point ``app`` at ``url`` under a namespace of its own for the block, then delete every
    key of that namespace, close its connections and put its URL and namespace back."""
    if app.is_open:
        raise TetherError(f"{app!r} is open; isolate it before `async with app`")
    app.close_sync()
    saved = (app.settings.url, app.namespace, app.url_source)
    namespace = namespace or new_namespace()
    app.configure(url=url, namespace=namespace)
    try:
        yield app
    finally:
        with contextlib.suppress(Exception):
            delete_namespace(app, namespace)
        app.close_sync()
        if not app.is_open:  # an app left open by the test keeps its client to the end
            app.configure(url=saved[0], namespace=saved[1])
            app.url_source = saved[2]


def delete_namespace(app: Core, namespace: str) -> int:
    """Delete every key under ``namespace`` (a test's own: SCAN is fine here, never on the
    hot path)."""
    client: Any = sync_client(app.target, socket_timeout=10, connect_timeout=5)
    deleted = 0
    try:
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{{{namespace}:*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += client.unlink(*batch)
                batch.clear()
        if batch:
            deleted += client.unlink(*batch)
    finally:
        close_sync(client)
    return deleted


def known_queues(app: Core, client: Any) -> list[str]:
    """The queues of the app's tasks, and any queue with keys in its namespace."""
    queues = {task.config.queue for task in app.tasks.values()} | {"default"}
    prefix = f"{{{app.namespace}:"
    for key in client.scan_iter(match=f"{prefix}*", count=1000):
        text = key.decode() if isinstance(key, bytes) else str(key)
        queue = text[len(prefix) :].split("}", 1)[0]
        if queue not in ("workers", "scheduler"):
            queues.add(queue)
    return sorted(queues)


def _left(client: Any, keys: Iterable[QueueKeys]) -> tuple[int, int, float | None]:
    """(entries in the streams, delayed tasks, seconds until the next one is due)."""
    pipe = client.pipeline(transaction=False)
    keys = list(keys)
    for k in keys:
        for stream in k.streams:
            pipe.xlen(stream)
        pipe.zcard(k.delayed)
        pipe.zrange(k.delayed, 0, 0, withscores=True)
    pipe.time()
    replies = pipe.execute()
    now_ms = replies[-1][0] * 1000 + replies[-1][1] // 1000
    entries = delayed = 0
    next_due: float | None = None
    for i in range(len(keys)):
        *lengths, count, first = replies[i * 5 : i * 5 + 5]
        entries += sum(lengths)
        delayed += count
        if first:
            wait = max(0.0, (first[0][1] - now_ms) / 1000)
            next_due = wait if next_due is None else min(next_due, wait)
    return entries, delayed, next_due


def _make_due(client: Any, keys: Iterable[QueueKeys]) -> None:
    for k in keys:
        members = client.zrange(k.delayed, 0, -1)
        if members:
            client.zadd(k.delayed, dict.fromkeys(members, 0), xx=True)


async def drain(
    app: Core,
    *,
    queues: Iterable[str] | None = None,
    due_now: bool = False,
    timeout: float = 30.0,
    **worker_settings: Any,
) -> WorkerCounters:
    """Run burst workers for ``app`` until its queues and delayed sets are empty: delayed
    tasks and retries run when they fall due (``due_now=True`` makes them due at once).
    Returns the workers' counters, summed. Raises :class:`DrainTimeout` after ``timeout``
    seconds with what is left. The app is opened for the drain if it is not open (tasks
    may enqueue)."""
    deadline = time.monotonic() + timeout
    settings = {**DRAIN_SETTINGS, **worker_settings}
    client: Any = sync_client(app.target, socket_timeout=10, connect_timeout=5)
    total = WorkerCounters()
    opened = False
    try:
        if not app.is_open:
            await app.open()
            opened = True
        names = list(queues) if queues is not None else known_queues(app, client)
        keys = [app.keys(q) for q in names]
        while True:
            if due_now:
                await asyncio.to_thread(_make_due, client, keys)
            worker = Worker(app, WorkerSettings(queues=tuple(names), burst=True, **settings))
            await worker.run()
            for name, value in worker.counters.as_dict().items():
                setattr(total, name, getattr(total, name) + value)
            entries, delayed, next_due = await asyncio.to_thread(_left, client, keys)
            if not entries and not delayed:
                return total
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                due = "" if next_due is None else f", the next due in {next_due:.1f}s"
                raise DrainTimeout(
                    f"drain() gave up after {timeout}s: {entries} entries in the streams and "
                    f"{delayed} delayed tasks left{due} (due_now=True runs delayed tasks at once)"
                )
            if not entries and next_due:
                await asyncio.sleep(min(next_due, remaining))
    finally:
        close_sync(client)
        if opened:
            await app.close()


def drain_sync(
    app: Core,
    *,
    queues: Iterable[str] | None = None,
    due_now: bool = False,
    timeout: float = 30.0,
    **worker_settings: Any,
) -> WorkerCounters:
    """:func:`drain`, blocking (on a private event loop)."""
    refuse_on_loop("drain_sync")
    if app.is_open:
        raise TetherError(f"{app!r} is open on an event loop: use `await drain(app)` on that loop")
    return asyncio.run(
        drain(app, queues=queues, due_now=due_now, timeout=timeout, **worker_settings)
    )
