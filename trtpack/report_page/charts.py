"""The charts of ``report.html`` as inline SVG with text kept as text: the build's own charts
(stages, INT8 sensitivity) as plain SVG bars (``svg_bars``: no plotting library, so every build
and rebuild writes its page at once), the benchmark charts by matplotlib (imported here only,
when ``trtpack bench`` draws them). Every chart is an
``<figure class="chart" id="chart-...">``; bars carry ids (``gid``)."""

from __future__ import annotations

import html
import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from trtpack.json_values import JsonValue, json_list, json_number, json_object
from trtpack.report import BenchRow, BuildReport, ServedResult, ServedRow
from trtpack.report_page.svg_bars import Bar, Panel, hbar_chart

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLORS = {"served": "#2a9d8f", "onnx-fp32": "#8ab17d", "cpu-fp32": "#e9c46a", "pytorch": "#e76f51",
          "triton": "#264653", "ok": "#2a9d8f", "skipped": "#bbbbbb", "failed": "#e63946",
          "kept": "#e76f51", "quantized": "#2a9d8f", "memory": "#e9c46a"}


def _figure(width: float, height: float) -> Figure:
    import matplotlib
    from matplotlib.figure import Figure

    matplotlib.rcParams.update({
        "svg.fonttype": "none", "font.family": "sans-serif", "font.size": 10,
        "axes.spines.top": False, "axes.spines.right": False, "axes.edgecolor": "#9aa7b0",
        "axes.labelcolor": "#1d2a33", "xtick.color": "#5c6b75", "ytick.color": "#5c6b75",
        "axes.grid": True, "grid.color": "#e3e8ec", "grid.linewidth": 0.8,
        "axes.axisbelow": True, "svg.hashsalt": "trtpack",
    })
    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Figure, chart_id: str, caption: str) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]  # drop the XML declaration and doctype
    return (f'<figure class="chart" id="{chart_id}">{svg}'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def _figure_html(svg: str, chart_id: str, caption: str) -> str:
    return (f'<figure class="chart" id="{chart_id}">{svg}'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def stage_chart(report: BuildReport) -> str:
    """Time and peak memory per stage (plain SVG: drawn at every build, in milliseconds)."""
    stages = [s for s in report.stages if s.status != "skipped"]
    if not stages:
        return ""
    time = Panel("time per stage", "seconds", [
        Bar(s.seconds, f"{s.seconds:.1f} s", COLORS["ok"] if s.status == "ok"
            else COLORS["failed"], f"bar-stage-{s.name}") for s in stages], width=420)
    memory = Panel("peak memory", "peak memory, MB (process and children)", [
        Bar(s.peak_memory_mb or 0.0, "–" if s.peak_memory_mb is None
            else f"{s.peak_memory_mb:,.0f} MB", COLORS["memory"], f"bar-memory-{s.name}")
        for s in stages], width=300)
    svg = hbar_chart([s.name + (" (cached)" if s.cached else "") for s in stages],
                     [time, memory])
    return _figure_html(svg, "chart-stages", f"Stage timeline: {report.total_seconds:.1f} s "
                        "in all. Cached stages are reused from the stage cache.")


def _group_label(row: Mapping[str, JsonValue], where: str, limit: int = 60) -> str:
    """A sensitivity row's name: its first layer's module path (and how many more), else its
    hint or first node; at most ``limit`` characters, a cut marked with an ellipsis."""
    layers = [str(x) for x in json_list(row.get("layers"), f"{where}.layers")]
    nodes = json_list(row.get("nodes"), f"{where}.nodes")
    label = (layers[0] + (f" and {len(layers) - 1} more" if len(layers) > 1 else "")
             if layers else str(row.get("hint") or (nodes[0] if nodes else "?")))
    return label if len(label) <= limit else label[:limit - 1] + "…"


def sensitivity_chart(search: Mapping[str, JsonValue], kept: set[str],
                      where: str = "fallback") -> str:
    """Damage per node group quantized alone, most sensitive first (plain SVG, log scale);
    ``search``: the fallback search's metrics (``where`` names them in an error)."""
    groups = [(json_object(r, f"{where}.sensitivity[{i}]"), f"{where}.sensitivity[{i}]")
              for i, r in enumerate(json_list(search.get("sensitivity"), f"{where}.sensitivity"))]
    if not groups:
        return ""
    damages = {id(row): json_number(row.get("damage"), f"{at}.damage") or 0.0
               for row, at in groups}
    ranked = sorted(groups, key=lambda g: -damages[id(g[0])])[:40]
    bars = []
    labels = []
    for i, (row, at) in enumerate(ranked):
        nodes = {str(n) for n in json_list(row.get("nodes"), f"{at}.nodes")}
        is_kept = bool(nodes & kept)
        damage = max(damages[id(row)], 1e-7)
        bars.append(Bar(damage, f"{damage:.2g}", COLORS["kept"] if is_kept
                        else COLORS["quantized"],
                        f"bar-sensitivity-{i}-{'kept' if is_kept else 'int8'}"))
        labels.append(_group_label(row, at))
    svg = hbar_chart(labels,
                     [Panel("damage per group", "damage when quantized alone "
                            "(1 − worst cosine), log scale", bars, width=520,
                            log_scale=True)],
                     legend=[(COLORS["kept"], "kept in higher precision"),
                             (COLORS["quantized"], "quantized (INT8)")])
    return _figure_html(svg, "chart-sensitivity", "INT8 sensitivity per node group, most "
                        "sensitive first: each group quantized alone, measured on real inputs.")


def benchmark_chart(rows: Sequence[BenchRow]) -> str:
    measured = [(r, r.p50_ms) for r in rows if r.status == "ok" and r.p50_ms]
    if not measured:
        return ""
    corners = list(dict.fromkeys(f"p{r.profile} {r.corner}" for r, _ in measured))
    runtimes = list(dict.fromkeys(r.runtime for r, _ in measured))
    labels = {r.runtime: r.engine for r, _ in measured}
    fig = _figure(9.5, 3.6)
    ax = fig.subplots()
    width = 0.8 / len(runtimes)
    for k, runtime in enumerate(runtimes):
        for c, corner in enumerate(corners):
            found = next(((r, p50) for r, p50 in measured if r.runtime == runtime
                          and f"p{r.profile} {r.corner}" == corner), None)
            if found is None or found[1] is None:
                continue
            row, p50 = found
            x = c + (k - (len(runtimes) - 1) / 2) * width
            bar = ax.bar([x], [p50], width * 0.92,
                         color=COLORS.get(runtime, "#888888"),
                         label=labels[runtime] if c == 0 else None)[0]
            bar.set_gid(f"bar-bench-{runtime}-p{row.profile}-{row.corner}")
            p90 = row.p90_ms or p50
            ax.plot([x, x], [p50, p90], color="#1d2a33", linewidth=1)
            ax.annotate(f"{p50:.1f}", (x, p90), xytext=(0, 2),
                        textcoords="offset points", ha="center", fontsize=8)
    shapes = {f"p{r.profile} {r.corner}": r.shapes for r, _ in measured}
    ax.set_xticks(range(len(corners)), [f"{c}\n{short_shape(shapes[c])}" for c in corners])
    ax.set_yscale("log")
    ax.set_ylabel("ms per request: p50, line to p90")
    # above the axes, not over the bars and their figures
    fig.legend(frameon=False, loc="outside upper center", ncol=min(len(runtimes), 2))
    return _svg(fig, "chart-benchmark", "Latency per profile corner (log scale): the served "
                "model in its runtime, the FP32 ONNX in ONNX Runtime and PyTorch eager, same "
                "inputs.")


def served_chart(served: ServedResult) -> str:
    rows = served.rows
    if not rows:
        return ""
    fig = _figure(9.5, 3.2)
    ax = fig.subplots()
    series: dict[tuple[str, str, str], list[ServedRow]] = {}
    for r in rows:
        series.setdefault((r.model, f"{r.corner} b{r.batch}", r.batching), []).append(r)
    palette = ["#2a9d8f", "#e76f51", "#264653", "#e9c46a", "#8ab17d", "#9d4edd"]
    shades = {k: palette[i % len(palette)]
              for i, k in enumerate(dict.fromkeys((m, c) for m, c, _ in series))}
    for i, ((model, corner, batching), points) in enumerate(series.items()):
        points.sort(key=lambda r: r.concurrency)
        (line,) = ax.plot([p.concurrency for p in points],
                          [p.throughput for p in points], marker="o",
                          color=shades[(model, corner)],
                          linestyle="--" if batching == "none" else "-",
                          label=f"{model} {corner} ({batching} batching)")
        line.set_gid(f"line-served-{i}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({r.concurrency for r in rows}),
                  [str(c) for c in sorted({r.concurrency for r in rows})])
    ax.set_xlabel("concurrent requests (perf_analyzer)")
    ax.set_ylabel("inferences / s")
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _svg(fig, "chart-served", f"Served throughput through Triton at {served.url}"
                " over a concurrency sweep.")


def short_shape(shapes: str) -> str:
    """The first input's shape of a case's ``name=BxS,...`` shapes."""
    first = shapes.split(",")[0]
    return first.split("=", 1)[-1]
