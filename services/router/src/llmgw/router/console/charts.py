"""Charts drawn on the server as inline SVG, pure: series of (x, y) points in, an SVG string out.

No script and no chart library: the page carries the picture itself, so it shows with
JavaScript off. Every text that comes from data (a series' label, a tick's words, the title) is
escaped; the chart says what it is in a <title> (and is an image to a screen reader).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape
from typing import NamedTuple

from markupsafe import Markup

__all__ = ["PALETTE", "Chart", "Series", "line_chart", "nice_ceiling", "x_ticks", "y_ticks"]

PALETTE = ("#0a58ca", "#b3261e", "#116329", "#7a4d00", "#6f42c1", "#0f6674", "#a4286a", "#57606a")
"""Series colours, in turn (each dark enough to read on the page's light panel)."""

_LEFT, _RIGHT, _TOP, _BOTTOM, _LEGEND_ROW = 64, 16, 16, 28, 18


class Series(NamedTuple):
    """One line: what it is called and its points (x, y), in x order."""

    label: str
    points: Sequence[tuple[float, float]]


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value` (1 for nothing above 0)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value * (1 - 1e-9))


def y_ticks(high: float, whole: bool) -> list[float]:
    """Ticks from 0 up to a round number at or above `high`, in at most 5 equal round steps
    (steps of at least 1 where the values are whole numbers)."""
    step = nice_ceiling(high / 5)
    step = max(step, 1.0) if whole else step
    return [i * step for i in range(max(1, math.ceil(high / step - 1e-9)) + 1)]


def x_ticks(xs: Sequence[float], most: int = 7) -> list[float]:
    """At most `most` of the points' x values, evenly picked from the first on."""
    seen = sorted(set(xs))
    return seen[:: max(1, math.ceil(len(seen) / most))]


def _text(x: float, y: float, words: str, anchor: str = "middle") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">{escape(words)}</text>'


class Chart(NamedTuple):
    """What a chart is, apart from its data: its id and title, how its ticks are written, what it
    says when it has nothing to show, its size."""

    id: str
    title: str
    x_text: Callable[[float], str]
    y_text: Callable[[float], str]
    empty: str
    width: int = 720
    height: int = 240


def line_chart(chart: Chart, series: Sequence[Series]) -> Markup:
    """An SVG line chart of `series`: x ticks labelled by `chart.x_text`, y ticks (from 0 up to a
    round number) by `chart.y_text`, each point a dot whose tooltip says its series, x and y, a
    legend below; `chart.empty` written across it where no series has a point."""
    width, height, x_text, y_text = chart.width, chart.height, chart.x_text, chart.y_text
    drawn = [s for s in series if s.points]
    rows = math.ceil(len(drawn) / 4)
    full_height = height + rows * _LEGEND_ROW
    title_id = escape(f"{chart.id}-title")
    parts = [
        f'<svg class="chart" id="{escape(chart.id)}" role="img" aria-labelledby="{title_id}" '
        f'viewBox="0 0 {width} {full_height}" width="{width}" height="{full_height}" '
        f'xmlns="http://www.w3.org/2000/svg">',
        f'<title id="{title_id}">{escape(chart.title)}</title>',
    ]
    if not drawn:
        parts.append(_text(width / 2, height / 2, chart.empty))
        parts.append("</svg>")
        return Markup("".join(parts))
    xs = [x for s in drawn for x, _ in s.points]
    x_low, x_high = min(xs), max(xs)
    ys = [y for s in drawn for _, y in s.points]
    y_marks = y_ticks(max(ys), all(float(y).is_integer() for y in ys))
    y_high = y_marks[-1]
    plot_w, plot_h = width - _LEFT - _RIGHT, height - _TOP - _BOTTOM

    def at(x: float, y: float) -> tuple[float, float]:
        across = 0.5 if x_high == x_low else (x - x_low) / (x_high - x_low)
        return _LEFT + across * plot_w, _TOP + plot_h - (y / y_high) * plot_h

    parts.append('<g class="axes" stroke="#d0d7de">')
    for y in y_marks:
        _, py = at(x_low, y)
        parts.append(f'<line x1="{_LEFT}" y1="{py:.1f}" x2="{width - _RIGHT}" y2="{py:.1f}"/>')
    parts.append("</g>")
    for y in y_marks:
        parts.append(_text(_LEFT - 6, at(x_low, y)[1] + 4, y_text(y), "end"))
    for x in x_ticks(xs):
        parts.append(_text(at(x, 0)[0], height - 8, x_text(x)))
    for i, s in enumerate(drawn):
        colour = PALETTE[i % len(PALETTE)]
        placed = [at(x, y) for x, y in s.points]
        if len(placed) > 1:
            line = " ".join(f"{px:.1f},{py:.1f}" for px, py in placed)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{line}"/>')
        for (x, y), (px, py) in zip(s.points, placed, strict=True):
            tip = escape(f"{s.label}: {x_text(x)}: {y_text(y)}")
            parts.append(
                f'<circle class="point" cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{colour}" '
                f'data-series="{escape(s.label)}" data-x="{x:.15g}" data-y="{y:.15g}"><title>{tip}</title></circle>'
            )
        lx, ly = _LEFT + (i % 4) * (plot_w / 4), height + (i // 4) * _LEGEND_ROW + 10
        parts.append(f'<rect x="{lx:.1f}" y="{ly - 8:.1f}" width="10" height="10" fill="{colour}"/>')
        parts.append(_text(lx + 14, ly + 1, s.label, "start"))
    parts.append("</svg>")
    return Markup("".join(parts))
