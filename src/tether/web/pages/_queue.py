"""A queue: its figures and an hour of charts, the tasks running (with a cancel button)
and the tasks waiting for their time (run now, cancel); pause and resume.

The dead letters are the third tab of the same page (:mod:`._dead`). Each tab reads one
page of its list by cursor (O(page) commands, see :mod:`tether.admin._listing`), never the
whole list."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from ...admin import pause, resume
from .._context import WebContext
from .._guard import audit
from .._params import Cursor, QueueName, writer
from . import _charts
from ._render import back, form_value, page, render, route_class

PER_PAGE = 50
Limit = Annotated[int, Query(ge=1, le=500)]


async def header(ctx: WebContext, queue: str) -> dict[str, Any]:
    """What every tab of a queue shows above its list (404 for an unknown queue)."""
    stats = await ctx.stats()
    figures = await stats.queue(queue)
    minutes = max(1, min(60, int(ctx.app.settings.stats_window // 60)))
    series = await ctx.series.series(stats, queue, minutes)
    return {
        "q": figures,
        "throughput": _charts.throughput(series, _charts.LARGE),
        "failures": _charts.failures(series, _charts.LARGE),
        "attempts": sum(m.counts.attempts for m in series),
        "errors": sum(m.counts.errors for m in series),
        "failure_share": _charts.failure_share(series),
        "chart_minutes": minutes,
        "title": f"Queue {queue}",
        "active": "overview",
    }


def routes(ctx: WebContext) -> APIRouter:
    pages = APIRouter(route_class=route_class(ctx), include_in_schema=False)
    write = writer(ctx)

    @page(pages, "/queues/{queue}")
    async def running(
        request: Request, queue: QueueName, cursor: Cursor = None, limit: Limit = PER_PAGE
    ) -> Response:
        top = await header(ctx, queue)
        listed = await (await ctx.stats()).running(queue, cursor=cursor, limit=limit)
        context = {**top, "tab": "running", "items": listed.items, "cursor": cursor,
                   "next_cursor": listed.cursor}  # fmt: skip
        return render(ctx, request, "queue_running.html", context)

    @page(pages, "/queues/{queue}/scheduled")
    async def scheduled(
        request: Request, queue: QueueName, cursor: Cursor = None, limit: Limit = PER_PAGE
    ) -> Response:
        top = await header(ctx, queue)
        listed = await (await ctx.stats()).delayed(queue, cursor=cursor, limit=limit)
        context = {**top, "tab": "scheduled", "items": listed.items, "cursor": cursor,
                   "next_cursor": listed.cursor}  # fmt: skip
        return render(ctx, request, "queue_scheduled.html", context)

    @page(pages, "/queues/{queue}/pause", methods=("POST",))
    async def pause_queue(
        request: Request, who: Annotated[str, Depends(write)], queue: QueueName
    ) -> Response:
        await (await ctx.stats()).require_queue(queue)
        changed = await pause(await ctx.core(), queue)
        audit(who, "queue.pause", queue=queue, changed=changed)
        words = (
            f"Queue {queue} paused: within one maintenance pass no worker fetches from it "
            "(tasks already running finish; enqueues are still accepted)."
            if changed
            else f"Queue {queue} was paused already."
        )
        return back(request, await form_value(request, "next"), words)

    @page(pages, "/queues/{queue}/resume", methods=("POST",))
    async def resume_queue(
        request: Request, who: Annotated[str, Depends(write)], queue: QueueName
    ) -> Response:
        await (await ctx.stats()).require_queue(queue)
        changed = await resume(await ctx.core(), queue)
        audit(who, "queue.resume", queue=queue, changed=changed)
        words = (
            f"Queue {queue} resumed: workers fetch from it again at their next pass."
            if changed
            else f"Queue {queue} was not paused."
        )
        return back(request, await form_value(request, "next"), words)

    return pages
