"""trtpack bench --served against the real tritonserver the suite starts.

The bundled server has only the Python backend: the build's ONNX model is served by the test
stand-in for Triton's onnxruntime backend (``ort_standin_model.py``: the same model.onnx in
ONNX Runtime through the Python backend), so the rows say backend ``python``: they measure
Triton (HTTP, queue, dynamic batching) around that stand-in, not Triton's onnxruntime backend.
perf_analyzer comes from ``make perf-analyzer-env`` (or ``$TRTPACK_PERF_ANALYZER``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.serving.conftest import use_onnxruntime_standin
from tests.serving.tritonserver import ROOT, TritonServer
from trtpack.stages.package import SERVED

pytestmark = pytest.mark.triton

PERF_ANALYZER = ROOT / ".venv-perf" / "perf_analyzer"


@pytest.fixture(scope="module")
def perf_analyzer() -> str:
    given = os.environ.get("TRTPACK_PERF_ANALYZER") or (
        str(PERF_ANALYZER) if PERF_ANALYZER.is_file() else None)
    if given is None:
        pytest.skip("no perf_analyzer: run `make perf-analyzer-env` (or set "
                    "TRTPACK_PERF_ANALYZER)")
    return given


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-bert built for cpu by trtpack (real pipeline, random weights)."""
    out = tmp_path_factory.mktemp("bench-served") / "tiny"
    result = run_cli("build", "tiny-bert", "--random-weights", "--target", "cpu", "--out",
                     str(out), "--cache-dir", str(tmp_path_factory.mktemp("cache")))
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def server(triton_server: Callable[..., TritonServer], build: Path,
           tmp_path_factory: pytest.TempPathFactory) -> TritonServer:
    """The build's repository, its ONNX model on the stand-in, in explicit model control (so
    --compare-batching can load a config variant)."""
    repo = tmp_path_factory.mktemp("served") / "repository"
    shutil.copytree(build / "model_repository", repo)
    use_onnxruntime_standin(repo / "tiny-bert")
    return triton_server(repo, explicit=True)  # type: ignore[no-any-return]


def test_served_throughput_over_concurrencies_with_and_without_batching(
        build: Path, server: TritonServer, perf_analyzer: str) -> None:
    result = run_cli("bench", str(build), "--served", server.http_url, "--no-runtimes",
                     "--seconds", "0.5", "--corners", "opt", "--concurrency", "1,2,4",
                     "--compare-batching", env={"TRTPACK_PERF_ANALYZER": perf_analyzer})
    assert result.exit_code == 0, result.output + server.log()[-3000:]
    served = json.loads((build / "report.json").read_text())["benchmark"]["served"]
    assert served["url"] == server.http_url
    rows = served["rows"]
    for batching in ("dynamic", "none"):
        sweep = [r for r in rows if r["batching"] == batching]
        assert sorted(r["concurrency"] for r in sweep) == [1, 2, 4], rows
        for r in sweep:
            assert r["model"] == "tiny-bert" and r["corner"] == "opt" and r["batch"] == 2
            assert r["backend"] == "python"  # the ONNX Runtime stand-in, see the docstring
            assert r["throughput"] > 0
            assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"] < 60_000
    # the server has the build's own config back (dynamic batching) afterwards
    client = server.client()
    try:
        assert "dynamic_batching" in client.get_model_config("tiny-bert")
    finally:
        client.close()
    page = (build / "report.html").read_text()
    assert 'id="chart-served"' in page and page.count('<g id="line-served-') == 2
    assert "served through Triton" in result.stdout


def test_server_not_serving_the_model_is_exit_3_within_seconds(
        build: Path, server: TritonServer, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(build, other)
    report = json.loads((other / "report.json").read_text())
    report["model"] = "not-served"
    # the package stage's record of what is served (build_folder.served_model_file reads it)
    package = next(s for s in report["stages"] if s["name"] == "package")
    for entry in package["metrics"][SERVED]:
        entry["file"] = entry["file"].replace("/tiny-bert/", "/not-served/")
        entry["model"] = "not-served"
    (other / "report.json").write_text(json.dumps(report))
    (other / "model_repository" / "tiny-bert").rename(other / "model_repository" / "not-served")
    started = time.perf_counter()
    result = run_cli("bench", str(other), "--served", server.http_url, "--no-runtimes")
    assert result.exit_code == 3, result.output
    assert result.stderr.count("error:") == 1 and "does not serve model 'not-served'" \
        in result.stderr
    assert time.perf_counter() - started < 10
