"""OUT/report.html: self-contained, opened in headless Chromium (Debian's `chromium`, which
`make test` installs when missing), screenshot not blank, the charts rendered."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli
from trtpack.report import BuildReport, StageResult
from trtpack.report_page.html import render_report_html

SERVED_COLOR = (0x2A, 0x9D, 0x8F)  # report_page.html.COLORS["served"], the served model's bars


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
               "before": {"worst": 0.81}, "after": {"worst": 0.995},
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
