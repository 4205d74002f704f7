"""The live workers, from the registry their heartbeats publish: host, pid, queues, what
they run and hold against their capacity, their last heartbeat, their counters. A page of
names by cursor, and only that page's records are read (see :mod:`tether.admin._workers`).
A record expires with its worker's lease: every worker listed is alive."""

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from .._context import WebContext
from .._params import Cursor
from ._render import page, render, route_class

PER_PAGE = 50
SHOWN_COUNTERS = ("succeeded", "failed", "retried")
"""Counters with a column of their own; the others are in each row's details."""


def routes(ctx: WebContext) -> APIRouter:
    pages = APIRouter(route_class=route_class(ctx), include_in_schema=False)

    @page(pages, "/workers")
    async def workers(
        request: Request,
        cursor: Cursor = None,
        limit: Annotated[int, Query(ge=1, le=500)] = PER_PAGE,
    ) -> Response:
        listed = await (await ctx.stats()).workers(cursor=cursor, limit=limit)
        context = {
            "title": "Workers",
            "active": "workers",
            "items": listed.items,
            "cursor": cursor,
            "next_cursor": listed.cursor,
            "shown_counters": SHOWN_COUNTERS,
        }
        return render(ctx, request, "workers.html", context)

    return pages
