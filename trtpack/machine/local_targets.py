"""Which targets this machine can build TensorRT engines for.

``check_engine_environment`` is the up-front check of a GPU build (a visible GPU matching
the target, TensorRT that imports, polygraphy); ``local_target`` is ``--target auto``;
``targets_table`` is ``trtpack targets``. Detection itself is ``trtpack.machine``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from trtpack.errors import MissingEnvironmentError
from trtpack.machine.gpus import LocalGpu, VisibleGpus, cuda_visible_gpus, detect_gpu, detect_gpus
from trtpack.machine.packages import (
    MIN_TENSORRT,
    TENSORRT_INSTALL,
    TensorRTProbe,
    module_installed,
    parse_version,
    probe_tensorrt,
    tensorrt_available,
)
from trtpack.machine.targets import (
    CPU,
    TARGETS,
    HardwareCompatibility,
    Target,
    engine_support_problem,
    gpu_mismatch,
    is_gpu_target,
    local_gpu_target,
    portability_problem,
)


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
    seen = cuda_visible_gpus(all_gpus) if gpus is None else VisibleGpus(tuple(gpus))
    visible = list(seen.gpus)
    gpu = seen.first
    if seen.problem is not None:
        problems.append(seen.problem)
    elif gpu is None:
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
            notes.append(f"GPU {other.index} ({other.name}) matches: set CUDA_VISIBLE_DEVICES="
                         + (other.uuid if other.uuid else f"{other.index} CUDA_DEVICE_ORDER="
                            "PCI_BUS_ID"))
    probe = tensorrt if tensorrt is not None else probe_tensorrt()
    if not probe.ok:
        problems.append(f"TensorRT is not usable: {probe.error}")
    elif probe.version is not None and parse_version(probe.version)[:2] < MIN_TENSORRT:
        problems.append(f"TensorRT {probe.version} is installed; trtpack needs "
                        f"{MIN_TENSORRT[0]}.{MIN_TENSORRT[1]} or newer")
    has_polygraphy = module_installed("polygraphy") if polygraphy is None else polygraphy
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

    @property
    def is_gpu(self) -> bool:
        return is_gpu_target(self.name)


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
