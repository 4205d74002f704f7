"""Queues: figures, pause and resume, what they hold, throughput.

The routers here keep their annotations evaluated (no ``from __future__ import
annotations``): FastAPI reads them at import, and some name values of the closure."""

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from ...admin import QueueStats, pause, resume
from .._context import WebContext
from .._errors import NOT_FOUND, TetherRoute
from .._guard import audit
from .._models import DelayedPage, QueueControl, QueuePage, RunningPage, Throughput
from .._params import DEFAULT, Cursor, Limit, QueueName, writer


def routes(ctx: WebContext) -> APIRouter:
    api = APIRouter(route_class=TetherRoute, tags=["queues"])
    write = writer(ctx)
    max_minutes = max(1, min(24 * 60, int(ctx.app.settings.stats_window // 60)))

    @api.get("/queues", response_model=QueuePage)
    async def queues(cursor: Cursor = None, limit: Limit = DEFAULT) -> QueuePage:
        """Every known queue's figures, in name order: waiting per priority, running,
        delayed, dead, age of the oldest waiting entry, paused, live workers, recent rate."""
        page = await (await ctx.stats()).queues(cursor=cursor, limit=limit)
        return QueuePage(items=page.items, cursor=page.cursor)

    @api.get("/queues/{queue}", response_model=QueueStats, responses=NOT_FOUND)
    async def queue(queue: QueueName) -> QueueStats:
        """One queue's figures."""
        return await (await ctx.stats()).queue(queue)

    @api.post("/queues/{queue}/pause", response_model=QueueControl, responses=NOT_FOUND)
    async def pause_queue(who: Annotated[str, Depends(write)], queue: QueueName) -> QueueControl:
        """Pause the queue: within one maintenance pass no worker fetches from it; enqueues
        are still accepted."""
        app = await ctx.core()
        await (await ctx.stats()).require_queue(queue)
        changed = await pause(app, queue)
        audit(who, "queue.pause", queue=queue, changed=changed)
        return QueueControl(queue=queue, paused=True, changed=changed)

    @api.post("/queues/{queue}/resume", response_model=QueueControl, responses=NOT_FOUND)
    async def resume_queue(who: Annotated[str, Depends(write)], queue: QueueName) -> QueueControl:
        """Resume a paused queue: workers fetch from it again at their next pass."""
        app = await ctx.core()
        await (await ctx.stats()).require_queue(queue)
        changed = await resume(app, queue)
        audit(who, "queue.resume", queue=queue, changed=changed)
        return QueueControl(queue=queue, paused=False, changed=changed)

    @api.get("/queues/{queue}/running", response_model=RunningPage, responses=NOT_FOUND)
    async def running(
        queue: QueueName, cursor: Cursor = None, limit: Limit = DEFAULT
    ) -> RunningPage:
        """Entries delivered to workers and not yet settled (task, worker, elapsed),
        highest priority first."""
        stats = await ctx.stats()
        await stats.require_queue(queue)
        page = await stats.running(queue, cursor=cursor, limit=limit)
        return RunningPage(items=page.items, cursor=page.cursor)

    @api.get("/queues/{queue}/delayed", response_model=DelayedPage, responses=NOT_FOUND)
    async def delayed(
        queue: QueueName, cursor: Cursor = None, limit: Limit = DEFAULT
    ) -> DelayedPage:
        """Tasks waiting for their due time (scheduled, or retrying), soonest first."""
        stats = await ctx.stats()
        await stats.require_queue(queue)
        page = await stats.delayed(queue, cursor=cursor, limit=limit)
        return DelayedPage(items=page.items, cursor=page.cursor)

    @api.get("/queues/{queue}/throughput", response_model=Throughput, responses=NOT_FOUND)
    async def throughput(
        queue: QueueName,
        minutes: Annotated[int, Query(ge=1, le=max_minutes)] = 60,
        task: Annotated[str | None, Query(min_length=1, max_length=500)] = None,
    ) -> Throughput:
        """Attempts that ended per minute, by outcome, oldest minute first. Reads one hash
        per minute asked (1,440 for a day, in one pipeline); for totals over a long span,
        /stats/tasks with a window over three hours reads hour hashes."""
        stats = await ctx.stats()
        await stats.require_queue(queue)
        series = await stats.throughput(queue, minutes=minutes, task=task)
        return Throughput(queue=queue, task=task, minutes=series)

    return api
