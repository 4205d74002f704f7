"""Small charts as inline SVG, drawn on the server: no script, no library, no request of
their own, and they show without JavaScript.

Each bar series is one ``<path>`` of vertical strokes (one per minute), so a chart of an
hour costs about half a kilobyte however busy the queue was: the overview redraws one
pair per queue at every live refresh. Colours come from the stylesheet (classes), so the
charts follow the light and dark themes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape

from ...admin import MinuteCounts
from .._format import count, percent


@dataclass(frozen=True)
class Size:
    width: int = 120
    height: int = 28


SMALL = Size()
LARGE = Size(480, 72)


UNIT = 10
"""Drawing units per pixel: whole numbers in the path data keep it short and quick to write."""


def _y(share: float, size: Size) -> int:
    """The top of a bar holding ``share`` (0 to 1) of the chart's height (1 px floor)."""
    return round((size.height - 0.5 - share * (size.height - 2)) * UNIT)


def _bars(tops: Sequence[tuple[int, float, float]], size: Size, slots: int) -> str:
    """Path data: for each (slot, bottom share, top share), a vertical stroke."""
    slot = size.width * UNIT / max(1, slots)
    return "".join(
        f"M{round(i * slot + slot / 2)} {_y(low, size)}V{_y(high, size)}"
        for i, low, high in tops
        if high > low
    )


def _svg(kind: str, size: Size, label: str, paths: Sequence[tuple[str, str]]) -> Markup:
    body = "".join(f'<path class="{cls}" d="{d}"/>' for cls, d in paths if d)
    large = " chart-large" if size != SMALL else ""
    width, height = size.width * UNIT, size.height * UNIT
    return Markup(
        f'<svg class="chart chart-{kind}{large}" viewBox="0 0 {width} {height}" '
        f'width="{size.width}" height="{size.height}" role="img" aria-label="{escape(label)}">'
        f"<title>{escape(label)}</title>"
        f'<path class="chart-axis" d="M0 {height - UNIT // 2}H{width}"/>{body}</svg>'
    )


Counted = tuple[tuple[int, int], ...]
"""(attempts, errors) of each minute."""


def _counts(minutes: Sequence[MinuteCounts]) -> Counted:
    """(attempts, errors) of each minute, each summed once: a refresh draws 100 charts."""
    out = []
    for m in minutes:
        c = m.counts
        errors = c.failed + c.retried + c.dead
        out.append((c.succeeded + c.cancelled + errors, errors))
    return tuple(out)


def throughput(minutes: Sequence[MinuteCounts], size: Size = SMALL) -> Markup:
    """Attempts that ended per minute, the errors stacked on the successes."""
    return _throughput(_counts(minutes), size)


def failures(minutes: Sequence[MinuteCounts], size: Size = SMALL) -> Markup:
    """The share of each minute's attempts that raised (the full height is 100%)."""
    return _failures(_counts(minutes), size)


# The same counts draw the same chart: between two reads of a series (every ten seconds,
# see tether.web._series) the overview's refreshes redraw nothing.
@functools.lru_cache(maxsize=512)
def _throughput(counted: Counted, size: Size) -> Markup:
    peak = max((a for a, _ in counted), default=0)
    total = sum(a for a, _ in counted)
    n = len(counted)
    label = (
        f"Attempts per minute, last {n} min: {count(total)} in all, peak {count(peak)}/min"
        if total
        else f"No attempts in the last {n} min"
    )
    ok = [(i, 0.0, (a - e) / peak) for i, (a, e) in enumerate(counted) if a]
    bad = [(i, (a - e) / peak, a / peak) for i, (a, e) in enumerate(counted) if e]
    return _svg(
        "throughput",
        size,
        label,
        [("chart-ok", _bars(ok, size, n)), ("chart-err", _bars(bad, size, n))],
    )


@functools.lru_cache(maxsize=512)
def _failures(counted: Counted, size: Size) -> Markup:
    n = len(counted)
    total = sum(a for a, _ in counted)
    errors = sum(e for _, e in counted)
    shares = [(i, e / a) for i, (a, e) in enumerate(counted) if a]
    worst = max((s for _, s in shares), default=0.0)
    label = (
        f"Failure rate per minute, last {n} min: {percent(errors / total)} "
        f"overall, worst minute {percent(worst)}"
        if total
        else f"No attempts in the last {n} min"
    )
    # A minute with any failure shows, however small its share: the eye looks for them.
    bars = [(i, 0.0, max(share, 0.04)) for i, share in shares if share]
    return _svg("failures", size, label, [("chart-err", _bars(bars, size, n))])


def failure_share(minutes: Sequence[MinuteCounts]) -> float | None:
    """Errors over attempts across the series; None without attempts."""
    attempts = sum(m.counts.attempts for m in minutes)
    return sum(m.counts.errors for m in minutes) / attempts if attempts else None
