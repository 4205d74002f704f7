"""One task by its id: its status (read by the ``status`` script, in one consistent step),
then what is still there to show: its payload (while queued, running or delayed), when a
running task was delivered to its worker, its outcome record, and for a failed or dead task
its dead letter (which keeps the payload, so its arguments). A fixed number of commands,
whatever the queue holds.

What each attempt leaves: the outcome record is one key per task, written by every attempt
over the one before; the settle of a retry also appends that attempt's record to the task's
attempt list (the last 25, expiring with the result), so the errors of the attempts before
the last are read from there; and the dead letter holds the last attempt's error, its
payload and how many times that attempt's entry was delivered. Tasks settled before the
attempt list existed have none: their page says how many attempts there were, not what
they raised."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..base._errors import TaskNotFound
from ..base._redis import text
from ..base._settings import PRIORITIES
from ..base._unreadable import parsed, skip
from ..producer._lifecycle import keys_for
from ..protocol import scripts
from ..protocol._codecs import parse_index_value, parse_scheduled, payload_of
from ..protocol._envelope import BadEnvelope, Envelope
from ..protocol._keys import GROUP, QueueKeys, entry_of_task_id
from ._models import EarlierAttempt, TaskError, TaskInfo, from_ms, utc
from ._replies import CLOCK, detached, server_ms, value

if TYPE_CHECKING:
    from ..producer._core import Core


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
    pipe.lrange(keys.attempts(task_id), 0, -1)
    where, scheduled, due, retried = await pipe.execute()
    record: dict[str, Any] = {}
    if reply.state in ("retrying", "record"):
        record = _record(core, keys.result(task_id), reply.detail)
    payload: bytes | None = None
    started_at = None
    located = _located(keys.index, task_id, where) or derived
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
        payload = payload_of(rows)
    elif scheduled:
        sidx, payload = parse_scheduled(scheduled)
    env = _decode(core, payload)
    status = text(record.get("status", "")) if reply.state == "record" else reply.state
    error = record.get("error")
    fields = _Fields(keys.result(task_id), record)
    letter = None
    if status in ("failed", "dead"):
        letter = await _dead_letter(core, keys, task_id, fields.whole("finished_ms"))
        env = env or (_decode(core, letter.payload) if letter else None)
    return TaskInfo(
        id=task_id,
        queue=keys.queue,
        status=status,
        task=env.task if env else fields.text("task"),
        attempt=env.attempt if env else fields.whole("attempt"),
        priority=PRIORITIES[sidx - 1] if sidx in (1, 2, 3) else None,
        args=env.args if env else None,
        kwargs=env.kwargs if env else None,
        enqueued_at=from_ms(env.enqueued_ms or None) if env else fields.time("enqueued_ms"),
        due_at=_due(keys.delayed, task_id, due),
        worker=text(reply.detail) if reply.state == "running" else None,
        started_at=started_at or fields.time("started_ms"),
        finished_at=fields.time("finished_ms") if reply.state == "record" else None,
        result=record.get("value") if status == "succeeded" else None,
        error=_error(error),
        dead_letter=letter.entry_id if letter else None,
        deliveries=letter.deliveries if letter else None,
        earlier_attempts=[_earlier(core, keys.attempts(task_id), raw) for raw in retried],
    )


def _earlier(core: Core, key: str, raw: bytes) -> EarlierAttempt:
    """One record of the task's retried attempts (a malformed one shows as unknown)."""
    fields = _Fields(key, _record(core, key, raw))
    return EarlierAttempt(
        attempt=fields.whole("attempt"),
        started_at=fields.time("started_ms"),
        finished_at=fields.time("finished_ms"),
        error=_error(fields.record.get("error")),
    )


def _error(error: Any) -> TaskError | None:
    if not isinstance(error, dict):
        return None
    return TaskError(
        type=str(error.get("type", "")),
        message=str(error.get("message", "")),
        traceback=str(error.get("traceback", "")),
    )


LETTER_SEARCH_BEFORE_MS = 60_000
LETTER_SEARCH_AFTER_MS = 600_000
"""Where a task's dead letter is looked for, around the finish time of its record: the
record's time is the worker's clock before the settle, the letter's id the server's clock
at it (a skewed clock, a slow settle)."""
LETTER_SEARCH_COUNT = 500
"""Letters read at most to find it: a burst of failures may hide it (then none is shown)."""


@dataclass(frozen=True)
class _Letter:
    entry_id: str
    payload: bytes
    deliveries: int | None


async def _dead_letter(
    core: Core, keys: QueueKeys, task_id: str, finished_ms: int | None
) -> _Letter | None:
    """The dead letter of the attempt the record tells of: of this task, the nearest to its
    finish time, in one bounded read (the stream has no index by task id). None without a
    finish time (a record of an earlier release), or when it was retried or purged."""
    if not finished_ms:
        return None
    client: Any = core.client
    start = max(0, finished_ms - LETTER_SEARCH_BEFORE_MS)
    rows = await client.xrange(
        keys.dead, str(start), str(finished_ms + LETTER_SEARCH_AFTER_MS), count=LETTER_SEARCH_COUNT
    )
    wanted = task_id.encode()
    found = [(text(entry_id), fields) for entry_id, fields in rows if fields.get(b"id") == wanted]
    if not found:
        return None
    entry_id, fields = min(found, key=lambda row: abs(_ms_of(row[0]) - finished_ms))
    raw = fields.get(b"deliveries", b"")
    deliveries = int(raw) if raw.isdigit() else None
    return _Letter(entry_id, fields.get(b"m", b""), deliveries)


def _ms_of(entry_id: str) -> int:
    return int(entry_id.partition("-")[0])


def _record(core: Core, key: str, raw: bytes) -> dict[str, Any]:
    """The outcome record at ``key``; empty (reported) when it is not an object."""
    loaded = parsed("task", key, lambda: core.serializer.loads(raw))
    if isinstance(loaded, dict):
        return loaded
    if loaded is not None:
        skip("task", key, f"a {type(loaded).__name__}, not an object")
    return {}


@dataclass(frozen=True)
class _Fields:
    """The fields of an outcome record, each of the type shown or None (reported)."""

    key: str
    record: dict[str, Any]

    def _checked(self, name: str, ok: bool) -> Any:
        found = self.record.get(name)
        if found is None or ok:
            return found
        skip("task", f"{self.key} field {name!r}", f"{found!r:.100} is not what Tether writes")
        return None

    def text(self, name: str) -> str | None:
        return self._checked(name, isinstance(self.record.get(name), str)) or None

    def whole(self, name: str) -> int | None:
        found = self.record.get(name)
        checked: int | None = self._checked(
            name, isinstance(found, int) and not isinstance(found, bool)
        )
        return checked

    def time(self, name: str) -> datetime | None:
        """Unix milliseconds as a time; a record of an earlier release may lack it."""
        ms = self._checked(name, isinstance(self.record.get(name), (int, float)))
        return None if not ms else parsed("task", f"{self.key} field {name!r}", lambda: utc(ms))


def _located(key: str, task_id: str, where: bytes | None) -> tuple[int, str] | None:
    """(stream index, entry id) from the task's index entry; None without one, or for one
    no Tether writes (reported; the status script read past it too)."""
    if where is None:
        return None
    found = parse_index_value(where)
    if found is None:
        skip("task", f"{key} field {task_id!r}", f"{where[:100]!r} is not <stream 1-3><entry id>")
    return found


def _due(key: str, task_id: str, due: float | None) -> datetime | None:
    """When a delayed task is due: its score, unless that is no time (set by hand)."""
    if due is None:
        return None
    return parsed("delayed", f"{key} member {task_id!r}", lambda: utc(float(due)))


def _decode(core: Core, payload: bytes | None) -> Envelope | None:
    if payload is None:
        return None
    try:
        return Envelope.decode(payload, core.serializer)
    except BadEnvelope:
        return None
