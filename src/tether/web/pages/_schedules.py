"""Schedules: each one's next run, last run and last outcome, paused or not, the last error
the scheduler met firing it; pause, resume, trigger. Names go in the form, not the path:
a schedule name may hold any character."""

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from ...base._errors import TetherError
from ...scheduler import Schedules
from .._context import WebContext
from .._guard import audit
from .._params import Cursor, writer
from ._render import back, form_value, page, render, route_class

PER_PAGE = 50


def routes(ctx: WebContext) -> APIRouter:
    pages = APIRouter(route_class=route_class(ctx), include_in_schema=False)
    write = writer(ctx)

    @page(pages, "/schedules")
    async def schedules(
        request: Request,
        cursor: Cursor = None,
        limit: Annotated[int, Query(ge=1, le=500)] = PER_PAGE,
    ) -> Response:
        schedules = Schedules(await ctx.core())
        infos, next_cursor = await schedules.page(cursor, limit)
        context = {
            "title": "Schedules",
            "active": "schedules",
            "items": infos,
            "leader": await schedules.leader(),
            "cursor": cursor,
            "next_cursor": next_cursor,
        }
        return render(ctx, request, "schedules.html", context)

    async def act(request: Request, who: str, action: str) -> Response:
        name = (await form_value(request, "name")) or ""
        target = await form_value(request, "next")
        schedules = Schedules(await ctx.core())
        try:
            if await schedules.get(name) is None:
                raise LookupError(f"no schedule named {name!r}")
            if action == "pause":
                await schedules.pause(name)
                words = f"Schedule {name} paused: its ticks are skipped until it is resumed."
            elif action == "resume":
                await schedules.resume(name)
                words = f"Schedule {name} resumed."
            else:
                handle = await schedules.trigger(name)
                audit(who, "schedule.trigger", ids=[name], task_ids=[handle.id])
                return back(request, target, f"Schedule {name} triggered: task {handle.id}.")
        except (TetherError, LookupError) as exc:
            return back(request, target, f"Could not {action} {name!r}: {exc}", ok=False)
        audit(who, f"schedule.{action}", ids=[name])
        return back(request, target, words)

    @page(pages, "/schedules/pause", methods=("POST",))
    async def pause(request: Request, who: Annotated[str, Depends(write)]) -> Response:
        return await act(request, who, "pause")

    @page(pages, "/schedules/resume", methods=("POST",))
    async def resume(request: Request, who: Annotated[str, Depends(write)]) -> Response:
        return await act(request, who, "resume")

    @page(pages, "/schedules/trigger", methods=("POST",))
    async def trigger(request: Request, who: Annotated[str, Depends(write)]) -> Response:
        return await act(request, who, "trigger")

    return pages
