"""One task by its id: its status (read by the ``status`` script, in one consistent step),
then what is still there to show: its payload (while queued, running or delayed), when a
running task was delivered to its worker, and its outcome record. A fixed number of
commands, whatever the queue holds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import scripts
from .._envelope import BadEnvelope, Envelope
from .._errors import TaskNotFound
from .._keys import GROUP, entry_of_task_id
from .._lifecycle import keys_for
from .._redis import text
from .._settings import PRIORITIES
from ._models import TaskError, TaskInfo, from_ms
from ._replies import CLOCK, detached, server_ms, value

if TYPE_CHECKING:
    from .._core import Core


async def task_info(core: Core, task_id: str) -> TaskInfo:
    keys = keys_for(core, task_id)
    derived = entry_of_task_id(task_id)
    client: Any = core.client
    reply = await scripts.status(keys, task_id, derived).run(client)
    if reply.state == "unknown":
        raise TaskNotFound(
            f"task {task_id} is unknown: it never existed, its record expired, or it does not "
            "store results"
        )
    pipe: Any = client.pipeline(transaction=False)
    pipe.hget(keys.index, task_id)
    pipe.hget(keys.scheduled_payloads, task_id)
    pipe.zscore(keys.delayed, task_id)
    where, scheduled, due = await pipe.execute()
    record: dict[str, Any] = {}
    if reply.state in ("retrying", "record"):
        loaded = core.serializer.loads(reply.detail)
        record = loaded if isinstance(loaded, dict) else {}
    payload: bytes | None = None
    started_at = None
    located = (int(where[:1]), text(where[1:])) if where is not None else derived
    sidx = located[0] if located is not None else None
    if located is not None and reply.state in ("queued", "running"):
        sidx, entry = located
        stream = keys.streams[sidx - 1]
        if reply.state == "running":  # its delivery: when the worker took it
            reads: Any = client.pipeline(transaction=False)
            reads.xrange(stream, entry, entry)
            reads.eval(CLOCK, 1, stream)
            reads.xpending_range(stream, GROUP, entry, entry, 1)
            rows, now, pending = detached(await reads.execute(raise_on_error=False))
            rows, pending = value(rows, []), value(pending, [])
            if pending and not isinstance(now, BaseException):
                idle_ms = int(pending[0]["time_since_delivered"])
                started_at = from_ms(server_ms(now) - idle_ms)
        else:
            rows = await client.xrange(stream, entry, entry)
        payload = rows[0][1].get(b"m") if rows else None
    elif scheduled:
        sidx, payload = int(scheduled[:1]) if scheduled[:1].isdigit() else 2, scheduled[1:]
    env = _decode(core, payload)
    status = text(record.get("status", "")) if reply.state == "record" else reply.state
    error = record.get("error")
    return TaskInfo(
        id=task_id,
        queue=keys.queue,
        status=status,
        task=env.task if env else (record.get("task") or None),
        attempt=env.attempt if env else record.get("attempt"),
        priority=PRIORITIES[sidx - 1] if sidx in (1, 2, 3) else None,
        args=env.args if env else None,
        kwargs=env.kwargs if env else None,
        enqueued_at=from_ms((env.enqueued_ms if env else record.get("enqueued_ms")) or None),
        due_at=from_ms(float(due)) if due is not None else None,
        worker=text(reply.detail) if reply.state == "running" else None,
        started_at=started_at or from_ms(record.get("started_ms")),
        finished_at=from_ms(record.get("finished_ms")) if reply.state == "record" else None,
        result=record.get("value") if status == "succeeded" else None,
        error=TaskError(
            type=str(error.get("type", "")),
            message=str(error.get("message", "")),
            traceback=str(error.get("traceback", "")),
        )
        if isinstance(error, dict)
        else None,
    )


def _decode(core: Core, payload: bytes | None) -> Envelope | None:
    if payload is None:
        return None
    try:
        return Envelope.decode(payload, core.serializer)
    except BadEnvelope:
        return None
