"""Flow-control limits: read them, change them at runtime, see what they hold back.

The routes call :class:`tether.limits.Limits` (``app.limits``); a change reaches every
worker at its next admission. The routers keep their annotations evaluated (no ``from
__future__ import annotations``): FastAPI reads them at import."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel, ConfigDict, Field

from ...limits import KEEP, HeldCounts, KeyUsage, LimitInfo, Limits
from .._context import WebContext
from .._errors import NOT_FOUND, TetherRoute
from .._guard import audit
from .._params import QueueName, writer

TaskName = Annotated[str, Path(min_length=1, max_length=500, description="A task name.")]
LimitKey = Annotated[str, Path(min_length=1, max_length=500, description="A limit key.")]


class LimitsOut(BaseModel):
    """Limits in readable form: rates as text ("60/m"), None where there is no limit."""

    rate_limit: str | None
    rate_burst: int | None
    concurrency_limit: int | None
    key_rate_limit: str | None
    key_rate_burst: int | None
    key_concurrency_limit: int | None


class LimitOut(BaseModel):
    queue: str
    task: str
    declared: LimitsOut | None = Field(description="As declared in the code this server runs.")
    override: dict[str, Any] | None = Field(description="The runtime change, if any.")
    effective: LimitsOut = Field(description="What the workers apply.")
    generation: int
    running: int = Field(description="Slots of the task-wide concurrency limit in use.")
    waiting_for_rate: int
    waiting_for_slot: int
    keys_waiting: int


class LimitList(BaseModel):
    items: list[LimitOut]


class LimitChange(BaseModel):
    """The limits to change: a field left out keeps its limit, ``null`` removes it."""

    model_config = ConfigDict(extra="forbid")

    rate_limit: str | None = Field(default=None, max_length=100, examples=["60/m"])
    rate_burst: int | None = None
    concurrency_limit: int | None = None
    key_rate_limit: str | None = Field(default=None, max_length=100, examples=["10/s"])
    key_rate_burst: int | None = None
    key_concurrency_limit: int | None = None


class KeyUsageOut(BaseModel):
    queue: str
    task: str
    key: str
    running: int
    waiting_for_slot: int


class HeldOut(BaseModel):
    queue: str
    task: str
    rate: int
    key_rate: int
    concurrency: int
    key_concurrency: int
    backpressure: int = Field(description="Attempts that raised RateLimited.")
    total: int


class HeldList(BaseModel):
    window: float
    items: list[HeldOut]


def _out(info: LimitInfo) -> LimitOut:
    return LimitOut.model_validate(info.as_dict())


def _held(counts: HeldCounts) -> HeldOut:
    return HeldOut.model_validate({**counts.as_dict(), "total": counts.total})


def _usage(usage: KeyUsage) -> KeyUsageOut:
    return KeyUsageOut.model_validate(usage.as_dict())


def routes(ctx: WebContext) -> APIRouter:
    api = APIRouter(route_class=TetherRoute, tags=["limits"])
    write = writer(ctx)
    max_window = ctx.app.settings.stats_window

    async def limits(queue: str) -> Limits:
        await (await ctx.stats()).require_queue(queue)
        return Limits(await ctx.core())

    @api.get("/queues/{queue}/limits", response_model=LimitList, responses=NOT_FOUND)
    async def list_limits(queue: QueueName) -> LimitList:
        """Every task with limits on the queue (declared, or set at runtime), with what
        waits for them now."""
        infos = await (await limits(queue)).list(queue)
        return LimitList(items=[_out(i) for i in infos])

    @api.get("/queues/{queue}/limits/{task}", response_model=LimitOut, responses=NOT_FOUND)
    async def get_limit(queue: QueueName, task: TaskName) -> LimitOut:
        """One task's declared, overridden and effective limits."""
        return _out(await (await limits(queue)).get(task, queue=queue))

    @api.patch("/queues/{queue}/limits/{task}", response_model=LimitOut, responses=NOT_FOUND)
    async def change_limit(
        who: Annotated[str, Depends(write)],
        queue: QueueName,
        task: TaskName,
        change: LimitChange,
    ) -> LimitOut:
        """Change some of a task's limits for every worker; tasks waiting for them are
        admitted again under the new ones. A malformed value answers 422."""
        given = {name: getattr(change, name) for name in change.model_fields_set}
        fields = LimitChange.model_fields
        arguments: dict[str, Any] = {name: given.get(name, KEEP) for name in fields}
        info = await (await limits(queue)).set(task, queue=queue, **arguments)
        audit(who, "limits.set", queue=queue, ids=[task], changed=given)
        return _out(info)

    @api.delete("/queues/{queue}/limits/{task}", response_model=LimitOut, responses=NOT_FOUND)
    async def reset_limit(
        who: Annotated[str, Depends(write)], queue: QueueName, task: TaskName
    ) -> LimitOut:
        """Drop the runtime change: the limits declared in code apply again."""
        info = await (await limits(queue)).reset(task, queue=queue)
        audit(who, "limits.reset", queue=queue, ids=[task])
        return _out(info)

    @api.get(
        "/queues/{queue}/limits/{task}/keys/{key}",
        response_model=KeyUsageOut,
        responses=NOT_FOUND,
    )
    async def key_usage(queue: QueueName, task: TaskName, key: LimitKey) -> KeyUsageOut:
        """One limit key of a task: its slots in use and the tasks parked for them."""
        return _usage(await (await limits(queue)).usage(task, key, queue=queue))

    @api.get("/queues/{queue}/held", response_model=HeldList, responses=NOT_FOUND)
    async def held(
        queue: QueueName,
        window: Annotated[float, Query(ge=60, le=max_window)] = 3600.0,
    ) -> HeldList:
        """How often each task of the queue was held back, by limit, over the window."""
        counts = await (await limits(queue)).held(queue, window=window)
        return HeldList(window=window, items=[_held(c) for c in counts])

    return api
