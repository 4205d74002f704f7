"""One typed function per script: KEYS and ARGV are built here and only here, and each reply
is parsed into named fields. Callers never index a raw reply.

Each function returns a :class:`~tether.protocol.scripts._script.Call`; run it with
``await call.run(client)`` or ``call.run_sync(client)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ...base._settings import ABANDONED
from .._codecs import parse_entry_name
from .._keys import GROUP, QueueKeys
from ._script import (
    APPEND,
    CANCEL,
    CLAIM,
    DEAD_RETRY,
    ENQUEUE,
    FETCH,
    HANDOFF,
    LEAD,
    PROMOTE,
    PRUNE,
    RELEASE,
    RENEW,
    SETTLE,
    START,
    STATUS,
    TICK,
    Arg,
    Call,
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _optional_bytes(value: Any) -> bytes | None:
    """Lua ``false`` arrives as None."""
    if value is None or value is False:
        return None
    return value if isinstance(value, bytes) else str(value).encode()


# -- enqueue ------------------------------------------------------------------------------


class EnqueueItem(NamedTuple):
    task_id: str
    payload: bytes
    sidx: int
    """1-based stream index (1 high, 2 normal, 3 low)."""
    mode: str
    """'n' now, 'r' relative (``when_ms`` from the server's now), 'a' absolute unix ms."""
    when_ms: int
    dedup_key: str | None
    dedup_hold_ms: int


class Enqueued(NamedTuple):
    entry_id: str | None
    """The stream entry when queued now; None when delayed or a duplicate."""
    duplicate_of: str | None
    """The task id already holding the dedup key, when this one was refused."""


def _parse_enqueued(reply: Any) -> list[Enqueued]:
    out: list[Enqueued] = []
    for value in reply:
        raw = _text(value)
        if raw.startswith("="):
            out.append(Enqueued(None, raw[1:]))
        elif raw == "d":
            out.append(Enqueued(None, None))
        else:
            out.append(Enqueued(raw, None))
    return out


def enqueue(keys: QueueKeys, items: Sequence[EnqueueItem]) -> Call[list[Enqueued]]:
    """Add tasks now or later, at most once per dedup key (scripts/enqueue.lua)."""
    script_keys: list[Arg] = [*keys.streams, keys.index, keys.delayed, keys.scheduled_payloads]
    dedup_index: dict[str, int] = {}
    args: list[Arg] = [len(items)]
    for item in items:
        index = 0
        if item.dedup_key is not None:
            index = dedup_index.get(item.dedup_key, 0)
            if not index:
                script_keys.append(item.dedup_key)
                index = dedup_index[item.dedup_key] = len(script_keys)
        args += (
            item.task_id, item.payload, item.sidx, item.mode, item.when_ms, index,
            item.dedup_hold_ms,
        )  # fmt: skip
    return Call(ENQUEUE, script_keys, args, _parse_enqueued)


def _parse_ids(reply: Any) -> list[str]:
    return [_text(v) for v in reply]


def append(stream: str, payloads: Sequence[bytes]) -> Call[list[str]]:
    """Add plain tasks to one stream; returns their entry ids (scripts/append.lua)."""
    return Call(APPEND, [stream], list(payloads), _parse_ids)


# -- fetch --------------------------------------------------------------------------------


class FetchReply(NamedTuple):
    entries: list[tuple[int, bytes, bytes | None]]
    """(stream index, entry id, payload or None), highest priority first."""
    last_ids: list[bytes]
    """Each stream's last-delivered id, when asked for and nothing was delivered."""


def _parse_fetch(reply: Any) -> FetchReply:
    flat, last = reply
    entries = [
        (int(flat[i]), flat[i + 1], _optional_bytes(flat[i + 2])) for i in range(0, len(flat), 3)
    ]
    return FetchReply(entries, list(last))


def fetch(
    streams: Sequence[str], consumer: str, count: int, want_last_ids: bool
) -> Call[FetchReply]:
    """Deliver up to ``count`` new entries of one queue, highest priority first."""
    return Call(
        FETCH, list(streams), [GROUP, consumer, count, "1" if want_last_ids else "0"], _parse_fetch
    )


# -- settle -------------------------------------------------------------------------------


TICK_LOG_LENGTH = 100
"""Records kept in a schedule's tick log (ticks and the outcomes of their runs)."""
TICK_LOG_TTL_MS = 30 * 24 * 3600 * 1000
"""A tick log expires a month after its last record (a removed schedule's goes with it)."""


class ScheduleRun(NamedTuple):
    """Where a run of a schedule records its outcome (see scripts/settle.lua)."""

    log_key: str
    backoff_key: str | None
    """None when the schedule does not back off."""
    spec: str
    """'<tick>|<log length>|<log ttl ms>|<initial ms>|<factor>|<cap ms>|<forget ms>|<name>'"""

    @classmethod
    def of(cls, keys: QueueKeys, name: str, tick: int | None, backoff: str | None) -> ScheduleRun:
        """``backoff``: the schedule's policy as the envelope carries it
        ('<initial ms>|<factor>|<cap ms>|<forget ms>'), None when it has none."""
        tick_text = "" if tick is None else str(tick)
        spec = f"{tick_text}|{TICK_LOG_LENGTH}|{TICK_LOG_TTL_MS}|{backoff or '|||'}|{name}"
        return cls(keys.tick_log(name), keys.backoff if backoff else None, spec)


@dataclass(slots=True)
class SettleItem:
    """How one entry ended, as the settle script records it (see scripts/settle.lua)."""

    op: str
    """'o' (a bare success: nothing to record), 'ok', 'retry', 'fail', 'dead' or 'cancel'."""
    task_id: str = ""
    bound: bool = False
    """The task id came in the payload: the settle refuses it unless the index binds it to
    this entry (so a forged or copied entry cannot write another task's records)."""
    record: bytes = b""
    ttl_ms: int = 0
    retry_delay_ms: int = 0
    next_payload: bytes = b""
    reason: str = ""
    error: bytes = b""
    result_key: str | None = None
    done_key: str | None = None
    dedup_key: str | None = None
    dedup_hold_ms: int = 0
    schedule_run: ScheduleRun | None = None
    """Set for a run of a schedule: its outcome goes to the tick log, and moves the
    schedule's backoff."""
    attempts_key: str | None = None
    """Where a retry's record is kept (the task's earlier attempts), when it stores results."""


class StatsWrite(NamedTuple):
    minute_key: str
    hour_key: str
    minute_ttl_ms: int
    hour_ttl_ms: int
    signatures: Sequence[Sequence[str]]
    """The distinct sets of fields the batch's entries add one to (few: a task, its outcome
    and the buckets of its times)."""
    per_entry: Sequence[int]
    """For each entry of the call, in order: 1 + the index of its signature, 0 for none. The
    script counts an entry only if it settles it, so an outcome the fenced ack discards (a
    lost lease) or one already settled (a call sent again) is never counted."""

    @property
    def totals(self) -> dict[str, int]:
        """Each field's increment were every entry settled."""
        out: dict[str, int] = {}
        for sig in self.per_entry:
            for field in self.signatures[sig - 1] if sig else ():
                out[field] = out.get(field, 0) + 1
        return out


EntryKey = tuple[int, bytes]
"""(stream index, entry id): one entry of a queue (the same id can be in two of its streams)."""


class SettleReply(NamedTuple):
    taken: dict[EntryKey, str]
    """Entries another consumer owns now (a lost lease), with that owner."""
    gone: set[EntryKey]
    """Entries no longer pending (settled by an earlier attempt whose reply was lost, or
    lost with the server's data)."""
    settled: int
    forged: set[EntryKey]
    """Entries whose task id the index binds to another entry: dead-lettered instead."""


def _entry_key(raw: Any) -> EntryKey:
    """The script's name of an entry (its stream index, then its id) as a key."""
    return parse_entry_name(_optional_bytes(raw) or b"")


def _parse_settle(reply: Any) -> SettleReply:
    taken_flat, gone, settled, forged = reply
    taken = {
        _entry_key(taken_flat[i]): _text(taken_flat[i + 1]) for i in range(0, len(taken_flat), 2)
    }
    return SettleReply(
        taken,
        {_entry_key(g) for g in gone},
        int(settled),
        {_entry_key(f) for f in forged},
    )


def _key_index(script_keys: list[Arg], key: str | None) -> int:
    """Append ``key`` to a call's keys; its 1-based index there (0 for no key)."""
    if key is None:
        return 0
    script_keys.append(key)
    return len(script_keys)


def settle(
    keys: QueueKeys,
    consumer: str,
    dead_cap: int,
    entries: Sequence[tuple[int, bytes, SettleItem]],
    stats: StatsWrite | None = None,
) -> Call[SettleReply]:
    """The fenced ack of (stream index, entry id, outcome) triples of one queue."""
    script_keys: list[Arg] = [
        *keys.streams, keys.index, keys.delayed, keys.scheduled_payloads, keys.dead,
        stats.minute_key if stats else keys.dead, stats.hour_key if stats else keys.dead,
    ]  # fmt: skip
    args: list[Arg] = [GROUP, consumer, dead_cap]
    per_entry: Sequence[int] = ()
    if stats is None or not stats.signatures:
        args += (0, 0, 0)
    else:
        args += (stats.minute_ttl_ms, stats.hour_ttl_ms, len(stats.signatures))
        for fields in stats.signatures:
            args += (len(fields), *fields)
        per_entry = stats.per_entry
    for i, (sidx, entry_id, o) in enumerate(entries):
        sig = per_entry[i] if per_entry else 0
        if o.op == "o":  # the hot path: a success with nothing to record
            args += ("o", sidx, entry_id, sig)
            continue
        result_k = _key_index(script_keys, o.result_key)
        done_k = _key_index(script_keys, o.done_key)
        dedup_k = _key_index(script_keys, o.dedup_key)
        if o.op == "retry":
            detail: Arg = o.retry_delay_ms
            extra: Arg = o.next_payload
        else:
            detail, extra = o.reason, o.error
        args += (
            o.op, sidx, entry_id, o.task_id, "1" if o.bound else "0", result_k, done_k, dedup_k,
            o.record, o.ttl_ms, detail, extra, o.dedup_hold_ms, sig,
        )  # fmt: skip
        run = o.schedule_run
        if run is None:
            args += (0, 0, "")
        else:
            backoff_k = _key_index(script_keys, run.backoff_key)
            args += (backoff_k, _key_index(script_keys, run.log_key), run.spec)
        args.append(_key_index(script_keys, o.attempts_key))
    return Call(SETTLE, script_keys, args, _parse_settle)


# -- reclaim, start, handoff, prune -------------------------------------------------------


class Claimed(NamedTuple):
    entry_id: bytes
    payload: bytes | None
    deliveries: int
    """The stream's delivery count: for a reclaimed entry, the starts so far."""
    owner: str
    """The consumer it was taken from."""


def _parse_claimed(reply: Any) -> list[Claimed]:
    return [
        Claimed(
            _optional_bytes(reply[i]) or b"",
            _optional_bytes(reply[i + 1]),
            int(reply[i + 2]),
            _text(reply[i + 3]),
        )
        for i in range(0, len(reply), 4)
    ]


def claim(
    stream: str,
    lease_of: Callable[[str], str],
    consumer: str,
    candidates: Sequence[tuple[bytes, str]],
) -> Call[list[Claimed]]:
    """Take (entry id, expected owner) pairs whose owner has no lease; an owner equal to
    ``consumer`` resumes this consumer's own entries, 'abandoned' is always claimable."""
    script_keys: list[Arg] = [stream]
    lease_index: dict[str, int] = {}
    args: list[Arg] = [GROUP, consumer]
    for entry_id, owner in candidates:
        index = 0
        if owner not in (ABANDONED, consumer):
            index = lease_index.get(owner, 0)
            if not index:
                script_keys.append(lease_of(owner))
                index = lease_index[owner] = len(script_keys)
        args += (entry_id, owner, index)
    return Call(CLAIM, script_keys, args, _parse_claimed)


def start(stream: str, consumer: str, entry_id: bytes, seen: int | None = None) -> Call[int]:
    """Count a start of a reclaimed entry; 0 when this consumer no longer owns it. With
    ``seen``, the delivery count this consumer saw when it took the entry, a call sent again
    after its reply was lost counts once."""
    args: list[Arg] = [GROUP, consumer, entry_id]
    if seen is not None:
        args.append(seen)
    return Call(START, [stream], args, int)


def handoff(stream: str, consumer: str, items: Sequence[tuple[bytes, bool]]) -> Call[int]:
    """Give (entry id, give back the counted delivery) entries to 'abandoned'."""
    args: list[Arg] = [GROUP, consumer]
    for entry_id, give_back in items:
        args += (entry_id, "1" if give_back else "0")
    return Call(HANDOFF, [stream], args, int)


def prune(streams: Sequence[str], lease: str, consumer: str) -> Call[bool]:
    """Remove a consumer with no lease and no pending entries."""
    return Call(PRUNE, [*streams, lease], [GROUP, consumer], bool)


def _parse_promote(reply: Any) -> PromoteReply:
    moved, next_due, now, paused, malformed = reply
    return PromoteReply(
        int(moved),
        None if next_due is None or next_due is False else float(next_due),
        float(now),
        bool(int(paused)),
        int(malformed),
    )


class PromoteReply(NamedTuple):
    moved: int
    next_due_ms: float | None
    now_ms: float
    """The server's clock."""
    paused: bool
    malformed: int
    """Members that could not be promoted and went to the dead letters."""


def promote(keys: QueueKeys, batch: int, dead_cap: int) -> Call[PromoteReply]:
    """Move up to ``batch`` due delayed tasks into their streams; read the pause flag."""
    return Call(
        PROMOTE,
        [*keys.streams, keys.index, keys.delayed, keys.scheduled_payloads, keys.dead, keys.paused],
        [batch, dead_cap],
        _parse_promote,
    )


# -- leases -------------------------------------------------------------------------------


class RenewReply(NamedTuple):
    previous: str | None
    """The token the lease held before (None: it had lapsed)."""
    cancels: list[str]


def _parse_renew(reply: Any) -> RenewReply:
    previous, cancels = reply
    return RenewReply(
        None if previous is None else _text(previous), [_text(c) for c in cancels or ()]
    )


def renew(lease: str, cancels: str, token: str, ttl_ms: int) -> Call[RenewReply]:
    """The heartbeat of one queue: extend the lease, collect cancel requests."""
    return Call(RENEW, [lease, cancels], [token, ttl_ms], _parse_renew)


def release(lease: str, token: str) -> Call[bool]:
    """Delete a lease only if it still holds ``token``."""
    return Call(RELEASE, [lease], [token], bool)


def lead(key: str, holder: str, ttl_ms: int) -> Call[bool]:
    """Take or extend the scheduler leadership (compare-and-extend)."""
    return Call(LEAD, [key], [holder, ttl_ms], bool)


# -- following a task ---------------------------------------------------------------------


class StatusReply(NamedTuple):
    state: str
    """'running', 'queued', 'scheduled', 'retrying', 'record' or 'unknown'."""
    detail: bytes
    """The owner when running; the record for 'retrying' and 'record'."""
    unreadable: bytes = b""
    """The task's index entry when it is not one Tether writes (read past), else b''."""


def _parse_pair(reply: Any) -> tuple[str, bytes]:
    state = _text(reply[0])
    detail = reply[1] if len(reply) > 1 else b""
    return state, detail if isinstance(detail, bytes) else _text(detail).encode()


def _derived_args(derived: tuple[int, str] | None) -> tuple[str, str]:
    return ("", "") if derived is None else (str(derived[0]), derived[1])


def status(keys: QueueKeys, task_id: str, derived: tuple[int, str] | None) -> Call[StatusReply]:
    """Where a task is now. ``derived`` is (stream index, entry id) for a plain task's id."""
    return Call(
        STATUS,
        [*keys.streams, keys.index, keys.delayed, keys.result(task_id)],
        [GROUP, task_id, *_derived_args(derived)],
        lambda reply: StatusReply(*_parse_pair(reply), _unreadable_index(reply)),
    )


def _unreadable_index(reply: Any) -> bytes:
    found = reply[2] if len(reply) > 2 else b""
    return found if isinstance(found, bytes) else _text(found).encode()


class CancelReply(NamedTuple):
    state: str
    """'cancelled', 'requested', 'owner' (another consumer runs it) or 'finished'."""
    owner: str


def cancel(
    keys: QueueKeys,
    task_id: str,
    *,
    owner: str,
    record: bytes,
    record_ttl_ms: int,
    request_ttl_ms: int,
    dedup_key: str,
    derived: tuple[int, str] | None,
) -> Call[CancelReply]:
    """Remove a queued or scheduled task, or ask ``owner`` to stop running it."""
    return Call(
        CANCEL,
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
        [GROUP, task_id, owner, record, record_ttl_ms, request_ttl_ms, *_derived_args(derived)],
        lambda reply: CancelReply(_parse_pair(reply)[0], _parse_pair(reply)[1].decode()),
    )


def dead_retry(
    keys: QueueKeys, dead_entry: str, sidx: int, task_id: str, payload: bytes
) -> Call[str | None]:
    """Move a dead letter back into its stream as a fresh attempt; None if it is gone."""
    return Call(
        DEAD_RETRY,
        [*keys.streams, keys.index, keys.dead, keys.result(task_id)],
        [dead_entry, sidx, task_id, payload],
        lambda reply: None if reply is None else _text(reply),
    )


def tick(
    keys: QueueKeys,
    schedule: str,
    overlap: bool,
    sidx: int,
    backoff: bool,
    ticks: Sequence[tuple[int, str, bytes, str]],
) -> Call[list[str]]:
    """Enqueue (tick ms, task id, payload or b'' to skip, why skipped) ticks of a schedule
    at most once; ``backoff``: its ticks rest while its runs fail (see tick.lua)."""
    args: list[Arg] = [
        schedule, "1" if overlap else "0", sidx, "1" if backoff else "0", TICK_LOG_LENGTH,
        TICK_LOG_TTL_MS,
    ]  # fmt: skip
    for tick_ms, task_id, payload, why in ticks:
        args += (tick_ms, task_id, payload, why)
    script_keys: list[Arg] = [
        *keys.streams, keys.index, keys.delayed, keys.schedules, keys.backoff,
        keys.tick_log(schedule),
    ]  # fmt: skip
    return Call(TICK, script_keys, args, _parse_ids)
