"""Horizontal bar charts as plain SVG, for the charts every build draws (stage timeline,
INT8 sensitivity): no plotting library to import, so a cached rebuild writes its report page in
milliseconds. Each bar is ``<g id="GID"><rect/></g>`` so tests and scripts can find it."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass

FONT = "font-family:sans-serif"
ROW = 24  # px per bar
LABEL_WIDTH = 120  # px for the row labels on the left, at least (wider for longer labels)
LABEL_SIZE = 11  # px, the row labels' font size
EM_PER_CHAR = 0.64  # a sans-serif character's width at most on average (DejaVu Sans: ~0.6)
TITLE = 26  # px above the bars
AXIS = 30  # px below the bars (axis label)
TEXT = "#1d2a33"
MUTED = "#5c6b75"
GRID = "#e3e8ec"


@dataclass(frozen=True)
class Bar:
    value: float
    text: str  # written at the bar's end
    color: str
    gid: str


@dataclass(frozen=True)
class Panel:
    title: str
    axis_label: str
    bars: Sequence[Bar]  # one per row, top to bottom
    width: int = 380
    log_scale: bool = False


def _scale(panel: Panel) -> tuple[float, float]:
    """(low, high) of the value axis."""
    values = [b.value for b in panel.bars if b.value > 0]
    if panel.log_scale:
        low = 10 ** math.floor(math.log10(min(values)) - 1e-9) if values else 1e-3
        high = 10 ** math.ceil(math.log10(max(values))) if values else 1.0
        return low, max(high, low * 10)
    return 0.0, max(values, default=1.0) * 1.22  # room for the value text


def _x(value: float, panel: Panel, low: float, high: float, span: float) -> float:
    if panel.log_scale:
        value = max(value, low)
        return span * (math.log10(value) - math.log10(low)) / (math.log10(high) - math.log10(low))
    return span * (value - low) / (high - low)


def _panel_svg(panel: Panel, left: float) -> list[str]:
    low, high = _scale(panel)
    span = panel.width - 60  # room for the value text past the longest bar
    parts = [f'<text x="{left}" y="16" style="{FONT};font-size:13px" fill="{TEXT}">'
             f"{html.escape(panel.title)}</text>"]
    ticks = ([low * 10 ** k for k in range(round(math.log10(high / low)) + 1)]
             if panel.log_scale else [high / 1.22 * f for f in (0.0, 0.5, 1.0)])
    bottom = TITLE + ROW * len(panel.bars)
    for tick in ticks:
        x = left + _x(tick, panel, low, high, span)
        parts.append(f'<line x1="{x:.1f}" y1="{TITLE}" x2="{x:.1f}" y2="{bottom}" '
                     f'stroke="{GRID}"/>')
        parts.append(f'<text x="{x:.1f}" y="{bottom + 13}" text-anchor="middle" '
                     f'style="{FONT};font-size:10px" fill="{MUTED}">{tick:.3g}</text>')
    for i, bar in enumerate(panel.bars):
        y = TITLE + ROW * i + 4
        width = max(_x(bar.value, panel, low, high, span), 0.5)
        parts.append(f'<g id="{html.escape(bar.gid)}"><rect x="{left}" y="{y}" '
                     f'width="{width:.1f}" height="{ROW - 8}" fill="{bar.color}"/></g>')
        parts.append(f'<text x="{left + width + 4:.1f}" y="{y + ROW / 2}" '
                     f'style="{FONT};font-size:10px" fill="{TEXT}">'
                     f"{html.escape(bar.text)}</text>")
    parts.append(f'<text x="{left}" y="{bottom + 27}" style="{FONT};font-size:11px" '
                 f'fill="{TEXT}">{html.escape(panel.axis_label)}</text>')
    return parts


def text_width(text: str, size: float) -> float:
    """How wide ``text`` is drawn at ``size`` px, at most (an estimate: no fonts are read;
    the report page's Chromium test measures the real boxes)."""
    return len(text) * size * EM_PER_CHAR


def hbar_chart(labels: Sequence[str], panels: Sequence[Panel],
               legend: Sequence[tuple[str, str]] = ()) -> str:
    """An ``<svg>`` with one row per label and one panel of bars per ``panels`` side by
    side; ``legend`` is (color, text) pairs under the chart. The label column is as wide as
    the longest label, so no label is cut at the chart's left edge."""
    rows = len(labels)
    label_width = max(LABEL_WIDTH, round(max((text_width(t, LABEL_SIZE) for t in labels),
                                             default=0.0)) + 16)
    legend_width = sum(24 + text_width(text, 11) for _, text in legend)
    width = label_width + max(sum(p.width + 20 for p in panels), round(legend_width))
    height = TITLE + ROW * rows + AXIS + (22 if legend else 6)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}">']
    for i, label in enumerate(labels):
        y = TITLE + ROW * i + ROW / 2 + 4
        parts.append(f'<text x="{label_width - 8}" y="{y}" text-anchor="end" '
                     f'style="{FONT};font-size:{LABEL_SIZE}px" fill="{TEXT}">'
                     f"{html.escape(label)}</text>")
    left = float(label_width)
    for panel in panels:
        parts += _panel_svg(panel, left)
        left += panel.width + 20
    x = float(label_width)
    for color, text in legend:
        y = height - 10
        parts.append(f'<rect x="{x}" y="{y - 9}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{x + 14}" y="{y}" style="{FONT};font-size:11px" '
                     f'fill="{TEXT}">{html.escape(text)}</text>')
        x += 24 + text_width(text, 11)
    parts.append("</svg>")
    return "".join(parts)
