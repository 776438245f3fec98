"""``trtpack bench``'s up-front check of an engine build: the GPU it runs on and TensorRT.

No GPU or TensorRT here: GPU detection and the TensorRT probe are stubbed (``detect_gpus`` and
``probe_tensorrt`` in ``trtpack.machine.local_targets`` return the values below); the engine is
a few bytes with a provenance file, as a finished build leaves it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from trtpack.bench.runners import check_runtime
from trtpack.engine.provenance import EngineProvenance, provenance_path
from trtpack.errors import ExitCode, MissingEnvironmentError
from trtpack.machine import local_targets
from trtpack.machine.gpus import LocalGpu
from trtpack.machine.packages import TensorRTProbe
from trtpack.pipeline.build_folder import BuildFolder
from trtpack.report import BuildReport

# stand-ins for detection (no GPU here); B200 (10.0) has no family in trtpack's table
B200 = LocalGpu("NVIDIA B200", (10, 0), "570.124.06", 183359, 0, "GPU-b200")
L4 = LocalGpu("NVIDIA L4", (8, 9), "550.54.15", 23034, 0, "GPU-l4")
T4 = LocalGpu("Tesla T4", (7, 5), "550.54.15", 15360, 0, "GPU-t4")
TRT = "10.13.3.9"
Install = Callable[..., None]


def engine_build(root: Path, target: str, gpu: LocalGpu, hardware: str = "none",
                 tensorrt: str = TRT) -> BuildFolder:
    version_dir = root / "model_repository" / "minilm" / "1"
    version_dir.mkdir(parents=True)
    plan = version_dir / "model.plan"
    plan.write_bytes(b"plan")
    EngineProvenance(
        trtpack_version="0.1.0", tensorrt_version=tensorrt, gpu_name=gpu.name,
        compute_capability=gpu.sm, target=target, precision="fp16",
        profiles=[{"input_ids": {"min": [1, 8], "opt": [4, 32], "max": [8, 128]}}],
        build_options={"hardware_compatibility": hardware, "version_compatible": False},
        onnx_sha256="a" * 64, plan_sha256="b" * 64, plan_bytes=4,
    ).save(provenance_path(plan))
    report = BuildReport("minilm", "fp16", target, ["1x8:4x32:8x128"], str(root))
    return BuildFolder(root, report, plan, root / "model.onnx", root / "reference.npz")


@pytest.fixture
def machine_with(monkeypatch: pytest.MonkeyPatch) -> Install:
    def install(gpu: LocalGpu, tensorrt: str = TRT) -> None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        monkeypatch.setattr(local_targets, "detect_gpus", lambda: [gpu])
        monkeypatch.setattr(local_targets, "probe_tensorrt",
                            lambda timeout=120: TensorRTProbe(True, tensorrt))
    return install


def test_an_engine_for_a_gpu_outside_the_table_benches_on_that_gpu(
        tmp_path: Path, machine_with: Install) -> None:
    """``--target auto`` on a B200 records target 'sm100'; bench on the B200 proceeds (it
    raised "unknown target 'sm100'", exit 2)."""
    machine_with(B200)
    check_runtime(engine_build(tmp_path, "sm100", B200))


def test_an_engine_for_a_gpu_outside_the_table_refuses_another_gpu(
        tmp_path: Path, machine_with: Install) -> None:
    machine_with(L4)
    with pytest.raises(MissingEnvironmentError) as info:
        check_runtime(engine_build(tmp_path, "sm100", B200))
    assert info.value.exit_code == ExitCode.MISSING_ENVIRONMENT
    assert "B200" in str(info.value) and "L4" in str(info.value)


def test_an_ampere_plus_engine_benches_on_any_ampere_or_newer_gpu(
        tmp_path: Path, machine_with: Install) -> None:
    """Built for g5 (A10G) on an A100 with hardware compatibility 'ampere+': it runs on an L4
    (it was refused: the check compared the target's compute capability 8.6 with 8.9)."""
    machine_with(L4)
    a100 = LocalGpu("NVIDIA A100-SXM4-40GB", (8, 0))
    check_runtime(engine_build(tmp_path, "g5", a100, hardware="ampere+"))


def test_an_ampere_plus_engine_refuses_a_turing_gpu(
        tmp_path: Path, machine_with: Install) -> None:
    machine_with(T4)
    a100 = LocalGpu("NVIDIA A100-SXM4-40GB", (8, 0))
    with pytest.raises(MissingEnvironmentError, match="ampere"):
        check_runtime(engine_build(tmp_path, "g5", a100, hardware="ampere+"))


def test_an_engine_needs_the_tensorrt_that_built_it(
        tmp_path: Path, machine_with: Install) -> None:
    machine_with(B200, tensorrt="10.14.1.48")
    with pytest.raises(MissingEnvironmentError) as info:
        check_runtime(engine_build(tmp_path, "sm100", B200))
    assert TRT in str(info.value) and "10.14.1.48" in str(info.value)
