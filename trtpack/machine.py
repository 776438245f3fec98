"""This machine: its GPUs and driver, TensorRT, and the one table of the packages trtpack uses.

GPUs come from ``nvidia-smi`` (or NVML through ``pynvml`` where nvidia-smi is absent).
Python packages are found with ``importlib.util.find_spec`` and ``importlib.metadata``;
TensorRT itself is imported only in a subprocess (``probe_tensorrt``), so a broken
installation is reported instead of crashing the caller, and only when it is installed.
Everything here returns data; the CLI renders it (``trtpack doctor``, ``trtpack targets``).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Literal

MIN_TENSORRT = (10, 12)
"""The oldest TensorRT the engine stage supports (strongly typed networks, tiling level)."""

TENSORRT_DISTRIBUTIONS = ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu13-bindings",
                          "tensorrt-cu12-bindings")
"""Names the TensorRT Python bindings are installed under (NGC containers use ``tensorrt``)."""

TENSORRT_INSTALL = (
    "pip install 'trtpack[tensorrt-cu12]' (CUDA 12 driver) or 'trtpack[tensorrt-cu13]' (CUDA "
    "13): PyPI's tensorrt packages fetch TensorRT's libraries from NVIDIA's index at install "
    "time; or run in an NGC container that ships TensorRT (Dockerfile.ngc)"
)
"""How to get TensorRT: the exit-3 hint, ``trtpack doctor`` and the docs (GPU and TensorRT)
say this."""

# --- packages -------------------------------------------------------------------------------

NeededFor = Literal["build", "modelopt", "engine", "serving", "report"]


@dataclass(frozen=True)
class Package:
    """A Python package trtpack uses: its pip name, import name, and what it is for.

    ``needed_for``: ``build`` packages are checked before every build (exit 3 when one is
    missing), ``modelopt`` ones before an fp16/int8 build; ``shown``: a row of ``trtpack
    doctor``; ``recorded``: its version is in the build report (and the stage cache keys).
    """

    name: str
    module: str
    needed_for: NeededFor
    purpose: str = ""
    shown: bool = True
    recorded: bool = True
    distributions: tuple[str, ...] = ()  # where installed under other names than ``name``

    def version(self) -> str | None:
        if self.name == "tensorrt":
            return tensorrt_version()
        return distribution_version(*(self.distributions or (self.name,)))


PACKAGES: tuple[Package, ...] = (
    Package("torch", "torch", "build", "export (PyTorch → ONNX)"),
    Package("transformers", "transformers", "build", "loading Hugging Face models"),
    Package("onnx", "onnx", "build", "every ONNX stage"),
    Package("onnxruntime", "onnxruntime", "build", "verification on CPU, --target cpu serving"),
    Package("onnxscript", "onnxscript", "report", shown=False),
    Package("onnx-ir", "onnx_ir", "report", shown=False),
    Package("onnxsim", "onnxsim", "build", "simplify"),
    Package("polygraphy", "polygraphy", "build", "comparison, TensorRT engine build"),
    Package("nvidia-modelopt", "modelopt", "modelopt", "--precision fp16 / int8"),
    # ModelOpt's ONNX path without its [onnx] extra: modelopt.onnx imports these at import time
    Package("onnxslim", "onnxslim", "modelopt", shown=False),
    Package("onnx-graphsurgeon", "onnx_graphsurgeon", "modelopt", shown=False),
    Package("ml_dtypes", "ml_dtypes", "modelopt", shown=False, recorded=False),
    Package("lief", "lief", "modelopt", shown=False, recorded=False),
    Package("cppimport", "cppimport", "modelopt", shown=False, recorded=False),
    Package("tokenizers", "tokenizers", "report", shown=False),
    Package("tensorrt", "tensorrt", "engine",
            "TensorRT engines (pip install 'trtpack[tensorrt-cu12]', or NGC)",
            distributions=TENSORRT_DISTRIBUTIONS),
    Package("tritonclient", "tritonclient", "serving", "Triton config schema", recorded=False),
)


def required_modules(needed_for: NeededFor) -> dict[str, str]:
    """Import name -> pip package of the packages ``needed_for`` one purpose (for
    ``errors.require_modules``: nothing is imported)."""
    return {p.module: p.name for p in PACKAGES if p.needed_for == needed_for}


def recorded_versions() -> dict[str, str | None]:
    """The version of every package a build report records (None: not installed)."""
    return {p.name: p.version() if p.name == "tensorrt" else distribution_version(p.name)
            for p in PACKAGES if p.recorded}


def module_installed(module: str) -> bool:
    """``module`` can be found (it is not imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def distribution_version(*names: str) -> str | None:
    """The version of the first of ``names`` that is installed."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def parse_version(text: str) -> tuple[int, ...]:
    """``"10.13.0.35"`` -> ``(10, 13, 0, 35)``; stops at the first part that is not a number."""
    parts: list[int] = []
    for piece in text.split("."):
        match = re.match(r"\d+", piece)
        if match is None:
            break
        parts.append(int(match[0]))
        if match[0] != piece:
            break
    return tuple(parts)


def tensorrt_available() -> bool:
    """The ``tensorrt`` module can be found (not that it imports: see ``probe_tensorrt``)."""
    return module_installed("tensorrt")


def tensorrt_version() -> str | None:
    """TensorRT's version from the installed distribution's metadata (no import)."""
    if not tensorrt_available():
        return None
    return distribution_version(*TENSORRT_DISTRIBUTIONS)


@dataclass(frozen=True)
class TensorRTProbe:
    """The result of importing TensorRT in a subprocess."""

    ok: bool
    version: str | None
    error: str | None = None


def probe_tensorrt(timeout: float = 120) -> TensorRTProbe:
    """Import ``tensorrt`` in a fresh interpreter: its real version, or why it fails."""
    if not tensorrt_available():
        return TensorRTProbe(False, None, "the Python package 'tensorrt' is not installed")
    code = "import tensorrt; print(tensorrt.__version__)"
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return TensorRTProbe(False, None, f"importing tensorrt failed: {e}")
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        return TensorRTProbe(False, tensorrt_version(),
                             f"'import tensorrt' fails: {lines[-1] if lines else 'no output'}")
    return TensorRTProbe(True, done.stdout.strip() or tensorrt_version())


# --- GPUs -----------------------------------------------------------------------------------

_SMI_QUERY = "index,name,compute_cap,driver_version,memory.total,uuid"


@dataclass(frozen=True)
class LocalGpu:
    """One NVIDIA GPU of this machine."""

    name: str
    compute_capability: tuple[int, int]
    driver: str | None = None
    memory_mb: int | None = None
    index: int = 0
    uuid: str | None = None

    @property
    def sm(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


def parse_nvidia_smi_csv(text: str) -> list[LocalGpu]:
    """GPUs from ``nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total,
    uuid --format=csv,noheader,nounits``. Lines that do not parse are skipped."""
    gpus: list[LocalGpu] = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        index, name, cc, driver, memory = parts[:5]
        uuid = parts[5] if len(parts) > 5 and parts[5] else None
        match = re.fullmatch(r"(\d+)\.(\d+)", cc)
        if not match or not index.isdigit():
            continue
        try:
            memory_mb: int | None = int(float(memory))
        except ValueError:
            memory_mb = None
        gpus.append(LocalGpu(name, (int(match[1]), int(match[2])), driver or None, memory_mb,
                             int(index), uuid))
    return gpus


def parse_cuda_driver_version(nvidia_smi_output: str) -> str | None:
    """The highest CUDA version the driver supports, from plain ``nvidia-smi`` output."""
    match = re.search(r"CUDA Version:\s*([\d.]+)", nvidia_smi_output)
    return match[1] if match else None


@dataclass(frozen=True)
class VisibleGpus:
    """The GPUs CUDA will use, in CUDA's order, or why that cannot be told from nvidia-smi."""

    gpus: tuple[LocalGpu, ...]
    problem: str | None = None

    @property
    def first(self) -> LocalGpu | None:
        """The GPU a build uses (CUDA device 0), or None (none visible, or unknown which)."""
        return self.gpus[0] if self.gpus and self.problem is None else None


def parse_mig_devices(nvidia_smi_list: str) -> dict[str, int]:
    """MIG device UUID -> index of its GPU, from ``nvidia-smi -L``: each ``GPU <i>: ...``
    line is followed by that GPU's ``MIG <profile> Device <j>: (UUID: MIG-...)`` lines."""
    devices: dict[str, int] = {}
    parent: int | None = None
    for line in nvidia_smi_list.splitlines():
        gpu = re.match(r"\s*GPU (\d+):", line)
        if gpu:
            parent = int(gpu[1])
            continue
        mig = re.match(r"\s*MIG .*\(UUID: (MIG-[^)\s]+)\)", line)
        if mig and parent is not None:
            devices[mig[1]] = parent
    return devices


def visible_gpus(gpus: Sequence[LocalGpu], cuda_visible_devices: str | None,
                 cuda_device_order: str | None = None,
                 mig_devices: dict[str, int] | None = None) -> VisibleGpus:
    """The GPUs CUDA will use, in CUDA's order: ``CUDA_VISIBLE_DEVICES`` filters and orders
    them (indices, ``GPU-`` UUIDs or their prefixes, ``MIG-`` device UUIDs, which select their
    GPU's compute capability); unset means all of them. CUDA stops at the first entry that
    names no device.

    nvidia-smi numbers GPUs in PCI bus order; CUDA numbers them fastest first unless
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. So on a machine whose GPUs differ, an index (or no
    ``CUDA_VISIBLE_DEVICES`` at all) names a GPU nvidia-smi cannot tell: ``problem`` says so
    instead of guessing (UUIDs are unambiguous).
    """
    mig_devices = mig_devices or {}
    by_index = cuda_visible_devices is None
    if cuda_visible_devices is None:
        chosen = list(gpus)
    else:
        chosen = []
        for item in (i.strip() for i in cuda_visible_devices.split(",")):
            if item.isdigit():
                by_index = True
                match = next((g for g in gpus if g.index == int(item)), None)
            elif item.startswith("MIG-GPU-"):  # R450/R460 form: MIG-GPU-<uuid>/<gi>/<ci>
                parent = item[len("MIG-"):].split("/")[0]
                match = next((g for g in gpus if g.uuid == parent), None)
            elif item.startswith("MIG-"):
                index = next((i for uuid, i in mig_devices.items() if uuid.startswith(item)),
                             None) if len(item) > len("MIG-") else None
                match = next((g for g in gpus if g.index == index), None)
            else:
                match = next((g for g in gpus if item and g.uuid and g.uuid.startswith(item)),
                             None)
            if match is None:
                break
            chosen.append(match)
    kinds = sorted({f"{g.name} ({g.sm})" for g in gpus})
    pci_order = (cuda_device_order or "").strip().upper() == "PCI_BUS_ID"
    if by_index and not pci_order and len(kinds) > 1 and chosen:
        return VisibleGpus(tuple(chosen), (
            f"this machine has different GPUs ({', '.join(kinds)}) and CUDA numbers them "
            "fastest first (CUDA_DEVICE_ORDER is not PCI_BUS_ID), so which one CUDA device "
            f"{'0' if cuda_visible_devices is None else cuda_visible_devices} is cannot be "
            "told: set CUDA_DEVICE_ORDER=PCI_BUS_ID (nvidia-smi's numbering) or name the GPU "
            "by its UUID in CUDA_VISIBLE_DEVICES"))
    return VisibleGpus(tuple(chosen))


def _run(cmd: Sequence[str], timeout: float = 20) -> str | None:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout,
                              check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None


def _gpus_from_nvml() -> list[LocalGpu]:
    if importlib.util.find_spec("pynvml") is None:
        return []
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # NVML missing or no driver: no GPU
        return []
    try:
        gpus = []
        driver = pynvml.nvmlSystemGetDriverVersion()
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            cc = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // 2**20
            gpus.append(LocalGpu(str(name.decode() if isinstance(name, bytes) else name),
                                 (int(cc[0]), int(cc[1])),
                                 str(driver.decode() if isinstance(driver, bytes) else driver),
                                 int(memory), i))
        return gpus
    except Exception:
        return []
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def detect_gpus() -> list[LocalGpu]:
    """All NVIDIA GPUs of this machine (nvidia-smi, else NVML), visible to CUDA or not."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        out = _run([smi, f"--query-gpu={_SMI_QUERY}", "--format=csv,noheader,nounits"])
        if out is not None:
            return parse_nvidia_smi_csv(out)
    return _gpus_from_nvml()


def detect_mig_devices() -> dict[str, int]:
    """MIG device UUID -> its GPU's index (``nvidia-smi -L``); empty without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    out = _run([smi, "-L"]) if smi is not None else None
    return parse_mig_devices(out) if out else {}


def cuda_visible_gpus(gpus: Sequence[LocalGpu] | None = None) -> VisibleGpus:
    """This process's CUDA devices (``visible_gpus`` with this environment's
    ``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``) among ``gpus`` (default: detected)."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    mig = detect_mig_devices() if cvd is not None and "MIG-" in cvd else {}
    return visible_gpus(detect_gpus() if gpus is None else gpus, cvd,
                        os.environ.get("CUDA_DEVICE_ORDER"), mig)


def detect_gpu() -> LocalGpu | None:
    """The GPU a build uses: CUDA device 0, or None (no GPU visible, or which one it is
    cannot be told: ``cuda_visible_gpus().problem``)."""
    return cuda_visible_gpus().first


def cuda_driver_version() -> str | None:
    """The CUDA version the installed driver supports (``nvidia-smi`` header), or None."""
    smi = shutil.which("nvidia-smi")
    out = _run([smi]) if smi is not None else None
    return parse_cuda_driver_version(out) if out else None
