"""Following a task after enqueue: status, results and cancellation, from asyncio or from
plain threads. Each step reads or writes in one script call; waiting for a result blocks on
Redis (``BLMOVE``), never polls."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ..base._errors import ConfigError, ResultTimeout, TaskFailed, TaskNotFound
from ..base._status import CancelResult, TaskStatus
from ..base._unreadable import parsed, skip
from ..protocol import scripts
from ..protocol._codecs import parse_index_value, parse_scheduled, payload_of
from ..protocol._envelope import BadEnvelope, Envelope
from ..protocol._keys import QueueKeys, entry_of_task_id, queue_of_task_id

if TYPE_CHECKING:
    from ._core import Core

WAIT_CHUNK = 5.0
"""Longest single blocking wait for a result; below the socket timeout."""
CANCEL_REQUEST_TTL_MS = 3600 * 1000


"""An index value as Tether writes it: the stream (1 to 3) then the entry id."""


def keys_for(core: Core, task_id: str) -> QueueKeys:
    try:
        return core.keys(queue_of_task_id(task_id))
    except ValueError:
        raise ConfigError(
            f"{task_id!r} is not a Tether task id (expected <queue>:<32 hex digits> or "
            "<queue>:<stream index>-<entry id>)"
        ) from None


def _status_call(core: Core, task_id: str) -> scripts.Call[scripts.StatusReply]:
    return scripts.status(keys_for(core, task_id), task_id, entry_of_task_id(task_id))


def _to_status(core: Core, task_id: str, reply: scripts.StatusReply) -> TaskStatus:
    keys = keys_for(core, task_id)
    if reply.unreadable:
        skip("task", f"{keys.index} field {task_id!r}",
             f"{reply.unreadable[:100]!r} is not <stream 1-3><entry id>")  # fmt: skip
    if reply.state == "record":
        return TaskStatus(_record(core, keys.result(task_id), task_id, reply.detail)["status"])
    if reply.state == "unknown":
        raise TaskNotFound(
            f"task {task_id} is unknown: it never existed, its record expired, or it does not "
            "store results"
        )
    return TaskStatus(reply.state)


async def status(core: Core, task_id: str) -> TaskStatus:
    if core.intercept is not None:
        return await core.intercept.status(task_id)  # type: ignore[no-any-return]
    return _to_status(core, task_id, await _status_call(core, task_id).run(core.client))


def status_sync(core: Core, task_id: str) -> TaskStatus:
    if core.intercept is not None:
        return core.intercept.status_sync(task_id)  # type: ignore[no-any-return]
    return _to_status(core, task_id, _status_call(core, task_id).run_sync(core.sync_client))


def _record(core: Core, key: str, task_id: str, raw: bytes) -> dict[str, Any]:
    """The outcome record of ``task_id``: an object whose status Tether knows. Anything
    else (written by another program, or by a release with a status this one does not
    know) raises :class:`TaskNotFound` saying so, after reporting it: what the task came
    to cannot be known from it, and a caller waiting for a final status must not wait for
    good, as it would for a status of its own such as "unknown"."""
    record = parsed("task", key, lambda: _checked_record(core, raw))
    if record is None:
        raise TaskNotFound(
            f"task {task_id} has a record Tether cannot read (at {key}: not written by this "
            "release of Tether); what it came to is unknown"
        )
    return record


def _checked_record(core: Core, raw: bytes) -> dict[str, Any]:
    record = core.serializer.loads(raw)
    if not isinstance(record, dict):
        raise TypeError(f"a {type(record).__name__}, not an object")
    TaskStatus(record.get("status"))  # ValueError naming a status Tether does not know
    return record


# -- results ------------------------------------------------------------------------------


class _Wait:
    """The bookkeeping of one wait for a result, shared by both kinds of client."""

    def __init__(self, core: Core, task_id: str, timeout: float | timedelta | None) -> None:
        if isinstance(timeout, timedelta):
            timeout = timeout.total_seconds()
        if timeout is not None and timeout < 0:
            raise ConfigError(f"timeout={timeout!r} must be zero or more seconds")
        self.core = core
        self.task_id = task_id
        self.timeout = timeout
        self.keys = keys_for(core, task_id)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.chunk = max(0.1, min(WAIT_CHUNK, core.settings.socket_timeout - 1))

    def outcome(self, raw: Any) -> tuple[bool, Any]:
        """(final, value) from a stored record; raises TaskFailed for a failed outcome,
        TaskNotFound for a record Tether cannot read."""
        record = _record(self.core, self.keys.result(self.task_id), self.task_id, raw)
        if record["status"] == "succeeded":
            return True, record.get("value")
        if record["status"] == "retrying":
            return False, None
        error = record.get("error") or {}
        raise TaskFailed(
            self.task_id,
            record["status"],
            error.get("type", ""),
            error.get("message", ""),
            error.get("traceback", ""),
        )

    def next_wait(self) -> float:
        if self.deadline is None:
            return self.chunk
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise ResultTimeout(f"task {self.task_id} did not finish within {self.timeout}s")
        return min(self.chunk, remaining)

    def block(self, wait: float) -> tuple[Any, ...]:
        # BLMOVE onto the same list keeps the element for every other waiter.
        done = self.keys.done(self.task_id)
        return ("BLMOVE", done, done, "RIGHT", "LEFT", round(wait, 3))


async def wait_result(core: Core, task_id: str, timeout: float | timedelta | None) -> Any:
    wait = _Wait(core, task_id, timeout)
    if core.intercept is not None:
        return await core.intercept.wait_result(task_id, wait.timeout)
    client = core.client
    while True:
        raw: Any = await client.get(wait.keys.result(task_id))
        if raw is not None:
            final, value = wait.outcome(raw)
            if final:
                return value
        else:
            await status(core, task_id)  # raises TaskNotFound for an unknown id
        await client.execute_command(*wait.block(wait.next_wait()))


def wait_result_sync(core: Core, task_id: str, timeout: float | timedelta | None) -> Any:
    wait = _Wait(core, task_id, timeout)
    if core.intercept is not None:
        return core.intercept.wait_result_sync(task_id, wait.timeout)
    client: Any = core.sync_client
    while True:
        raw: Any = client.get(wait.keys.result(task_id))
        if raw is not None:
            final, value = wait.outcome(raw)
            if final:
                return value
        else:
            status_sync(core, task_id)
        client.execute_command(*wait.block(wait.next_wait()))


# -- cancel -------------------------------------------------------------------------------


class _Cancel:
    """A cancel request: the dedup key and task of the target are read from its payload
    first (keys are passed to scripts, never built in them), then one script removes the
    task or asks its owner to stop it."""

    def __init__(self, core: Core, task_id: str) -> None:
        self.core = core
        self.task_id = task_id
        self.keys = keys_for(core, task_id)
        self.derived = entry_of_task_id(task_id)
        self.record = core.serializer.dumps(
            {
                "status": "cancelled",
                "task": "",
                "attempt": 0,
                "finished_ms": int(time.time() * 1000),
                "error": {
                    "type": "Cancelled",
                    "message": "cancelled before it ran",
                    "traceback": "",
                },
            }
        )
        self.dedup_key = f"{self.keys.tag}:dedup-none"
        self.task_name = ""

    def where(self, index_value: Any) -> tuple[int, bytes] | None:
        if index_value is not None:
            found = parse_index_value(index_value)
            if found is not None:
                return found[0], found[1].encode()
            # An entry no Tether writes (set by hand): read past, as the script does.
            skip("task", f"{self.keys.index} field {self.task_id!r}", "not <stream><entry id>")
        if self.derived is not None:
            return self.derived[0], self.derived[1].encode()
        return None

    def learn(self, payload: Any) -> None:
        try:
            env = Envelope.decode(payload, self.core.serializer)
        except BadEnvelope:
            return
        self.task_name = env.task
        key = env.options.get("key")
        if isinstance(key, str):
            self.dedup_key = self.keys.dedup(key)

    def call(self, owner: str) -> scripts.Call[scripts.CancelReply]:
        return scripts.cancel(
            self.keys,
            self.task_id,
            owner=owner,
            record=self.record,
            record_ttl_ms=int(self.core.settings.result_ttl * 1000),
            request_ttl_ms=CANCEL_REQUEST_TTL_MS,
            dedup_key=self.dedup_key,
            derived=self.derived,
        )

    def runs_in_thread(self) -> bool:
        """The task is a plain function this app knows: its thread cannot be interrupted."""
        task = self.core.tasks.get(self.task_name)
        return task is not None and not task.is_async


async def cancel(core: Core, task_id: str) -> CancelResult:
    if core.intercept is not None:
        return await core.intercept.cancel(task_id)  # type: ignore[no-any-return]
    c = _Cancel(core, task_id)
    client = core.client
    where = c.where(await client.hget(c.keys.index, task_id))
    if where is not None:
        rows: Any = await client.xrange(c.keys.streams[where[0] - 1], where[1], where[1])
        if rows:
            c.learn(payload_of(rows))
    else:
        value: Any = await client.hget(c.keys.scheduled_payloads, task_id)
        c.learn(parse_scheduled(value)[1] if value else None)
    owner = ""
    for _ in range(5):
        reply = await c.call(owner).run(client)
        if reply.state == "cancelled":
            return CancelResult.CANCELLED
        if reply.state == "requested":
            return CancelResult.REQUESTED
        if reply.state == "finished":
            await status(core, task_id)  # an unknown id raises TaskNotFound
            return CancelResult.FINISHED
        if c.runs_in_thread():
            return CancelResult.NOT_CANCELLABLE
        owner = reply.owner
    return CancelResult.FINISHED


def cancel_sync(core: Core, task_id: str) -> CancelResult:
    if core.intercept is not None:
        return core.intercept.cancel_sync(task_id)  # type: ignore[no-any-return]
    c = _Cancel(core, task_id)
    client = core.sync_client
    where = c.where(client.hget(c.keys.index, task_id))
    if where is not None:
        rows: Any = client.xrange(c.keys.streams[where[0] - 1], where[1], where[1])
        if rows:
            c.learn(payload_of(rows))
    else:
        value: Any = client.hget(c.keys.scheduled_payloads, task_id)
        c.learn(parse_scheduled(value)[1] if value else None)
    owner = ""
    for _ in range(5):
        reply = c.call(owner).run_sync(client)
        if reply.state == "cancelled":
            return CancelResult.CANCELLED
        if reply.state == "requested":
            return CancelResult.REQUESTED
        if reply.state == "finished":
            status_sync(core, task_id)
            return CancelResult.FINISHED
        if c.runs_in_thread():
            return CancelResult.NOT_CANCELLABLE
        owner = reply.owner
    return CancelResult.FINISHED
