"""Records in Redis that the readers cannot parse: skipped and reported, never a crash.

What the readers parse comes from Redis, where anything may have written it: another
program, a release of Tether before or after this one, a person at ``redis-cli``. One such
record must not take down every page, the metrics and ``tether info`` that read it (a
worker-registry record with a time in words answered 500 everywhere and set ``tether_up 0``).
So a reader parses each record with :func:`parsed`: a record that does not parse is left
out of what the reader returns (or, where the record itself must stay listed, such as a dead
letter that can still be purged, the field shows as unreadable), logged once (per kind and
key, on the ``tether.admin`` logger, the readers' logger since this began there) and counted
in ``tether_unreadable_records_total{kind}`` at every reading.

It sits at the root of the package, beside the keys, because readers at every level use it:
the admin readers, and below them the schedules, dead letters, limits and task status,
which :mod:`tether.admin` imports (it could not import them back).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("tether.admin")

KINDS: tuple[str, ...] = (
    "worker", "statistics", "queue", "delayed", "task", "schedule", "dead", "limit",
)  # fmt: skip
"""What a skipped record was: the values of the metric's ``kind`` label."""

REMEMBERED = 10_000
"""Records remembered as logged already: past that the memory starts over (and a record
still there is logged again), so forged keys cannot grow it for good."""

_lock = threading.Lock()
_counts: Counter[str] = Counter()
_logged: set[tuple[str, str]] = set()


def skip(kind: str, where: str, problem: object) -> None:
    """Report a record of ``kind`` at ``where`` (its key, and field or member) that cannot
    be read: counted each time, logged the first time."""
    with _lock:
        _counts[kind] += 1
        first = (kind, where) not in _logged
        if first:
            if len(_logged) >= REMEMBERED:
                _logged.clear()
            _logged.add((kind, where))
    if first:
        reason = f"{type(problem).__name__}: {problem}" if isinstance(problem, BaseException) \
            else str(problem)  # fmt: skip
        log.warning("skipped an unreadable %s record at %s (%s)", kind, where, reason[:300])


def parsed(kind: str, where: str, parse: Callable[[], T]) -> T | None:
    """``parse()``, or None when it raises (reported with :func:`skip`). Any exception: the
    record may hold anything (RecursionError for JSON nested too deep, OverflowError for a
    time past the year 9999), and parsing reads nothing from the network."""
    try:
        return parse()
    except Exception as exc:
        skip(kind, where, exc)
        return None


def text_or_none(kind: str, where: str, raw: Any) -> str | None:
    """A name read from Redis as text; None (reported) when it is not UTF-8."""
    if not isinstance(raw, bytes):
        return str(raw)
    return parsed(kind, f"{where} {raw[:100]!r}", raw.decode)


def finite(kind: str, where: str, value: float) -> float | None:
    """A score or time that can be shown: None (reported) for infinities and NaN."""
    if math.isfinite(value):
        return value
    skip(kind, where, f"{value} is not a finite number")
    return None


def counts() -> dict[str, int]:
    """Records skipped by this process's readers so far, by kind (every kind present)."""
    with _lock:
        return {kind: _counts[kind] for kind in KINDS}
