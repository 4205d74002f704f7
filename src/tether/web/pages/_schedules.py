"""Schedules: each one's next run, last run and last outcome, paused or not, in backoff or
not, the last error the scheduler met firing it; pause, resume, trigger, reset a backoff.
Names go in the form, not the path: a schedule name may hold any character."""

from collections.abc import Awaitable, Callable
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
            words = await _ACTIONS[action](schedules, name, who)
        except (TetherError, LookupError) as exc:
            return back(
                request, target, f"Could not {action.replace('-', ' ')} {name!r}: {exc}", ok=False
            )
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

    @page(pages, "/schedules/reset-backoff", methods=("POST",))
    async def reset_backoff(request: Request, who: Annotated[str, Depends(write)]) -> Response:
        return await act(request, who, "reset-backoff")

    return pages


async def _pause(schedules: Schedules, name: str, who: str) -> str:
    await schedules.pause(name)
    audit(who, "schedule.pause", ids=[name])
    return f"Schedule {name} paused: its ticks are skipped until it is resumed."


async def _resume(schedules: Schedules, name: str, who: str) -> str:
    await schedules.resume(name)
    audit(who, "schedule.resume", ids=[name])
    return f"Schedule {name} resumed."


async def _trigger(schedules: Schedules, name: str, who: str) -> str:
    handle, rest = await schedules.trigger_run(name)
    audit(who, "schedule.trigger", ids=[name], task_ids=[handle.id], in_backoff=bool(rest))
    words = f"Schedule {name} triggered: task {handle.id}."
    if rest is not None:
        words += (
            f" It ran through the schedule's backoff ({rest.failures} failed "
            f"run{'' if rest.failures == 1 else 's'} in a row); the backoff stays until a "
            "run succeeds."
        )
    return words


async def _reset_backoff(schedules: Schedules, name: str, who: str) -> str:
    reset = await schedules.reset_backoff(name)
    audit(who, "schedule.reset_backoff", ids=[name], reset=reset)
    if reset:
        return f"Schedule {name}: backoff ended, its next tick runs."
    return f"Schedule {name} was not in backoff."


_ACTIONS: dict[str, Callable[[Schedules, str, str], Awaitable[str]]] = {
    "pause": _pause,
    "resume": _resume,
    "trigger": _trigger,
    "reset-backoff": _reset_backoff,
}
