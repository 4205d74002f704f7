"""Per task name, over the last hour and the last day: attempts, throughput, the attempts
retried and dead-lettered, and the p50/p95/p99 of run time and wait time, read from the
statistics the workers write (see :mod:`tether.admin._buckets`: an hour is read per minute,
a day per hour). Paged by ``<queue>|<task>``, one queue or every known queue.

Throughput divides by the time that holds data (``TaskStats.active_s``), not by the whole
window: a day of which ten minutes were recorded is a rate over those minutes. A day is
read per hour, so when it holds no attempt the hour lacks (the same count), its rate is
the hour's, read per minute: the finer of the two."""

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from ...admin import TaskStats
from .._context import WebContext
from .._params import Cursor
from ._render import page, render, route_class

PER_PAGE = 50


@dataclass(frozen=True)
class Cell:
    """One task over one window, as the page shows it."""

    stats: TaskStats
    per_second: float
    active_s: float | None
    """The seconds the rate is over (None: a reader of an earlier release, the window)."""


@dataclass(frozen=True)
class Row:
    queue: str
    task: str
    windows: list[Cell | None]
    """One per window of the page, shortest first (None: no attempt in it)."""


def cells(windows: list[TaskStats | None]) -> list[Cell | None]:
    """The windows of a task, shortest first; a window with the same attempts as the one
    before it takes that one's rate (its data all lies in the shorter, finer window)."""
    out: list[Cell | None] = []
    for s in windows:
        finer = out[-1] if out else None
        if s is None:
            out.append(None)
        elif finer is not None and finer.stats.attempts == s.attempts:
            out.append(Cell(s, finer.per_second, finer.active_s))
        else:
            out.append(Cell(s, s.per_second, s.active_s))
    return out


def routes(ctx: WebContext) -> APIRouter:
    pages = APIRouter(route_class=route_class(ctx), include_in_schema=False)
    longest = ctx.app.settings.stats_window
    windows = sorted({min(3600.0, longest), min(86400.0, longest)})

    @page(pages, "/stats")
    async def statistics(
        request: Request,
        queue: Annotated[str | None, Query(max_length=100)] = None,
        cursor: Cursor = None,
        limit: Annotated[int, Query(ge=1, le=500)] = PER_PAGE,
    ) -> Response:
        stats = await ctx.stats()
        chosen = queue or None  # the form's "every queue" sends an empty value
        if chosen is not None:
            await stats.require_queue(chosen)  # 422 for a malformed name, 404 unknown
        # Paged on the longest window (a task with attempts in the hour has some in the day
        # too); the shorter windows are read for the page's own queues only.
        longest_page = await stats.tasks_page(
            chosen, window=windows[-1], cursor=cursor, limit=limit
        )
        found: dict[tuple[str, str], list[TaskStats | None]] = {}
        for s in longest_page.items:
            found.setdefault((s.queue, s.task), [None] * len(windows))[-1] = s
        for i, window in enumerate(windows[:-1]):
            for q in dict.fromkeys(q for q, _ in found):
                for s in await stats.tasks(q, window=window):
                    if (s.queue, s.task) in found:
                        found[(s.queue, s.task)][i] = s
        shown = list(found)
        next_cursor = longest_page.cursor
        context = {
            "title": "Statistics",
            "active": "stats",
            "rows": [Row(q, t, cells(found[(q, t)])) for q, t in shown],
            "windows": windows,
            "queue": chosen or "",
            "queues": (await stats.queue_names()).items,
            "cursor": cursor,
            "next_cursor": next_cursor,
        }
        return render(ctx, request, "stats.html", context)

    return pages
