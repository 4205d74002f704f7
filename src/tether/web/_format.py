"""Numbers and times for people: ``1.2k``, ``1.2k/s``, ``340 ms``, ``3 min ago``.

Pure functions, registered as Jinja filters by :mod:`tether.web._templates`. Each takes
None (a figure the server could not give) and shows a dash for it, so a template never
needs a guard around a missing value.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone
from typing import Any

from markupsafe import Markup, escape

DASH = "\u2013"  # an en dash


def count(n: float | None) -> str:
    """``999``, ``1.2k``, ``12k``, ``1.2M``: three significant figures at most."""
    if n is None:
        return DASH
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1000:
        return f"{sign}{n:.0f}" if n == int(n) or n >= 10 else f"{sign}{n:.1f}"
    for unit, size in (("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12)):
        scaled = n / size
        if scaled < 999.5 or unit == "T":
            text = f"{scaled:.1f}" if scaled < 9.95 else f"{scaled:.0f}"
            return f"{sign}{text.removesuffix('.0')}{unit}"
    raise AssertionError("unreachable")  # pragma: no cover


def rate(per_second: float | None) -> str:
    """A rate in the unit that gives a readable number: ``1.2k/s``, ``12/min``, ``3/h``,
    ``2/d``."""
    if per_second is None:
        return DASH
    if per_second <= 0:
        return "0/s"
    if per_second >= 1:
        return f"{count(per_second)}/s"
    if per_second * 60 >= 1:
        return f"{count(per_second * 60)}/min"
    if per_second * 3600 >= 0.1:  # one an hour over a window a little longer: "1.0/h"
        return f"{count(per_second * 3600)}/h"
    return f"{count(per_second * 86400)}/d"


def duration(seconds: float | None) -> str:
    """``4.2 ms``, ``340 ms``, ``3.4 s``, ``42 s``, ``1 min 13 s``, ``2 h 5 min``, ``3 d 4 h``:
    past a minute, two units: the larger, and what is left of it in the next one down."""
    if seconds is None or math.isnan(seconds):
        return DASH
    if seconds < 0:
        return "-" + duration(-seconds)
    if seconds < 0.0005:
        return "0 ms" if seconds == 0 else "<1 ms"
    if seconds < 1:
        ms = seconds * 1000
        return f"{ms:.1f} ms" if ms < 9.95 else f"{ms:.0f} ms"
    if seconds < 59.5:
        return f"{seconds:.1f} s" if seconds < 9.95 else f"{seconds:.0f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def ago(moment: datetime | None, now: datetime | None = None) -> str:
    """``just now``, ``3 s ago``, ``5 min ago``; a future time reads ``in 5 min``."""
    if moment is None:
        return DASH
    now = now or datetime.now(timezone.utc)
    delta = (now - moment).total_seconds()
    if abs(delta) < 1:
        return "just now"
    # Whole seconds: "3 s ago", not "3.4 s ago" (the tooltip has the exact time).
    seconds = int(abs(delta))
    if seconds >= 60:  # a relative time needs no seconds past the first minute
        seconds -= seconds % 60
    text = f"{seconds} s" if seconds < 60 else duration(seconds)
    return f"{text} ago" if delta > 0 else f"in {text}"


def percent(share: float | None) -> str:
    """``0%``, ``<0.1%``, ``3.4%``, ``42%``."""
    if share is None:
        return DASH
    if share <= 0:
        return "0%"
    value = share * 100
    if value < 0.1:
        return "<0.1%"
    return f"{value:.1f}%" if value < 9.95 else f"{value:.0f}%"


def utc(moment: datetime | None) -> str:
    """The exact time, for a tooltip: ``2024-05-01 12:03:04 UTC``."""
    if moment is None:
        return DASH
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


MAX_DEPTH = 64
"""Levels of nesting of a task's arguments, result or error that the API and the pages show.
A producer can write values nested about 1,000 deep (Python's recursion limit) and a
producer other than Tether deeper still, but pydantic refuses to serialize past 255 levels
and the json module's indenting encoder recurses in Python: the levels past this one are
replaced by :data:`TOO_DEEP`, so any payload renders."""

TOO_DEEP = f"... (nested deeper than {MAX_DEPTH} levels)"


def shallow(value: Any, depth: int = MAX_DEPTH) -> Any:
    """``value`` with the lists and objects nested more than ``depth`` levels below it
    replaced by :data:`TOO_DEEP` (tuples as lists, as JSON has them). Recurses at most
    ``depth`` levels itself."""
    if isinstance(value, (list, tuple)):
        if depth <= 0 and value:
            return TOO_DEEP
        return [shallow(v, depth - 1) for v in value]
    if isinstance(value, dict):
        if depth <= 0 and value:
            return TOO_DEEP
        return {k: shallow(v, depth - 1) for k, v in value.items()}
    return value


def pretty(value: Any) -> str:
    """A value as indented JSON (arguments, results), its deepest levels cut off (see
    :func:`shallow`); its ``repr`` when JSON cannot say it."""
    value = shallow(value)
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def pretty_text(text: str) -> str:
    """A payload shown as indented JSON when it is JSON, else as it is (also when it nests
    too deep for the parser: RecursionError)."""
    try:
        return pretty(json.loads(text))
    except (ValueError, RecursionError):
        return text


_NAME_BREAKS = re.compile(r"([._:/-])")


def breakable(name: str) -> Markup:
    """A task name that wraps only after its separators (``billing.<wbr>send_<wbr>invoice``)
    when its cell is narrow, never in the middle of a word."""
    return Markup(_NAME_BREAKS.sub(r"\1<wbr>", str(escape(name))))


FILTERS = {
    "count": count,
    "rate": rate,
    "duration": duration,
    "ago": ago,
    "percent": percent,
    "utc": utc,
    "pretty": pretty,
    "pretty_text": pretty_text,
    "breakable": breakable,
}
