"""``tether exporter``: the deployment's metrics on a port of their own, for deployments
that do not run ``tether web``.

The HTTP server runs in threads (``_server.py``); each scrape reads Redis on the event
loop that entered the exporter, through the app's own connection, and waits for it.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from ._deployment import READ_TIMEOUT, DeploymentCollector
from ._server import MetricsServer

if TYPE_CHECKING:
    from ..producer._core import Core


class Exporter:
    """Serve ``app``'s deployment metrics at ``http://host:port/metrics`` while inside
    ``async with Exporter(...)``. With ``token`` set, every scrape must send
    ``Authorization: Bearer <token>``. The app is opened on entry unless it is open
    already, and closed on exit if the exporter opened it."""

    def __init__(
        self,
        app: Core,
        *,
        port: int,
        host: str = "127.0.0.1",
        token: str | None = None,
        timeout: float = READ_TIMEOUT,
    ) -> None:
        self.app = app
        self.token = token
        self.registry = CollectorRegistry()
        self._host, self._port, self._timeout = host, port, timeout
        self._server: MetricsServer | None = None
        self._opened = False

    @property
    def url(self) -> str:
        assert self._server is not None, "the exporter is not running"
        return self._server.url

    async def __aenter__(self) -> Exporter:
        loop = asyncio.get_running_loop()
        self.registry.register(DeploymentCollector(self.app, loop, self._timeout))
        server = MetricsServer(self.registry, self._host, self._port, token=self.token)
        server.start()  # a port in use fails here, before the app is opened
        self._server = server
        if not self.app.is_open:
            await self.app.open()
            self._opened = True
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        server, self._server = self._server, None
        if server is not None:
            # From a thread: a scrape in flight waits for this loop to finish its read.
            await asyncio.to_thread(server.stop)
        if self._opened:
            self._opened = False
            await self.app.close()
