"""What the compile check hands TensorRT for RTX instead of TensorRT: the one table of the
settings TensorRT-RTX lacks or names differently, each with the document it comes from, and
the compute capability compiled for per target.

TensorRT for RTX parses ONNX and builds engines without a GPU ("CPU-only Ahead Of Time", on
by default). It shares TensorRT's ONNX parser and network builder lineage, so a graph and
profiles it accepts are what TensorRT's parser and builder are asked to accept; it is a
different product from the TensorRT that Triton's backend loads, so its engine proves
parse and build, not numerics or speed. Nothing here imports it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from trtpack.engine.builder import BuilderOptions, BuilderSettings
from trtpack.json_values import JsonValue, json_list, json_number, json_object
from trtpack.machine.targets import Target
from trtpack.runtimes.polygraphy_setup import ConfigKwargs, NetworkKwargs

CPU_ENGINES_DOC = ("NVIDIA TensorRT-RTX docs, CPU-Only AOT and TensorRT-RTX Engines "
                   "(docs.nvidia.com/deeplearning/tensorrt-rtx/latest/inference-library/"
                   "cpu-engines.html)")
SUPPORT_MATRIX_DOC = ("NVIDIA TensorRT-RTX 1.7 Support Matrix (docs.nvidia.com/deeplearning/"
                      "tensorrt-rtx/latest/getting-started/support-matrix.html)")

Handling = Literal["left out", "replaced"]


@dataclass(frozen=True)
class RtxDifference:
    """One setting TensorRT-RTX lacks or names differently: what the engine stage's
    TensorRT build does, what the compile check does instead, and where that comes from.
    ``config_key``: the ``ConfigKwargs`` key left out of TensorRT-RTX's ``CreateConfig``;
    ``refusal``: a pattern of the builder's message when TensorRT-RTX refuses a graph for
    this reason (the check then records "not checked: <row>" and warns, exit 0)."""

    setting: str
    tensorrt: str
    tensorrt_rtx: str
    handling: Handling
    source: str
    config_key: str | None = None
    refusal: str | None = None

    def matches(self, message: str) -> bool:
        return self.refusal is not None and re.search(self.refusal, message) is not None

    def line(self) -> str:
        return f"{self.setting}: {self.tensorrt_rtx} ({self.source})"


RTX_DIFFERENCES: tuple[RtxDifference, ...] = (
    RtxDifference(
        "hardware compatibility level",
        "--portable / engine.hardware_compatibility: ampere+ or same_compute_capability",
        "unsupported: its builder logs 'setHardwareCompatibilityLevel() is unsupported in "
        "TensorRT-RTX'; its engines are portable across the compute capabilities compiled for",
        "left out", CPU_ENGINES_DOC + "; measured with tensorrt-rtx-cu12 1.7.1.116",
        config_key="hardware_compatibility_level"),
    RtxDifference(
        "version compatibility",
        "engine.version_compatible: a lean runtime embedded in the plan",
        "refused: its builder needs libnvinfer_lean.so.1, which TensorRT-RTX does not ship "
        "('Unable to load library: libnvinfer_lean.so.1')",
        "left out", "measured with tensorrt-rtx-cu12 1.7.1.116 (no lean runtime in its wheel)",
        config_key="version_compatible", refusal=r"libnvinfer_lean"),
    RtxDifference(
        "timing cache",
        "one file per GPU and TensorRT version (CACHE/tensorrt/, --timing-cache)",
        "not read or written: the ahead-of-time build times no tactics on a GPU (its kernels "
        "are compiled just in time on the device); the engine stage's cache is for the GPU",
        "left out", CPU_ENGINES_DOC),
    RtxDifference(
        "compute capability",
        "the GPU the engine is built on",
        "set on the builder config (set_compute_capability); by default 8.0, 8.6, 8.9 and "
        "12.0; 7.5 only when set explicitly; 9.0 (Hopper) is not among its choices",
        "replaced", CPU_ENGINES_DOC + "; " + SUPPORT_MATRIX_DOC),
    RtxDifference(
        "FP32 GEMM on Turing (7.5)",
        "FP32 MatMul/Gemm on a T4 (g4dn)",
        "refused when compiling for 7.5: 'Cannot compile operation ... for Turing (SM75): FP32 "
        "GEMM is not supported'; an FP32 graph for g4dn is not checked (FP16 is)",
        "replaced", SUPPORT_MATRIX_DOC + " (Turing's FP32 column is footnoted); measured "
        "with tensorrt-rtx-cu12 1.7.1.116",
        refusal=r"for Turing \(SM75\): FP32 GEMM is not supported"),
    RtxDifference(
        "INT8",
        "INT8 kernels from the Q/DQ graph",
        "INT8 only as weight-only GEMM: an INT8 graph proves parse and build, not INT8 "
        "kernels, and its engine size does not predict TensorRT's",
        "replaced", SUPPORT_MATRIX_DOC + " (INT8 WoQ GEMM)"),
)
"""The settings TensorRT-RTX lacks or names differently (the compile check's one table)."""

LEFT_OUT_CONFIG_KEYS = frozenset(d.config_key for d in RTX_DIFFERENCES if d.config_key)

# The compute capabilities TensorRT-RTX 1.7's ``ComputeCapability`` enum offers (SM75 ... SM121)
RTX_COMPUTE_CAPABILITIES = ((7, 5), (8, 0), (8, 6), (8, 9), (12, 0), (12, 1))
# What is compiled for a GPU whose compute capability TensorRT-RTX does not offer: Ampere's
# data-centre architecture (8.0), the closest it has to Hopper's (9.0) feature set
STAND_IN = (8, 0)


@dataclass(frozen=True)
class CompiledFor:
    """The compute capability the check compiles for, for one target: the target's own, or
    a stand-in when TensorRT-RTX does not offer it (then not the target's architecture)."""

    target_sm: str
    compiled_sm: str
    stand_in: bool

    @property
    def enum_member(self) -> str:
        """``tensorrt_rtx.ComputeCapability``'s member name (``SM75``)."""
        return "SM" + self.compiled_sm.replace(".", "")

    def describe(self) -> str:
        if self.stand_in:
            return (f"compute capability {self.compiled_sm} as a stand-in: TensorRT-RTX does "
                    f"not offer the target's {self.target_sm}, so this is not the target's "
                    "architecture")
        return f"compute capability {self.compiled_sm} (the target's)"


def compiled_for(target: Target) -> CompiledFor:
    """The compute capability compiled for ``target`` (a GPU target)."""
    if target.gpu is None:
        raise ValueError(f"{target.name} is not a GPU target")
    cc = target.gpu.compute_capability
    chosen = cc if cc in RTX_COMPUTE_CAPABILITIES else STAND_IN
    return CompiledFor(target.gpu.sm, f"{chosen[0]}.{chosen[1]}", chosen != cc)


@dataclass(frozen=True)
class RtxSettings:
    """The engine stage's builder settings as the compile check hands them to TensorRT-RTX
    (``runtimes.tensorrt.BuilderSettings``): the same network and config keyword arguments,
    less those TensorRT-RTX lacks (``RTX_DIFFERENCES``' ``config_key``)."""

    engine: BuilderSettings

    def config_kwargs(self) -> ConfigKwargs:
        kept = {k: v for k, v in self.engine.config_kwargs().items()
                if k not in LEFT_OUT_CONFIG_KEYS}
        return ConfigKwargs(**kept)  # type: ignore[typeddict-item]

    def network_kwargs(self) -> NetworkKwargs:
        return self.engine.network_kwargs()

    def to_dict(self) -> BuilderOptions:
        return self.engine.to_dict()

    def left_out(self) -> list[str]:
        """The table's rows whose setting this build asked for and the check left out."""
        asked = self.engine.config_kwargs()
        return [d.setting for d in RTX_DIFFERENCES if d.config_key and d.config_key in asked]


def refusal_difference(message: str) -> RtxDifference | None:
    """The table's row a builder refusal comes from, if any."""
    return next((d for d in RTX_DIFFERENCES if d.matches(message)), None)


COMPILE_CHECK_STAGE = "compile_check"
BUILDER = "TensorRT-RTX"


def wording(version: str) -> str:
    """What the check is, in the words every view uses (terminal, report.html, inspect):
    compiled, not run, and not the engine Triton serves."""
    short = ".".join(version.split(".")[:3])
    return (f"compiled by {BUILDER} {short} on CPU (not run); the Triton engine is built by "
            "TensorRT on the GPU")


def _corners(corners: JsonValue, where: str) -> str:
    return ":".join("x".join(str(d) for d in json_list(corner, where))
                    for corner in json_list(corners, where))


def record_lines(metrics: Mapping[str, JsonValue]) -> list[str]:
    """The compile check's record (its stage metrics in report.json) as plain lines: the
    wording, the builder, what it compiled for, the network's inputs with their profiles as
    the builder read them, the engine's size and sha256, or what was not checked."""
    where = "the compile check's record"
    version = str(metrics.get("builder_version", "?"))
    lines = [wording(version) + "."]
    target = f"compute capability {metrics.get('compiled_for')}"
    if metrics.get("stand_in"):
        target += (f" (a stand-in: not the target's {metrics.get('target_compute_capability')}"
                   " architecture)")
    lines.append(f"builder {metrics.get('builder', BUILDER)} {version}, for {target}")
    if metrics.get("not_checked"):
        lines.append(f"not checked: {metrics['not_checked']}")
        return lines
    profiles = [json_object(p, f"{where}: profiles[{i}]") for i, p in
                enumerate(json_list(metrics.get("profiles"), f"{where}: profiles"))]
    for name, value in json_object(metrics.get("inputs"), f"{where}: inputs").items():
        tensor = json_object(value, f"{where}: inputs.{name}")
        ranges = " ".join(_corners(p[name], f"{where}: profiles.{name}")
                          for p in profiles if name in p)
        lines.append(f"input {name} {tensor.get('dtype')} {tensor.get('shape')}: "
                     f"profiles {ranges or '-'}")
    size = json_number(metrics.get("engine_bytes"), f"{where}: engine_bytes")
    if size is not None:
        lines.append(f"engine {size:,.0f} bytes ({size / 2**20:.1f} MB, not kept), sha256 "
                     f"{str(metrics.get('engine_sha256'))[:16]}…, built in "
                     f"{metrics.get('build_seconds')} s, peak {metrics.get('peak_memory_mb')} MB")
    left_out = json_list(metrics.get("left_out"), f"{where}: left_out")
    if left_out:
        lines.append("left out (TensorRT-RTX lacks them): " + ", ".join(map(str, left_out)))
    return lines
    profiles = metrics.get("profiles") or []
    for name, tensor in (metrics.get("inputs") or {}).items():
        ranges = " ".join(_corners(p[name]) for p in profiles if name in p)
        lines.append(f"input {name} {tensor.get('dtype')} {tensor.get('shape')}: "
                     f"profiles {ranges or '-'}")
    size = metrics.get("engine_bytes")
    if size is not None:
        lines.append(f"engine {size:,} bytes ({size / 2**20:.1f} MB, not kept), sha256 "
                     f"{str(metrics.get('engine_sha256'))[:16]}…, built in "
                     f"{metrics.get('build_seconds')} s, peak {metrics.get('peak_memory_mb')} MB")
    if metrics.get("left_out"):
        lines.append("left out (TensorRT-RTX lacks them): " + ", ".join(metrics["left_out"]))
    return lines
