"""``OUT/report.html``: the build report as one self-contained page.

Charts come from the report's chart module as inline SVG with text kept as text: the build's
own (stage timeline, INT8 sensitivity) as plain SVG bars, the benchmark charts by matplotlib
(imported there, only when a benchmark is drawn). Styles are inline; nothing is fetched when
the page is viewed.
Sections: summary, stage timeline (seconds and peak memory), verification per corner and
output, INT8 sensitivity and kept layers (when the precision stage searched), benchmark
(runtime latency per corner, served throughput), artifacts with size and sha256, provenance.
Every chart is an ``<figure class="chart" id="chart-...">``; bars carry ids (``gid``).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trtpack.report import REPORT, BuildReport
from trtpack.report_page.charts import (
    benchmark_chart,
    sensitivity_chart,
    served_chart,
    short_shape,
    stage_chart,
)

PAGE = "report.html"
KNOWN_ROW_KEYS = ("check", "profile", "corner", "shapes", "output", "max_abs_diff",
                  "max_rel_diff", "metric", "metric_value", "passed", "reason")

CSS = """
:root { --ink:#1d2a33; --muted:#5c6b75; --line:#e3e8ec; --bg:#f6f8fa; --ok:#2a9d8f;
        --bad:#e63946; --warn:#e9a23b; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
       color:var(--ink); background:var(--bg); }
header { background:#1d2a33; color:#fff; padding:28px max(40px, calc((100% - 1100px) / 2)) 22px; }
header h1 { margin:0 0 4px; font-size:26px; font-weight:600; }
header .sub { color:#b8c4cc; }
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
th { color:var(--muted); font-weight:600; background:#fafbfc; }
td:last-child { white-space:normal; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
.pass { color:var(--ok); font-weight:600; } .fail { color:var(--bad); font-weight:600; }
.muted { color:var(--muted); } code { font-size:12.5px; }
.pill { display:inline-block; border-radius:10px; padding:0 8px; font-size:12px;
        background:#eef2f4; color:var(--muted); }
.warn { border-left:4px solid var(--warn); background:#fff8ec; padding:8px 12px;
        margin:6px 0; border-radius:4px; }
figure.chart { margin:6px 0 10px; } figure.chart svg { max-width:100%; height:auto; }
figcaption { color:var(--muted); font-size:13px; }
details summary { cursor:pointer; color:var(--muted); margin:6px 0; }
"""


# --- tables ----------------------------------------------------------------------------------

def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Iterable[int] = (),
           table_id: str = "") -> str:
    num = set(numeric)
    head = "".join(f'<th class="num">{html.escape(h)}</th>' if i in num
                   else f"<th>{html.escape(h)}</th>" for i, h in enumerate(headers))
    body = []
    for row in rows:
        cells = "".join(f'<td class="num">{c}</td>' if i in num else f"<td>{c}</td>"
                        for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    attr = f' id="{table_id}"' if table_id else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _num(value: Any, fmt: str = ".3g") -> str:
    if value is None:
        return '<span class="muted">–</span>'
    if isinstance(value, (int, float)):
        return format(value, fmt)
    return html.escape(str(value))


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def verification_table(report: BuildReport) -> str:
    rows = [dict(vars(r)) for r in report.verification]  # fields added later included
    if not rows:
        return '<p class="muted">No verification rows.</p>'
    extra = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in KNOWN_ROW_KEYS]
    headers = ["check", "profile", "corner", "shape", "output", "max abs diff",
               "max rel diff", "metric", *[k.replace("_", " ") for k in extra], "result"]
    body = []
    for r in rows:
        metric = "" if r["metric_value"] is None else f"{r['metric']} {r['metric_value']:.6f}"
        result = ('<span class="pass">pass</span>' if r["passed"] else
                  f'<span class="fail">FAIL</span> {html.escape(r["reason"])}')
        body.append([html.escape(r["check"]), r["profile"], html.escape(r["corner"]),
                     f"<code title=\"{html.escape(r['shapes'])}\">"
                     f"{html.escape(short_shape(r['shapes']))}</code>",
                     html.escape(r["output"]),
                     _num(r["max_abs_diff"]), _num(r["max_rel_diff"]), metric,
                     *[_num(r.get(k), ".6g") if not isinstance(r.get(k), (list, dict))
                       else html.escape(json.dumps(r.get(k))[:80]) for k in extra], result])
    numeric = [5, 6, *range(8, 8 + len(extra))]
    return _table(headers, body, numeric, "verification")


def benchmark_section(bench: dict[str, Any]) -> str:
    parts = []
    rows = bench.get("rows") or []
    if rows:
        m = bench.get("machine") or {}
        gpu = f", GPU {m['gpu']}" if m.get("gpu") else ", no GPU"
        load = m.get("load_average")
        parts.append(
            f'<p class="muted">{html.escape(str(m.get("cpu", "?")))}, '
            f'{m.get("logical_cores")} cores{html.escape(gpu)}; {bench.get("threads")} threads, '
            f'{bench.get("seconds_per_row")} s per row after warm-up; load average '
            f'{load}; measured {html.escape(str(bench.get("measured_at", "")))}.</p>')
        parts.append(benchmark_chart(rows))
        body = []
        for r in rows:
            status = "" if r["status"] == "ok" else \
                f'<span class="pill">{html.escape(r["status"])}</span> ' \
                f'<span class="muted">{html.escape(r["reason"])}</span>'
            speed = "" if r.get("speedup_vs_pytorch") is None else \
                f"{r['speedup_vs_pytorch']:.2f}×"
            body.append([html.escape(r["engine"]), f"p{r['profile']} {html.escape(r['corner'])}",
                         f"<code>{html.escape(short_shape(r['shapes']))}</code>",
                         _num(r.get("p50_ms"), ".2f"), _num(r.get("p90_ms"), ".2f"),
                         _num(r.get("p99_ms"), ".2f"), _num(r.get("throughput"), ",.1f"),
                         r.get("iterations") or "", speed + status])
        parts.append(_table(["runtime", "corner", "shape", "p50 ms", "p90 ms", "p99 ms",
                             "samples/s", "runs", "vs PyTorch"], body, [3, 4, 5, 6, 7],
                            "benchmark"))
        for note in bench.get("notes") or []:
            parts.append(f'<p class="warn">{html.escape(note)}</p>')
    served = bench.get("served")
    if served:
        parts.append("<h3>Served through Triton (perf_analyzer)</h3>")
        parts.append(served_chart(served))
        body = [[html.escape(r["model"]), html.escape(r["backend"]), html.escape(r["batching"]),
                 html.escape(str(r["corner"])), r["batch"], r["concurrency"],
                 _num(r["throughput"], ",.1f"), _num(r["p50_ms"], ".2f"),
                 _num(r["p99_ms"], ".2f")] for r in served.get("rows", [])]
        parts.append(_table(["model", "backend", "batching", "corner", "batch", "concurrency",
                             "infer/s", "p50 ms", "p99 ms"], body, [4, 5, 6, 7, 8], "served"))
    return "".join(parts)


def int8_section(report: BuildReport) -> str:
    stage = report.stage("precision")
    if stage is None or stage.status != "ok" or stage.metrics.get("precision") != "int8":
        return ""
    m = stage.metrics
    kept = list(m.get("excluded_by_fallback") or [])
    hints = m.get("excluded_node_hints") or {}
    low = m.get("low_precision") or {}
    search = m.get("fallback") or {}
    parts = ["<section id='int8'><h2>INT8: what was quantized</h2>"]
    if low:
        parts.append(f"<p>{low.get('matmul_gemm_low_precision')}/{low.get('matmul_gemm_nodes')}"
                     f" MatMul/Gemm nodes run in INT8 ({low.get('matmul_gemm_share', 0):.0%}); "
                     f"{len(kept)} kept in {html.escape(str(m.get('high_precision')))} by the "
                     "fallback search. Worst metric before / after: "
                     f"{_num((m.get('before') or {}).get('worst'), '.4f')} / "
                     f"{_num((m.get('after') or {}).get('worst'), '.4f')}.</p>")
    splits = {k: v for k, v in (m.get("splits") or {}).items() if v}
    if splits:
        parts.append(_table(
            ["split", "samples", "worst sample", "mean", "worst sample's text", "result"],
            [[html.escape(name), v.get("samples", ""), _num(v.get("worst"), ".4f"),
              _num(v.get("mean"), ".4f"), html.escape(str(v.get("worst_text") or "")),
              '<span class="pass">pass</span>' if v.get("passed") else
              '<span class="fail">FAIL</span>'] for name, v in splits.items()],
            [1, 2, 3], "int8-splits"))
    parts.append(sensitivity_chart(search, set(kept)))
    if kept:
        parts.append(_table(["kept node", "what it is"],
                            [[f"<code>{html.escape(n)}</code>", html.escape(hints.get(n, ""))]
                             for n in kept], table_id="kept-layers"))
    parts.append("</section>")
    return "".join(parts)


def cpu_model_section(report: BuildReport) -> str:
    """What ONNX Runtime serves on the CPU: the fusions, the INT8 form and its integer
    kernels, and for --precision auto the candidates' latency and accuracy and the reason."""
    stage = report.stage("cpu_model")
    if stage is None or stage.status != "ok":
        return ""
    m = stage.metrics
    fused = ", ".join(f"{n} {html.escape(op)}" for op, n in
                      (m.get("fused_operators") or {}).items() if n) or "nothing fused"
    parts = ["<section id='cpu-model'><h2>CPU model (ONNX Runtime)</h2>",
             f"<p>Served form: <b>{html.escape(str(m.get('form')))}</b>. Fused: {fused} "
             f"({m.get('nodes_before')} → {m.get('nodes_after')} nodes).</p>"]
    if m.get("int8_form"):
        kernels = ", ".join(f"{n} {html.escape(op)}" for op, n in
                            (m.get("integer_kernels") or {}).items()) or "none"
        kept = ", ".join(html.escape(n) for n in m.get("kept_fp32_layers") or []) or "none"
        parts.append(f"<p>INT8 form: {html.escape(str(m['int8_form']))}; "
                     f"{html.escape(str(m.get('int8_weight_matmuls')))} weight MatMuls INT8; "
                     f"integer kernels in the graph ONNX Runtime runs: {kernels}; kept in "
                     f"FP32: {kept}.</p>")
    auto = m.get("auto")
    if auto:
        candidates = auto.get("candidates") or []
        corners = list((candidates[0].get("p50_ms") or {}) if candidates else [])
        rows = [[("<b>" if c["name"] == auto["winner"] else "") + html.escape(c["name"])
                 + ("</b>" if c["name"] == auto["winner"] else ""),
                 _num(c.get("worst"), ".4f"),
                 '<span class="pass">pass</span>' if c.get("passed") else
                 '<span class="fail">FAIL</span>',
                 *[f"{c['p50_ms'][k]:.2f} (±{c['spread'][k]:.0%})" for k in corners]]
                for c in candidates]
        parts.append("<h3>--precision auto: accuracy against latency</h3>")
        parts.append(_table(["candidate", "worst sample", "gates",
                             *[f"p50 ms {html.escape(k)}" for k in corners]], rows,
                            [1, *range(3, 3 + len(corners))], "auto-precision"))
        parts.append(f"<p>Served: <b>{html.escape(auto['winner'])}</b>: "
                     f"{html.escape(auto['reason'])}.</p>")
    parts.append("</section>")
    return "".join(parts)


def artifacts_table(report: BuildReport) -> str:
    rows = []
    for s in report.stages:
        for a in s.artifacts:
            rows.append([html.escape(s.name), f"<code>{html.escape(a.path)}</code>",
                         _size(a.size), f'<code title="{a.sha256}">{a.sha256[:16]}…</code>'])
    return _table(["stage", "file", "size", "sha256"], rows, [2], "artifacts")


def provenance(report: BuildReport, out: Path) -> str:
    versions = [[html.escape(k), html.escape(str(v)) if v else '<span class="muted">–</span>']
                for k, v in report.versions.items()]
    parts = [_table(["component", "version"], versions, table_id="versions")]
    for plan_json in sorted(out.glob("artifacts/engine/*.plan.json")):
        try:
            data = json.loads(plan_json.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        keys = ("target", "gpu_name", "compute_capability", "tensorrt_version", "precision",
                "plan_sha256", "built_at", "trtexec")
        parts.append("<h3>TensorRT engine</h3>" + _table(
            ["field", "value"], [[k, f"<code>{html.escape(str(data.get(k)))}</code>"]
                                 for k in keys]))
    return "".join(parts)


def _profiles(profiles: Sequence[str]) -> str:
    """``1x8:4x32:8x128`` when every input of a profile has the same shapes."""
    shown = []
    for p in profiles:
        specs = {part.split("=", 1)[-1] for part in p.split(",")}
        shown.append(specs.pop() if len(specs) == 1 else p)
    return ", ".join(shown)


def render_report_html(report: BuildReport, out: Path) -> str:
    """The page as a string (``write_report_html`` writes it)."""
    status_ok = report.status == "ok"
    gates = [r.passed for r in report.verification]
    cards = [
        (report.status, "status"), (f"{report.total_seconds:.1f} s", "build time"),
        (f"{report.peak_memory_mb:,.0f} MB" if report.peak_memory_mb else "–", "peak memory"),
        (f"{sum(gates)}/{len(gates)}", "checks passed"),
    ]
    bench = report.benchmark or {}
    best = [r["speedup_vs_pytorch"] for r in bench.get("rows", [])
            if r.get("runtime") == "served" and r.get("speedup_vs_pytorch")]
    if best:
        cards.append((f"{min(best):.2f}–{max(best):.2f}×", "served vs PyTorch"))
    card_html = "".join(f"<div class='card'><b>{html.escape(v)}</b><span>{k}</span></div>"
                        for v, k in cards)
    warnings = "".join(f'<div class="warn">{html.escape(w)}</div>' for w in report.warnings)
    error = f'<div class="warn"><b>error:</b> {html.escape(report.error)}</div>' \
        if report.error else ""
    stage_rows = [[html.escape(s.name), f'<span class="{"pass" if s.status == "ok" else "muted"}">'
                   f"{s.status}</span>" + (" <span class='pill'>cached</span>" if s.cached else ""),
                   f"{s.seconds:.1f}", _num(s.peak_memory_mb, ",.0f"), html.escape(s.message)]
                  for s in report.stages]
    bench_html = benchmark_section(bench) if bench else (
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
<div class="cards">{card_html}</div></header>
<main>{error}{warnings}
<section id="stages"><h2>Stages</h2>{stage_chart(report)}
{_table(["stage", "status", "seconds", "peak MB", "details"], stage_rows, [2, 3])}</section>
<section id="verification-section"><h2>Verification at every profile corner</h2>
{verification_table(report)}</section>
{int8_section(report)}
{cpu_model_section(report)}
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
    path = out / PAGE
    path.write_text(page, encoding="utf-8")
    return path
