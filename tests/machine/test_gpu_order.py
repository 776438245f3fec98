"""Which GPU CUDA uses, from nvidia-smi's output: MIG devices and machines with different GPUs.

No GPU here: nvidia-smi is stubbed (``which`` and ``subprocess.run`` answer with the texts
below). The texts are RECORDED-FORMAT FIXTURES: the line layout of real ``nvidia-smi -L`` /
``--query-gpu`` output as published from real machines (e.g. two MIG-partitioned
A100-SXM4-40GB in the JASMIN notebook service's docs, an A100 with seven 1g.5gb devices in a
GPU-operator walkthrough); the UUIDs are those listings', the drivers and memory sizes
illustrative. They were not recorded on this machine, which has no GPU.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest

from trtpack.machine import gpus, local_targets
from trtpack.machine.packages import TensorRTProbe
from trtpack.machine.targets import resolve_target

TRT_OK = TensorRTProbe(True, "10.13.3.9")  # stand-in probe result: no TensorRT here

MIG_QUERY = """\
0, NVIDIA A100-SXM4-40GB, 8.0, 550.54.15, 40960, GPU-2927d07e-3fe9-7904-9e08-b08b82d9a37d
1, NVIDIA A100-SXM4-40GB, 8.0, 550.54.15, 40960, GPU-e109d8d9-923e-7235-0429-96b7fdbcbd30
"""
MIG_LIST = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-2927d07e-3fe9-7904-9e08-b08b82d9a37d)
  MIG 1g.10gb     Device  0: (UUID: MIG-6e95ef19-5145-571b-b040-7e731f1c1af3)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-e109d8d9-923e-7235-0429-96b7fdbcbd30)
  MIG 1g.10gb     Device  0: (UUID: MIG-b4bcd4f3-6f69-516d-9404-b5ada80d760b)
"""
# a g5-like host with an extra T4: nvidia-smi's index is the PCI bus order
MIXED_QUERY = """\
0, NVIDIA A10G, 8.6, 550.54.15, 23028, GPU-1f5a0b2c-3d4e-5f60-7182-93a4b5c6d7e8
1, Tesla T4, 7.5, 550.54.15, 15360, GPU-9e8d7c6b-5a49-3827-1605-f4e3d2c1b0a9
"""
MIXED_LIST = """\
GPU 0: NVIDIA A10G (UUID: GPU-1f5a0b2c-3d4e-5f60-7182-93a4b5c6d7e8)
GPU 1: Tesla T4 (UUID: GPU-9e8d7c6b-5a49-3827-1605-f4e3d2c1b0a9)
"""


def stub_nvidia_smi(monkeypatch: pytest.MonkeyPatch, query: str, listing: str) -> None:
    """nvidia-smi answers with recorded-format text (stand-in: no GPU on this machine)."""
    real_run = subprocess.run

    def run(cmd: Sequence[str], *args: object, **kwargs: object) -> object:
        if not cmd or cmd[0] != "/usr/bin/nvidia-smi":
            return real_run(cmd, *args, **kwargs)  # type: ignore[call-overload]
        out = query if any(a.startswith("--query-gpu") for a in cmd) else \
            listing if "-L" in cmd else "| CUDA Version: 12.4 |"
        return subprocess.CompletedProcess(list(cmd), 0, out, "")

    monkeypatch.setattr(gpus.shutil, "which",
                        lambda name: "/usr/bin/nvidia-smi" if name == "nvidia-smi" else None)
    monkeypatch.setattr(gpus.subprocess, "run", run)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)


def environment(target: str) -> local_targets.EnvironmentReport:
    return local_targets.engine_environment(resolve_target(target), tensorrt=TRT_OK,
                                            polygraphy=True)


@pytest.mark.parametrize("device", ["MIG-b4bcd4f3-6f69-516d-9404-b5ada80d760b", "MIG-b4bcd4f3"])
def test_a_mig_device_is_its_gpus_compute_capability(
        monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """On a MIG host CUDA_VISIBLE_DEVICES names MIG devices; the build runs on that device's
    GPU (compute capability 8.0), not "no GPU visible" (exit 3)."""
    stub_nvidia_smi(monkeypatch, MIG_QUERY, MIG_LIST)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", device)
    report = environment("p4d")
    assert report.ok, report.problems
    assert report.gpu is not None and report.gpu.index == 1
    assert report.gpu.compute_capability == (8, 0)
    assert gpus.detect_gpu() == report.gpu


def test_an_unknown_mig_device_is_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    stub_nvidia_smi(monkeypatch, MIG_QUERY, MIG_LIST)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-00000000-0000-0000-0000-000000000000")
    report = environment("p4d")
    assert report.gpu is None and any("not visible" in p or "no NVIDIA GPU" in p
                                      for p in report.problems)


def test_the_old_mig_form_names_its_gpu() -> None:
    found = gpus.parse_nvidia_smi_csv(MIG_QUERY)
    seen = gpus.visible_gpus(
        found, "MIG-GPU-e109d8d9-923e-7235-0429-96b7fdbcbd30/1/0", None, {})
    assert [g.index for g in seen.gpus] == [1] and seen.problem is None


def test_parse_mig_devices_maps_each_device_to_its_gpu() -> None:
    assert gpus.parse_mig_devices(MIG_LIST) == {
        "MIG-6e95ef19-5145-571b-b040-7e731f1c1af3": 0,
        "MIG-b4bcd4f3-6f69-516d-9404-b5ada80d760b": 1,
    }
    assert gpus.parse_mig_devices(MIXED_LIST) == {}


def test_an_index_on_a_mixed_host_without_pci_order_is_not_guessed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA numbers GPUs fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID: index 1 is
    nvidia-smi's T4 only in PCI order. Guessing would record another GPU's compute capability;
    the check stops (exit 3) and says how to choose."""
    stub_nvidia_smi(monkeypatch, MIXED_QUERY, MIXED_LIST)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    report = environment("g4dn")
    assert not report.ok and report.gpu is None
    assert any("CUDA_DEVICE_ORDER=PCI_BUS_ID" in p and "Tesla T4" in p for p in report.problems)
    assert gpus.detect_gpu() is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # unset: CUDA device 0 is "the fastest"
    assert not environment("g5").ok


def test_pci_order_or_a_uuid_chooses_the_gpu_on_a_mixed_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stub_nvidia_smi(monkeypatch, MIXED_QUERY, MIXED_LIST)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    report = environment("g4dn")
    assert report.ok and report.gpu is not None and report.gpu.name == "Tesla T4"
    monkeypatch.delenv("CUDA_DEVICE_ORDER")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1f5a0b2c")
    report = environment("g5")
    assert report.ok and report.gpu is not None and report.gpu.name == "NVIDIA A10G"


def test_identical_gpus_need_no_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two A100-40GB: whichever CUDA calls 1, its compute capability is 8.0."""
    stub_nvidia_smi(monkeypatch, MIG_QUERY, MIG_LIST)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    report = environment("p4d")
    assert report.ok and report.gpu is not None and report.gpu.compute_capability == (8, 0)


def test_doctor_says_why_no_gpu_is_chosen_on_a_mixed_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from trtpack.diagnostics import doctor

    stub_nvidia_smi(monkeypatch, MIXED_QUERY, MIXED_LIST)
    report = doctor.environment_report()
    assert any(s.startswith("GPU: ") and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in s
               for s in report["summary"])
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    report = doctor.environment_report()
    gpu_row = next(c for c in report["components"] if c["name"] == "NVIDIA GPU")
    assert gpu_row["version"] == "NVIDIA A10G (sm 8.6)"
    assert not any(s.startswith("GPU: ") for s in report["summary"])
