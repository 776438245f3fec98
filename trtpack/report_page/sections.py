"""The sections of ``report.html`` below its header: tables and each section's body.

Verification per corner and output, benchmark (runtime latency per corner, served throughput),
INT8 sensitivity and kept layers, the CPU model's candidates, artifacts with size and sha256,
provenance; ``html`` puts them on the page.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from trtpack.report import BuildReport, shown_metric
from trtpack.report_page.charts import (
    benchmark_chart,
    sensitivity_chart,
    served_chart,
    short_shape,
)

KNOWN_ROW_KEYS = ("check", "profile", "corner", "shapes", "output", "max_abs_diff",
                  "max_rel_diff", "metric", "metric_value", "passed", "reason", "threshold")


# --- tables ----------------------------------------------------------------------------------

def table_html(headers: Sequence[str], rows: Iterable[Sequence[Any]],
               numeric: Iterable[int] = (), table_id: str = "") -> str:
    """A ``<table>``; the columns at ``numeric`` right-aligned."""
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


def number_cell(value: Any, fmt: str = ".3g") -> str:
    """A number formatted with ``fmt``; a dash for ``None``."""
    if value is None:
        return '<span class="muted">–</span>'
    if isinstance(value, (int, float)):
        return format(value, fmt)
    return html.escape(str(value))


def size_text(n: int) -> str:
    """A byte count in B, KB, MB or GB."""
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
        metric = "" if r["metric_value"] is None else \
            f"{r['metric']} {shown_metric(r['metric_value'], r.get('threshold'), digits=6)}"
        result = ('<span class="pass">pass</span>' if r["passed"] else
                  f'<span class="fail">FAIL</span> {html.escape(r["reason"])}')
        body.append([html.escape(r["check"]), r["profile"], html.escape(r["corner"]),
                     f"<code title=\"{html.escape(r['shapes'])}\">"
                     f"{html.escape(short_shape(r['shapes']))}</code>",
                     html.escape(r["output"]),
                     number_cell(r["max_abs_diff"]), number_cell(r["max_rel_diff"]), metric,
                     *[number_cell(r.get(k), ".6g") if not isinstance(r.get(k), (list, dict))
                       else html.escape(json.dumps(r.get(k))[:80]) for k in extra], result])
    numeric = [5, 6, *range(8, 8 + len(extra))]
    return table_html(headers, body, numeric, "verification")


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
            if speed and r.get("speedup_unreliable"):
                speed = (f'<span class="warn-text" title="'
                         f'{html.escape(r["speedup_unreliable"])}">{speed}?</span>')
            p50 = number_cell(r.get("p50_ms"), ".2f")
            if r.get("spread") is not None:
                p50 += f' <span class="muted">spread {r["spread"]:.0%}</span>'
            if r.get("unreliable"):
                p50 += f' <span class="warn-text" title="{html.escape(r["unreliable"])}">?</span>'
            body.append([html.escape(r["engine"]), f"p{r['profile']} {html.escape(r['corner'])}",
                         f"<code>{html.escape(short_shape(r['shapes']))}</code>", p50,
                         number_cell(r.get("p90_ms"), ".2f"),
                         number_cell(r.get("p99_ms"), ".2f"),
                         number_cell(r.get("throughput"), ",.1f"),
                         r.get("iterations") or "", speed + status])
        parts.append(table_html(["runtime", "corner", "shape", "p50 ms", "p90 ms", "p99 ms",
                             "samples/s", "runs", "vs PyTorch"], body, [3, 4, 5, 6, 7],
                            "benchmark"))
        if bench.get("thread_policy"):
            rounds = max(r.get("rounds") or 0 for r in rows)
            parts.append(f'<p class="muted">p50 and the spread of its {rounds} rounds&#39; '
                         "medians ((max − min) / median), the runtimes timed in rotation; "
                         f'threads: {html.escape(bench["thread_policy"])}.</p>')
        for r in rows:
            if r.get("status") == "ok" and r.get("unreliable"):
                parts.append(f'<p class="warn">? p{r["profile"]} {html.escape(r["corner"])} '
                             f'{html.escape(r["engine"])}: {html.escape(r["unreliable"])}; '
                             "its figures and every ratio against it are not to be trusted."
                             "</p>")
        for note in bench.get("notes") or []:
            parts.append(f'<p class="warn">{html.escape(note)}</p>')
    served = bench.get("served")
    if served:
        parts.append("<h3>Served through Triton (perf_analyzer)</h3>")
        parts.append(served_chart(served))
        body = [[html.escape(r["model"]), html.escape(r["backend"]), html.escape(r["batching"]),
                 html.escape(str(r["corner"])), r["batch"], r["concurrency"],
                 number_cell(r["throughput"], ",.1f"), number_cell(r["p50_ms"], ".2f"),
                 number_cell(r["p99_ms"], ".2f")] for r in served.get("rows", [])]
        parts.append(table_html(["model", "backend", "batching", "corner", "batch", "concurrency",
                             "infer/s", "p50 ms", "p99 ms"], body, [4, 5, 6, 7, 8], "served"))
    return "".join(parts)


def int8_section(report: BuildReport) -> str:
    stage = report.stage("precision")
    if stage is None or stage.status == "skipped" or stage.metrics.get("precision") != "int8":
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
                     f"{number_cell((m.get('before') or {}).get('worst'), '.4f')} / "
                     f"{number_cell((m.get('after') or {}).get('worst'), '.4f')}.</p>")
    splits = {k: v for k, v in (m.get("splits") or {}).items() if v}
    if splits:
        parts.append(table_html(
            ["split", "samples", "worst sample", "mean", "worst sample's text", "result"],
            [[html.escape(name), v.get("samples", ""), number_cell(v.get("worst"), ".4f"),
              number_cell(v.get("mean"), ".4f"), html.escape(str(v.get("worst_text") or "")),
              '<span class="pass">pass</span>' if v.get("passed") else
              '<span class="fail">FAIL</span>'] for name, v in splits.items()],
            [1, 2, 3], "int8-splits"))
    parts.append(sensitivity_chart(search, set(kept)))
    if kept:
        parts.append(table_html(["kept node", "what it is"],
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
                 number_cell(c.get("worst"), ".4f"),
                 '<span class="pass">pass</span>' if c.get("passed") else
                 '<span class="fail">FAIL</span>',
                 *[f"{c['p50_ms'][k]:.2f} (±{c['spread'][k]:.0%})" for k in corners]]
                for c in candidates]
        parts.append("<h3>--precision auto: accuracy against latency</h3>")
        parts.append(table_html(["candidate", "worst sample", "gates",
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
                         size_text(a.size), f'<code title="{a.sha256}">{a.sha256[:16]}…</code>'])
    return table_html(["stage", "file", "size", "sha256"], rows, [2], "artifacts")


def provenance(report: BuildReport, out: Path) -> str:
    versions = [[html.escape(k), html.escape(str(v)) if v else '<span class="muted">–</span>']
                for k, v in report.versions.items()]
    parts = [table_html(["component", "version"], versions, table_id="versions")]
    for plan_json in sorted(out.glob("artifacts/engine/*.plan.json")):
        try:
            data = json.loads(plan_json.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        keys = ("target", "gpu_name", "compute_capability", "tensorrt_version", "precision",
                "plan_sha256", "built_at", "trtexec")
        parts.append("<h3>TensorRT engine</h3>" + table_html(
            ["field", "value"], [[k, f"<code>{html.escape(str(data.get(k)))}</code>"]
                                 for k in keys]))
    return "".join(parts)
