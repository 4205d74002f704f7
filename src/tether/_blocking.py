"""The guard of every blocking call: it must not run on a thread that runs an event loop."""

from __future__ import annotations

import asyncio

from ._errors import BlockingCallError


def refuse_on_loop(method: str) -> None:
    """Raise :class:`BlockingCallError` when this thread runs an event loop, which the
    blocking call would freeze."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    async_name = method.removesuffix("_sync")
    raise BlockingCallError(
        f"{method}() blocks, and this thread runs an event loop: use `await ...{async_name}(...)`"
        " here, or call it from a thread without a running loop"
    )
