"""A task by its id: where it is, its attempts, a timeline (enqueued, due, started,
finished), its arguments, and its result or error; cancel it, or run a delayed one now.

The lookup is a plain GET form (``/task?id=...``), so a task's page has an address to
share. A malformed id answers 422 and an unknown one 404, each with the lookup form."""

from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response

from ...admin import EarlierAttempt, TaskInfo, run_now
from ...admin._models import from_ms
from ...base._errors import ConfigError, TaskNotFound, TetherError
from ...base._status import CancelResult
from ...producer._lifecycle import cancel
from ...protocol._keys import clipped, entry_of_task_id
from .._context import WebContext
from .._guard import audit
from .._params import writer
from .._task_ids import check_task_id
from ._render import back, form_value, page, render, route_class

CANCELLABLE = frozenset({"queued", "scheduled", "running", "retrying"})
DELAYED = frozenset({"scheduled", "retrying"})
FINAL = {"succeeded": "good", "failed": "bad", "dead": "bad", "cancelled": "bad"}

CANCEL_WORDS = {
    CancelResult.CANCELLED: "Task {id} cancelled: it will not run.",
    CancelResult.REQUESTED: "Cancellation of task {id} requested: it is cancelled at its next "
    "await (its worker hears of it within a heartbeat).",
    CancelResult.NOT_CANCELLABLE: "Task {id} runs a plain function in a worker thread, which "
    "cannot be interrupted: it runs to its end.",
    CancelResult.FINISHED: "Task {id} had finished already.",
}


@dataclass(frozen=True)
class Event:
    """One step of a task's life, as its page draws it."""

    label: str
    at: datetime | None
    state: str
    """'done', 'pending' (not yet), 'good' or 'bad' (the outcome), 'retried' (an attempt
    that raised and was retried, of which no time is kept)."""
    note: str = ""


def enqueued_at(info: TaskInfo) -> datetime | None:
    """From the payload while it is there; else from a plain enqueue's id, which is its
    stream entry: the server's time of the enqueue."""
    if info.enqueued_at is not None:
        return info.enqueued_at
    derived = entry_of_task_id(info.id)
    return from_ms(int(derived[1].partition("-")[0])) if derived else None


EACH_ATTEMPT_UP_TO = 10
"""Earlier attempts listed one by one; more are one line."""
NOT_KEPT = "raised and was retried; its error is not kept (each attempt's record replaces " \
    "the one before)"  # fmt: skip


def earlier_attempts(last: int, kept: list[EarlierAttempt] | None = None) -> list[Event]:
    """The attempts before the last one of a task that ended or is retrying: each with its
    error and times from its record (settle keeps the records of retried attempts); for an
    attempt whose record is not kept (settled by an earlier release), that it raised and was
    retried is all there is."""
    if kept:
        return [_retried(a) for a in kept]
    if last <= 1:
        return []
    if last - 1 > EACH_ATTEMPT_UP_TO:
        return [Event(f"Attempts 1 to {last - 1}", None, "retried", f"each {NOT_KEPT}")]
    return [Event(f"Attempt {n}", None, "retried", NOT_KEPT) for n in range(1, last)]


def _retried(attempt: EarlierAttempt) -> Event:
    error = attempt.error
    note = f"{error.type}: {error.message}" if error else "raised and was retried"
    label = f"Attempt {attempt.attempt}" if attempt.attempt else "An attempt"
    return Event(label, attempt.finished_at, "retried", f"{note}; retried")


def timeline(info: TaskInfo) -> list[Event]:
    events = [Event("Enqueued", enqueued_at(info), "done", f"priority {info.priority}"
                    if info.priority else "")]  # fmt: skip
    if info.status in ("retrying", "queued", "running") and info.earlier_attempts:
        events += earlier_attempts(0, info.earlier_attempts)  # a retry waits or runs
    if info.due_at is not None:
        note = "a retry in its backoff" if info.status == "retrying" else "scheduled"
        events.append(Event("Due", info.due_at, "pending", note))
    if info.status == "running":
        events.append(Event("Started", info.started_at, "done", f"on worker {info.worker}"))
        events.append(Event("Finished", None, "pending", "running now"))
    elif info.status in FINAL:
        events += earlier_attempts(info.attempt or 1, info.earlier_attempts)
        attempt = f"attempt {info.attempt}" if info.attempt else ""
        delivered = info.deliveries or 0
        if delivered > 1:
            attempt += f" (delivered {delivered} times: a worker was lost and another took it)"
        if info.started_at is not None:  # outcome records written by this release say when
            events.append(Event("Started", info.started_at, "done", attempt))
        events.append(Event(info.status.capitalize(), info.finished_at, FINAL[info.status],
                            attempt))  # fmt: skip
    else:
        events.append(Event("Started", None, "pending", "waiting for a worker"))
    return events


def checked(task_id: str) -> str:
    """A posted task id, or :class:`ConfigError` saying why it is malformed (the rule and
    the message of the API: :mod:`tether.web._task_ids`)."""
    return check_task_id(task_id)


def routes(ctx: WebContext) -> APIRouter:
    pages = APIRouter(route_class=route_class(ctx), include_in_schema=False)
    write = writer(ctx)

    @page(pages, "/task")
    async def task(
        request: Request,
        task_id: Annotated[str | None, Query(alias="id", max_length=300)] = None,
    ) -> Response:
        context: dict[str, Any] = {"title": "Task", "active": "task", "task_id": task_id or "",
                                   "info": None, "problem": None}  # fmt: skip
        status = 200
        if task_id:
            try:
                info = await (await ctx.stats()).task(checked(task_id.strip()))
            except ConfigError as exc:
                context["problem"], status = str(exc), 422
            except TaskNotFound as exc:
                context["problem"], status = str(exc), 404
            else:
                context.update(
                    info=info, title=f"Task {info.id}", events=timeline(info),
                    can_cancel=info.status in CANCELLABLE, can_run_now=info.status in DELAYED,
                )  # fmt: skip
        return render(ctx, request, "task.html", context, status=status)

    @page(pages, "/task/cancel", methods=("POST",))
    async def cancel_task(request: Request, who: Annotated[str, Depends(write)]) -> Response:
        task_id = (await form_value(request, "task_id")) or ""
        target = await form_value(request, "next")
        try:
            result = await cancel(await ctx.core(), checked(task_id))
        except (TetherError, LookupError) as exc:
            return back(request, target, f"Could not cancel {clipped(task_id)}: {exc}", ok=False)
        audit(who, "task.cancel", ids=[task_id], result=result.value)
        return back(request, target, CANCEL_WORDS[result].format(id=task_id), ok=bool(result))

    @page(pages, "/task/run-now", methods=("POST",))
    async def run_task_now(request: Request, who: Annotated[str, Depends(write)]) -> Response:
        task_id = (await form_value(request, "task_id")) or ""
        target = await form_value(request, "next")
        try:
            moved = await run_now(await ctx.core(), checked(task_id))
        except (TetherError, LookupError) as exc:
            return back(request, target, f"Could not run {clipped(task_id)} now: {exc}", ok=False)
        if not moved:
            words = f"Task {task_id} is not waiting for its due time: nothing to run now."
            return back(request, target, words, ok=False)
        audit(who, "task.run_now", ids=[task_id])
        words = f"Task {task_id} is due now: a worker starts it within one maintenance pass."
        return back(request, target, words)

    return pages
