"""Line charts as geometry for inline SVG, computed on the server.

No chart library and no script: Python places every point, the template draws
``<polyline>``/``<circle>`` elements, and hover text is an SVG ``<title>`` (escaped
by the template like any other text).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 12, 28  # plot margins for the axis labels
Y_TICKS = 4
X_TICKS = 6


@dataclass(frozen=True)
class Series:
    """Input: one named line; ``None`` values leave a gap."""

    name: str
    css: str
    values: Sequence[float | None]
    labels: Sequence[str]  # hover text per point
    point_css: Sequence[str] | None = None  # a class per point (e.g. the outcome)


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    label: str
    css: str


@dataclass(frozen=True)
class Line:
    name: str
    css: str
    segments: list[str]  # ``points`` attributes of polylines (gaps split them)
    points: list[Point]


@dataclass(frozen=True)
class Tick:
    pos: float
    label: str


@dataclass(frozen=True)
class Chart:
    title: str
    width: int
    height: int
    plot_left: int
    plot_right: int
    plot_top: int
    plot_bottom: int
    lines: list[Line]
    y_ticks: list[Tick]
    x_ticks: list[Tick]

    @property
    def empty(self) -> bool:
        return not any(line.points for line in self.lines)


def nice_ceiling(value: float) -> float:
    """The smallest 1, 2 or 5 × 10^k at or above ``value`` (a readable axis top)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if value <= step * power:
            return float(step * power)
    return float(10 * power)


def line_chart(
    title: str,
    series: Sequence[Series],
    x_labels: Sequence[str],
    y_format: Callable[[float], str] = lambda v: f"{v:g}",
    y_max: float | None = None,
) -> Chart:
    """Place the series on a shared y axis from 0 (x: one slot per label, left to right)."""
    count = len(x_labels)
    highest = max((v for s in series for v in s.values if v is not None), default=0.0)
    top = y_max if y_max is not None else nice_ceiling(highest)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_at(i: int) -> float:
        return LEFT + (plot_w / 2 if count <= 1 else plot_w * i / (count - 1))

    def y_at(v: float) -> float:
        return TOP + plot_h * (1 - min(max(v / top, 0.0), 1.0))

    lines = []
    for s in series:
        points: list[Point] = []
        segments: list[str] = []
        current: list[str] = []
        for i, value in enumerate(s.values):
            if value is None:
                if current:
                    segments.append(" ".join(current))
                current = []
                continue
            x, y = round(x_at(i), 1), round(y_at(value), 1)
            current.append(f"{x},{y}")
            css = s.point_css[i] if s.point_css is not None else s.css
            points.append(Point(x, y, s.labels[i] if i < len(s.labels) else "", css))
        if current:
            segments.append(" ".join(current))
        lines.append(Line(s.name, s.css, segments, points))
    y_ticks = [
        Tick(round(y_at(top * k / Y_TICKS), 1), y_format(top * k / Y_TICKS))
        for k in range(Y_TICKS + 1)
    ]
    step = max(1, math.ceil(count / X_TICKS))
    x_ticks = [Tick(round(x_at(i), 1), x_labels[i]) for i in range(0, count, step)]
    return Chart(
        title=title,
        width=WIDTH,
        height=HEIGHT,
        plot_left=LEFT,
        plot_right=WIDTH - RIGHT,
        plot_top=TOP,
        plot_bottom=HEIGHT - BOTTOM,
        lines=lines,
        y_ticks=y_ticks,
        x_ticks=x_ticks,
    )
