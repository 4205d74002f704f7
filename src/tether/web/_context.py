"""What every route of one router shares: the Tether app, the read-only flag, the CSRF
policy, how to name the caller in the audit log, and the dashboard's cache of settled
chart minutes. Routes are built by functions that take a :class:`WebContext`, so several
routers (two apps, two prefixes) never share state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from ..admin import Stats
from ._series import SeriesCache

if TYPE_CHECKING:
    from .._core import Core

Actor = Callable[[Request], str | None]
"""Names the caller of a request for the audit log (a mounted router's host knows who)."""


@dataclass(frozen=True)
class WebContext:
    app: Core
    read_only: bool = False
    csrf: bool = True
    """Require a CSRF token on state-changing requests that carry no Authorization header."""
    actor: Actor | None = None
    series: SeriesCache = field(default_factory=SeriesCache, compare=False, repr=False)
    """Settled minutes of the charts, kept between refreshes (see :mod:`._series`)."""

    async def core(self) -> Core:
        """The app, opened at first use when its host has not opened it (``async with app``
        in the host's lifespan closes it cleanly; otherwise it closes with the process)."""
        if not self.app.is_open:
            await self.app.open()
        return self.app

    async def stats(self) -> Stats:
        return Stats(await self.core())
