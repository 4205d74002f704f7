"""Typed calls of the flow-control scripts (``limit_*.lua``): KEYS and ARGV are built here
and only here, and each reply is parsed into named fields.

The limit scripts share a library of Lua functions (``limit_lib.lua``), prepended to each
of them when it is loaded, so the wake-up of parked tasks is written once.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, NamedTuple

from ...base._limits import NO_LIMITS, TaskLimits
from ...base._settings import ABANDONED
from .._codecs import holder_name
from .._keys import GROUP, QueueKeys, ScopeKeys, TaskLimitKeys, held_key, overrides_key
from ._script import Arg, Call, Script


class LimitScript(Script):
    """A limit script with the shared library in front of it."""

    __slots__ = ()

    def __init__(self, name: str) -> None:
        files = resources.files(__package__)
        library = files.joinpath("limit_lib.lua").read_text("utf-8")
        body = files.joinpath(f"{name}.lua").read_text("utf-8")
        super().__init__(name, f"{library}\n{body}")


LIMIT_ADMIT = LimitScript("limit_admit")
LIMIT_RELEASE = LimitScript("limit_release")
LIMIT_RECLAIM = LimitScript("limit_reclaim")
LIMIT_SET = LimitScript("limit_set")


class _Keys:
    """KEYS of one call: the queue keys first, then each other key once; and the task
    table (see limit_lib.lua) of the tasks named."""

    def __init__(self, queue: QueueKeys, extra: Sequence[str] = ()) -> None:
        self.queue = queue
        self.list: list[Arg] = [
            *queue.streams, queue.index, queue.delayed, queue.scheduled_payloads,
            held_key(queue.tag), overrides_key(queue.tag), *extra,
        ]  # fmt: skip
        self._index: dict[str, int] = {}
        self._tasks: dict[str, tuple[int, TaskLimitKeys]] = {}
        self._table: list[list[Any]] = []

    def add(self, key: str) -> int:
        index = self._index.get(key)
        if index is None:
            self.list.append(key)
            index = self._index[key] = len(self.list)
        return index

    def task(self, name: str, declared: TaskLimits | None) -> tuple[int, TaskLimitKeys]:
        """The task's index in the task table (added on first use) and its keys."""
        known = self._tasks.get(name)
        if known is not None:
            return known
        keys = task_keys(self.queue.tag, name)
        scope = keys.scope
        self._table.append([
            name, *(declared or NO_LIMITS).wire(), self.add(scope.bucket),
            self.add(scope.running), self.add(scope.waiting), self.add(keys.reservations),
            self.add(keys.waiting_keys),
        ])  # fmt: skip
        known = self._tasks[name] = (len(self._table), keys)
        return known

    def table(self) -> str:
        return _json(self._table)


@functools.lru_cache(maxsize=1024)
def task_keys(tag: str, task: str) -> TaskLimitKeys:
    return TaskLimitKeys.of(tag, task)


@functools.lru_cache(maxsize=4096)
def key_scope(tag: str, task: str, key: str) -> ScopeKeys:
    return task_keys(tag, task).key_scope(key)


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# -- admission ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AdmitItem:
    sidx: int
    entry_id: bytes
    task_id: str
    payload: bytes
    """What is stored if the entry is held back: the envelope with its task id; b'' for a
    plain task (the script asks for it with 'n' when it must hold the task back)."""
    task: str
    declared: TaskLimits | None
    bound: bool
    """The task id came in the payload: the index must bind it to this entry."""
    reclaimed: bool
    """Taken over from a dead worker (or resumed): held back, it stays in its stream."""
    limit_key: str
    """'' when the call gave none."""


class Admission(NamedTuple):
    code: str
    """'a' admitted, 'd' waits for a rate token, 'p' parked for a slot, 'h' reclaimed and
    handed back to wait in the pending list, 'x' not ours, 'n' held back but its payload
    is needed (nothing was changed: send it again with the payload)."""
    detail: str
    """'a': the scopes it holds ('c' the task's, 'C' the key's); 'd': '<due ms><r|R>';
    'p': 'c' or 'C'; 'h': the limit, 'c', 'C', 'r' or 'R'."""

    @property
    def due_ms(self) -> float:
        return float(self.detail[:-1])


class AdmitReply(NamedTuple):
    now_ms: float
    """The server's clock."""
    results: dict[bytes, Admission]


def _parse_admit(reply: Any) -> AdmitReply:
    now, flat = reply[0], reply[1:]
    results = {
        flat[i] if isinstance(flat[i], bytes) else str(flat[i]).encode(): Admission(
            _text(flat[i + 1]), _text(flat[i + 2]) if flat[i + 2] else ""
        )
        for i in range(0, len(flat), 3)
    }
    return AdmitReply(float(now), results)


class StatsTarget(NamedTuple):
    minute_key: str
    hour_key: str
    ttl_ms: int


def admit(
    keys: QueueKeys,
    consumer: str,
    holder: str,
    backstop_ms: int,
    slack_ms: int,
    missed_ms: int,
    stats: StatsTarget | None,
    items: Sequence[AdmitItem],
) -> Call[AdmitReply]:
    """Admit entries of limited tasks, or hold them back (scripts/limit_admit.lua).
    ``holder`` is this worker's lease instance (see
    :func:`tether.protocol._codecs.slot_holder`): the slots it takes are that instance's,
    not the name's."""
    stats_keys = (stats.minute_key, stats.hour_key) if stats else (keys.dead, keys.dead)
    table = _Keys(keys, stats_keys)
    entries: list[list[Any]] = []
    payloads: list[Arg] = []
    for item in items:
        ti, _ = table.task(item.task, item.declared)
        bucket = running = waiting = 0
        if item.limit_key:
            scope = key_scope(keys.tag, item.task, item.limit_key)
            bucket, running = table.add(scope.bucket), table.add(scope.running)
            waiting = table.add(scope.waiting)
        payload = 0
        if item.payload:
            payloads.append(item.payload)
            payload = 10 + len(payloads)
        entries.append([
            item.sidx, item.entry_id.decode(), item.task_id, ti, int(item.bound),
            int(item.reclaimed), item.limit_key, bucket, running, waiting, payload,
        ])  # fmt: skip
    args: list[Arg] = [
        GROUP, consumer, holder, ABANDONED, backstop_ms, slack_ms, missed_ms,
        stats.ttl_ms if stats else 0,
        table.table(), _json(entries), *payloads,
    ]  # fmt: skip
    return Call(LIMIT_ADMIT, table.list, args, _parse_admit)


# -- release and reclaim ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReleaseItem:
    task_id: str
    task: str
    declared: TaskLimits | None
    limit_key: str
    scopes: str
    """The scopes it was admitted to: 'c', 'C' or 'cC'."""


def release(keys: QueueKeys, holder: str, items: Sequence[ReleaseItem]) -> Call[int]:
    """Give back the slots of settled or handed-off entries, if still held by ``holder`` (this
    worker's lease instance)."""
    table = _Keys(keys)
    entries: list[list[Any]] = []
    for item in items:
        ti, _ = table.task(item.task, item.declared)
        running = waiting = 0
        if item.limit_key:
            scope = key_scope(keys.tag, item.task, item.limit_key)
            running, waiting = table.add(scope.running), table.add(scope.waiting)
        entries.append([item.task_id, ti, item.limit_key, item.scopes, running, waiting])
    return Call(LIMIT_RELEASE, table.list, [holder, table.table(), _json(entries)], int)


@dataclass(frozen=True, slots=True)
class ReclaimItem:
    task_id: str
    record: bytes
    """The held-slot record as read: the script frees it only if it is still that."""
    holder: str
    """The lease instance holding it ('<consumer> <instance>'); '' for a slot held for a
    task no worker runs (woken, or waiting for its rate token)."""
    task: str
    declared: TaskLimits | None
    limit_key: str


class ReclaimReply(NamedTuple):
    freed: int
    """Slots freed (each woke a parked task)."""
    kept: int
    """Slots of dead holders kept for their tasks' next run."""


def _parse_reclaim(reply: Any) -> ReclaimReply:
    return ReclaimReply(int(reply[0]), int(reply[1]))


def reclaim(
    keys: QueueKeys,
    holder: str,
    lease_of: Callable[[str], str],
    items: Sequence[ReclaimItem],
) -> Call[ReclaimReply]:
    """Take back slots whose holder's lease is missing or that an earlier incarnation of
    ``holder``'s worker name held, and slots held for tasks no worker runs that are gone."""
    table = _Keys(keys)
    entries: list[Arg] = []
    for item in items:
        ti, _ = table.task(item.task, item.declared)
        running = waiting = 0
        if item.limit_key:
            scope = key_scope(keys.tag, item.task, item.limit_key)
            running, waiting = table.add(scope.running), table.add(scope.waiting)
        lease = table.add(lease_of(holder_name(item.holder))) if item.holder else 0
        entries += (item.task_id, item.record, lease, ti, item.limit_key, running, waiting)
    args: list[Arg] = [holder, table.table(), *entries]
    return Call(LIMIT_RECLAIM, table.list, args, _parse_reclaim)


# -- runtime changes ----------------------------------------------------------------------


class SetReply(NamedTuple):
    released: int
    """Waiting tasks moved to the head of the delayed set by this call."""
    more: bool
    """Waiting tasks are left: call again with no override."""
    generation: int


def set_limits(
    keys: QueueKeys,
    task: str,
    mode: str,
    fields: str,
    budget: int,
    waiting_keys: Sequence[str],
) -> Call[SetReply]:
    """Change a task's override (``mode`` 'merge' or 'replace' with ``fields`` as JSON, ''
    to carry on releasing) and release its waiting tasks, at most ``budget`` of them
    (scripts/limit_set.lua)."""
    limit_keys = task_keys(keys.tag, task)
    lists = [limit_keys.key_scope(k).waiting for k in waiting_keys]
    return Call(
        LIMIT_SET,
        [
            *keys.streams,
            keys.index,
            keys.delayed,
            keys.scheduled_payloads,
            held_key(keys.tag),
            overrides_key(keys.tag),
            limit_keys.reservations,
            limit_keys.scope.waiting,
            limit_keys.waiting_keys,
            *lists,
        ],
        [task, mode, fields, budget, *waiting_keys],
        lambda r: SetReply(int(r[0]), bool(int(r[1])), int(r[2])),
    )
