"""The sections of ``report.html`` below its header: tables and each section's body.

Verification per corner and output, benchmark (runtime latency per corner, served throughput),
INT8 sensitivity and kept layers, the CPU model's candidates, artifacts with size and sha256,
provenance; ``html`` puts them on the page.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from trtpack.json_values import JsonValue, json_list, json_number, json_object, json_text
from trtpack.report import (
    BenchmarkResult,
    BuildReport,
    ServedResult,
    int8_weight_layers,
    shown_metric,
)
from trtpack.report_page.charts import (
    benchmark_chart,
    sensitivity_chart,
    served_chart,
    short_shape,
)

KNOWN_ROW_KEYS = ("check", "profile", "corner", "shapes", "output", "max_abs_diff",
                  "max_rel_diff", "metric", "metric_value", "passed", "reason", "metric_mean",
                  "samples", "worst_sample", "worst_text", "threshold")


# --- tables ----------------------------------------------------------------------------------

def table_html(headers: Sequence[str], rows: Iterable[Sequence[Any]],
               numeric: Iterable[int] = (), table_id: str = "",
               wrapped: Iterable[int] = ()) -> str:
    """A ``<table>``; the columns at ``numeric`` right-aligned, those at ``wrapped`` (text of
    any length) wrapped at the page's width (the last column always is)."""
    classes = {i: "num" for i in numeric} | {i: "wrap" for i in wrapped}

    def cell(tag: str, i: int, content: str) -> str:
        return (f'<{tag} class="{classes[i]}">{content}</{tag}>' if i in classes
                else f"<{tag}>{content}</{tag}>")

    head = "".join(cell("th", i, html.escape(h)) for i, h in enumerate(headers))
    body = []
    for row in rows:
        body.append(f"<tr>{''.join(cell('td', i, c) for i, c in enumerate(row))}</tr>")
    attr = f' id="{table_id}"' if table_id else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def number_cell(value: float | str | None, fmt: str = ".3g") -> str:
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


def corner_text(profile: int, corner: str) -> str:
    """A case's place: ``p0 max`` at a profile corner; a case outside the profiles (profile
    -1: the INT8 build's held-out, search or check batches, named ``heldout3``) by its
    split and batch, ``held-out 3``."""
    if profile >= 0:
        return f"p{profile} {corner}"
    split = corner.rstrip("0123456789")
    number = corner[len(split):]
    name = {"heldout": "held-out", "check": "check split", "search": "search split"}.get(
        split, split)
    return f"{name} {number}".strip()


GATE_NOTE = (
    "A row passes on its metric: each sample's {metrics} against the reference, and the worst "
    "sample must reach the threshold beside it (the recipe's "
    "<code>verify.&lt;precision&gt;.min_cosine</code>, or <code>min_top1</code> for top-1 "
    "agreement). Max abs and rel diff are element-wise "
    "statistics shown beside it; they gate only where the recipe sets <code>atol</code> / "
    "<code>rtol</code>. <span class='muted'>†</span> The relative diff divides by each "
    "reference element, so elements near zero, which every hidden state has, give large "
    "ratios (tens or thousands) while the output as a whole matches: read the metric, not the "
    "rel diff.")
NEAR_ZERO_MARK = ('<a class="muted" href="#verification-gate" title="a ratio over 1 on a '
                  'passing row: reference elements near zero (see the note above)">†</a>')


def verification_table(report: BuildReport) -> str:
    """One row per check, case and output: where (profile corner or held-out batch) and at
    which shape, the metric that gates (worst sample, mean, samples), the element-wise
    diffs, the result and the worst sample's text; fields added to the rows later get columns
    of their own."""
    rows = [dict(vars(r)) for r in report.verification]  # fields added later included
    if not rows:
        return '<p class="muted">No verification rows.</p>'
    extra = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in KNOWN_ROW_KEYS]
    metrics = list(dict.fromkeys(r["metric"] for r in rows if r["metric_value"] is not None))
    one_metric = metrics[0] if len(metrics) == 1 else None
    worst_header = f"{one_metric.replace('_', ' ')}, worst sample" if one_metric \
        else "metric, worst sample"
    headers = ["check", "where", "output", worst_header, "mean", "samples", "max abs diff",
               "max rel diff", *[k.replace("_", " ") for k in extra], "result"]
    with_text = any(r.get("worst_text") for r in rows)
    if with_text:
        headers.append("worst sample's text")
    body = []
    for r in rows:
        metric = ""
        if r["metric_value"] is not None:
            threshold = r.get("threshold")
            metric = f"<b>{shown_metric(r['metric_value'], threshold, digits=6)}</b>"
            if threshold is not None:
                relation = "<" if r["metric_value"] < threshold else "≥"
                metric += f'<br><span class="muted">{relation}&nbsp;{threshold:g}</span>'
            if not one_metric:
                metric = f"{html.escape(r['metric'])} {metric}"
        result = ('<span class="pass">pass</span>' if r["passed"] else
                  f'<span class="fail">FAIL</span> {html.escape(r["reason"])}')
        text = ""
        if r.get("worst_text"):
            sample = "" if r.get("worst_sample") is None else f"#{r['worst_sample']} "
            text = f'<span class="muted">{sample}“{html.escape(r["worst_text"])}”</span>'
        where = (f'<span class="nowrap">{html.escape(corner_text(r["profile"], r["corner"]))}'
                 "</span> "
                 f"<code title=\"{html.escape(r['shapes'])}\">"
                 f"{html.escape(short_shape(r['shapes']))}</code>")
        body.append([html.escape(r["check"]), where, html.escape(r["output"]), metric,
                     "" if r.get("metric_mean") is None else f"{r['metric_mean']:.6f}",
                     number_cell(r.get("samples"), "d"),
                     number_cell(r["max_abs_diff"]),
                     number_cell(r["max_rel_diff"]) + (
                         f" {NEAR_ZERO_MARK}" if r["passed"] and r["max_rel_diff"] > 1 else ""),
                     *[number_cell(r.get(k), ".6g") if not isinstance(r.get(k), (list, dict))
                       else html.escape(json.dumps(r.get(k))[:80]) for k in extra],
                     result, *([text] if with_text else [])])
    numeric = [3, 4, 5, 6, 7, *range(8, 8 + len(extra))]
    wrapped = [1, 8 + len(extra), 9 + len(extra)]  # where, result, text: wrap when needed
    shown = " / ".join(m.replace("_", " ") for m in metrics) or "task metric"
    note = f'<p class="muted" id="verification-gate">{GATE_NOTE.format(metrics=shown)}</p>'
    return note + table_html(headers, body, numeric, "verification", wrapped)


def benchmark_section(result: BenchmarkResult | None, served: ServedResult | None) -> str:
    """What ``trtpack bench`` measured: the runtimes' rows, served throughput through Triton."""
    parts = []
    rows = result.rows if result is not None else []
    if result is not None and rows:
        m = result.machine
        gpu = f", GPU {m['gpu']}" if m.get("gpu") else ", no GPU"
        parts.append(
            f'<p class="muted">{html.escape(str(m.get("cpu", "?")))}, '
            f'{m.get("logical_cores")} cores{html.escape(gpu)}; {result.threads} threads, '
            f'{result.seconds_per_row} s per row after warm-up; load average '
            f'{m.get("load_average")}; measured {html.escape(result.measured_at)}.</p>')
        parts.append(benchmark_chart(rows))
        body = []
        for r in rows:
            status = "" if r.status == "ok" else \
                f'<span class="pill">{html.escape(r.status)}</span> ' \
                f'<span class="muted">{html.escape(r.reason)}</span>'
            speed = "" if r.speedup_vs_pytorch is None else f"{r.speedup_vs_pytorch:.2f}×"
            if speed and r.speedup_unreliable:
                speed = (f'<span class="warn-text" title="'
                         f'{html.escape(r.speedup_unreliable)}">{speed}?</span>')
            p50 = number_cell(r.p50_ms, ".2f")
            if r.spread is not None:
                p50 += f' <span class="muted">spread {r.spread:.0%}</span>'
            if r.unreliable:
                p50 += f' <span class="warn-text" title="{html.escape(r.unreliable)}">?</span>'
            body.append([html.escape(r.engine), f"p{r.profile} {html.escape(r.corner)}",
                         f"<code>{html.escape(short_shape(r.shapes))}</code>", p50,
                         number_cell(r.p90_ms, ".2f"), number_cell(r.p99_ms, ".2f"),
                         number_cell(r.throughput, ",.1f"), r.iterations or "",
                         speed + status])
        parts.append(table_html(["runtime", "corner", "shape", "p50 ms", "p90 ms", "p99 ms",
                             "samples/s", "runs", "vs PyTorch"], body, [3, 4, 5, 6, 7],
                            "benchmark"))
        if result.thread_policy:
            rounds = max(r.rounds for r in rows)
            parts.append(f'<p class="muted">p50 and the spread of its {rounds} rounds&#39; '
                         "medians ((max − min) / median), the runtimes timed in rotation; "
                         f'threads: {html.escape(result.thread_policy)}.</p>')
        for r in rows:
            if r.status == "ok" and r.unreliable:
                parts.append(f'<p class="warn">? p{r.profile} {html.escape(r.corner)} '
                             f'{html.escape(r.engine)}: {html.escape(r.unreliable)}; '
                             "its figures and every ratio against it are not to be trusted."
                             "</p>")
        for note in result.notes:
            parts.append(f'<p class="warn">{html.escape(note)}</p>')
    if served is not None and served.rows:
        parts.append("<h3>Served through Triton (perf_analyzer)</h3>")
        parts.append(served_chart(served))
        body = [[html.escape(r.model), html.escape(r.backend), html.escape(r.batching),
                 html.escape(str(r.corner)), r.batch, r.concurrency,
                 number_cell(r.throughput, ",.1f"), number_cell(r.p50_ms, ".2f"),
                 number_cell(r.p99_ms, ".2f")] for r in served.rows]
        parts.append(table_html(["model", "backend", "batching", "corner", "batch", "concurrency",
                             "infer/s", "p50 ms", "p99 ms"], body, [4, 5, 6, 7, 8], "served"))
    return "".join(parts)


def int8_search_metrics(report: BuildReport) -> Mapping[str, JsonValue] | None:
    """The Q/DQ search's metrics: the precision stage's, or (``--target cpu``, where it runs
    only when the first CPU INT8 form fails) the CPU model stage's; None where it did not
    run."""
    stage = report.stage("precision")
    if stage is not None and stage.status != "skipped" \
            and stage.metrics.get("precision") == "int8":
        return stage.metrics
    cpu = report.stage("cpu_model")
    search = cpu.metrics.get("search") if cpu is not None and cpu.status != "skipped" \
        else None
    return search if isinstance(search, Mapping) and search.get("precision") == "int8" else None


def int8_section(report: BuildReport) -> str:
    m = int8_search_metrics(report)
    if m is None:
        return ""
    where = "the INT8 search's metrics"
    kept = [json_text(n, f"{where}: excluded_by_fallback[{i}]") for i, n in
            enumerate(json_list(m.get("excluded_by_fallback"), f"{where}: excluded_by_fallback"))]
    hints = json_object(m.get("excluded_node_hints"), f"{where}: excluded_node_hints")
    low = json_object(m.get("low_precision"), f"{where}: low_precision")
    search = json_object(m.get("fallback"), f"{where}: fallback")
    parts = ["<section id='int8'><h2>INT8: what was quantized</h2>"]
    if low:
        share = json_number(low.get("matmul_gemm_share"), f"{where}: matmul_gemm_share") or 0.0
        parts.append(f"<p>{low.get('matmul_gemm_low_precision')}/{low.get('matmul_gemm_nodes')}"
                     f" MatMul/Gemm nodes run in INT8 ({share:.0%}); "
                     f"{len(kept)} kept in {html.escape(str(m.get('high_precision')))} by the "
                     f"fallback search. {_before_after(m, where)}</p>")
    splits = {name: json_object(v, f"{where}: splits.{name}") for name, v in
              json_object(m.get("splits"), f"{where}: splits").items() if v}
    if splits:
        parts.append(table_html(
            ["split", "samples", "worst sample", "mean", "worst sample's text", "result"],
            [[html.escape(name), v.get("samples", ""),
              number_cell(json_number(v.get("worst"), f"{where}: splits.{name}.worst"), ".4f"),
              number_cell(json_number(v.get("mean"), f"{where}: splits.{name}.mean"), ".4f"),
              html.escape(str(v.get("worst_text") or "")),
              '<span class="pass">pass</span>' if v.get("passed") else
              '<span class="fail">FAIL</span>'] for name, v in splits.items()],
            [1, 2, 3], "int8-splits", wrapped=[4]))
    parts.append(sensitivity_chart(search, set(kept), f"{where}: fallback"))
    if kept:
        parts.append(table_html(["kept node", "what it is"],
                            [[f"<code>{html.escape(n)}</code>",
                              html.escape(str(hints.get(n) or ""))] for n in kept],
                            table_id="kept-layers"))
    parts.append("</section>")
    return "".join(parts)


def _before_after(m: Mapping[str, JsonValue], where: str) -> str:
    """The worst sample before and after the fallback search (the precision stage's
    ``AttemptSummary`` of each: at the profile corners, and on the search split)."""
    before = json_object(m.get("before"), f"{where}: before")
    after = json_object(m.get("after"), f"{where}: after")

    def worst(summary: Mapping[str, JsonValue], key: str, which: str) -> float | None:
        return json_number(summary.get(key), f"{where}: {which}.{key}")

    text = ("Worst sample at the profile corners before / after the fallback search: "
            f"<b id='worst-before'>{number_cell(worst(before, 'worst_metric', 'before'), '.4f')}"
            f"</b> / <b id='worst-after'>"
            f"{number_cell(worst(after, 'worst_metric', 'after'), '.4f')}</b>")
    search_before = worst(before, "search_worst_metric", "before")
    search_after = worst(after, "search_worst_metric", "after")
    if search_before is not None or search_after is not None:
        text += (f" (search split {number_cell(search_before, '.4f')} / "
                 f"{number_cell(search_after, '.4f')})")
    return text + "."


def cpu_model_section(report: BuildReport) -> str:
    """What ONNX Runtime serves on the CPU: the fusions, the INT8 form and its integer
    kernels, and for --precision auto the candidates' latency and accuracy and the reason."""
    stage = report.stage("cpu_model")
    if stage is None or stage.status != "ok":
        return ""
    m = stage.metrics
    where = "the CPU model stage's metrics"
    fused = ", ".join(f"{n} {html.escape(op)}" for op, n in
                      json_object(m.get("fused_operators"), f"{where}: fused_operators").items()
                      if n) or "nothing fused"
    parts = ["<section id='cpu-model'><h2>CPU model (ONNX Runtime)</h2>",
             f"<p>Served form: <b>{html.escape(str(m.get('form')))}</b>. Fused: {fused} "
             f"({m.get('nodes_before')} → {m.get('nodes_after')} nodes).</p>"]
    if m.get("int8_form"):
        kernels = ", ".join(f"{n} {html.escape(op)}" for op, n in json_object(
            m.get("integer_kernels"), f"{where}: integer_kernels").items()) or "none"
        kept = ", ".join(html.escape(str(n)) for n in json_list(
            m.get("kept_fp32_layers"), f"{where}: kept_fp32_layers")) or "none"
        parts.append(f"<p>INT8 form: {html.escape(str(m['int8_form']))}; "
                     f"{html.escape(str(int8_weight_layers(m)))} weight layers "
                     "(Conv/MatMul/Gemm) INT8; "
                     f"integer kernels in the graph ONNX Runtime runs: {kernels}; kept in "
                     f"FP32: {kept}.</p>")
    auto = json_object(m.get("auto"), f"{where}: auto")
    if auto:
        parts += _auto_choice(auto, f"{where}: auto")
    parts.append("</section>")
    return "".join(parts)


def _auto_choice(auto: Mapping[str, JsonValue], where: str) -> list[str]:
    """--precision auto's table: each candidate's worst sample, gates and p50 per corner."""
    winner = json_text(auto.get("winner"), f"{where}.winner")
    candidates = [json_object(c, f"{where}.candidates[{i}]") for i, c in
                  enumerate(json_list(auto.get("candidates"), f"{where}.candidates"))]
    corners = list(json_object(candidates[0].get("p50_ms"), f"{where}.candidates[0].p50_ms")
                   if candidates else [])
    rows = []
    for i, c in enumerate(candidates):
        at = f"{where}.candidates[{i}]"
        name = html.escape(json_text(c.get("name"), f"{at}.name"))
        p50 = json_object(c.get("p50_ms"), f"{at}.p50_ms")
        spread = json_object(c.get("spread"), f"{at}.spread")
        timings = [f"{json_number(p50.get(k), f'{at}.p50_ms.{k}') or 0.0:.2f} "
                   f"(±{json_number(spread.get(k), f'{at}.spread.{k}') or 0.0:.0%})"
                   for k in corners]
        rows.append([f"<b>{name}</b>" if c.get("name") == winner else name,
                     number_cell(json_number(c.get("worst"), f"{at}.worst"), ".4f"),
                     '<span class="pass">pass</span>' if c.get("passed") else
                     '<span class="fail">FAIL</span>', *timings])
    return ["<h3>--precision auto: accuracy against latency</h3>",
            table_html(["candidate", "worst sample", "gates",
                        *[f"p50 ms {html.escape(k)}" for k in corners]], rows,
                       [1, *range(3, 3 + len(corners))], "auto-precision"),
            f"<p>Served: <b>{html.escape(winner)}</b>: "
            f"{html.escape(json_text(auto.get('reason'), f'{where}.reason'))}.</p>"]


def artifacts_table(report: BuildReport) -> str:
    """Each stage's files, each file once (report.json of builds before the artifact records
    were made unique lists a file two artifact names share twice)."""
    rows = []
    listed: set[str] = set()
    for s in report.stages:
        for a in s.artifacts:
            if a.path in listed:
                continue
            listed.add(a.path)
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
