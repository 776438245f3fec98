"""What a finished build serves, read back from the record its package stage wrote in
report.json (``served_model_file``), and for a report written before that record, derived once
from its artifacts."""

from __future__ import annotations

import copy
from pathlib import Path

from trtpack.pipeline.build_folder import load_build_report, open_build, served_model_file
from trtpack.stages.package import SERVED


def test_the_served_file_is_the_package_stages_record(tiny_build: Path) -> None:
    report = load_build_report(tiny_build)
    version = tiny_build / "model_repository" / "tiny-bert" / "1"
    assert served_model_file(report, tiny_build) == version / "model.onnx"
    package = report.stage("package")
    assert package is not None
    assert package.metrics[SERVED] == [{"role": "model", "model": "tiny-bert",
                                        "runtime": "onnxruntime_onnx",
                                        "file": "model_repository/tiny-bert/1/model.onnx"}]
    assert served_model_file(report, tiny_build, role="cpu_fallback") is None
    assert open_build(tiny_build).served_model == version / "model.onnx"


def test_the_record_is_what_is_read(tiny_build: Path) -> None:
    """A record naming another file is followed, not re-derived."""
    report = copy.deepcopy(load_build_report(tiny_build))
    package = report.stage("package")
    assert package is not None
    package.metrics[SERVED] = [{"role": "model", "model": "m", "runtime": "tensorrt_plan",
                                "file": "model_repository/m/1/model.plan"}]
    assert served_model_file(report, tiny_build) == \
        tiny_build / "model_repository" / "m" / "1" / "model.plan"


def test_a_report_from_before_the_record_is_derived_once(tiny_build: Path) -> None:
    report = copy.deepcopy(load_build_report(tiny_build))
    package = report.stage("package")
    assert package is not None
    del package.metrics[SERVED]
    assert served_model_file(report, tiny_build) == \
        tiny_build / "model_repository" / "tiny-bert" / "1" / "model.onnx"
    assert served_model_file(report, tiny_build, role="cpu_fallback") is None


def test_inspect_names_the_served_file_from_the_record(tiny_build: Path) -> None:
    """``trtpack inspect`` on a build (or a path inside it) says what it serves: the
    package stage's record, read by ``served_model_file``."""
    from tests.conftest import run_cli
    from trtpack.diagnostics.model_files import build_record

    record = build_record(tiny_build / "model_repository")
    assert record is not None and record.served == "model_repository/tiny-bert/1/model.onnx"
    result = run_cli("inspect", str(tiny_build))
    assert result.exit_code == 0, result.output
    assert "serves model_repository/tiny-bert/1/model.onnx" in result.stdout
