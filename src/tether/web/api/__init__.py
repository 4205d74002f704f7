"""The JSON API, one router per area, all built from one :class:`WebContext`."""

from __future__ import annotations

from fastapi import APIRouter

from .._context import WebContext
from .._errors import COMMON_RESPONSES
from . import _dead, _limits, _queues, _schedules, _system, _tasks


def build(ctx: WebContext) -> APIRouter:
    """Every JSON route (mount it under ``/api``)."""
    api = APIRouter(responses=COMMON_RESPONSES)
    for area in (_system, _queues, _dead, _tasks, _schedules, _limits):
        api.include_router(area.routes(ctx))
    return api
