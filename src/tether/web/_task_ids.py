"""The one rule for task ids the web API and the pages apply, and its one message.

A task id is its queue, a colon, and the id proper in one of the forms Tether writes: a
plain enqueue's stream and entry id, 32 hex digits, or a taskiq id with the 8 hex digits
Tether adds to it. Anything else is malformed (422) before any lookup, so a mistyped or
cut-short id is never answered "unknown" (404) as if it could have existed. The protocol's
own check (:func:`tether.protocol._keys.queue_of_task_id`) is looser: it only keeps what
is no queue name out of the keys."""

from __future__ import annotations

import re

from ..base._errors import ConfigError
from ..protocol._keys import clipped

_QUEUE = r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}"
_TASK_ID = re.compile(
    rf"{_QUEUE}:(?:[123]-\d{{1,20}}-\d{{1,20}}|[0-9a-f]{{32}}|[!-9;-~]{{1,180}}\.[0-9a-f]{{8}})"
)
"""The forms: ``default:2-1732870000000-0``, ``default:<32 hex>``, ``default:<taskiq id>.<8
hex>`` (the taskiq id in printable ASCII without a colon)."""

FORMS = (
    "a task id is its queue, a colon and the id proper: a plain enqueue's stream and entry "
    "id (default:2-1732870000000-0), 32 hex digits (default:9f2c4e0b1a2d3c4b5a69788776655443) "
    "or a taskiq id with the 8 hex digits Tether adds (default:<taskiq id>.1a2b3c4d)"
)
CUT = ("\u2026", "...")
"""What a shortened id shows where it was cut."""


def task_id_problem(value: str) -> str | None:
    """Why ``value`` is no task id (None when it is one), in the one message."""
    if _TASK_ID.fullmatch(value):
        return None
    if any(mark in value for mark in CUT):
        return f"{clipped(value)} is cut short: copy the whole task id ({FORMS})"
    return f"{clipped(value)} is not a task id: {FORMS}"


def check_task_id(value: str) -> str:
    """``value``, or :class:`ConfigError` (422) with the message."""
    problem = task_id_problem(value)
    if problem is not None:
        raise ConfigError(problem)
    return value
