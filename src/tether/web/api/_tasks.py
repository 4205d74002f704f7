"""A task by its id (status, attempts, result or error), cancel; per-task statistics."""

from dataclasses import replace
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query

from ...admin import TaskInfo, run_now
from ...producer._lifecycle import cancel
from .._context import WebContext
from .._errors import CONFLICT, NOT_FOUND, NotApplicable, TetherRoute
from .._format import shallow
from .._guard import audit
from .._models import QUEUE_PATTERN, Cancelled, RanNow, TaskStatsPage
from .._params import DEFAULT, Cursor, Limit, writer
from .._task_ids import check_task_id

TaskId = Annotated[
    str,
    Path(
        min_length=3,
        max_length=300,
        description="A task id: <queue>:<stream index>-<entry id>, <queue>:<32 hex digits> "
        "or <queue>:<taskiq id>.<8 hex digits>; anything else is answered 422.",
    ),
]


def routes(ctx: WebContext) -> APIRouter:
    api = APIRouter(route_class=TetherRoute)
    write = writer(ctx)
    max_window = ctx.app.settings.stats_window

    @api.get("/tasks/{task_id}", response_model=TaskInfo, responses=NOT_FOUND, tags=["tasks"])
    async def task(task_id: TaskId) -> TaskInfo:
        """Where the task is (queued, scheduled, running, retrying, succeeded, failed,
        dead, cancelled), its attempt, arguments, and its result or error. Arguments and
        results nested deeper than 64 levels show a marker in their place."""
        info = await (await ctx.stats()).task(check_task_id(task_id))
        return replace(info, args=shallow(info.args), kwargs=shallow(info.kwargs),
                       result=shallow(info.result))  # fmt: skip

    @api.post(
        "/tasks/{task_id}/cancel", response_model=Cancelled, responses=NOT_FOUND, tags=["tasks"]
    )
    async def cancel_task(who: Annotated[str, Depends(write)], task_id: TaskId) -> Cancelled:
        """Cancel the task: a queued or delayed one is removed; a running async one is
        cancelled at its next await; a running plain function cannot be (not_cancellable)."""
        result = await cancel(await ctx.core(), check_task_id(task_id))
        audit(who, "task.cancel", ids=[task_id], result=result.value)
        return Cancelled(task_id=task_id, result=result.value)

    @api.post(
        "/tasks/{task_id}/run-now",
        response_model=RanNow,
        responses={**NOT_FOUND, **CONFLICT},
        tags=["tasks"],
    )
    async def run_task_now(who: Annotated[str, Depends(write)], task_id: TaskId) -> RanNow:
        """Make a delayed task (scheduled, or a retry in its backoff) due now: a worker
        starts it within one maintenance pass. 409 when it is not waiting for its time."""
        app = await ctx.core()
        status = (await (await ctx.stats()).task(check_task_id(task_id))).status  # 404 unknown
        if not await run_now(app, task_id):
            raise NotApplicable(f"task {task_id} is {status}, not waiting for its due time")
        audit(who, "task.run_now", ids=[task_id])
        return RanNow(task_id=task_id, due="now")

    @api.get("/stats/tasks", response_model=TaskStatsPage, responses=NOT_FOUND, tags=["statistics"])
    async def task_stats(
        queue: Annotated[str | None, Query(pattern=QUEUE_PATTERN)] = None,
        task: Annotated[str | None, Query(min_length=1, max_length=500)] = None,
        window: Annotated[float, Query(ge=60, le=max_window, description="Seconds.")] = min(
            3600.0, max_window
        ),
        cursor: Cursor = None,
        limit: Limit = DEFAULT,
    ) -> TaskStatsPage:
        """Per queue and task name over the last ``window`` seconds: counts by outcome,
        attempts per second, error rate, p50/p95/p99 run and wait time. Paged by
        ``<queue>|<task>``, in queue then task order. A page reads one hash per bucket of
        the window (a minute up to three hours, an hour beyond: 60 for an hour, 24 for a
        day) for each queue it covers, from the cursor's queue on: never the other
        queues'. A full page has a cursor; the page after it may be empty."""
        stats = await ctx.stats()
        if queue is not None:
            await stats.require_queue(queue)
        page = await stats.tasks_page(queue, window=window, task=task, cursor=cursor,
                                      limit=limit)  # fmt: skip
        return TaskStatsPage(items=page.items, cursor=page.cursor)

    return api
