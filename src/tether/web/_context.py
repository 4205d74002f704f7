"""What every route of one router shares: the Tether app, the read-only flag, the CSRF
policy, how to name the caller in the audit log, and the dashboard's cache of settled
chart minutes. Routes are built by functions that take a :class:`WebContext`, so several
routers (two apps, two prefixes) never share state.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request

from ..admin import Stats
from ..base._errors import NotOpen
from ._series import SeriesCache

if TYPE_CHECKING:
    from ..producer._core import Core

log = logging.getLogger("tether.web")

Actor = Callable[[Request], str | None]
"""Names the caller of a request for the audit log (a mounted router's host knows who)."""


@dataclass
class OpenedHere:
    """The client a router opened itself, the event loop it belongs to, and what closes it
    when that loop ends. An asyncio client's connections are bound to the loop that made
    them: a request on another loop (the next ``TestClient``, a server started again in
    the same process) cannot use them."""

    client: Any = None
    loop: weakref.ref[asyncio.AbstractEventLoop] | None = None
    closer: AsyncGenerator[None, None] | None = None


@dataclass(frozen=True)
class WebContext:
    app: Core
    read_only: bool = False
    csrf: bool = True
    """Require a CSRF token on state-changing requests a page on another site could send
    (see :mod:`._guard`)."""
    actor: Actor | None = None
    series: SeriesCache = field(default_factory=SeriesCache, compare=False, repr=False)
    """Settled minutes of the charts, kept between refreshes (see :mod:`._series`)."""
    opened: OpenedHere = field(default_factory=OpenedHere, compare=False, repr=False)

    async def core(self) -> Core:
        """The app, opened at first use when its host has not opened it (``async with app``
        in the host's lifespan is the clean way).

        An app the router opened belongs to the event loop it was opened on: it is closed
        when that loop ends, and opened again on the loop of the next request. An app the
        host opened is the host's: it is used as it is."""
        app = self.app
        loop = asyncio.get_running_loop()
        mine = self.opened
        if app.is_open and mine.client is not None and app.client is mine.client:
            then = mine.loop() if mine.loop is not None else None
            if then is not loop:
                if then is not None and then.is_running():
                    # Another thread's loop serves with this client right now: closing it
                    # from here would break that loop's requests.
                    raise NotOpen(
                        "the Tether app behind this router is in use on another running "
                        "event loop: open it in each server's lifespan (async with app)"
                    )
                await self._drop_stale()
        if not app.is_open:
            await self._retire_closer()
        if not app.is_open:  # still: a request beside this one may have opened it meanwhile
            await app.open()
            mine.client, mine.loop = app.client, weakref.ref(loop)
            mine.closer = self._close_at_loop_end(app.client)
            await anext(mine.closer)
        return app

    async def _retire_closer(self) -> None:
        """Finish the closer of a client that is gone (closed by its host, or with its
        loop): finished here, it never asks its loop, perhaps closed, to finish it when it
        is collected."""
        closer, self.opened.closer = self.opened.closer, None
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer.aclose()

    async def _close_at_loop_end(self, client: Any) -> AsyncGenerator[None, None]:
        """Parked at its ``yield`` for as long as the loop runs. ``asyncio.run`` (and so
        uvicorn, ``TestClient``'s portal, pytest's loops) closes every parked async
        generator before it closes the loop: the ``finally`` closes the client then, on
        its own loop, while its connections can still be closed."""
        try:
            yield
        finally:
            if self.app.is_open and self.app.client is client:
                self.opened.client = self.opened.loop = None
                await self.app.close()

    async def _drop_stale(self) -> None:
        """Let go of a client whose loop ended without closing its async generators (a loop
        closed by hand). Its connections cannot be closed from this loop, their transports
        belong to the old one: the close fails, and the sockets go with the old objects."""
        self.opened.client = self.opened.loop = None
        # Awaited inline (no task): close() lets go of the client before its first await,
        # so a concurrent request on this loop opens a new one instead of using the old.
        with contextlib.suppress(Exception):
            await self.app.close()
        await self._retire_closer()
        log.info("the event loop changed: the router opens its Tether app again")

    async def stats(self) -> Stats:
        return Stats(await self.core())
