"""Following a task after enqueue: status, results, cancellation, replica-safe enqueue."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from redis.asyncio.cluster import RedisCluster

from ._envelope import BadEnvelope, Envelope
from ._errors import ConfigError, EnqueueError, ResultTimeout, TaskFailed, TaskNotFound
from ._keys import GROUP, QueueKeys, entry_of_task_id, queue_of_task_id
from ._task import TaskStatus
from .scripts import CANCEL, STATUS, Script

if TYPE_CHECKING:
    from ._app import Tether

WAIT_CHUNK = 5.0
"""Longest single blocking wait for a result; below the socket timeout."""
CANCEL_REQUEST_TTL_MS = 3600 * 1000


def _keys_for(app: Tether, task_id: str) -> QueueKeys:
    try:
        return app.keys(queue_of_task_id(task_id))
    except ValueError:
        raise ConfigError(f"{task_id!r} is not a Tether task id (expected <queue>:<hex>)") from None


def _entry_args(task_id: str) -> tuple[str, str]:
    derived = entry_of_task_id(task_id)
    return ("", "") if derived is None else (str(derived[0]), derived[1])


async def _raw_status(app: Tether, task_id: str) -> tuple[str, bytes]:
    keys = _keys_for(app, task_id)
    sidx, entry = _entry_args(task_id)
    state, detail = await STATUS(
        app.client,
        [*keys.streams, keys.index, keys.delayed, keys.result(task_id)],
        [GROUP, task_id, sidx, entry],
    )
    return state.decode(), detail


async def status(app: Tether, task_id: str) -> TaskStatus:
    state, detail = await _raw_status(app, task_id)
    if state == "record":
        return TaskStatus(app.serializer.loads(detail)["status"])
    if state == "unknown":
        raise TaskNotFound(
            f"task {task_id} is unknown: it never existed, its record expired, or it does not "
            "store results"
        )
    return TaskStatus(state)


async def wait_result(app: Tether, task_id: str, timeout: float | timedelta | None) -> Any:
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if timeout is not None and timeout < 0:
        raise ConfigError(f"timeout={timeout!r} must be zero or more seconds")
    keys = _keys_for(app, task_id)
    client = app.client
    deadline = None if timeout is None else time.monotonic() + timeout
    chunk = max(0.1, min(WAIT_CHUNK, app.settings.socket_timeout - 1))
    while True:
        raw: Any = await client.get(keys.result(task_id))
        if raw is not None:
            record = app.serializer.loads(raw)
            if record["status"] == "succeeded":
                return record.get("value")
            if record["status"] != "retrying":
                error = record.get("error") or {}
                raise TaskFailed(
                    task_id,
                    record["status"],
                    error.get("type", ""),
                    error.get("message", ""),
                    error.get("traceback", ""),
                )
        else:
            await status(app, task_id)  # raises TaskNotFound for an unknown id
        wait = chunk
        if deadline is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ResultTimeout(f"task {task_id} did not finish within {timeout}s")
            wait = min(chunk, remaining)
        # Block until the outcome is pushed; BLMOVE onto the same list keeps the element
        # for every other waiter.
        await client.execute_command(
            "BLMOVE", keys.done(task_id), keys.done(task_id), "RIGHT", "LEFT", round(wait, 3)
        )


async def _dedup_key_of(app: Tether, keys: QueueKeys, task_id: str) -> str:
    """The dedup key a queued or scheduled task holds, read from its payload."""
    client = app.client
    payload: Any = None
    where: Any = await client.hget(keys.index, task_id)
    derived = entry_of_task_id(task_id)
    if where is None and derived is not None:
        where = f"{derived[0]}{derived[1]}".encode()
    if where is not None:
        sidx, eid = int(where[:1]), where[1:]
        rows: Any = await client.xrange(keys.streams[sidx - 1], eid, eid)
        if rows:
            payload = rows[0][1].get(b"m")
    else:
        value: Any = await client.hget(keys.scheduled_payloads, task_id)
        payload = value[1:] if value else None
    try:
        env = Envelope.decode(payload, app.serializer)
    except BadEnvelope:
        return f"{keys.tag}:dedup-none"
    key = env.options.get("key")
    return keys.dedup(key) if isinstance(key, str) else f"{keys.tag}:dedup-none"


async def cancel(app: Tether, task_id: str) -> bool:
    keys = _keys_for(app, task_id)
    dedup_key = await _dedup_key_of(app, keys, task_id)
    record = app.serializer.dumps(
        {
            "status": "cancelled",
            "task": "",
            "attempt": 0,
            "finished_ms": int(time.time() * 1000),
            "error": {"type": "Cancelled", "message": "cancelled before it ran", "traceback": ""},
        }
    )
    owner = ""
    for _ in range(5):
        reply = await CANCEL(
            app.client,
            [
                *keys.streams,
                keys.index,
                keys.delayed,
                keys.scheduled_payloads,
                keys.result(task_id),
                keys.done(task_id),
                keys.cancels(owner or "-"),
                dedup_key,
            ],
            [
                GROUP,
                task_id,
                owner,
                record,
                int(app.settings.result_ttl * 1000),
                CANCEL_REQUEST_TTL_MS,
                *_entry_args(task_id),
            ],
        )
        state = reply[0].decode()
        if state in ("cancelled", "requested"):
            return True
        if state == "finished":
            await status(app, task_id)  # an unknown id raises TaskNotFound
            return False
        owner = reply[1].decode()
    return False


async def enqueue_with_replicas(
    app: Tether, script: Script, keys: list[str], args: list[Any]
) -> Any:
    """Run an enqueue script and ``WAIT`` on the same connection until enough replicas have
    it: ``WAIT`` counts the replicas that acknowledged this connection's writes."""
    client = app.client
    needed = app.settings.enqueue_replicas
    timeout_ms = int(app.settings.enqueue_replicas_timeout * 1000)
    evaluate = ("EVAL", script.text, len(keys), *keys, *args)
    if isinstance(client, RedisCluster):
        # A cluster pipeline would send the key-less WAIT to any node: talk to the master
        # that owns the queue's slot on one of its connections.
        await client.initialize()  # the slot map is loaded lazily, by the first command
        node = client.get_node_from_key(keys[0])
        if node is None:
            raise EnqueueError(f"no cluster node serves the slot of {keys[0]!r} right now")
        conn = node.acquire_connection()
        try:
            await conn.send_packed_command(
                conn.pack_commands([evaluate, ("WAIT", needed, timeout_ms)])
            )
            reply = await conn.read_response()
            acked = await conn.read_response()
        finally:
            node.release(conn)
    else:
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(*evaluate)
        pipe.execute_command("WAIT", needed, timeout_ms)
        reply, acked = await pipe.execute()
    if int(acked) < needed:
        raise EnqueueError(
            f"only {acked} of {needed} replicas acknowledged the enqueue within "
            f"{app.settings.enqueue_replicas_timeout}s; the tasks are queued on the master but a "
            "failover now could lose them"
        )
    return reply
