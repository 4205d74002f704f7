"""``GET /metrics`` of the standalone server: the deployment's Prometheus metrics.

It sits behind the server's token like every other path: Prometheus sends it with its
``authorization`` setting (``credentials_file`` naming the token file). The figures are
read from Redis on each scrape (:func:`tether.metrics.exposition`); an unreachable server
answers ``tether_up 0``, not an error. Without the metrics extra the route says how to get
it (501), and the rest of the server works as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

if TYPE_CHECKING:
    from ..producer._core import Core


def routes(app: Core) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/metrics")
    async def metrics(request: Request) -> Response:
        try:
            from ..metrics import exposition
        except ImportError as exc:
            return PlainTextResponse(
                f"/metrics needs prometheus-client ({exc}): pip install 'tether-queue[metrics]'\n",
                status_code=501,
            )
        body, content_type = await exposition(app, request.headers.get("accept"))
        return Response(body, media_type=content_type)

    return router
