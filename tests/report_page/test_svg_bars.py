"""The plain-SVG bar charts of the report page: well-formed SVG, bars sized by value (linear
and log scale), every bar findable by its id."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from trtpack.report_page.svg_bars import Bar, Panel, hbar_chart

NS = "{http://www.w3.org/2000/svg}"


def bar_widths(svg: str) -> dict[str, float]:
    root = ET.fromstring(svg)
    return {g.get("id", ""): float(g.find(f"{NS}rect").get("width"))  # type: ignore[union-attr]
            for g in root.iter(f"{NS}g")}


def test_bars_are_proportional_to_their_values() -> None:
    bars = [Bar(10.0, "10 s", "#2a9d8f", "bar-a"), Bar(2.5, "2.5 s", "#2a9d8f", "bar-b"),
            Bar(5.0, "5 s", "#e76f51", "bar-c")]
    svg = hbar_chart(["a", "b <c>"], [Panel("time", "seconds", bars)])
    widths = bar_widths(svg)
    assert set(widths) == {"bar-a", "bar-b", "bar-c"}
    assert abs(widths["bar-a"] / widths["bar-b"] - 4.0) < 0.01
    assert abs(widths["bar-a"] / widths["bar-c"] - 2.0) < 0.01
    assert "b &lt;c&gt;" in svg and "10 s" in svg


def test_log_scale_gives_each_decade_the_same_length() -> None:
    bars = [Bar(1e-4, "", "#000", "bar-0"), Bar(1e-3, "", "#000", "bar-1"),
            Bar(1e-2, "", "#000", "bar-2")]
    svg = hbar_chart(["x", "y", "z"], [Panel("damage", "log", bars, log_scale=True)],
                     legend=[("#000", "kept")])
    w = bar_widths(svg)
    assert w["bar-0"] < w["bar-1"] < w["bar-2"]
    assert abs((w["bar-2"] - w["bar-1"]) - (w["bar-1"] - w["bar-0"])) < 0.5
    assert "kept" in svg


def test_panels_side_by_side_share_the_rows() -> None:
    time = Panel("time", "s", [Bar(1.0, "1 s", "#111", "t-0"), Bar(3.0, "3 s", "#111", "t-1")])
    memory = Panel("memory", "MB", [Bar(0.0, "–", "#222", "m-0"),
                                    Bar(700.0, "700 MB", "#222", "m-1")])
    root = ET.fromstring(hbar_chart(["export", "simplify"], [time, memory]))
    rects = {g.get("id"): g.find(f"{NS}rect") for g in root.iter(f"{NS}g")}
    assert rects["t-0"].get("y") == rects["m-0"].get("y")  # type: ignore[union-attr]
    assert float(rects["m-1"].get("x")) > float(rects["t-1"].get("x"))  # type: ignore[union-attr,arg-type]


def test_label_column_is_as_wide_as_the_longest_label() -> None:
    """A long row label (a module path) gets the room it needs left of the bars; the
    Chromium test of the report page measures the drawn boxes."""
    from trtpack.report_page.svg_bars import LABEL_SIZE, LABEL_WIDTH, text_width

    long = "encoder.layer.3.attention.output.dense (MatMul)"
    bars = [Bar(1.0, "1", "#000", "bar-0"), Bar(2.0, "2", "#000", "bar-1")]
    root = ET.fromstring(hbar_chart(["short", long], [Panel("p", "x", bars)]))
    x = float(next(g for g in root.iter(f"{NS}g")).find(f"{NS}rect").get("x"))  # type: ignore[union-attr,arg-type]
    assert x >= text_width(long, LABEL_SIZE) + 8 > LABEL_WIDTH
    short = ET.fromstring(hbar_chart(["a", "b"], [Panel("p", "x", bars)]))
    assert float(next(g for g in short.iter(f"{NS}g")).find(f"{NS}rect").get("x")) \
        == LABEL_WIDTH  # type: ignore[union-attr,arg-type]
