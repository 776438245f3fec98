"""``OUT/report.html``: the build report as one self-contained page.

Charts come from the report's chart module as inline SVG with text kept as text: the build's
own (stage timeline, INT8 sensitivity) as plain SVG bars, the benchmark charts by matplotlib
(imported there, only when a benchmark is drawn). Styles are inline; nothing is fetched when
the page is viewed.
Sections: summary, stage timeline (seconds and peak memory), then the ones ``sections`` makes:
verification per corner and output, INT8 sensitivity and kept layers (when the precision stage
searched), the CPU model, benchmark (runtime latency per corner, served throughput), artifacts
with size and sha256, provenance.
Every chart is an ``<figure class="chart" id="chart-...">``; bars carry ids (``gid``).
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path

from trtpack.out_files import REPORT_PAGE
from trtpack.report import REPORT, BenchRow, BuildReport
from trtpack.report_page.charts import stage_chart
from trtpack.report_page.compile_check import compile_check_section
from trtpack.report_page.sections import (
    artifacts_table,
    benchmark_section,
    cpu_model_section,
    int8_section,
    number_cell,
    provenance,
    table_html,
    verification_table,
)

CSS = """
:root { --ink:#1d2a33; --muted:#5c6b75; --line:#e3e8ec; --bg:#f6f8fa; --ok:#2a9d8f;
        --bad:#e63946; --warn:#e9a23b; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
       color:var(--ink); background:var(--bg); }
header { background:#1d2a33; color:#fff; padding:28px max(40px, calc((100% - 1100px) / 2)) 22px; }
header h1 { margin:0 0 4px; font-size:26px; font-weight:600; }
header .sub { color:#b8c4cc; }
header #cache-note { margin-top:12px; }
main { max-width:1180px; margin:0 auto; padding:8px 40px 60px; }
section { background:#fff; border:1px solid var(--line); border-radius:10px; margin:22px 0;
          padding:18px 24px; overflow-x:auto; }
h2 { font-size:19px; margin:0 0 12px; }
h3 { font-size:15px; margin:18px 0 8px; color:var(--muted); }
.cards { display:flex; gap:14px; flex-wrap:wrap; margin-top:16px; }
.card { background:#26363f; border-radius:8px; padding:10px 16px; min-width:130px; }
.card b { display:block; font-size:20px; } .card span { color:#b8c4cc; font-size:13px; }
table { border-collapse:collapse; width:100%; font-size:13.5px; }
th, td { text-align:left; padding:5px 10px; white-space:nowrap; border-bottom:1px solid var(--line);
         vertical-align:top; }
th { color:var(--muted); font-weight:600; background:#fafbfc; white-space:normal;
     vertical-align:bottom; }
td:last-child, td.wrap { white-space:normal; } .nowrap { white-space:nowrap; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
.pass { color:var(--ok); font-weight:600; } .fail { color:var(--bad); font-weight:600; }
.muted { color:var(--muted); } code { font-size:12.5px; }
.pill { display:inline-block; border-radius:10px; padding:0 8px; font-size:12px;
        background:#eef2f4; color:var(--muted); }
.warn { border-left:4px solid var(--warn); background:#fff8ec; padding:8px 12px;
        margin:6px 0; border-radius:4px; }
.warn-text { color:var(--warn); font-weight:600; cursor:help; }
figure.chart { margin:6px 0 10px; } figure.chart svg { max-width:100%; height:auto; }
figcaption { color:var(--muted); font-size:13px; }
details summary { cursor:pointer; color:var(--muted); margin:6px 0; }
"""


def _profiles(profiles: Sequence[str]) -> str:
    """``1x8:4x32:8x128`` when every input of a profile has the same shapes."""
    shown = []
    for p in profiles:
        specs = {part.split("=", 1)[-1] for part in p.split(",")}
        shown.append(specs.pop() if len(specs) == 1 else p)
    return ", ".join(shown)


def speedup_cards(rows: Sequence[BenchRow]) -> list[tuple[str, str]]:
    """The header's "served vs PyTorch" range, from the corners whose ratio can be trusted
    (``speedup_unreliable`` empty); the others are counted, never shown as a fact."""
    served = [r for r in rows if r.runtime == "served" and r.speedup_vs_pytorch]
    sure = [r.speedup_vs_pytorch for r in served
            if r.speedup_vs_pytorch is not None and not r.speedup_unreliable]
    doubtful = len(served) - len(sure)
    left_out = f" ({doubtful} unstable corner{'s' * (doubtful > 1)} left out)" \
        if doubtful else ""
    if sure:
        return [(f"{min(sure):.2f}–{max(sure):.2f}×", f"served vs PyTorch{left_out}")]
    if doubtful:
        return [("unreliable", "served vs PyTorch: the timings were unstable (benchmark)")]
    return []


def render_report_html(report: BuildReport, out: Path) -> str:
    """The page as a string (``write_report_html`` writes it)."""
    status_ok = report.status == "ok"
    gates = [r.passed for r in report.verification]
    done = [s for s in report.stages if s.status != "skipped"]
    reused = [s.name for s in done if s.cached]
    ran = [s.ran_seconds for s in done if s.cached and s.ran_seconds is not None]
    this_run = " (this run)" if reused else ""
    cards = [
        (report.status, "status"), (f"{report.total_seconds:.1f} s", "build time" + this_run),
        (f"{report.peak_memory_mb:,.0f} MB" if report.peak_memory_mb else "–",
         "peak memory" + this_run),
        (f"{sum(gates)}/{len(gates)}", "checks passed"),
    ]
    if reused:
        cards.append((f"{len(reused)} of {len(done)}", "stages from the cache"))
    bench, served = report.benchmark_result(), report.served_result()
    cards += speedup_cards(bench.rows if bench is not None else [])
    card_html = "".join(f"<div class='card'><b>{html.escape(v)}</b><span>{k}</span></div>"
                        for v, k in cards)
    took = f", {sum(ran):.1f} s when they ran" if len(ran) == len(reused) else ""
    cache_note = (f'<div class="sub" id="cache-note">{len(reused)} of {len(done)} stages reused '
                  f"from the stage cache ({html.escape(', '.join(reused))}{took}): the build "
                  "time and peak memory cover only the work done in this run.</div>"
                  if reused else "")
    warnings = "".join(f'<div class="warn">{html.escape(w)}</div>' for w in report.warnings)
    error = f'<div class="warn"><b>error:</b> {html.escape(report.error)}</div>' \
        if report.error else ""
    stage_rows = [[html.escape(s.name), f'<span class="{"pass" if s.status == "ok" else "muted"}">'
                   f"{s.status}</span>" + (" <span class='pill'>cached</span>" if s.cached else ""),
                   f"{s.seconds:.1f}", number_cell(s.peak_memory_mb, ",.0f"),
                   html.escape(s.message)]
                  for s in report.stages]
    held_out = " and on held-out data" if any(r.profile < 0 for r in report.verification) \
        else ""
    bench_html = benchmark_section(bench, served) if bench or served else (
        '<p class="muted">Not measured yet: run <code>trtpack bench '
        f'{html.escape(report.out_dir)}</code> (or build with <code>--bench</code>).</p>')
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>trtpack · {html.escape(report.model)} {html.escape(report.precision)}</title>
<style>{CSS}</style></head>
<body><header>
<h1>{html.escape(report.model)} <span style="font-weight:400">·
{html.escape(report.precision)} for {html.escape(report.target)}</span></h1>
<div class="sub">profiles {html.escape(_profiles(report.profiles))} · trtpack
{html.escape(str(report.versions.get("trtpack", "")))} ·
<span class="{"pass" if status_ok else "fail"}">{html.escape(report.status)}</span></div>
<div class="cards">{card_html}</div>{cache_note}</header>
<main>{error}{warnings}
<section id="stages"><h2>Stages</h2>{stage_chart(report)}
{table_html(["stage", "status", "seconds", "peak MB", "details"], stage_rows, [2, 3])}</section>
<section id="verification-section"><h2>Verification at every profile corner{held_out}</h2>
{verification_table(report)}</section>
{int8_section(report)}
{cpu_model_section(report)}
{compile_check_section(report)}
<section id="benchmark-section"><h2>Benchmark</h2>{bench_html}</section>
<section id="artifacts-section"><h2>Artifacts</h2>{artifacts_table(report)}</section>
<section id="provenance"><h2>Provenance</h2>{provenance(report, out)}</section>
</main></body></html>
"""


def write_report_html(out: Path, report: BuildReport | None = None) -> Path:
    """Write ``out/report.html`` from ``report`` (default: ``out/report.json``)."""
    report = report or BuildReport.load(out / REPORT)
    page = render_report_html(report, out)
    page = re.sub(r"\n\s*\n", "\n", page)
    path = out / REPORT_PAGE
    path.write_text(page, encoding="utf-8")
    return path
