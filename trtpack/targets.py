"""Deployment targets: cloud instance families -> GPU -> compute capability.

A TensorRT engine runs only on the GPU family (compute capability) and TensorRT version
it was built with, so the target is part of what an engine *is*.
"""

from __future__ import annotations

from dataclasses import dataclass

from trtpack.errors import UserInputError


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: tuple[int, int]
    architecture: str
    memory_gb: int

    @property
    def sm(self) -> str:
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


@dataclass(frozen=True)
class Target:
    """Where a model will be served: ``cpu`` or an instance family with its GPU."""

    name: str
    gpu: Gpu | None
    instance_types: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()

    @property
    def is_gpu(self) -> bool:
        return self.gpu is not None


T4 = Gpu("T4", (7, 5), "Turing", 16)
A10G = Gpu("A10G", (8, 6), "Ampere", 24)
L4 = Gpu("L4", (8, 9), "Ada Lovelace", 24)
L40S = Gpu("L40S", (8, 9), "Ada Lovelace", 48)
V100 = Gpu("V100", (7, 0), "Volta", 16)
A100_40 = Gpu("A100-SXM4-40GB", (8, 0), "Ampere", 40)
A100_80 = Gpu("A100-SXM4-80GB", (8, 0), "Ampere", 80)
H100 = Gpu("H100", (9, 0), "Hopper", 80)
H200 = Gpu("H200", (9, 0), "Hopper", 141)

CPU = Target("cpu", None, ("c6i", "c7i", "m6i", "m7i", "any CPU"), ("onnxruntime",))

TARGETS: tuple[Target, ...] = (
    CPU,
    Target("g4dn", T4, ("g4dn.xlarge", "g4dn.12xlarge"), ("t4",)),
    Target("g5", A10G, ("g5.xlarge", "g5.12xlarge", "g5.48xlarge"), ("a10g",)),
    Target("g6", L4, ("g6.xlarge", "g6.12xlarge"), ("l4",)),
    Target("g6e", L40S, ("g6e.xlarge", "g6e.12xlarge"), ("l40s",)),
    Target("p3", V100, ("p3.2xlarge", "p3.8xlarge"), ("v100",)),
    Target("p4d", A100_40, ("p4d.24xlarge",), ("a100",)),
    Target("p4de", A100_80, ("p4de.24xlarge",), ("a100-80gb",)),
    Target("p5", H100, ("p5.48xlarge",), ("h100",)),
    Target("p5e", H200, ("p5e.48xlarge",), ("h200",)),
    Target("p5en", H200, ("p5en.48xlarge",), ()),
)

AUTO = "auto"


def resolve_target(name: str) -> Target:
    """Look up a target by family (``g5``), instance type (``g5.xlarge``) or GPU (``a10g``)."""
    key = name.strip().lower()
    for target in TARGETS:
        if key == target.name or key in target.aliases or key in target.instance_types:
            return target
    family = key.split(".")[0]
    for target in TARGETS:
        if family == target.name:
            return target
    known = ", ".join(t.name for t in TARGETS)
    raise UserInputError(
        f"unknown target '{name}'; known targets: {known}, or 'auto'",
        hint="trtpack targets lists them with their GPUs",
    )


def target_for_gpu(gpu_name: str, compute_capability: tuple[int, int]) -> Target | None:
    """The first target whose GPU has this compute capability and (loosely) this name."""
    name = gpu_name.lower()
    same_cc = [t for t in TARGETS if t.gpu and t.gpu.compute_capability == compute_capability]
    for target in same_cc:
        assert target.gpu is not None
        if target.gpu.name.split("-")[0].lower() in name:
            return target
    return same_cc[0] if same_cc else None


def gpu_mismatch(target: Target, gpu_name: str, compute_capability: tuple[int, int]) -> str | None:
    """Why an engine for ``target`` cannot be built or run on this GPU, or None if it can."""
    if target.gpu is None:
        return None
    if target.gpu.compute_capability != compute_capability:
        cc = f"{compute_capability[0]}.{compute_capability[1]}"
        return (
            f"target '{target.name}' is {target.gpu.name} (compute capability {target.gpu.sm}) "
            f"but this machine's GPU is {gpu_name} (compute capability {cc})"
        )
    return None
