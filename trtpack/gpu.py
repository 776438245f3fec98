"""The local GPU and TensorRT, found without importing TensorRT at module import."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from dataclasses import dataclass

from trtpack.errors import MissingEnvironmentError
from trtpack.targets import Target, gpu_mismatch, target_for_gpu


@dataclass(frozen=True)
class LocalGpu:
    name: str
    compute_capability: tuple[int, int]
    driver: str | None = None
    memory_mb: int | None = None


def detect_gpu() -> LocalGpu | None:
    """The first NVIDIA GPU as nvidia-smi reports it, or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=name,compute_cap,driver_version,memory.total",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out:
        return None
    name, cc, driver, memory = (p.strip() for p in out[0].split(",")[:4])
    major, _, minor = cc.partition(".")
    return LocalGpu(name, (int(major), int(minor or 0)), driver,
                    int(float(memory)) if memory.replace(".", "").isdigit() else None)


def tensorrt_available() -> bool:
    try:
        return importlib.util.find_spec("tensorrt") is not None
    except (ImportError, ValueError):
        return False


def local_target() -> Target | None:
    """The target family of this machine's GPU when a GPU and TensorRT are both present."""
    gpu = detect_gpu()
    if gpu is None or not tensorrt_available():
        return None
    return target_for_gpu(gpu.name, gpu.compute_capability)


def check_engine_environment(target: Target) -> None:
    """Raise ``MissingEnvironmentError`` (exit 3) unless an engine for ``target`` can be
    built here: an NVIDIA GPU of the target's compute capability, and TensorRT."""
    missing = []
    gpu = detect_gpu()
    if gpu is None:
        missing.append("no NVIDIA GPU (nvidia-smi not found or found no GPU)")
    elif (why := gpu_mismatch(target, gpu.name, gpu.compute_capability)) is not None:
        missing.append(why)
    if not tensorrt_available():
        missing.append("TensorRT is not installed (it ships in NGC TensorRT containers)")
    if missing:
        assert target.gpu is not None
        raise MissingEnvironmentError(
            f"cannot build a TensorRT engine for --target {target.name} "
            f"({target.gpu.name}, compute capability {target.gpu.sm}): " + "; ".join(missing),
            hint="use --target cpu for an ONNX Runtime model, or --no-engine to build "
            "everything up to the engine",
        )
