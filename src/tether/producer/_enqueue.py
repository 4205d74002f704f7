"""Enqueue: check and encode every call first, then write in one round trip, from asyncio
or from plain threads alike.

A plain task (no delay, no dedup key) is one ``XADD`` and nothing else: its id is derived
from its stream entry. Delayed and deduplicated tasks go through the ``enqueue`` script,
which gives them an id of their own and an index entry. The synchronous path runs the same
commands and scripts on the app's blocking client.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import redis.exceptions
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster

from ..base._blocking import refuse_on_loop
from ..base._errors import ArgumentSerializationError, EnqueueError
from ..base._middleware import Middleware, call_hooks, call_hooks_sync, overrides
from ..base._settings import PRIORITIES
from ..protocol import scripts
from ..protocol._envelope import (
    ENVELOPE_VERSION,
    PlainEncoder,
    Serializer,
    find_unserializable,
    plain_encoder,
)
from ..protocol._keys import QueueKeys, derived_task_id
from ._failure import enqueue_error
from ._handle import TaskHandle

if TYPE_CHECKING:
    from ..protocol.scripts import Call
    from ._core import Core

Calls = Sequence[tuple[tuple[Any, ...], Mapping[str, Any]]]

CHUNK = 1000
"""Tasks per script call: large enough to amortise the round trip, small enough not to hold
the server for long."""

DEDUP_MAX_HOLD_MS = 24 * 3600 * 1000
"""A dedup key lives at most this long past its task's due time, even if the task never
reaches an outcome, so no key acts as a lock forever."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallOptions:
    """Options for one enqueue; ``None`` means the task's default."""

    queue: str | None = None
    priority: str | None = None
    delay: float | None = None
    at_ms: int | None = None
    key: str | None = None
    key_ttl: float | None = None
    timeout: float | None = None
    retries: int | None = None
    store_result: bool | None = None
    limit_key: str | None = None


class Enqueueable(Protocol):
    """What enqueue needs of a task: its name, defaults, options and argument checks."""

    name: str

    @property
    def default_queue(self) -> str: ...

    @property
    def default_priority(self) -> str: ...

    @property
    def call_options(self) -> CallOptions: ...

    def check_arguments(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None: ...

    def bind_arguments(
        self, args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Plan:
    """What every enqueue of one task (with one set of options) shares, computed once."""

    queue: str
    sidx: int
    stream: str
    plain: bool
    options: dict[str, Any]
    encode_plain: PlainEncoder | None = None
    """The envelope's fixed parts written once (plain tasks, JSON): the blocking fast path."""

    @classmethod
    def of(cls, core: Core, task: Enqueueable) -> Plan:
        opts = task.call_options
        queue = opts.queue or task.default_queue
        sidx = PRIORITIES.index(opts.priority or task.default_priority) + 1
        plain = opts.delay is None and opts.at_ms is None and opts.key is None
        options = _envelope_options(opts)
        return cls(
            queue=queue,
            sidx=sidx,
            stream=core.keys(queue).streams[sidx - 1],
            plain=plain,
            options=options,
            encode_plain=plain_encoder(core.serializer, task.name, options) if plain else None,
        )


@dataclass(frozen=True, slots=True)
class Step:
    """One command of an enqueue, built without I/O: a script call (``call``), or a bare
    command (``command``, one ``XADD``) whose reply ``parse`` reads."""

    call: Call[list[Any]] | None
    command: tuple[Any, ...] | None = None
    parse: Callable[[Any], list[Any]] | None = None


@dataclass(slots=True)
class Write:
    """An enqueue call, planned and encoded: the ids it gives, the payloads, the steps."""

    plan: Plan
    ids: list[str]
    payloads: list[bytes]
    steps: list[Step]


def plain_steps(stream: str, payloads: list[bytes], *, replicas: bool) -> list[Step]:
    """A plain task is one ``XADD``; a batch (or a write that waits for replicas) is the
    ``append`` script, ``CHUNK`` payloads a call. Each reply is a list of entry ids."""
    if len(payloads) == 1 and not replicas:
        return [Step(None, ("XADD", stream, "*", "m", payloads[0]), _entry_ids)]
    return [
        Step(scripts.append(stream, payloads[start : start + CHUNK]))
        for start in range(0, len(payloads), CHUNK)
    ]


def scripted_steps(
    keys: QueueKeys,
    sidx: int,
    ids: Sequence[str],
    payloads: Sequence[bytes],
    *,
    mode: str = "n",
    when: int = 0,
    dedup_key: str | None = None,
) -> list[Step]:
    """Delayed (``mode`` 'r' relative or 'a' absolute, ``when`` ms) or deduplicated tasks:
    the ``enqueue`` script, ``CHUNK`` tasks a call. Each reply is a list of ``Enqueued``."""
    items = [
        scripts.EnqueueItem(task_id, payload, sidx, mode, when, dedup_key, DEDUP_MAX_HOLD_MS)
        for task_id, payload in zip(ids, payloads, strict=True)
    ]
    return [Step(scripts.enqueue(keys, items[i : i + CHUNK])) for i in range(0, len(items), CHUNK)]


def write_of(
    core: Core, task: Enqueueable, plan: Plan, calls: Calls, headers: dict[str, str] | None
) -> Write:
    """Check and encode every call, and the steps that write them: nothing is sent."""
    ids: list[str] = [] if plan.plain else [f"{plan.queue}:{uuid.uuid4().hex}" for _ in calls]
    opts = task.call_options
    delay_ms = None if opts.delay is None else int(opts.delay * 1000)
    payloads = encode(
        core.serializer, task, calls, ids, plan.options, delay_ms, opts.at_ms, headers
    )
    if plan.plain:
        steps = plain_steps(plan.stream, payloads, replicas=bool(core.settings.enqueue_replicas))
    else:
        mode, when = "n", 0
        if delay_ms is not None:
            mode, when = "r", delay_ms
        elif opts.at_ms is not None:
            mode, when = "a", opts.at_ms
        keys = core.keys(plan.queue)
        dedup_key = keys.dedup(opts.key) if opts.key is not None else None
        steps = scripted_steps(
            keys, plan.sidx, ids, payloads, mode=mode, when=when, dedup_key=dedup_key
        )
    return Write(plan, ids, payloads, steps)


def handles_of(core: Core, write: Write, replies: list[Any]) -> list[TaskHandle[Any]]:
    """The handles of a write, from the replies of its steps."""
    plan = write.plan
    queue = plan.queue
    if plan.plain:
        sidx = plan.sidx
        return [TaskHandle(core, derived_task_id(queue, sidx, e), queue) for e in replies]
    handles: list[TaskHandle[Any]] = []
    for task_id, reply in zip(write.ids, replies, strict=True):
        if reply.duplicate_of is not None:
            handles.append(TaskHandle(core, reply.duplicate_of, queue, duplicate=True))
        else:
            handles.append(TaskHandle(core, task_id, queue))
    return handles


def _entry_ids(reply: Any) -> list[str]:
    return [reply.decode() if isinstance(reply, bytes) else str(reply)]


# -- asyncio ------------------------------------------------------------------------------


async def enqueue(core: Core, task: Enqueueable, plan: Plan, calls: Calls) -> list[TaskHandle[Any]]:
    if not calls:
        return []
    middleware = core.middleware
    if not middleware or not _surrounded(middleware):
        return await _enqueue(core, task, plan, calls, None)
    headers = _before_enqueue(middleware, task, plan)
    handles: list[TaskHandle[Any]] = []
    try:
        handles = await _enqueue(core, task, plan, calls, headers)
    except BaseException as exc:
        _after_enqueue(middleware, task, plan, [], exc)
        raise
    _after_enqueue(middleware, task, plan, handles, None)
    return handles


async def _enqueue(
    core: Core, task: Enqueueable, plan: Plan, calls: Calls, headers: dict[str, str] | None
) -> list[TaskHandle[Any]]:
    write = write_of(core, task, plan, calls, headers)
    if core.intercept is not None:  # tether.testing: served in memory
        handles: list[TaskHandle[Any]] = await core.intercept.enqueue(
            task, plan, write.ids, write.payloads
        )
        return handles
    try:
        handles = handles_of(core, write, await execute(core, write.steps))
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        raise enqueue_error(core, task.name, exc) from exc
    if core.middleware and overrides(core.middleware, "on_enqueue"):
        await _on_enqueue(core.middleware, task, plan, handles)
    return handles


async def execute(core: Core, steps: Sequence[Step], client: Any = None) -> list[Any]:
    """Send the steps in order (waiting for replicas when the app asks), their replies
    concatenated. ``client``: another than the app's own."""
    client = core.client if client is None else client
    replies: list[Any] = []
    for step in steps:
        if step.command is not None:
            assert step.parse is not None
            replies += step.parse(await client.execute_command(*step.command))
        elif core.settings.enqueue_replicas:
            assert step.call is not None
            replies += step.call.parse(await _with_replicas(core, step.call))
        else:
            assert step.call is not None
            replies += await step.call.run(client)
    return replies


async def _with_replicas(core: Core, call: Call[Any]) -> Any:
    """Run a script and ``WAIT`` on the same connection until enough replicas have it:
    ``WAIT`` counts the replicas that acknowledged this connection's writes."""
    client = core.client
    needed = core.settings.enqueue_replicas
    wait = ("WAIT", needed, int(core.settings.enqueue_replicas_timeout * 1000))
    for attempt in (1, 2):
        command = call.evalsha if attempt == 1 else ("EVAL", call.script.text, *call.evalsha[2:])
        try:
            if isinstance(client, AsyncRedisCluster):
                reply, acked = await _cluster_pair(client, str(call.keys[0]), command, wait)
            else:
                pipe = client.pipeline(transaction=False)
                pipe.execute_command(*command)
                pipe.execute_command(*wait)
                reply, acked = await pipe.execute()
        except redis.exceptions.NoScriptError:
            continue
        _check_replicas(core, int(acked))
        return reply
    raise EnqueueError("the server refused the enqueue script twice (NOSCRIPT)")


async def _cluster_pair(
    client: AsyncRedisCluster, key: str, command: tuple[Any, ...], wait: tuple[Any, ...]
) -> tuple[Any, Any]:
    # A cluster pipeline would send the key-less WAIT to any node: talk to the master that
    # owns the queue's slot, on one of its connections.
    await client.initialize()  # the slot map is loaded lazily, by the first command
    node = client.get_node_from_key(key)
    if node is None:
        raise EnqueueError(f"no cluster node serves the slot of {key!r} right now")
    conn = node.acquire_connection()
    healthy = False
    try:
        await conn.send_packed_command(conn.pack_commands([command, wait]))
        # Read both replies even when the first is an error, so the connection goes back
        # to the pool with nothing unread on it.
        first: Any
        try:
            first = await conn.read_response()
        except redis.exceptions.ResponseError as exc:
            first = exc
        acked = await conn.read_response()
        healthy = True
    finally:
        if not healthy:
            await conn.disconnect()
        node.release(conn)
    if isinstance(first, BaseException):
        raise first
    return first, acked


# -- blocking -----------------------------------------------------------------------------


def enqueue_sync(
    core: Core, task: Enqueueable, plan: Plan, calls: Calls, method: str
) -> list[TaskHandle[Any]]:
    refuse_on_loop(method)
    if not calls:
        return []
    middleware = core.middleware
    if not middleware or not _surrounded(middleware):
        return _enqueue_sync(core, task, plan, calls, None)
    headers = _before_enqueue(middleware, task, plan)
    handles: list[TaskHandle[Any]] = []
    try:
        handles = _enqueue_sync(core, task, plan, calls, headers)
    except BaseException as exc:
        _after_enqueue(middleware, task, plan, [], exc)
        raise
    _after_enqueue(middleware, task, plan, handles, None)
    return handles


def _enqueue_sync(
    core: Core, task: Enqueueable, plan: Plan, calls: Calls, headers: dict[str, str] | None
) -> list[TaskHandle[Any]]:
    write = write_of(core, task, plan, calls, headers)
    if core.intercept is not None:
        intercepted: list[TaskHandle[Any]] = core.intercept.enqueue_sync(
            task, plan, write.ids, write.payloads
        )
        return intercepted
    try:
        handles = handles_of(core, write, execute_sync(core, write.steps))
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        raise enqueue_error(core, task.name, exc) from exc
    if core.middleware and overrides(core.middleware, "on_enqueue"):
        # The async hooks run on a private loop, one for the whole call (a loop per task made
        # a batch 15 times slower): this thread runs none (checked above).
        asyncio.run(_on_enqueue(core.middleware, task, plan, handles))
    return handles


def execute_sync(core: Core, steps: Sequence[Step]) -> list[Any]:
    """:func:`execute` on the app's blocking client."""
    client: Any = core.sync_client
    replies: list[Any] = []
    for step in steps:
        if step.command is not None:
            assert step.parse is not None
            replies += step.parse(client.execute_command(*step.command))
        elif core.settings.enqueue_replicas:
            assert step.call is not None
            replies += step.call.parse(_with_replicas_sync(core, step.call))
        else:
            assert step.call is not None
            replies += step.call.run_sync(client)
    return replies


def enqueue_one_sync(
    core: Core, task: Enqueueable, plan: Plan, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> TaskHandle[Any]:
    """``task.enqueue_sync(...)`` of one plain task, kept short: the envelope's fixed parts
    are written once (``Plan.encode_plain``), then one ``XADD``. The same bytes and the same
    command as :func:`enqueue_sync`, which takes every other case (hooks, replicas, the
    testing kit, an event loop's thread, an argument the encoder refuses)."""
    encode_plain = plan.encode_plain
    if (
        encode_plain is None
        or core.middleware
        or core.intercept is not None
        or core.settings.enqueue_replicas
        or asyncio._get_running_loop() is not None
    ):
        return enqueue_sync(core, task, plan, [(args, kwargs)], "enqueue_sync")[0]
    task.check_arguments(args, kwargs)
    try:
        payload = encode_plain(args, kwargs, int(time.time() * 1000))
    except Exception:  # the general path names the argument the serializer refuses
        return enqueue_sync(core, task, plan, [(args, kwargs)], "enqueue_sync")[0]
    try:
        client: Any = core.sync_client
        entry = client.execute_command("XADD", plan.stream, "*", "m", payload)
    except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
        raise enqueue_error(core, task.name, exc) from exc
    entry_id = entry.decode() if isinstance(entry, bytes) else str(entry)
    return TaskHandle(core, derived_task_id(plan.queue, plan.sidx, entry_id), plan.queue)


def _with_replicas_sync(core: Core, call: Call[Any]) -> Any:
    client: Any = core.sync_client
    needed = core.settings.enqueue_replicas
    wait = ("WAIT", needed, int(core.settings.enqueue_replicas_timeout * 1000))
    for attempt in (1, 2):
        command = call.evalsha if attempt == 1 else ("EVAL", call.script.text, *call.evalsha[2:])
        try:
            if isinstance(client, RedisCluster):
                reply, acked = _cluster_pair_sync(client, str(call.keys[0]), command, wait)
            else:
                pipe = client.pipeline(transaction=False)
                pipe.execute_command(*command)
                pipe.execute_command(*wait)
                reply, acked = pipe.execute()
        except redis.exceptions.NoScriptError:
            continue
        _check_replicas(core, int(acked))
        return reply
    raise EnqueueError("the server refused the enqueue script twice (NOSCRIPT)")


def _cluster_pair_sync(
    client: RedisCluster, key: str, command: tuple[Any, ...], wait: tuple[Any, ...]
) -> tuple[Any, Any]:
    node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
    if node is None or node.redis_connection is None:
        raise EnqueueError(f"no cluster node serves the slot of {key!r} right now")
    pool: Any = node.redis_connection.connection_pool
    conn = pool.get_connection()
    healthy = False
    try:
        conn.send_packed_command(conn.pack_commands([command, wait]))
        first: Any
        try:
            first = conn.read_response()
        except redis.exceptions.ResponseError as exc:
            first = exc
        acked = conn.read_response()
        healthy = True
    finally:
        if not healthy:
            conn.disconnect()
        pool.release(conn)
    if isinstance(first, BaseException):
        raise first
    return first, acked


# -- shared -------------------------------------------------------------------------------


async def _on_enqueue(
    middleware: tuple[Middleware, ...],
    task: Enqueueable,
    plan: Plan,
    handles: list[TaskHandle[Any]],
) -> None:
    """The ``on_enqueue`` hooks, once per task Redis accepted (not for a duplicate)."""
    for handle in handles:
        if not handle.duplicate:
            await call_hooks(middleware, "on_enqueue", task.name, handle.id, plan.queue)


def _surrounded(middleware: tuple[Middleware, ...]) -> bool:
    """Whether a middleware hooks in before or after the write of an enqueue call."""
    return overrides(middleware, "before_enqueue") or overrides(middleware, "after_enqueue")


def _before_enqueue(
    middleware: tuple[Middleware, ...], task: Enqueueable, plan: Plan
) -> dict[str, str]:
    """The headers the ``before_enqueue`` hooks set, sent with every task of the call."""
    headers: dict[str, str] = {}
    call_hooks_sync(middleware, "before_enqueue", task.name, plan.queue, headers)
    return headers


def _after_enqueue(
    middleware: tuple[Middleware, ...],
    task: Enqueueable,
    plan: Plan,
    handles: list[TaskHandle[Any]],
    error: BaseException | None,
) -> None:
    ids = [h.id for h in handles]
    call_hooks_sync(middleware[::-1], "after_enqueue", task.name, plan.queue, ids, error)


def encode(
    serializer: Serializer,
    task: Enqueueable,
    calls: Calls,
    ids: Sequence[str],
    options: dict[str, Any],
    delay_ms: int | None = None,
    at_ms: int | None = None,
    headers: dict[str, str] | None = None,
) -> list[bytes]:
    """Check and encode every call before anything is sent, so a bad one writes nothing."""
    now_ms = int(time.time() * 1000)
    due_ms = at_ms if at_ms is not None else None if delay_ms is None else now_ms + delay_ms
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
        if headers:
            envelope["hdr"] = headers
        envelope["enq"] = now_ms
        if due_ms is not None:
            envelope["due"] = due_ms
        try:
            payloads.append(dumps(envelope))
        except Exception as exc:
            bound = task.bind_arguments(args, kwargs)
            raise _serialization_error(serializer, name, bound, exc) from None
    return payloads


def _check_replicas(core: Core, acked: int) -> None:
    needed = core.settings.enqueue_replicas
    if acked < needed:
        raise EnqueueError(
            f"only {acked} of {needed} replicas acknowledged the enqueue within "
            f"{core.settings.enqueue_replicas_timeout}s; the tasks are queued on the master but "
            "a failover now could lose them"
        )


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
    if opts.limit_key is not None:
        out["limit_key"] = opts.limit_key
    return out


def _serialization_error(
    serializer: Serializer, task: str, bound: Mapping[str, Any], exc: Exception
) -> ArgumentSerializationError:
    found = find_unserializable(serializer, bound)
    if found is None:
        return ArgumentSerializationError(
            f"task {task!r}: the arguments cannot be serialized by the {serializer.name} "
            f"serializer: {exc}"
        )
    name, error = found
    value = bound[name]
    return ArgumentSerializationError(
        f"task {task!r}: argument {name!r} ({type(value).__name__}) cannot be serialized by "
        f"the {serializer.name} serializer: {error}"
    )
