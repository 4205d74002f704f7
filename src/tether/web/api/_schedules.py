"""Schedules: list, pause, resume, trigger, reset a backoff, remove."""

from typing import Annotated

from fastapi import APIRouter, Depends, Path

from ...scheduler import ScheduleInfo, Schedules
from .._context import WebContext
from .._errors import CONFLICT, NOT_FOUND, NotApplicable, TetherRoute
from .._guard import audit
from .._models import ScheduleBackoffOut, ScheduleControl, ScheduleOut, SchedulePage
from .._params import DEFAULT, Cursor, Limit, writer

ScheduleName = Annotated[str, Path(min_length=1, max_length=200, description="A schedule name.")]


def _out(info: ScheduleInfo) -> ScheduleOut:
    s = info.schedule
    return ScheduleOut(
        name=s.name, task=s.task, queue=s.queue, priority=s.priority, spec=s.spec,
        source=info.source, paused=info.paused, next_run=info.next_run,
        last_run=info.last_run, last_task_id=info.last_task_id,
        last_outcome=info.last_outcome, error=info.error,
        backoff=None if info.backoff is None else ScheduleBackoffOut(
            failures=info.backoff.failures, until=info.backoff.until,
            resting=info.backoff.resting(),
        ),
    )  # fmt: skip


def routes(ctx: WebContext) -> APIRouter:
    api = APIRouter(route_class=TetherRoute, tags=["schedules"])
    write = writer(ctx)

    async def existing(name: str) -> Schedules:
        schedules = Schedules(await ctx.core())
        if await schedules.get(name) is None:
            raise LookupError(f"no schedule named {name!r}")
        return schedules

    @api.get("/schedules", response_model=SchedulePage)
    async def schedules(cursor: Cursor = None, limit: Limit = DEFAULT) -> SchedulePage:
        """Schedules in name order: next run, last run and outcome, paused, last error."""
        infos, next_cursor = await Schedules(await ctx.core()).page(cursor, limit)
        return SchedulePage(items=[_out(i) for i in infos], cursor=next_cursor)

    @api.post("/schedules/{name:path}/pause", response_model=ScheduleControl, responses=NOT_FOUND)
    async def pause(who: Annotated[str, Depends(write)], name: ScheduleName) -> ScheduleControl:
        """Skip the schedule's ticks until it is resumed."""
        await (await existing(name)).pause(name)
        audit(who, "schedule.pause", ids=[name])
        return ScheduleControl(name=name, paused=True)

    @api.post("/schedules/{name:path}/resume", response_model=ScheduleControl, responses=NOT_FOUND)
    async def resume(who: Annotated[str, Depends(write)], name: ScheduleName) -> ScheduleControl:
        await (await existing(name)).resume(name)
        audit(who, "schedule.resume", ids=[name])
        return ScheduleControl(name=name, paused=False)

    @api.post(
        "/schedules/{name:path}/trigger",
        response_model=ScheduleControl,
        responses={**NOT_FOUND, **CONFLICT},
    )
    async def trigger(who: Annotated[str, Depends(write)], name: ScheduleName) -> ScheduleControl:
        """Enqueue a run now, outside the schedule's ticks (409 when this app does not know
        the schedule's task)."""
        schedules = await existing(name)
        try:
            handle, rest = await schedules.trigger_run(name)
        except ValueError as exc:  # the task is not registered in this app
            raise NotApplicable(str(exc)) from None
        audit(who, "schedule.trigger", ids=[name], task_ids=[handle.id], in_backoff=bool(rest))
        return ScheduleControl(
            name=name, task_id=handle.id, backoff_until=rest.until if rest else None
        )

    @api.post(
        "/schedules/{name:path}/reset-backoff",
        response_model=ScheduleControl,
        responses=NOT_FOUND,
    )
    async def reset_backoff(
        who: Annotated[str, Depends(write)], name: ScheduleName
    ) -> ScheduleControl:
        """End the schedule's failure backoff: its next tick runs (``backoff_reset`` says
        whether it was in backoff)."""
        schedules = await existing(name)
        state = await schedules.backoff(name)
        reset = await schedules.reset_backoff(name)
        audit(who, "schedule.reset_backoff", ids=[name], reset=reset)
        return ScheduleControl(
            name=name, backoff_reset=reset, backoff_until=state.until if state else None
        )

    @api.delete(
        "/schedules/{name:path}",
        response_model=ScheduleControl,
        responses={**NOT_FOUND, **CONFLICT},
    )
    async def remove(who: Annotated[str, Depends(write)], name: ScheduleName) -> ScheduleControl:
        """Remove a schedule added at runtime (409 for one declared in code: pause it)."""
        schedules = await existing(name)
        if name in {s.name for s in ctx.app.declared_schedules}:
            raise NotApplicable(
                f"schedule {name!r} is declared in code: pause it, or delete it there"
            )
        removed = await schedules.remove(name)
        audit(who, "schedule.remove", ids=[name], removed=removed)
        return ScheduleControl(name=name, removed=removed)

    return api
