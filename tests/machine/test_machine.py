"""GPU/TensorRT detection and the up-front environment check (exit 3), on CPU.

Detected GPUs and TensorRT probes are passed in as plain data (``LocalGpu``,
``TensorRTProbe``): nothing here pretends to be TensorRT.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from trtpack.errors import ExitCode, MissingEnvironmentError
from trtpack.machine import gpus, local_targets, packages
from trtpack.machine.gpus import LocalGpu
from trtpack.machine.packages import TensorRTProbe
from trtpack.machine.targets import resolve_target

SMI_CSV = """\
0, NVIDIA A10G, 8.6, 550.54.15, 23028, GPU-aaaa-1111
1, Tesla T4, 7.5, 550.54.15, 15360, GPU-bbbb-2222
"""

A10G = LocalGpu("NVIDIA A10G", (8, 6), "550.54.15", 23028, 0, "GPU-aaaa-1111")
T4 = LocalGpu("Tesla T4", (7, 5), "550.54.15", 15360, 1, "GPU-bbbb-2222")
TRT_OK = TensorRTProbe(True, "10.13.0.35")
TRT_MISSING = TensorRTProbe(False, None, "the Python package 'tensorrt' is not installed")


def test_parse_nvidia_smi_csv() -> None:
    assert gpus.parse_nvidia_smi_csv(SMI_CSV) == [A10G, T4]


def test_parse_nvidia_smi_skips_garbage() -> None:
    text = "No devices were found\n0, NVIDIA L4, [N/A], 550, 23034, GPU-x\n"
    assert gpus.parse_nvidia_smi_csv(text) == []


def test_parse_memory_not_a_number() -> None:
    (g,) = gpus.parse_nvidia_smi_csv("0, NVIDIA L4, 8.9, 550.1, [N/A], GPU-x\n")
    assert g.memory_mb is None and g.compute_capability == (8, 9)


def test_parse_cuda_driver_version() -> None:
    header = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: 12.4     |"
    assert gpus.parse_cuda_driver_version(header) == "12.4"
    assert gpus.parse_cuda_driver_version("no header") is None


@pytest.mark.parametrize(("env", "expected"), [
    (None, [A10G, T4]), ("1", [T4]), ("1,0", [T4, A10G]), ("GPU-bbbb", [T4]), ("", []),
    ("7,0", []),  # CUDA stops at the first invalid entry
])
def test_visible_gpus(env: str | None, expected: list[LocalGpu]) -> None:
    """With CUDA_DEVICE_ORDER=PCI_BUS_ID, CUDA's indices are nvidia-smi's."""
    seen = gpus.visible_gpus([A10G, T4], env, "PCI_BUS_ID")
    assert list(seen.gpus) == expected and seen.problem is None


@pytest.mark.parametrize(("text", "version"), [
    ("10.13.0.35", (10, 13, 0, 35)), ("11.0.0", (11, 0, 0)), ("10.12.0rc1", (10, 12, 0)),
    ("abc", ()),
])
def test_parse_version(text: str, version: tuple[int, ...]) -> None:
    assert packages.parse_version(text) == version


def test_environment_ok_with_matching_gpu_and_tensorrt() -> None:
    report = local_targets.check_engine_environment(resolve_target("g5"), gpus=[A10G],
                                                    tensorrt=TRT_OK, polygraphy=True)
    assert report.ok and report.gpu == A10G and report.tensorrt_version == "10.13.0.35"


def test_environment_mismatch_names_what_was_found() -> None:
    with pytest.raises(MissingEnvironmentError) as info:
        local_targets.check_engine_environment(resolve_target("g5"), gpus=[T4], tensorrt=TRT_OK,
                                     polygraphy=True)
    message = str(info.value)
    assert info.value.exit_code == ExitCode.MISSING_ENVIRONMENT == 3
    assert "Tesla T4" in message and "7.5" in message and "A10G" in message
    assert "--target cpu" in (info.value.hint or "") and "--no-engine" in (info.value.hint or "")


def test_environment_points_at_a_matching_second_gpu() -> None:
    report = local_targets.engine_environment(resolve_target("g4dn"), gpus=[A10G, T4],
                                              tensorrt=TRT_OK, polygraphy=True)
    assert not report.ok
    assert any("CUDA_VISIBLE_DEVICES=GPU-bbbb-2222" in n for n in report.notes)


def test_environment_old_tensorrt_is_refused() -> None:
    report = local_targets.engine_environment(resolve_target("g5"), gpus=[A10G],
                                    tensorrt=TensorRTProbe(True, "10.3.0"), polygraphy=True)
    assert any("10.3.0" in p and "10.12" in p for p in report.problems)


def test_environment_tensorrt_11_is_accepted() -> None:
    report = local_targets.engine_environment(resolve_target("g5"), gpus=[A10G],
                                    tensorrt=TensorRTProbe(True, "11.4.1"), polygraphy=True)
    assert report.ok


def test_environment_lists_every_missing_thing() -> None:
    report = local_targets.engine_environment(resolve_target("g5"), gpus=[], tensorrt=TRT_MISSING,
                                    polygraphy=False)
    text = " ".join(report.problems)
    assert "no NVIDIA GPU" in text and "tensorrt" in text and "polygraphy" in text


def test_environment_ampere_plus_on_turing_target() -> None:
    report = local_targets.engine_environment(resolve_target("g4dn"), "ampere+", gpus=[T4],
                                    tensorrt=TRT_OK, polygraphy=True)
    assert any("ampere+" in p for p in report.problems)


def test_this_machine_check_without_injection() -> None:
    """The real detection on this machine: with no GPU or TensorRT it must stop with exit 3."""
    if gpus.detect_gpu() is not None and packages.probe_tensorrt().ok:
        pytest.skip("this machine has a GPU and TensorRT; covered by tests/gpu")
    with pytest.raises(MissingEnvironmentError) as info:
        local_targets.check_engine_environment(resolve_target("g5"))
    assert info.value.exit_code == 3
    assert "found" in str(info.value)


def test_targets_table_marks_local_matches() -> None:
    rows = {r.name: r for r in local_targets.targets_table(LocalGpu("NVIDIA L4", (8, 9)))}
    # an L4 builds g6's engines; g6e's L40S needs its own (issue 45, item 2: kNONE engines
    # are meant for the GPU model they were built on)
    assert rows["g6"].local and not rows["g6e"].local and not rows["g5"].local
    assert rows["g5"].compute_capability == "8.6"
    assert not any(r.local for r in local_targets.targets_table(None) if r.name != "cpu")


def test_package_table_reports_without_importing_tensorrt() -> None:
    names = {p.name: p for p in packages.PACKAGES}
    assert {"tensorrt", "polygraphy", "onnxruntime", "tritonclient"} <= set(names)
    assert names["polygraphy"].version()  # a dependency of trtpack[onnx]
    assert names["tensorrt"].version() is None  # not installable here
    assert "tensorrt" not in sys.modules


def test_the_package_table_is_what_a_build_checks_and_records() -> None:
    assert packages.required_modules("build") == {
        "torch": "torch", "transformers": "transformers", "onnx": "onnx",
        "onnxruntime": "onnxruntime", "onnxsim": "onnxsim", "polygraphy": "polygraphy"}
    assert packages.required_modules("modelopt")["modelopt"] == "nvidia-modelopt"
    recorded = packages.recorded_versions()
    assert {"torch", "onnx", "nvidia-modelopt", "tokenizers", "tensorrt"} <= set(recorded)
    assert recorded["onnx"] and recorded["tensorrt"] is None


def test_importing_gpu_module_does_not_import_heavy_packages() -> None:
    code = ("import sys, trtpack.machine, trtpack.machine.local_targets, trtpack.engine, "
            "trtpack.diagnostics.inspection, trtpack.stages.engine; "
            "heavy = [m for m in ('tensorrt', 'torch', 'onnxruntime', 'polygraphy') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
