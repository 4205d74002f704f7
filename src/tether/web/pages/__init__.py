"""The dashboard: server-rendered pages over the same readers and writes as the JSON API.

One module per page or area; each builds its routes from the router's
:class:`~tether.web._context.WebContext`:

=================  ============================================================================
``_overview``      ``/``: every queue with its charts, workers, the scheduler leader; live
``_queue``         ``/queues/{queue}``: figures, running tasks, scheduled tasks; pause, resume
``_dead``          ``/queues/{queue}/dead``: dead letters; retry and purge, one or in bulk
``_task``          ``/task?id=``: a task by its id, its timeline; cancel, run now
``_workers``       ``/workers``: the registry
``_schedules``     ``/schedules``: next and last runs; pause, resume, trigger
``_stats``         ``/stats``: per task name over an hour and a day
=================  ============================================================================

``_render`` holds what they share (base URL, rendering, flash messages, error pages),
``_charts`` the inline SVG charts. Writes are forms posted to the dashboard, checked by the
API's own dependency (read-only mode, CSRF token), audit-logged, and answered by a redirect
back to the page with a message (post-redirect-get).
"""

from __future__ import annotations

from fastapi import APIRouter

from .._context import WebContext
from . import _dead, _overview, _queue, _schedules, _stats, _task, _workers


def build(ctx: WebContext) -> APIRouter:
    """Every page of the dashboard (mount it at the router's root)."""
    pages = APIRouter(include_in_schema=False)
    for area in (_overview, _queue, _dead, _task, _workers, _schedules, _stats):
        pages.include_router(area.routes(ctx))
    return pages
