"""How a taskiq message is stored: a Tether envelope that carries taskiq's bytes unchanged,
and how taskiq labels map to Tether's enqueue options.

The envelope is an ordinary Tether v1 envelope, so the dead-letter tools read it::

    {"v": 1, "task": "myapp.tasks:add", "args": [], "enq": 1732870000000,
     "taskiq": {"id": "9f2c…", "message": "{\"task_id\":\"9f2c…\",…}"}}

``task`` is taskiq's task name and ``args`` stays empty: the arguments live in the taskiq
message, which is kept exactly as taskiq's formatter made it (as text when it is UTF-8, as
``message_b64`` otherwise, for binary serializers), so the worker hands taskiq the very bytes
it sent. A delayed or deduplicated message also carries ``id`` (its Tether task id), ``due``
and ``opts`` (``key``, ``key_ttl``).
"""

from __future__ import annotations

import base64
import binascii
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...base._errors import ConfigError, EnqueueError, TetherError
from ...base._settings import PRIORITIES, check_name
from ...protocol._envelope import ENVELOPE_VERSION, Envelope, Serializer

TASKIQ_FIELD = "taskiq"

DELAY_LABEL = "delay"
"""Seconds from now (a number, or text holding one); taskiq's SmartRetryMiddleware sets it."""
PRIORITY_LABEL = "priority"
"""'high', 'normal' or 'low', or a number (see :func:`stream_of`): the stream the message
goes to."""
QUEUE_LABEL = "queue_name"
"""The Tether queue of the broker's namespace the message goes to, as taskiq-redis sends it
to the stream this label names; default the broker's queue."""
DEDUP_KEY_LABEL = "dedup_key"
"""At most one message with this key queued, delayed or running at a time."""
DEDUP_TTL_LABEL = "dedup_key_ttl"
"""Seconds the key stays held after the task's outcome (default: released at once)."""


@dataclass(frozen=True, slots=True)
class Kick:
    """Where and when one message goes, from its labels."""

    sidx: int
    """1-based stream index (1 high, 2 normal, 3 low)."""
    queue: str | None = None
    """Another queue than the broker's (the ``queue_name`` label)."""
    delay_ms: int | None = None
    dedup_key: str | None = None
    dedup_ttl: float | None = None

    @property
    def plain(self) -> bool:
        """One XADD and nothing else: no delay, no dedup key."""
        return self.delay_ms is None and self.dedup_key is None


def plan(task_name: str, labels: Mapping[str, Any]) -> Kick:
    """Read the labels Tether acts on; a bad value raises :class:`EnqueueError` naming it
    (taskiq's kicker turns it into ``SendTaskError`` with this error as its cause)."""
    priority = labels.get(PRIORITY_LABEL)
    sidx = 2 if priority is None else stream_of(task_name, priority)
    queue = labels.get(QUEUE_LABEL)
    if queue is not None:
        try:
            check_name("queue", queue)
        except ConfigError as exc:
            raise EnqueueError(f"task {task_name!r}: label {QUEUE_LABEL}: {exc}") from None
    delay_ms = None
    delay = labels.get(DELAY_LABEL)
    if delay is not None:
        seconds = _number(delay)
        if seconds is None or seconds < 0:
            raise _bad(task_name, DELAY_LABEL, delay, "a number of seconds, 0 or more")
        if seconds > 0:
            delay_ms = int(seconds * 1000)
    key = labels.get(DEDUP_KEY_LABEL)
    ttl = labels.get(DEDUP_TTL_LABEL)
    if key is not None and not (isinstance(key, str) and 0 < len(key) <= 512):
        raise _bad(task_name, DEDUP_KEY_LABEL, key, "text of 1 to 512 characters")
    hold = None
    if ttl is not None:
        hold = _number(ttl)
        if hold is None or hold <= 0:
            raise _bad(task_name, DEDUP_TTL_LABEL, ttl, "a number of seconds above zero")
        if key is None:
            raise EnqueueError(
                f"task {task_name!r}: label {DEDUP_TTL_LABEL} is set without {DEDUP_KEY_LABEL}"
            )
    return Kick(sidx, queue, delay_ms, key, hold)


PRIORITY_EXPECTED = (
    "'high', 'normal' or 'low', or a number (above 0: high, 0: normal, below 0: low)"
)


def stream_of(task_name: str, priority: Any) -> int:
    """The 1-based stream of a ``priority`` label. Tether has three levels; a number maps by
    its sign, a higher number being the more urgent as on RabbitMQ (taskiq-aio-pika's
    ``priority``; taskiq-redis ignores the label): above 0 is ``high``, 0 (what an unlabelled
    message is there) ``normal``, below 0 ``low``."""
    if priority in PRIORITIES:
        return PRIORITIES.index(priority) + 1
    number = _number(priority)
    if number is None or not math.isfinite(number):
        raise _bad(task_name, PRIORITY_LABEL, priority, PRIORITY_EXPECTED)
    return 1 if number > 0 else 2 if number == 0 else 3


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _bad(task_name: str, label: str, value: Any, expected: str) -> EnqueueError:
    return EnqueueError(f"task {task_name!r}: label {label}={value!r} must be {expected}")


def tether_id(queue: str, taskiq_id: str) -> str:
    """The Tether task id of a delayed or deduplicated message: unique per kick (a retry
    that taskiq kicks again with the same task id must not take the first one's index
    entry), with taskiq's id inside so a duplicate can name the task holding its key."""
    return f"{queue}:{taskiq_id}.{secrets.token_hex(4)}"


def taskiq_id_of(queue: str, task_id: str) -> str:
    """The taskiq task id inside a Tether id made by :func:`tether_id`."""
    return task_id.removeprefix(queue + ":").rpartition(".")[0] or task_id


def wrap(
    serializer: Serializer,
    *,
    task_name: str,
    taskiq_id: str,
    message: bytes,
    now_ms: int,
    task_id: str = "",
    kick: Kick | None = None,
) -> bytes:
    """The stream payload of one taskiq message."""
    carried: dict[str, str] = {"id": taskiq_id}
    try:
        carried["message"] = message.decode("utf-8")
    except UnicodeDecodeError:
        carried["message_b64"] = base64.b64encode(message).decode("ascii")
    envelope: dict[str, Any] = {"v": ENVELOPE_VERSION, "task": task_name, "args": []}
    if task_id:
        envelope["id"] = task_id
    if kick is not None and kick.dedup_key is not None:
        opts: dict[str, Any] = {"key": kick.dedup_key}
        if kick.dedup_ttl is not None:
            opts["key_ttl"] = kick.dedup_ttl
        envelope["opts"] = opts
    envelope["enq"] = now_ms
    if kick is not None and kick.delay_ms is not None:
        envelope["due"] = now_ms + kick.delay_ms
    envelope[TASKIQ_FIELD] = carried
    return serializer.dumps(envelope)


class NotTaskiq(TetherError):
    """An envelope that carries no usable taskiq message; the text is the reason."""


def unwrap(env: Envelope) -> tuple[bytes, str]:
    """taskiq's bytes and task id from a decoded envelope, or :class:`NotTaskiq`."""
    carried = (env.extra or {}).get(TASKIQ_FIELD)
    if not isinstance(carried, dict):
        raise NotTaskiq(
            f"the envelope carries no {TASKIQ_FIELD!r} object: it is not a taskiq message "
            "(was a Tether task enqueued into the broker's queue?)"
        )
    taskiq_id = carried.get("id")
    if not isinstance(taskiq_id, str):
        raise NotTaskiq(f"the {TASKIQ_FIELD!r} object has no text 'id'")
    text = carried.get("message")
    if isinstance(text, str):
        return text.encode("utf-8"), taskiq_id
    encoded = carried.get("message_b64")
    if isinstance(encoded, str):
        try:
            return base64.b64decode(encoded, validate=True), taskiq_id
        except (binascii.Error, ValueError) as exc:
            raise NotTaskiq(f"its 'message_b64' is not base64 ({exc})") from None
    raise NotTaskiq(f"the {TASKIQ_FIELD!r} object has neither 'message' nor 'message_b64'")
