"""A queue's dead letters: list, show, retry, purge (one, several, all of a task, all)."""

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from ...dead import Bulk, DeadLetters, total_of
from .._context import WebContext
from .._errors import CONFLICT, NOT_FOUND, TetherRoute
from .._guard import audit
from .._models import LISTED_PAYLOAD, BulkOut, DeadLetterOut, DeadPage, Retried, Selection
from .._params import DEFAULT, Cursor, EntryId, Limit, QueueName, writer


def _out(bulk: Bulk, count: int | None = None) -> BulkOut:
    return BulkOut(
        count=len(bulk.done) if count is None else count,
        done=bulk.done,
        task_ids=bulk.handles,
        failed=bulk.failed,
        cursor=bulk.cursor,
    )


def routes(ctx: WebContext) -> APIRouter:
    api = APIRouter(route_class=TetherRoute, tags=["dead letters"])
    write = writer(ctx)

    @api.get("/queues/{queue}/dead", response_model=DeadPage, responses=NOT_FOUND)
    async def dead_list(
        queue: QueueName,
        cursor: Cursor = None,
        limit: Limit = DEFAULT,
        task: Annotated[str | None, Query(min_length=1, max_length=500)] = None,
    ) -> DeadPage:
        """Dead letters, newest first (payloads cut to 2,000 characters); ``task`` keeps one
        task's letters (a filtered page reads at most 1,000 entries: follow the cursor)."""
        dead = await _letters(ctx, queue)
        page = await dead.page(cursor=cursor, limit=limit, task=task)
        return DeadPage(
            total=await dead.count(),
            items=[DeadLetterOut.of(d, LISTED_PAYLOAD) for d in page.items],
            cursor=page.cursor,
        )

    @api.get("/queues/{queue}/dead/{entry_id}", response_model=DeadLetterOut, responses=NOT_FOUND)
    async def dead_show(queue: QueueName, entry_id: EntryId) -> DeadLetterOut:
        """One dead letter: reason, error with traceback, the whole payload."""
        dead = await _letters(ctx, queue)
        return DeadLetterOut.of(await dead.show(entry_id))

    @api.post(
        "/queues/{queue}/dead/{entry_id}/retry",
        response_model=Retried,
        responses={**NOT_FOUND, **CONFLICT},
    )
    async def dead_retry_one(
        who: Annotated[str, Depends(write)], queue: QueueName, entry_id: EntryId
    ) -> Retried:
        """Enqueue the letter's task again as a fresh attempt (same task id)."""
        dead = await _letters(ctx, queue)
        handle = await dead.retry(entry_id)
        audit(who, "dead.retry", queue=queue, ids=[entry_id], task_ids=[handle.id])
        return Retried(entry_id=entry_id, task_id=handle.id)

    @api.delete("/queues/{queue}/dead/{entry_id}", response_model=BulkOut, responses=NOT_FOUND)
    async def dead_purge_one(
        who: Annotated[str, Depends(write)], queue: QueueName, entry_id: EntryId
    ) -> BulkOut:
        """Delete one dead letter (404 when it is not there)."""
        dead = await _letters(ctx, queue)
        if not await dead.purge([entry_id]):
            raise LookupError(f"no dead-letter entry {entry_id} in queue {queue!r}")
        audit(who, "dead.purge", queue=queue, ids=[entry_id])
        return BulkOut(count=1, done=[entry_id])

    @api.post("/queues/{queue}/dead/retry", response_model=BulkOut, responses=NOT_FOUND)
    async def dead_retry(
        who: Annotated[str, Depends(write)], queue: QueueName, selection: Selection
    ) -> BulkOut:
        """Retry several letters (``ids``), or those of one task (``task``), or all
        (``all``): a call handles at most ``limit``; follow the ``cursor`` until null. The
        calls take the letters present when the first one began: a retried task that
        fails again meanwhile is left for another run, as the CLI and the dashboard do."""
        dead = await _letters(ctx, queue)
        if selection.ids is not None:
            bulk = await dead.retry_many(selection.ids)
        else:
            bulk = await dead.retry_matching(selection.task, selection.cursor, selection.limit)
        audit(
            who, "dead.retry", queue=queue, task=selection.task, all=selection.all,
            ids=bulk.done, failed=sorted(bulk.failed), cursor=bulk.cursor,
        )  # fmt: skip
        return _out(bulk)

    @api.post("/queues/{queue}/dead/purge", response_model=BulkOut, responses=NOT_FOUND)
    async def dead_purge(
        who: Annotated[str, Depends(write)], queue: QueueName, selection: Selection
    ) -> BulkOut:
        """Delete several letters (``ids``), those of one task (``task``, at most ``limit``
        a call: follow the ``cursor``), or every letter present when the call began
        (``all``, in one call: the count, not the entry ids)."""
        dead = await _letters(ctx, queue)
        if selection.ids is not None:
            purged = await dead.purge(selection.ids)
            bulk = Bulk(list(selection.ids), {})
            audit(who, "dead.purge", queue=queue, ids=selection.ids, purged=purged)
            return _out(bulk, purged)
        if selection.all and selection.cursor is None:
            # The run the CLI and the dashboard make, to its end: a stream is capped (at
            # dead_letter_maxlen), and the answer is a count whatever the stream holds.
            total = await total_of(dead.purge_all())
            audit(who, "dead.purge", queue=queue, all=True, purged=total.done)
            return BulkOut(count=total.done, done=[])
        bulk = await dead.purge_matching(selection.task, selection.cursor, selection.limit)
        audit(who, "dead.purge", queue=queue, task=selection.task, ids=bulk.done,
              cursor=bulk.cursor)  # fmt: skip
        return _out(bulk)

    return api


async def _letters(ctx: WebContext, queue: str) -> DeadLetters:
    await (await ctx.stats()).require_queue(queue)
    return DeadLetters(await ctx.core(), queue)
