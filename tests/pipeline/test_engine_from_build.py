"""Convert once, build engines per GPU family (issue 32, item F and "What to build" 2).

A CPU job builds everything up to the engine once (``--no-engine``); each GPU job runs
``trtpack engine BUILD_DIR --target T``, which copies the stages before the engine and runs
the engine and package stages, verified against the FP32 references BUILD_DIR recorded.
TensorRT cannot run here: the engine step is the labelled STAND-IN of
``tests/pipeline/standin_engine.py`` (ONNX Runtime on the engine stage's ONNX). This proves
the flow and that ``trtpack merge`` accepts its output (one ``onnx_sha256`` by
construction), not an engine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.hf_models import minilm_dir
from tests.pipeline.standin_engine import PLAN_HEADER, STANDIN_TENSORRT, use_standin_engine
from trtpack.engine.provenance import EngineProvenance
from trtpack.onnx_tools.files import sha256_file
from trtpack.report import BuildReport


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """What the CPU job makes: tiny-bert for a GPU target with --no-engine and --serve text
    (the tokenizer and post-processing models travel too), and its cache."""
    root = tmp_path_factory.mktemp("convert-once")
    out, cache = root / "onnx", root / "cache"
    result = run_cli("build", "tiny-bert", "--set", "config.vocab_size=30522",
                     "--tokenizer", str(minilm_dir()), "--serve", "text", "--precision", "fp32",
                     "--target", "g5", "--no-engine", "--out", str(out),
                     "--cache-dir", str(cache))
    assert result.exit_code == 0, result.output
    return out, cache


def test_engines_for_two_families_from_one_build_merge(
        converted: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source, cache = converted
    use_standin_engine(monkeypatch)  # STAND-IN: no TensorRT and no GPU here
    builds = []
    for target in ("g4dn", "g5"):
        out = tmp_path / f"tiny-bert-{target}"
        result = run_cli("engine", str(source), "--target", target, "--out", str(out),
                         "--cache-dir", str(cache))
        assert result.exit_code == 0, result.output
        builds.append(out)

    onnx = source / "artifacts" / "simplify" / "model.onnx"  # fp32: the engine's ONNX
    for out, cc in zip(builds, ("7.5", "8.6"), strict=True):
        report = BuildReport.load(out / "report.json")
        assert report.status == "ok" and report.target in out.name
        stages = {s.name: s for s in report.stages}
        assert stages["export"].message.endswith(f"(copied from {source})")
        assert stages["engine"].status == "ok" and not stages["engine"].cached
        engine_rows = [r for r in report.verification if r.check == "engine-vs-onnx"]
        assert engine_rows and all(r.passed for r in engine_rows)
        assert any(r.check == "onnx-vs-torch" for r in report.verification)  # carried over
        plan = out / "model_repository" / "tiny-bert" / "1" / "model.plan"
        assert plan.read_bytes().startswith(PLAN_HEADER)
        prov = EngineProvenance.load(plan.with_name("model.plan.json"))
        assert prov.onnx_sha256 == sha256_file(onnx)  # one ONNX for every family
        assert prov.compute_capability == cc and prov.tensorrt_version == STANDIN_TENSORRT

    merged = tmp_path / "fleet"
    result = run_cli("merge", *map(str, builds), "--out", str(merged))
    assert result.exit_code == 0, result.output
    record = json.loads((merged / "merge.json").read_text())
    assert {"tiny-bert_tokenizer", "tiny-bert_ensemble"} <= set(record["models"]), record
    assert {e["compute_capability"]: e["file"] for e in record["engines"]} == \
        {"7.5": "model.sm75.plan", "8.6": "model.sm86.plan"}, record


def test_a_changed_reference_is_refused(converted: tuple[Path, Path], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The references an engine is verified against are the files the CPU job recorded."""
    source, cache = converted
    copy = tmp_path / "changed"
    shutil.copytree(source, copy)
    with (copy / "artifacts" / "verify" / "fp32_outputs.npz").open("ab") as f:
        f.write(b"\0")
    use_standin_engine(monkeypatch)
    result = run_cli("engine", str(copy), "--target", "g5", "--out", str(tmp_path / "o"),
                     "--cache-dir", str(cache))
    assert result.exit_code == 2, result.output
    assert "fp32_outputs.npz is not the file its report recorded" in result.output


def test_an_engine_build_or_a_cpu_build_is_refused(converted: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    source, _ = converted
    result = run_cli("engine", str(source), "--target", "cpu", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "not a GPU target" in result.output, result.output
    result = run_cli("engine", str(tmp_path), "--target", "g5", "--out", str(tmp_path / "o"))
    assert result.exit_code == 2 and "not a trtpack build folder" in result.output


def test_without_tensorrt_it_is_exit_3_before_any_work(converted: tuple[Path, Path],
                                                       tmp_path: Path) -> None:
    from trtpack.machine.packages import tensorrt_available

    if tensorrt_available():
        pytest.skip("TensorRT is installed here")
    source, _ = converted
    result = run_cli("engine", str(source), "--target", "g5", "--out", str(tmp_path / "o"))
    assert result.exit_code == 3, result.output
    assert not (tmp_path / "o").exists()
