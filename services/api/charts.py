"""The dashboard's pictures, as geometry for server-drawn SVG: pure functions, no I/O.

A chart is columns over time buckets (side by side or stacked) or a histogram; the template
(`_charts.html`) draws its rectangles in a `viewBox` of `WIDTH` by `HEIGHT`, so no style is
computed in the browser (the Content-Security-Policy allows no inline style anyway).
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

WIDTH: Final = 600
HEIGHT: Final = 120
#: Columns at most: a longer span is cut into wider buckets.
MAX_BUCKETS: Final = 60
#: Bins of a histogram.
BINS: Final = 20


@dataclass(frozen=True)
class Rect:
    """One drawn rectangle: where, which series (its colour), and what hovering it says."""

    x: float
    y: float
    width: float
    height: float
    series: str
    title: str


@dataclass(frozen=True)
class Chart:
    """A picture and its legend: `top` is the value at the top of the drawing."""

    id: str
    title: str
    rects: list[Rect]
    series: list[str]
    top: int
    left_label: str
    right_label: str
    #: The sum of everything drawn (a histogram: how many runs).
    total: int = 0

    @property
    def empty(self) -> bool:
        return not self.rects


def buckets(start: datetime, end: datetime) -> tuple[list[datetime], timedelta]:
    """Minute-aligned buckets from `start` to `end` (at most `MAX_BUCKETS`, each a whole number
    of minutes): their starts and their width."""
    first = start.replace(second=0, microsecond=0)
    minutes = max(1, math.ceil((end - first).total_seconds() / 60))
    width = timedelta(minutes=math.ceil(minutes / MAX_BUCKETS))
    count = math.ceil(minutes / (width.total_seconds() / 60))
    return [first + i * width for i in range(count)], width


def binned(
    rows: Sequence[tuple[datetime, str, int]],
    starts: list[datetime],
    width: timedelta,
    series: Mapping[str, Sequence[str]],
) -> dict[str, list[int]]:
    """Per series, the sum over each bucket of the rows whose kind is one of the series'."""
    of_kind = {kind: name for name, kinds in series.items() for kind in kinds}
    values = {name: [0] * len(starts) for name in series}
    if not starts:
        return values
    for minute, kind, n in rows:
        name = of_kind.get(kind)
        i = int((minute - starts[0]) / width)
        if name is not None and 0 <= i < len(starts):
            values[name][i] += n
    return values


def columns(
    chart_id: str,
    title: str,
    starts: list[datetime],
    values: dict[str, list[int]],
    *,
    stacked: bool,
) -> Chart:
    """Columns per bucket: the series side by side, or stacked (parts of one whole)."""
    names = list(values)
    totals = [
        sum(v[i] for v in values.values())
        if stacked
        else max((v[i] for v in values.values()), default=0)
        for i in range(len(starts))
    ]
    top = max(totals, default=0)
    rects: list[Rect] = []
    if top and starts:
        slot = WIDTH / len(starts)
        for i, start in enumerate(starts):
            base = 0.0
            for k, name in enumerate(names):
                n = values[name][i]
                if not n:
                    continue
                h = HEIGHT * n / top
                if stacked:
                    x, w, y = i * slot + 0.1 * slot, 0.8 * slot, HEIGHT - base - h
                    base += h
                else:
                    w = 0.8 * slot / len(names)
                    x, y = i * slot + 0.1 * slot + k * w, HEIGHT - h
                label = f"{start:%H:%M}: {n} {name}"
                rects.append(Rect(round(x, 2), round(y, 2), round(w, 2), round(h, 2), name, label))
    left = f"{starts[0]:%H:%M}" if starts else ""
    right = f"{starts[-1]:%H:%M}" if starts else ""
    total = sum(sum(v) for v in values.values())
    return Chart(chart_id, title, rects, names, top, left, right, total)


def histogram(chart_id: str, title: str, seconds: Sequence[float]) -> Chart:
    """How many runs took how long: `BINS` equal bins from 0 to the longest."""
    if not seconds:
        return Chart(chart_id, title, [], ["runs"], 0, "", "")
    longest = max(max(seconds), 1e-3)
    counts = [0] * BINS
    for s in seconds:
        counts[min(BINS - 1, int(BINS * max(s, 0.0) / longest))] += 1
    top = max(counts)
    slot = WIDTH / BINS
    rects = []
    for i, n in enumerate(counts):
        if n:
            h = HEIGHT * n / top
            lo, hi = longest * i / BINS, longest * (i + 1) / BINS
            label = f"{n} runs of {duration(lo)} to {duration(hi)}"
            rects.append(
                Rect(
                    round(i * slot + 1, 2),
                    round(HEIGHT - h, 2),
                    round(slot - 2, 2),
                    round(h, 2),
                    "runs",
                    label,
                )
            )
    return Chart(chart_id, title, rects, ["runs"], top, "0 s", duration(longest), len(seconds))


def duration(seconds: float) -> str:
    """A short human duration: 850 ms, 12.5 s, 3.2 min, 1.5 h."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.3g} min"
    return f"{seconds / 3600:.3g} h"
