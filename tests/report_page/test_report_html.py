"""OUT/report.html: self-contained, opened in headless Chromium (Debian's `chromium`, which
`make test` installs when missing), screenshot not blank, the charts rendered; at 1280 px
nothing overflows, measured in the page (tables against their boxes, chart labels against
their charts); the content says what a reader needs (worst sample before / after the INT8
search, held-out rows by name, which metric gates, each file once, stages from the cache)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli
from trtpack.precision.metrics import AttemptSummary
from trtpack.report import BuildReport, StageResult
from trtpack.report_page.html import render_report_html
from trtpack.verify.compare import trim_text

SERVED_COLOR = (0x2A, 0x9D, 0x8F)  # report_page.html.COLORS["served"], the served model's bars
TINY_PROFILES = ["1x4:2x8:4x16", "2x16:4x32:8x64"]  # those of conftest's tiny_build
WIDTH = 1280

# Run in a copy of the page (the page itself has no scripts): measures each table against its
# own box and against the box that would scroll it sideways (its section), each SVG text's
# bounding box against its chart's, and reads the cells of some tables back; writes it all as
# JSON into <pre id="measured">, which --dump-dom returns.
MEASURE_JS = """
const out = {viewport: document.documentElement.clientWidth,
             pageWidth: document.documentElement.scrollWidth, tables: [], labels: [],
             cells: {}, text: {}};
for (const t of document.querySelectorAll("table")) {
  let box = t.parentElement;
  while (box !== document.body && getComputedStyle(box).overflowX === "visible")
    box = box.parentElement;
  out.tables.push({id: t.id, scrollWidth: t.scrollWidth, clientWidth: t.clientWidth,
                   boxScrollWidth: box.scrollWidth, boxClientWidth: box.clientWidth,
                   right: t.getBoundingClientRect().right,
                   boxRight: box.getBoundingClientRect().right});
  if (t.id) out.cells[t.id] = [...t.querySelectorAll("tbody tr")].map(
      r => [...r.cells].map(c => c.textContent.trim()));
}
for (const svg of document.querySelectorAll("figure.chart svg")) {
  const c = svg.getBoundingClientRect();
  for (const label of svg.querySelectorAll("text")) {
    const b = label.getBoundingClientRect();
    if (b.width === 0) continue;
    out.labels.push({chart: svg.closest("figure").id, text: label.textContent,
                     over: Math.max(c.left - b.left, b.right - c.right,
                                    c.top - b.top, b.bottom - c.bottom)});
  }
}
for (const id of ["worst-before", "worst-after", "cache-note", "verification-gate"]) {
  const el = document.getElementById(id);
  if (el) out.text[id] = el.textContent;
}
const pre = document.createElement("pre");
pre.id = "measured";
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
"""


@pytest.fixture(scope="module")
def benched(tiny_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny-bert build (two profiles) with benchmark rows."""
    out = tmp_path_factory.mktemp("page") / "tiny"
    shutil.copytree(tiny_build, out)
    result = run_cli("bench", str(out), "--seconds", "0.1", "--threads", "1")
    assert result.exit_code == 0, result.output
    return out


def _chromium(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium")
    if binary is None:
        pytest.skip("chromium is not installed (make test installs Debian's package)")
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={cwd / 'chromium-profile'}", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd, check=False)


def _measure(page: Path, tmp_path: Path) -> dict:
    """``page`` opened at 1280 px in headless Chromium, measured by ``MEASURE_JS``."""
    probe = tmp_path / f"measure-{page.parent.name}.html"
    probe.write_text(page.read_text().replace("</body>", f"<script>{MEASURE_JS}</script></body>"))
    dom = _chromium(f"--window-size={WIDTH},1600", "--dump-dom", probe.as_uri(), cwd=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'<pre id="measured">(.*?)</pre>', dom.stdout, re.S)
    assert found is not None, dom.stdout[-2000:]
    import html

    measured: dict = json.loads(html.unescape(found.group(1)))
    assert measured["viewport"] == WIDTH
    return measured


def assert_fits(measured: dict) -> None:
    """No table wider than its box (nothing to scroll sideways, no column cut) and no chart
    label outside its chart, as the browser laid them out."""
    assert measured["tables"] and measured["pageWidth"] <= measured["viewport"]
    wide = [t for t in measured["tables"]
            if t["scrollWidth"] > t["clientWidth"] or t["boxScrollWidth"] > t["boxClientWidth"]
            or t["right"] > t["boxRight"] + 0.5]
    assert not wide, wide
    assert measured["labels"]
    cut = [label for label in measured["labels"] if label["over"] > 0.5]
    assert not cut, cut


@pytest.fixture(scope="module")
def int8_build(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path) -> Path:
    """tiny-bert INT8 as a GPU build serves it (the Q/DQ graph of the precision stage, which
    ``--target cpu`` skips when its CPU form passes): its held-out rows and INT8 sections."""
    out = tmp_path_factory.mktemp("int8") / "out"
    profiles = [a for p in TINY_PROFILES for a in ("--profile", p)]
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "g5", "--no-engine",
                     "--precision", "int8", *profiles, "--out", str(out),
                     "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    return out


def minilm_sensitivity() -> list[dict]:
    """Sensitivity rows named as a 6-layer BERT's search names them (minilm's module paths,
    the longest of them 47 characters; one group of two layers): the tiny model passes
    without a search, so its report has none."""
    parts = ["attention.output.dense", "intermediate.dense", "attention.self.query",
             "output.dense"]
    rows = [{"nodes": [f"node_MatMul_{i}"], "damage": 10 ** -(1 + i % 6),
             "layers": [f"encoder.layer.{i % 6}.{parts[i % 4]} (MatMul)"]} for i in range(24)]
    rows[0]["layers"] = ["encoder.layer.5.attention.self.query (MatMul)",
                         "encoder.layer.5.attention.self.key (MatMul)"]
    return rows


def test_every_build_writes_a_self_contained_page(tiny_build: Path) -> None:
    page = (tiny_build / "report.html").read_text()
    # nothing to fetch: no scripts, stylesheets, images or fonts from elsewhere
    assert not re.search(r"<(script|link|img|iframe)\b", page)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "@import" not in page
    assert not re.search(r"url\((?!#)", page)  # only references inside the page (SVG clips)
    assert 'id="chart-stages"' in page
    report = json.loads((tiny_build / "report.json").read_text())
    for stage in report["stages"]:
        if stage["status"] == "ok":
            assert f'<g id="bar-stage-{stage["name"]}">' in page
    for artifact in (a for s in report["stages"] for a in s["artifacts"]):
        assert artifact["sha256"] in page and artifact["path"] in page


def test_page_opens_in_headless_chromium_with_its_charts(benched: Path, tmp_path: Path
                                                         ) -> None:
    url = (benched / "report.html").resolve().as_uri()
    dom = _chromium("--dump-dom", url, cwd=tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    for chart in ("chart-stages", "chart-benchmark"):
        assert f'id="{chart}"' in html
    rows = json.loads((benched / "report.json").read_text())["benchmark"]["rows"]
    # one bar per measured row (2 profiles x 3 corners x 3 runtimes), as the browser parsed it
    assert len(rows) == 18
    for r in rows:
        assert f'id="bar-bench-{r["runtime"]}-p{r["profile"]}-{r["corner"]}"' in html
    assert html.count('id="bar-stage-') >= 4
    assert "<table" in html and 'id="verification"' in html

    shot = tmp_path / "report.png"
    done = _chromium("--window-size=1280,2000", f"--screenshot={shot}", url, cwd=tmp_path)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    from matplotlib.image import imread

    pixels = (imread(str(shot))[..., :3] * 255).round().astype(np.int16)
    assert pixels.shape[:2] == (2000, 1280)
    flat = pixels.reshape(-1, 3)
    # not blank: the most common colour (the background) is far from all of the page
    _, counts = np.unique(flat, axis=0, return_counts=True)
    assert counts.max() / len(flat) < 0.8
    # the served model's bars were drawn (their colour covers a visible area)
    served = np.abs(flat - np.array(SERVED_COLOR)).sum(axis=1) <= 6
    assert served.sum() > 2000


def test_int8_section_charts_the_sensitivity_and_lists_the_kept_layers() -> None:
    """The page from a report whose precision stage searched (the numbers are the input;
    what is checked is how the page shows them)."""
    groups = [{"nodes": [f"/layer.{i}/MatMul"], "damage": d, "worst": 1 - d,
               "layers": [f"encoder.layer.{i}.output.dense (MatMul)"], "kept_quantized": i > 0}
              for i, d in enumerate([0.2, 0.05, 0.001, 0.0001])]
    metrics = {"precision": "int8", "excluded_by_fallback": ["/layer.0/MatMul"],
               "excluded_node_hints": {"/layer.0/MatMul": "layer 0 ffn"},
               "high_precision": "fp32",
               "low_precision": {"matmul_gemm_low_precision": 3, "matmul_gemm_nodes": 4,
                                 "matmul_gemm_share": 0.75},
               "before": asdict(AttemptSummary(0.9037, 0.8554, 3.7, 3, False, False)),
               "after": asdict(AttemptSummary(0.9986, 0.9960, 2.2, 0, True, True)),
               "fallback": {"sensitivity": groups},
               "splits": {"calibration": {"samples": 30, "worst": 0.997, "mean": 0.999,
                                          "worst_text": "A longer sentence.", "passed": True},
                          "search": {},
                          "holdout": {"samples": 10, "worst": 0.9912, "mean": 0.998,
                                      "worst_text": "Thanks!", "passed": True}}}
    report = BuildReport("m", "int8", "cpu", ["1x8:4x32:8x128"], "/tmp/m", stages=[
        StageResult("precision", "ok", seconds=3.0, metrics=metrics)])
    page = render_report_html(report, Path("/nonexistent"))
    assert 'id="chart-sensitivity"' in page
    assert page.count('<g id="bar-sensitivity-') == 4
    assert page.count("-kept\">") == 1 and page.count("-int8\">") == 3
    assert 'id="kept-layers"' in page and "/layer.0/MatMul" in page
    assert "3/4 MatMul/Gemm" in page
    # the worst sample before and after the search, as the stage recorded them
    assert "<b id='worst-before'>0.9037</b> / <b id='worst-after'>0.9986</b>" in page
    assert "search split 0.8554 / 0.9960" in page
    # the chart names each group by its module path; the splits table shows each split's worst
    assert "encoder.layer.2.output.dense (MatMul)" in page
    assert 'id="int8-splits"' in page and "Thanks!" in page and "0.9912" in page
    assert "<td>search</td>" not in page  # an empty split is left out
    # --target cpu: the search ran inside the CPU model stage (its first form failed)
    cpu_target = BuildReport("m", "int8", "cpu", ["1x8:4x32:8x128"], "/tmp/m", stages=[
        StageResult("precision", "skipped", seconds=0.0),
        StageResult("cpu_model", "ok", seconds=3.0, metrics={"form": "int8", "search": metrics})])
    assert 'id="kept-layers"' in render_report_html(cpu_target, Path("/nonexistent"))
    # ... and where the first form passed, no search ran and no INT8 search section is drawn
    served_first = BuildReport("m", "int8", "cpu", ["1x8:4x32:8x128"], "/tmp/m", stages=[
        StageResult("precision", "skipped", seconds=0.0),
        StageResult("cpu_model", "ok", seconds=3.0, metrics={"form": "int8"})])
    assert "chart-sensitivity" not in render_report_html(served_first, Path("/nonexistent"))


def test_verification_columns_added_later_are_shown(benched: Path) -> None:
    """Keys beyond the ones known today (e.g. per-sample worst/mean) get their own column."""
    report = BuildReport.load(benched / "report.json")
    row = report.verification[0]
    row.worst_sample_metric = 0.987654  # type: ignore[attr-defined]
    page = render_report_html(report, benched)
    assert "worst sample metric" in page and "0.987654" in page


def test_page_fits_1280_px_and_says_what_the_numbers_mean(benched: Path, tmp_path: Path
                                                         ) -> None:
    """The FP32 build with benchmark rows: every table fits its section, every label its
    chart; the note above the verification table says what gates and why the relative
    difference does not; each file is listed once under Artifacts."""
    measured = _measure(benched / "report.html", tmp_path)
    assert_fits(measured)
    assert {"verification", "artifacts", "benchmark"} <= {t["id"] for t in measured["tables"]}
    assert {label["chart"] for label in measured["labels"]} >= {"chart-stages",
                                                                 "chart-benchmark"}
    note = measured["text"]["verification-gate"]
    assert "pooled cosine" in note and "worst sample" in note and "min_cosine" in note
    assert "near zero" in note and "not the rel diff" in note
    report = BuildReport.load(benched / "report.json")
    paths = [a.path for s in report.stages for a in s.artifacts]
    assert len(paths) == len(set(paths))  # recorded once (cpu_onnx is cpu_fp32_onnx here)
    shown = [row[1] for row in measured["cells"]["artifacts"]]
    assert sorted(shown) == sorted(paths)
    assert any(p.startswith("artifacts/cpu_model/") for p in shown)


def test_int8_page_shows_the_search_and_the_held_out_rows_and_fits(
        int8_build: Path, tmp_path: Path) -> None:
    """A real INT8 build's page, with a 6-layer model's sensitivity names put into its
    report (see ``minilm_sensitivity``): the worst sample before / after as the precision
    stage recorded it, held-out rows named as such (never ``profile -1``), every table and
    label inside the page at 1280 px."""
    report = BuildReport.load(int8_build / "report.json")
    stage = report.stage("precision")
    assert stage is not None
    stage.metrics["fallback"]["sensitivity"] = minilm_sensitivity()
    for i, row in enumerate(report.verification):
        # as wide as a real model's rows (minilm INT8's: rel diffs up to 3.33e+05, texts as
        # long as the rows keep); the tiny model has no tokenizer and smaller diffs
        row.worst_sample, row.worst_text = 7, trim_text("Mount the volume read-only and "
                                                        "restart the container to apply " * 3)
        row.max_rel_diff = 333_826.53125 / (i + 1)
        row.max_abs_diff = 2.1844735145568848e-06 * (i + 1)
    page = tmp_path / "int8" / "report.html"
    page.parent.mkdir()
    page.write_text(render_report_html(report, int8_build))
    measured = _measure(page, tmp_path)
    assert_fits(measured)
    charted = {label["text"] for label in measured["labels"]
               if label["chart"] == "chart-sensitivity"}
    assert "encoder.layer.0.attention.output.dense (MatMul)" in charted
    assert "encoder.layer.5.attention.self.query (MatMul) and 1 more" in charted

    before, after = stage.metrics["before"], stage.metrics["after"]
    assert measured["text"]["worst-before"] == f"{before['worst_metric']:.4f}"
    assert measured["text"]["worst-after"] == f"{after['worst_metric']:.4f}"

    rows = measured["cells"]["verification"]
    held = [r for r in report.verification if r.profile < 0]
    assert held and len(rows) == len(report.verification)
    for row, cells in zip(report.verification, rows, strict=True):
        where = cells[1]
        if row.profile < 0:
            assert where.startswith("held-out "), cells
        else:
            assert where.startswith(f"p{row.profile} {row.corner}"), cells
        assert "-1" not in where
        # the gate's threshold beside the worst sample's value
        assert row.threshold is not None and cells[3].endswith(f"≥\xa0{row.threshold:g}"), cells
        # a large relative diff on a passing row points at the note that explains it
        assert cells[7].endswith("†") == (row.passed and row.max_rel_diff > 1), cells
    assert any(r.passed and r.max_rel_diff > 1 for r in report.verification)
    assert "near zero" in measured["text"]["verification-gate"]
    assert "held-out data" in page.read_text()


def test_cached_rebuild_says_its_stages_came_from_the_cache(
        tiny_build: Path, cache_dir: Path, tmp_path: Path) -> None:
    """The same build again: every stage comes from the cache, and the header says so beside
    a build time and peak memory that cover only this run."""
    out = tmp_path / "again"
    profiles = [a for p in TINY_PROFILES for a in ("--profile", p)]
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu", *profiles,
                     "--out", str(out), "--cache-dir", str(cache_dir))
    assert result.exit_code == 0, result.output
    report = BuildReport.load(out / "report.json")
    reused = [s.name for s in report.stages if s.cached]
    done = [s for s in report.stages if s.status != "skipped"]
    assert {"export", "simplify", "verify"} <= set(reused)
    measured = _measure(out / "report.html", tmp_path)
    assert_fits(measured)
    note = measured["text"]["cache-note"]
    assert f"{len(reused)} of {len(done)} stages reused from the stage cache" in note
    assert all(name in note for name in reused)
    # and how long those stages took when they ran (in tiny_build, or before it from the cache)
    first = {s.name: s for s in BuildReport.load(tiny_build / "report.json").stages}
    ran = [s.ran_seconds for s in report.stages if s.cached]
    assert ran == [first[n].ran_seconds if first[n].cached else first[n].seconds for n in reused]
    assert f"{sum(ran):.1f} s when they ran" in note  # type: ignore[arg-type]
    assert "only the work done in this run" in note
    page = (out / "report.html").read_text()
    assert "build time (this run)" in page and "peak memory (this run)" in page
    # a build with nothing reused has no such note
    assert 'id="cache-note"' not in (tiny_build / "report.html").read_text() or \
        any(s.cached for s in BuildReport.load(tiny_build / "report.json").stages)
