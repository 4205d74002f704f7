"""Enqueue: check and encode every call first, then write in one round trip.

A plain task (no delay, no dedup key) is one ``XADD`` and nothing else: its id is derived
from its stream entry. Delayed and deduplicated tasks go through the ``enqueue`` script,
which gives them an id of their own and an index entry.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import _lifecycle
from ._envelope import ENVELOPE_VERSION, Serializer, find_unserializable
from ._errors import EnqueueError, SerializationError
from ._keys import derived_task_id
from ._middleware import call_hooks
from ._redis import text
from ._settings import PRIORITIES
from ._task import CallOptions, Task, TaskHandle
from .scripts import APPEND, ENQUEUE

if TYPE_CHECKING:
    from ._app import Tether

Calls = Sequence[tuple[tuple[Any, ...], Mapping[str, Any]]]

CHUNK = 1000
"""Tasks per script call: large enough to amortise the round trip, small enough not to hold
the server for long."""

PER_TASK = 7
"""Values per task in the enqueue script's ARGV."""

DEDUP_MAX_HOLD_MS = 24 * 3600 * 1000
"""A dedup key lives at most this long past its task's due time, even if the task never
reaches an outcome, so no key acts as a lock forever."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What every enqueue of one task (with one set of options) shares, computed once."""

    queue: str
    sidx: int
    stream: str
    plain: bool
    options: dict[str, Any]

    @classmethod
    def of(cls, app: Tether, task: Task[Any, Any]) -> Plan:
        opts = task.call_options
        queue = opts.queue or task.config.queue
        sidx = PRIORITIES.index(opts.priority or task.config.priority) + 1
        return cls(
            queue=queue,
            sidx=sidx,
            stream=app.keys(queue).streams[sidx - 1],
            plain=opts.delay is None and opts.at_ms is None and opts.key is None,
            options=_envelope_options(opts),
        )


async def enqueue(app: Tether, task: Task[Any, Any], calls: Calls) -> list[TaskHandle[Any]]:
    plan = task.plan
    if plan is None or plan[0] is not app:
        task.plan = plan = (app, Plan.of(app, task))
    queue, sidx = plan[1].queue, plan[1].sidx
    plain = plan[1].plain
    ids: list[str] = [] if plain else [f"{queue}:{uuid.uuid4().hex}" for _ in calls]
    payloads = encode(app.serializer, task, calls, ids, plan[1].options)
    if not payloads:
        return []
    if plain:
        entries = await _append(app, plan[1].stream, payloads)
        handles: list[TaskHandle[Any]] = [
            TaskHandle(app, derived_task_id(queue, sidx, text(e)), queue) for e in entries
        ]
    else:
        handles = await _enqueue_scripted(app, task, queue, sidx, ids, payloads)
    if app.middleware:
        for handle in handles:
            if not handle.duplicate:
                await call_hooks(app.middleware, "on_enqueue", task.name, handle.id, queue)
    return handles


def encode(
    serializer: Serializer,
    task: Task[Any, Any],
    calls: Calls,
    ids: Sequence[str],
    options: dict[str, Any],
) -> list[bytes]:
    """Check and encode every call before anything is sent, so a bad one writes nothing."""
    now_ms = int(time.time() * 1000)
    dumps = serializer.dumps
    name = task.name
    payloads: list[bytes] = []
    for n, (args, kwargs) in enumerate(calls):
        task.check_arguments(args, kwargs)
        # Fields at their defaults are left out: a smaller entry is cheaper to write and read.
        envelope: dict[str, Any] = {"v": ENVELOPE_VERSION, "task": name, "args": list(args)}
        if kwargs:
            envelope["kwargs"] = dict(kwargs)
        if ids:
            envelope["id"] = ids[n]
        if options:
            envelope["opts"] = options
        envelope["enq"] = now_ms
        try:
            payloads.append(dumps(envelope))
        except Exception as exc:
            bound = task.bind_arguments(args, kwargs)
            raise _serialization_error(serializer, name, bound, exc) from None
    return payloads


async def _append(app: Tether, stream: str, payloads: list[bytes]) -> list[Any]:
    client = app.client
    if app.settings.enqueue_replicas:
        entries: list[Any] = []
        for start in range(0, len(payloads), CHUNK):
            entries += await _lifecycle.enqueue_with_replicas(
                app, APPEND, [stream], payloads[start : start + CHUNK]
            )
        return entries
    if len(payloads) == 1:
        return [await client.execute_command("XADD", stream, "*", "m", payloads[0])]
    entries = []
    for start in range(0, len(payloads), CHUNK):
        entries += await APPEND(client, [stream], payloads[start : start + CHUNK])
    return entries


async def _enqueue_scripted(
    app: Tether,
    task: Task[Any, Any],
    queue: str,
    sidx: int,
    ids: list[str],
    payloads: list[bytes],
) -> list[TaskHandle[Any]]:
    opts = task.call_options
    keys = app.keys(queue)
    script_keys: list[str] = [*keys.streams, keys.index, keys.delayed, keys.scheduled_payloads]
    dedup_index = 0
    if opts.key is not None:
        script_keys.append(keys.dedup(opts.key))
        dedup_index = len(script_keys)
    mode, when = "n", 0
    if opts.delay is not None:
        mode, when = "r", int(opts.delay * 1000)
    elif opts.at_ms is not None:
        mode, when = "a", opts.at_ms
    args: list[Any] = []
    for task_id, payload in zip(ids, payloads, strict=True):
        args += (task_id, payload, sidx, mode, when, dedup_index, DEDUP_MAX_HOLD_MS)
    replies: list[Any] = []
    for start in range(0, len(ids), CHUNK):
        chunk = args[start * PER_TASK : (start + CHUNK) * PER_TASK]
        chunk_args = [len(chunk) // PER_TASK, *chunk]
        if app.settings.enqueue_replicas:
            replies += await _lifecycle.enqueue_with_replicas(app, ENQUEUE, script_keys, chunk_args)
        else:
            replies += await ENQUEUE(app.client, script_keys, chunk_args)
    handles: list[TaskHandle[Any]] = []
    for task_id, reply in zip(ids, replies, strict=True):
        if isinstance(reply, bytes) and reply.startswith(b"="):
            handles.append(TaskHandle(app, reply[1:].decode(), queue, duplicate=True))
        else:
            handles.append(TaskHandle(app, task_id, queue))
    return handles


def _envelope_options(opts: CallOptions) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if opts.timeout is not None:
        out["timeout"] = opts.timeout
    if opts.retries is not None:
        out["retries"] = opts.retries
    if opts.store_result is not None:
        out["store_result"] = opts.store_result
    if opts.key is not None:
        out["key"] = opts.key
        if opts.key_ttl is not None:
            out["key_ttl"] = opts.key_ttl
    return out


def _serialization_error(
    serializer: Serializer, task: str, bound: Mapping[str, Any], exc: Exception
) -> EnqueueError:
    found = find_unserializable(serializer, bound)
    if found is None:
        return SerializationError(
            f"task {task!r}: the arguments cannot be serialized by the {serializer.name} "
            f"serializer: {exc}"
        )
    name, error = found
    value = bound[name]
    return SerializationError(
        f"task {task!r}: argument {name!r} ({type(value).__name__}) cannot be serialized by "
        f"the {serializer.name} serializer: {error}"
    )
