"""A queue's dead letters: a page of them (newest first, by cursor, optionally of one task)
with reason, error and traceback; one letter whole; retry and purge, one at a time, the
selected ones, or all of them (of one task when the list is filtered).

"All" is the run the CLI and the API make (:meth:`tether.dead.DeadLetters.retry_all` and
``purge_all``), a page of letters at a time, for at most :data:`BULK_SECONDS`; it takes up
only the letters present when it began, so a retried task that fails again is not retried
twice by one press. Past the budget the page says more remain: press again to go on."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from ...base._errors import ConfigError, TetherError
from ...dead import SCAN_BUDGET, Bulk, BulkTotal, DeadLetters, total_of
from .._context import WebContext
from .._guard import audit
from .._models import LISTED_PAYLOAD, DeadLetterOut
from .._params import Cursor, EntryId, QueueName, writer
from ._queue import PER_PAGE, Limit, header
from ._render import back, form_value, form_values, link, page, render, route_class

BULK_SECONDS = 20.0
"""How long one press of "retry all" or "purge all" may work before it reports."""
TaskFilter = Annotated[str | None, Query(max_length=500, description="A task name.")]


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


async def _letters(ctx: WebContext, queue: str) -> DeadLetters:
    await (await ctx.stats()).require_queue(queue)
    return DeadLetters(await ctx.core(), queue)


def _failures(count: int, first: str) -> str:
    if not count:
        return ""
    return f"; {_plural(count, 'letter')} could not be retried ({first})"


def routes(ctx: WebContext) -> APIRouter:
    pages = APIRouter(route_class=route_class(ctx), include_in_schema=False)
    _reads(ctx, pages)
    _writes_one(ctx, pages)
    _writes_bulk(ctx, pages)
    return pages


def _reads(ctx: WebContext, pages: APIRouter) -> None:
    @page(pages, "/queues/{queue}/dead")
    async def dead_letters(
        request: Request,
        queue: QueueName,
        cursor: Cursor = None,
        limit: Limit = PER_PAGE,
        task: TaskFilter = None,
    ) -> Response:
        top = await header(ctx, queue)
        dead = DeadLetters(await ctx.core(), queue)
        listed = await dead.page(cursor=cursor, limit=limit, task=task or None)
        context: dict[str, Any] = {
            **top,
            "tab": "dead",
            "items": [DeadLetterOut.of(d, LISTED_PAYLOAD) for d in listed.items],
            "cursor": cursor,
            "next_cursor": listed.cursor,
            "task": task or "",
            "scan_budget": SCAN_BUDGET,
        }
        return render(ctx, request, "queue_dead.html", context)

    @page(pages, "/queues/{queue}/dead/{entry_id}")
    async def dead_letter(request: Request, queue: QueueName, entry_id: EntryId) -> Response:
        dead = await _letters(ctx, queue)
        letter = DeadLetterOut.of(await dead.show(entry_id))
        context = {"queue": queue, "d": letter, "title": f"Dead letter {entry_id}",
                   "active": "overview"}  # fmt: skip
        return render(ctx, request, "dead_letter.html", context)


def _writes_one(ctx: WebContext, pages: APIRouter) -> None:
    write = writer(ctx)

    @page(pages, "/queues/{queue}/dead/{entry_id}/retry", methods=("POST",))
    async def retry_one(
        request: Request, who: Annotated[str, Depends(write)], queue: QueueName, entry_id: EntryId
    ) -> Response:
        dead = await _letters(ctx, queue)
        target = await form_value(request, "next")
        try:
            handle = await dead.retry(entry_id)
        except (TetherError, LookupError) as exc:
            return back(request, target, f"Could not retry {entry_id}: {exc}", ok=False)
        audit(who, "dead.retry", queue=queue, ids=[entry_id], task_ids=[handle.id])
        if target and target.startswith(f"/queues/{queue}/dead/{entry_id}"):
            # The retry took the letter out of the stream: its own page is gone. The task
            # it queued again is where the operator follows it.
            target = link("", "/task", id=handle.id)
        return back(request, target, f"Dead letter {entry_id} retried: queued as {handle.id}.")

    @page(pages, "/queues/{queue}/dead/{entry_id}/purge", methods=("POST",))
    async def purge_one(
        request: Request, who: Annotated[str, Depends(write)], queue: QueueName, entry_id: EntryId
    ) -> Response:
        dead = await _letters(ctx, queue)
        target = await form_value(request, "next")
        if not await dead.purge([entry_id]):
            return back(request, target, f"Dead letter {entry_id} was gone already.", ok=False)
        audit(who, "dead.purge", queue=queue, ids=[entry_id])
        if target and target.startswith(f"/queues/{queue}/dead/{entry_id}"):
            target = f"/queues/{queue}/dead"  # its own page is gone with it
        return back(request, target, f"Dead letter {entry_id} purged.")


def _writes_bulk(ctx: WebContext, pages: APIRouter) -> None:
    write = writer(ctx)

    @page(pages, "/queues/{queue}/dead/retry", methods=("POST",))
    async def retry_many(
        request: Request, who: Annotated[str, Depends(write)], queue: QueueName
    ) -> Response:
        dead = await _letters(ctx, queue)
        target = await form_value(request, "next")
        if (await form_value(request, "scope")) == "all":
            task = (await form_value(request, "task")) or None
            words, ok = await _retry_all(dead, task, who)
            return back(request, target, words, ok=ok)
        ids = await form_values(request, "ids")
        if not ids:
            return back(request, target, "Select the dead letters to retry first.", ok=False)
        try:
            bulk = await dead.retry_many(ids[:SCAN_BUDGET])
        except ConfigError as exc:
            return back(request, target, str(exc), ok=False)
        audit(who, "dead.retry", queue=queue, ids=bulk.done, failed=sorted(bulk.failed))
        failures = _failures(len(bulk.failed), next(iter(bulk.failed.values()), ""))
        words = f"Retried {_plural(len(bulk.done), 'dead letter')}{failures}."
        return back(request, target, words, ok=not bulk.failed)

    @page(pages, "/queues/{queue}/dead/purge", methods=("POST",))
    async def purge_many(
        request: Request, who: Annotated[str, Depends(write)], queue: QueueName
    ) -> Response:
        dead = await _letters(ctx, queue)
        target = await form_value(request, "next")
        if (await form_value(request, "scope")) == "all":
            task = (await form_value(request, "task")) or None
            return back(request, target, await _purge_all(dead, task, who))
        ids = await form_values(request, "ids")
        if not ids:
            return back(request, target, "Select the dead letters to purge first.", ok=False)
        try:
            purged = await dead.purge(ids[:SCAN_BUDGET])
        except ConfigError as exc:
            return back(request, target, str(exc), ok=False)
        audit(who, "dead.purge", queue=queue, ids=ids[:SCAN_BUDGET], purged=purged)
        return back(request, target, f"Purged {_plural(purged, 'dead letter')}.")


async def _retry_all(dead: DeadLetters, task: str | None, who: str) -> tuple[str, bool]:
    """Retry every letter (of ``task``) present now, within the time budget: the flash
    message, and whether every one was retried."""

    def record(bulk: Bulk) -> None:
        audit(who, "dead.retry", queue=dead.queue, task=task, all=task is None,
              ids=bulk.done, failed=sorted(bulk.failed))  # fmt: skip

    total = await total_of(dead.retry_all(task), record, BULK_SECONDS)
    failures = _failures(total.failed, total.first_failure)
    words = f"Retried {_plural(total.done, 'dead letter')}{failures}{_more(total)}."
    return words, not total.failed


async def _purge_all(dead: DeadLetters, task: str | None, who: str) -> str:
    """Delete every letter (of ``task``) present now, within the time budget: the flash
    message."""

    def record(bulk: Bulk) -> None:
        audit(who, "dead.purge", queue=dead.queue, task=task, all=task is None, ids=bulk.done)

    total = await total_of(dead.purge_all(task), record, BULK_SECONDS)
    of_task = f" of {task}" if task else ""
    return f"Purged {_plural(total.done, 'dead letter')}{of_task}{_more(total)}."


def _more(total: BulkTotal) -> str:
    return "; more remain: press again to go on" if total.cursor else ""
