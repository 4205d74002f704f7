"""Reading replies of pipelines run with ``raise_on_error=False``: a stream or a consumer
group that does not exist yet reads as empty, any other error is raised."""

from __future__ import annotations

from functools import partial
from typing import Any

from redis.exceptions import ResponseError

from ..base._redis import text
from ..base._unreadable import parsed
from ..protocol._keys import GROUP


def is_missing(reply: Any) -> bool:
    """The reply is the error of a key or consumer group that does not exist yet."""
    if not isinstance(reply, ResponseError):
        return False
    message = str(reply)
    return "NOGROUP" in message or "no such key" in message.lower()


def detached(replies: list[Any]) -> list[Any]:
    """The replies of a pipeline run with ``raise_on_error=False``, each error's traceback
    dropped. An error keeps the frames that parsed it, whose locals hold the list of
    replies that holds the error: a cycle only a full garbage collection frees, and with it
    every reply of the pipeline. Reading the figures of every queue made one per missing
    stream at each call (a queue declared and never used has three), and the dashboard
    reads them every two seconds."""
    for reply in replies:
        if isinstance(reply, BaseException):
            reply.__traceback__ = None
            reply.__context__ = None
    return replies


def value(reply: Any, default: Any) -> Any:
    """The reply, or ``default`` for a missing key or group; other errors are raised."""
    if isinstance(reply, BaseException):
        if is_missing(reply):
            return default
        raise reply
    return default if reply is None else reply


def group_info(reply: Any) -> tuple[int, str]:
    """(pending entries, last delivered id) of Tether's group from an XINFO GROUPS reply."""
    for group in value(reply, []):
        if text(group.get("name", b"")) == GROUP:
            return int(group.get("pending") or 0), text(group.get("last-delivered-id") or "0-0")
    return 0, "0-0"


def pending_by_consumer(reply: Any) -> dict[str, int]:
    """Consumer -> pending count from an XPENDING summary reply."""
    summary = value(reply, {})
    return {text(c["name"]): int(c["pending"]) for c in (summary.get("consumers") or []) if c}


def entry_ms(entry_id: str | bytes) -> int:
    """The millisecond part of a stream entry id (its server time)."""
    return int(text(entry_id).partition("-")[0])


CLOCK = "return redis.call('TIME')"
"""The server's clock, read on the node that holds a key (a Cluster pipeline refuses TIME,
and each master has its own clock): ``pipe.eval(CLOCK, 1, key)``."""


def server_ms(reply: Any) -> int:
    """Unix milliseconds from a TIME reply."""
    seconds, micros = reply
    return int(seconds) * 1000 + int(micros) // 1000


def counters_of(raw: Any, key: str) -> dict[str, int]:
    """The statistics hash at ``key`` as {field: count}; a field that is not text with a
    whole number is skipped and reported."""
    out: dict[str, int] = {}
    for k, v in value(raw, {}).items():
        counter = parsed("statistics", f"{key} field {k[:100]!r}", partial(_counter, k, v))
        if counter is not None:
            out[counter[0]] = counter[1]
    return out


def _counter(field: Any, amount: Any) -> tuple[str, int]:
    return text(field), int(amount)
