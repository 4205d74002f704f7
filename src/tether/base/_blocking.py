"""The guard of every blocking call: it must not run on a thread that runs an event loop."""

from __future__ import annotations

import asyncio

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
