"""The guard of every blocking call (it must not run on a thread that runs an event loop),
and the runner of the blocking twins of async readers."""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from ._errors import BlockingCallError


def refuse_on_loop(method: str) -> None:
    """Raise :class:`BlockingCallError` when this thread runs an event loop, which the
    blocking call would freeze."""
    # _get_running_loop (public in asyncio.events) answers None without raising: this guard
    # runs on every blocking call.
    if asyncio._get_running_loop() is None:
        return
    async_name = method.removesuffix("_sync")
    raise BlockingCallError(
        f"{method}() blocks, and this thread runs an event loop: use `await ...{async_name}(...)`"
        " here, or call it from a thread without a running loop"
    )


class Connectable(Protocol):
    """What :func:`run_blocking` needs of an app (a :class:`~tether.producer._core.Core`):
    its connections, and opening and closing them."""

    _client: Any
    _sync_client: Any
    _sync_lock: threading.Lock

    async def open(self) -> Any: ...

    async def close(self) -> None: ...


A = TypeVar("A", bound=Connectable)
T = TypeVar("T")


def run_blocking(method: str, app: A, work: Callable[[A], Awaitable[T]]) -> T:
    """The blocking twin of an async reader: run ``work(view)`` to its end on an event loop
    of this call. ``view`` is a copy of ``app`` (its settings, namespace, serializer and
    tasks) with a connection of its own, opened for the call and closed after it. The app
    itself is left as it was: it may be open on another thread's loop meanwhile, and calls
    from several threads share no connection. Each call connects anew: a script that reads
    in a loop is better served by the async API."""
    refuse_on_loop(method)
    view = copy.copy(app)
    # Its own connections: closing the view must not close the app's.
    view._client = view._sync_client = None
    view._sync_lock = threading.Lock()

    async def once() -> T:
        await view.open()
        try:
            return await work(view)
        finally:
            await view.close()

    return asyncio.run(once())
