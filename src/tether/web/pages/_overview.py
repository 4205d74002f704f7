"""The overview: every queue's figures with an hour of throughput and failures as small
charts, the live workers and the scheduler leader, refreshed live.

The live part is a fragment of its own (``/fragments/overview``) that the page's script
fetches every two seconds while the tab is visible and the operator has not paused it;
without JavaScript the page shows the same content and a reload refreshes it. Either
way the cost is the readers' own: the figures of the page's queues (a fixed number of
commands per queue, two round trips), the minutes of the charts not yet settled (two or
three ``HGETALL`` per queue: :mod:`tether.web._series` keeps the settled ones), the worker
registry and the health check: O(queues), whatever the queues hold.
"""

import asyncio
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request, Response
from markupsafe import Markup

from ...admin import MinuteCounts, QueueStats
from .._context import WebContext
from .._params import Cursor
from . import _charts
from ._queue import Limit
from ._render import page, render, route_class

CHART_MINUTES = 60
QUEUES_PER_PAGE = 50
REFRESH_MS = 2000
CONCURRENT_READS = 8


@dataclass(frozen=True)
class QueueRow:
    stats: QueueStats
    throughput: Markup
    failures: Markup
    attempts: int
    """Attempts that ended over the charts' window."""
    failure_share: float | None


@dataclass(frozen=True)
class Totals:
    waiting: int
    running: int
    delayed: int
    dead: int
    per_second: float


async def live(ctx: WebContext, cursor: str | None, limit: int) -> dict[str, Any]:
    """Everything the live part shows, read once."""
    stats = await ctx.stats()
    minutes = max(1, min(CHART_MINUTES, int(ctx.app.settings.stats_window // 60)))
    queues, workers, health = await asyncio.gather(
        stats.queues(cursor=cursor, limit=limit), stats.all_workers(), stats.health()
    )
    # A few queues' charts at a time: concurrent round trips, a bounded number of
    # connections (each concurrent read holds one of the app's pool).
    gate = asyncio.Semaphore(CONCURRENT_READS)

    async def chart(queue: str) -> list[MinuteCounts]:
        async with gate:
            return await ctx.series.series(stats, queue, minutes)

    series = await asyncio.gather(*(chart(q.name) for q in queues.items))
    rows = [
        QueueRow(
            stats=q,
            throughput=_charts.throughput(s),
            failures=_charts.failures(s),
            attempts=sum(m.counts.attempts for m in s),
            failure_share=_charts.failure_share(s),
        )
        for q, s in zip(queues.items, series, strict=True)
    ]
    totals = Totals(
        waiting=sum(q.depth for q in queues.items),
        running=sum(q.running for q in queues.items),
        delayed=sum(q.delayed for q in queues.items),
        dead=sum(q.dead for q in queues.items),
        per_second=sum(q.recent.per_second for q in queues.items),
    )
    return {
        "rows": rows,
        "totals": totals,
        "workers": workers,
        "health": health,
        "cursor": cursor,
        "next_cursor": queues.cursor,
        "chart_minutes": minutes,
    }


def routes(ctx: WebContext) -> APIRouter:
    pages = APIRouter(route_class=route_class(ctx), include_in_schema=False)

    @page(pages, "/")
    async def overview(
        request: Request, cursor: Cursor = None, limit: Limit = QUEUES_PER_PAGE
    ) -> Response:
        data = await live(ctx, cursor, limit)
        refresh = f"/fragments/overview?{request.url.query}" if request.url.query else None
        context = {
            **data,
            "active": "overview",
            "title": "Overview",
            "refresh_ms": REFRESH_MS,
            "fragment_path": refresh or "/fragments/overview",
        }
        return render(ctx, request, "overview.html", context)

    @page(pages, "/fragments/overview")
    async def overview_live(
        request: Request, cursor: Cursor = None, limit: Limit = QUEUES_PER_PAGE
    ) -> Response:
        data = await live(ctx, cursor, limit)
        return render(ctx, request, "_overview_live.html", data, fragment=True)

    return pages
