"""The local GPU, TensorRT and the other tools a build can use, found without importing them.

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
from dataclasses import dataclass, field
from importlib import metadata

from trtpack.errors import MissingEnvironmentError
from trtpack.targets import (
    CPU,
    TARGETS,
    HardwareCompatibility,
    Target,
    engine_support_problem,
    gpu_mismatch,
    local_gpu_target,
    portability_problem,
)

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
"""How to get TensorRT: the exit-3 hint, ``trtpack doctor`` and the README say this."""

TRTEXEC_LOCATIONS = ("/usr/src/tensorrt/bin/trtexec", "/opt/tensorrt/bin/trtexec")
TRITONSERVER_LOCATIONS = ("/opt/tritonserver/bin/tritonserver",)

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


def visible_gpus(gpus: Sequence[LocalGpu], cuda_visible_devices: str | None) -> list[LocalGpu]:
    """The GPUs CUDA will use, in CUDA's order: ``CUDA_VISIBLE_DEVICES`` filters and orders
    them (indices or UUIDs); unset means all of them."""
    if cuda_visible_devices is None:
        return list(gpus)
    chosen: list[LocalGpu] = []
    for item in (i.strip() for i in cuda_visible_devices.split(",")):
        if not item:
            continue
        if item.isdigit():
            match = next((g for g in gpus if g.index == int(item)), None)
        else:
            match = next((g for g in gpus if g.uuid and g.uuid.startswith(item)), None)
        if match is None:
            break  # CUDA stops at the first invalid entry
        chosen.append(match)
    return chosen


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


def detect_gpu() -> LocalGpu | None:
    """The GPU a build uses: the first one visible to CUDA, or None."""
    gpus = visible_gpus(detect_gpus(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    return gpus[0] if gpus else None


def cuda_driver_version() -> str | None:
    """The CUDA version the installed driver supports (``nvidia-smi`` header), or None."""
    smi = shutil.which("nvidia-smi")
    out = _run([smi]) if smi is not None else None
    return parse_cuda_driver_version(out) if out else None


def _find_spec(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _dist_version(*names: str) -> str | None:
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
    return _find_spec("tensorrt")


def tensorrt_version() -> str | None:
    """TensorRT's version from the installed distribution's metadata (no import)."""
    if not tensorrt_available():
        return None
    return _dist_version(*TENSORRT_DISTRIBUTIONS)


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


@dataclass(frozen=True)
class ToolStatus:
    """An installed (or missing) package or program."""

    name: str
    kind: str  # "python" (a package) or "program"
    version: str | None
    path: str | None = None
    purpose: str = ""

    @property
    def installed(self) -> bool:
        return self.version is not None or self.path is not None


_PACKAGES: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    # (shown name, module, distribution names, what it is for)
    ("torch", "torch", ("torch",), "export"),
    ("transformers", "transformers", ("transformers",), "export"),
    ("onnx", "onnx", ("onnx",), "ONNX models"),
    ("onnxruntime", "onnxruntime", ("onnxruntime", "onnxruntime-gpu"), "CPU target, verification"),
    ("onnxsim", "onnxsim", ("onnxsim",), "simplify"),
    ("polygraphy", "polygraphy", ("polygraphy",), "engine build and comparison"),
    ("nvidia-modelopt", "modelopt", ("nvidia-modelopt",), "fp16 / int8 ONNX"),
    ("tensorrt", "tensorrt", TENSORRT_DISTRIBUTIONS, "TensorRT engines"),
    ("tritonclient", "tritonclient", ("tritonclient",), "Triton config schema"),
    ("pynvml", "pynvml", ("nvidia-ml-py", "pynvml"), "GPU detection (optional)"),
)


def _program(name: str, extra: Sequence[str] = ()) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    return next((p for p in extra if os.access(p, os.X_OK)), None)


def installed_tools() -> list[ToolStatus]:
    """What this machine has for each step, without importing any of it."""
    tools: list[ToolStatus] = [
        ToolStatus("python", "program", sys.version.split()[0], sys.executable, "trtpack")
    ]
    for shown, module, dists, purpose in _PACKAGES:
        version = _dist_version(*dists) if _find_spec(module) else None
        if version is None and _find_spec(module):
            version = "unknown version"
        tools.append(ToolStatus(shown, "python", version, None, purpose))
    for name, extra, purpose in (
        ("nvidia-smi", (), "GPU detection"),
        ("trtexec", TRTEXEC_LOCATIONS, "reproducing an engine build"),
        ("tritonserver", TRITONSERVER_LOCATIONS, "serving the model repository"),
    ):
        path = _program(name, extra)
        tools.append(ToolStatus(name, "program", None, path, purpose))
    return tools


@dataclass(frozen=True)
class EnvironmentReport:
    """What an engine build for ``target`` finds on this machine."""

    target: str
    gpu: LocalGpu | None
    gpus: tuple[LocalGpu, ...] = ()
    tensorrt_version: str | None = None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems


def engine_environment(
    target: Target,
    hardware_compatibility: HardwareCompatibility = "none",
    *,
    gpus: Sequence[LocalGpu] | None = None,
    tensorrt: TensorRTProbe | None = None,
    polygraphy: bool | None = None,
) -> EnvironmentReport:
    """Check (without raising) that an engine for ``target`` can be built here: a visible
    GPU that matches the target, TensorRT 10.12+ that imports, and polygraphy. ``gpus``,
    ``tensorrt`` and ``polygraphy`` replace the detection (for tests and callers that have
    already detected them)."""
    problems: list[str] = []
    notes: list[str] = []
    if (why := portability_problem(target, hardware_compatibility)) is not None:
        problems.append(why)
    all_gpus = detect_gpus() if gpus is None else list(gpus)
    visible = visible_gpus(all_gpus, os.environ.get("CUDA_VISIBLE_DEVICES")) if gpus is None \
        else list(gpus)
    gpu = visible[0] if visible else None
    if gpu is None:
        if all_gpus:
            problems.append(f"no NVIDIA GPU is visible to CUDA (CUDA_VISIBLE_DEVICES="
                            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r})")
        else:
            problems.append("no NVIDIA GPU found (nvidia-smi is missing or lists no GPU)")
    elif (why := gpu_mismatch(target, gpu.name, gpu.compute_capability,
                              hardware_compatibility)) is not None:
        problems.append(why)
        other = next((g for g in visible[1:] + [g for g in all_gpus if g not in visible]
                      if gpu_mismatch(target, g.name, g.compute_capability,
                                      hardware_compatibility) is None), None)
        if other is not None:
            notes.append(f"GPU {other.index} ({other.name}) matches: set "
                         f"CUDA_VISIBLE_DEVICES={other.index}")
    probe = tensorrt if tensorrt is not None else probe_tensorrt()
    if not probe.ok:
        problems.append(f"TensorRT is not usable: {probe.error}")
    elif probe.version is not None and parse_version(probe.version)[:2] < MIN_TENSORRT:
        problems.append(f"TensorRT {probe.version} is installed; trtpack needs "
                        f"{MIN_TENSORRT[0]}.{MIN_TENSORRT[1]} or newer")
    has_polygraphy = _find_spec("polygraphy") if polygraphy is None else polygraphy
    if not has_polygraphy:
        problems.append("the Python package 'polygraphy' is not installed "
                        "(pip install 'trtpack[onnx]')")
    return EnvironmentReport(target.name, gpu, tuple(all_gpus), probe.version, tuple(problems),
                             tuple(notes))


def check_engine_environment(
    target: Target,
    hardware_compatibility: HardwareCompatibility = "none",
    *,
    gpus: Sequence[LocalGpu] | None = None,
    tensorrt: TensorRTProbe | None = None,
    polygraphy: bool | None = None,
) -> EnvironmentReport:
    """The up-front check for a GPU target: the ``EnvironmentReport`` when an engine for
    ``target`` can be built here, else ``MissingEnvironmentError`` (exit 3) naming what was
    found and what is missing. Call it before any work (the keyword arguments are those of
    ``engine_environment``)."""
    report = engine_environment(target, hardware_compatibility, gpus=gpus, tensorrt=tensorrt,
                                polygraphy=polygraphy)
    if report.ok:
        return report
    assert target.gpu is not None
    found = (f"found {report.gpu.name} (compute capability {report.gpu.sm})"
             if report.gpu is not None else "found no GPU")
    found += f", TensorRT {report.tensorrt_version}" if report.tensorrt_version else \
        ", no TensorRT"
    hint = ("use --target cpu for an ONNX Runtime model, or --no-engine to build everything "
            "up to the engine")
    if any("TensorRT" in p for p in report.problems):
        hint += "; to install TensorRT: " + TENSORRT_INSTALL
    if report.notes:
        hint = "; ".join(report.notes) + "; or " + hint
    raise MissingEnvironmentError(
        f"cannot build a TensorRT engine for --target {target.name} ({target.gpu.name}, "
        f"compute capability {target.gpu.sm}) here ({found}): " + "; ".join(report.problems),
        hint=hint,
    )


def local_target() -> Target | None:
    """The target of this machine's GPU when a GPU and TensorRT are both present."""
    gpu = detect_gpu()
    if gpu is None or not tensorrt_available():
        return None
    return local_gpu_target(gpu.name, gpu.compute_capability)


@dataclass(frozen=True)
class TargetRow:
    """A line of ``trtpack targets``: a target, its GPU, and whether this machine is one."""

    name: str
    gpu: str
    compute_capability: str
    architecture: str
    memory_gb: int
    instance_types: tuple[str, ...]
    aliases: tuple[str, ...]
    local: bool
    engine_problem: str | None = None  # why trtpack cannot build engines for it at all


def targets_table(local_gpu: LocalGpu | None = None) -> list[TargetRow]:
    """The target families; ``local`` marks those whose engines this machine's GPU builds."""
    rows = []
    for t in TARGETS:
        if t.gpu is None:
            rows.append(TargetRow(t.name, "-", "-", "CPU (ONNX Runtime)", 0, t.instance_types,
                                  t.aliases, t is CPU))
            continue
        local = local_gpu is not None and gpu_mismatch(
            t, local_gpu.name, local_gpu.compute_capability) is None
        rows.append(TargetRow(t.name, t.gpu.name, t.gpu.sm, t.gpu.architecture, t.gpu.memory_gb,
                              t.instance_types, t.aliases, local, engine_support_problem(t)))
    return rows


@dataclass(frozen=True)
class MachineReport:
    """Everything ``trtpack doctor`` shows: GPUs, driver, tools, and the local target."""

    gpus: tuple[LocalGpu, ...]
    cuda_driver_version: str | None
    tools: tuple[ToolStatus, ...]
    local_target: str | None
    tensorrt: TensorRTProbe


def machine_report() -> MachineReport:
    gpus = detect_gpus()
    visible = visible_gpus(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    local = local_gpu_target(visible[0].name, visible[0].compute_capability).name \
        if visible else None
    return MachineReport(tuple(gpus), cuda_driver_version() if gpus else None,
                         tuple(installed_tools()), local, probe_tensorrt())
