"""What an engine build will do, as plain data: profiles as TensorRT shapes, the builder
settings (as the names of TensorRT's enums), the timing-cache file and the trtexec command.

Nothing here imports TensorRT: ``trtpack.runtimes.tensorrt`` turns these values into
TensorRT objects at the last moment, so every decision can be tested on a CPU.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from trtpack.errors import UserInputError
from trtpack.runtimes.polygraphy_setup import ConfigKwargs, NetworkKwargs
from trtpack.shapes import Shape, ShapeProfile, TrtProfile
from trtpack.sources.recipe import EngineSettings

HARDWARE_COMPATIBILITY_ENUM = {
    "none": "NONE", "ampere+": "AMPERE_PLUS", "same_compute_capability": "SAME_COMPUTE_CAPABILITY",
}
HARDWARE_COMPATIBILITY_TRTEXEC = {
    "none": "none", "ampere+": "ampere+", "same_compute_capability": "sameComputeCapability",
}
TILING_ENUM = {"none": "NONE", "fast": "FAST", "moderate": "MODERATE", "full": "FULL"}
TILING_TRTEXEC = {"none": 0, "fast": 1, "moderate": 2, "full": 3}


def tensorrt_profiles(profiles: Sequence[ShapeProfile],
                      network_inputs: Sequence[str] | None = None) -> list[TrtProfile]:
    """The profiles for ``IOptimizationProfile.set_shape``, one per ``--profile``, in order.

    ``network_inputs`` are the inputs the ONNX model really has (an input the simplifier
    removed has no shape to set); every one of them must have a shape in every profile.
    """
    result: list[TrtProfile] = []
    for index, profile in enumerate(profiles):
        names = list(profile.shapes) if network_inputs is None else list(network_inputs)
        missing = [n for n in names if n not in profile.shapes]
        if missing:
            raise UserInputError(
                f"profile {index} ({profile}) has no shape for the model input(s) "
                f"{', '.join(missing)}"
            )
        result.append({
            name: (tuple(r.min), tuple(r.opt), tuple(r.max))
            for name, r in profile.shapes.items() if name in names
        })
    return result


class BuilderOptions(TypedDict):
    """The builder settings as recorded (the log, the engine's provenance)."""

    tensorrt_version: str
    strongly_typed: bool
    strongly_typed_flag: bool
    optimization_level: int
    workspace_bytes: int | None
    hardware_compatibility: str
    version_compatible: bool
    tiling_level: str | None
    tf32: bool


@dataclass(frozen=True)
class BuilderSettings:
    """The builder options of one build, resolved for one TensorRT version.

    Precision is not here: it is in the ONNX (strongly typed network), so no FP16/INT8
    builder flag is ever set. TF32 stays off so that FP32 layers compute in FP32.
    """

    tensorrt_version: tuple[int, ...]
    optimization_level: int = 3
    workspace_bytes: int | None = None
    hardware_compatibility: str = "none"
    version_compatible: bool = False
    tiling_level: str | None = None
    tf32: bool = False

    @property
    def strongly_typed_flag(self) -> bool:
        """Whether to set ``NetworkDefinitionCreationFlag.STRONGLY_TYPED``: needed in
        TensorRT 10; in 11 every network is strongly typed and the flag is not needed."""
        return not self.tensorrt_version or self.tensorrt_version[0] < 11

    def network_kwargs(self) -> NetworkKwargs:
        """Keyword arguments for polygraphy's ``NetworkFromOnnxPath`` (besides the path)."""
        return {"strongly_typed": True} if self.strongly_typed_flag else {}

    def config_kwargs(self) -> ConfigKwargs:
        """Keyword arguments for polygraphy's ``CreateConfig`` (besides profiles and the
        timing cache), with TensorRT enums given by member name (``"AMPERE_PLUS"``)."""
        kwargs: ConfigKwargs = {
            "tf32": self.tf32,
            "builder_optimization_level": self.optimization_level,
        }
        if self.workspace_bytes is not None:
            kwargs["memory_pool_limits"] = {"WORKSPACE": self.workspace_bytes}
        if self.hardware_compatibility != "none":
            kwargs["hardware_compatibility_level"] = \
                HARDWARE_COMPATIBILITY_ENUM[self.hardware_compatibility]
        if self.version_compatible:
            kwargs["version_compatible"] = True
        if self.tiling_level is not None:
            kwargs["tiling_optimization_level"] = TILING_ENUM[self.tiling_level]
        return kwargs

    def to_dict(self) -> BuilderOptions:
        return {
            "tensorrt_version": ".".join(map(str, self.tensorrt_version)),
            "strongly_typed": True,
            "strongly_typed_flag": self.strongly_typed_flag,
            "optimization_level": self.optimization_level,
            "workspace_bytes": self.workspace_bytes,
            "hardware_compatibility": self.hardware_compatibility,
            "version_compatible": self.version_compatible,
            "tiling_level": self.tiling_level,
            "tf32": self.tf32,
        }


def builder_settings(engine: EngineSettings, tensorrt_version: tuple[int, ...]) -> BuilderSettings:
    """The recipe's ``engine:`` section for the TensorRT version that builds it."""
    return BuilderSettings(
        tensorrt_version=tuple(tensorrt_version),
        optimization_level=engine.optimization_level,
        workspace_bytes=engine.workspace_mb * 2**20 if engine.workspace_mb else None,
        hardware_compatibility=engine.hardware_compatibility,
        version_compatible=engine.version_compatible,
        tiling_level=engine.tiling_level,
    )


def timing_cache_path(cache_dir: Path, gpu_name: str, compute_capability: tuple[int, int],
                      tensorrt_version: str, hardware_compatibility: str = "none",
                      shared_dir: Path | None = None) -> Path:
    """One timing cache per device (GPU model and compute capability) and TensorRT version,
    shared by builds: under ``cache_dir/tensorrt/``, or in ``shared_dir`` (``--timing-cache
    DIR``: one folder a CI matrix restores and saves, each GPU reading and updating its own
    file).

    Tactic timings are only valid for the device and TensorRT that measured them: GPUs that
    share a compute capability (L4 and L40S, A100 40 and 80 GB, H100 and H200) are different
    devices, and TensorRT refuses a cache timed on another one, so the GPU's name is part of
    the file name. An ``ampere+`` build times a different set of tactics: its own file.
    """
    version = re.sub(r"[^0-9A-Za-z.]+", "_", tensorrt_version)
    device = re.sub(r"[^0-9A-Za-z.]+", "_", gpu_name).strip("_.") or "gpu"
    suffix = "" if hardware_compatibility == "none" else \
        "-" + HARDWARE_COMPATIBILITY_TRTEXEC[hardware_compatibility].replace("+", "plus")
    major, minor = compute_capability
    folder = shared_dir if shared_dir is not None else cache_dir / "tensorrt"
    return folder / f"timing-{device}-sm{major}{minor}-trt{version}{suffix}.cache"


def _shape_spec(shapes: Mapping[str, Shape]) -> str:
    return ",".join(f"{name}:{'x'.join(map(str, shape))}" for name, shape in shapes.items())


def trtexec_command(onnx: Path, plan: Path, profiles: Sequence[TrtProfile],
                    settings: BuilderSettings, timing_cache: Path | None,
                    trtexec: str = "trtexec") -> list[str]:
    """The trtexec command that builds the same engine (same ONNX, profiles and options)."""
    cmd = [trtexec, f"--onnx={onnx}", f"--saveEngine={plan}", "--skipInference"]
    if settings.strongly_typed_flag:
        cmd.append("--stronglyTyped")
    for index, profile in enumerate(profiles):
        if len(profiles) > 1:
            cmd.append(f"--profile={index}")
        cmd += [
            f"--minShapes={_shape_spec({n: s[0] for n, s in profile.items()})}",
            f"--optShapes={_shape_spec({n: s[1] for n, s in profile.items()})}",
            f"--maxShapes={_shape_spec({n: s[2] for n, s in profile.items()})}",
        ]
    if settings.workspace_bytes is not None:
        cmd.append(f"--memPoolSize=workspace:{max(1, settings.workspace_bytes // 2**20)}M")
    cmd.append(f"--builderOptimizationLevel={settings.optimization_level}")
    if settings.hardware_compatibility != "none":
        cmd.append("--hardwareCompatibilityLevel="
                   + HARDWARE_COMPATIBILITY_TRTEXEC[settings.hardware_compatibility])
    if settings.version_compatible:
        cmd.append("--versionCompatible")
    if settings.tiling_level is not None:
        cmd.append(f"--tilingOptimizationLevel={TILING_TRTEXEC[settings.tiling_level]}")
    if not settings.tf32:
        cmd.append("--noTF32")
    if timing_cache is not None:
        cmd.append(f"--timingCacheFile={timing_cache}")
    return cmd


def command_text(cmd: Sequence[str]) -> str:
    """A command as one shell line."""
    return shlex.join(cmd)
