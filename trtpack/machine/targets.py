"""Deployment targets: cloud instance families -> GPU -> compute capability.

A TensorRT engine runs only on the GPU family (compute capability) and TensorRT version
it was built with, so the target is part of what an engine *is*.

``TARGETS`` is the one list of GPU families and what each supports: the Makefile has one
target per GPU family (``gpu_families``), the GPU workflow one job per family TensorRT 10.12+
builds engines for (``ci_families``: not p3, Volta) and merges the families into fleet
repositories of one engine per GPU model and compute capability (``fleet_repositories``);
tests/test_ci_files.py fails when they disagree.

An engine built with hardware compatibility ``none`` (TensorRT's ``kNONE``) is meant for the
GPU model it was built on: TensorRT's ``NvInfer.h`` (NVIDIA/TensorRT a892d22, lines
10396-10423) makes ``kSAME_COMPUTE_CAPABILITY`` the opt-in for other GPU models of that compute
capability, and TensorRT warns when a plan is used across device models that it "is likely to
affect performance or even cause errors" (NVIDIA/TensorRT#2900). So an L4 (g6) engine does not
serve an L40S (g6e), though both are compute capability 8.9.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from trtpack.errors import UserInputError

HardwareCompatibility = Literal["none", "ampere+", "same_compute_capability"]
HARDWARE_COMPATIBILITY: tuple[HardwareCompatibility, ...] = get_args(HardwareCompatibility)
AMPERE = (8, 0)
# TensorRT 10.5 removed Volta (compute capability 7.0), and trtpack builds with TensorRT
# 10.12+, so the oldest GPU trtpack can build engines for is Turing (7.5).
MIN_ENGINE_COMPUTE_CAPABILITY = (7, 5)


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

    @property
    def builds_engines(self) -> bool:
        """A GPU family the TensorRT trtpack supports builds engines for (not p3's V100)."""
        return self.is_gpu and engine_support_problem(self) is None


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


def gpu_families() -> tuple[Target, ...]:
    """Every GPU instance family (``make <family>`` builds for each)."""
    return tuple(t for t in TARGETS if t.is_gpu)


def ci_families() -> tuple[Target, ...]:
    """The GPU families the GPU workflow builds and tests engines on."""
    return tuple(t for t in TARGETS if t.builds_engines)


def fleet_repositories(level: HardwareCompatibility = "none",
                       families: Sequence[Target] | None = None
                       ) -> tuple[tuple[Target, ...], ...]:
    """The families of ``families`` (default ``ci_families``: a fleet manifest's instance
    types, ``trtpack fleet plan``) whose engines ``trtpack merge`` puts into each fleet
    repository (Triton's ``cc_model_filenames`` holds one engine per compute capability).

    ``none``: an engine serves only its GPU model, so each GPU model gets its own engine (the
    first family of a GPU model builds it; p5en's H200 is p5e's) and a repository holds at
    most one GPU model per compute capability: g4dn, g5, g6, p4d, p5 in the first, g6e,
    p4de, p5e in the second. ``same_compute_capability`` (or ``ampere+``): one repository, the
    first family of each compute capability, whose engine serves the others."""
    repositories: list[dict[tuple[int, int], Target]] = []
    models: set[Gpu] = set()
    for target in ci_families() if families is None else families:
        assert target.gpu is not None
        cc = target.gpu.compute_capability
        if level != "none":
            if not repositories:
                repositories.append({})
            repositories[0].setdefault(cc, target)
            continue
        if target.gpu in models:
            continue  # another family of this GPU model builds its engine
        models.add(target.gpu)
        free = next((r for r in repositories if cc not in r), None)
        if free is None:
            free = {}
            repositories.append(free)
        free[cc] = target
    return tuple(tuple(r.values()) for r in repositories)


def same_gpu_model(gpu: Gpu, device_name: str) -> bool:
    """Whether the device the driver names ``device_name`` ("NVIDIA L40S", "Tesla T4",
    "NVIDIA H100 80GB HBM3") is ``gpu``'s model: every word of the table's name among the
    device name's words, case and dashes aside ("L4" is not "NVIDIA L40S", "A100-SXM4-40GB"
    is not "NVIDIA A100-SXM4-80GB")."""
    words = device_name.lower().replace("-", " ").split()
    return all(w in words for w in gpu.name.lower().replace("-", " ").split())


def same_device_model(built_on: str, device_name: str) -> bool:
    """Whether two device names as the driver gives them ("NVIDIA A10G", "NVIDIA H100 80GB
    HBM3", "Tesla T4") name one GPU model: the same words, case, dashes and the vendor's words
    (NVIDIA, Tesla) aside ("NVIDIA A10" is not "NVIDIA A10G", "NVIDIA L4" not "NVIDIA L40S")."""
    def words(name: str) -> list[str]:
        return [w for w in name.lower().replace("-", " ").split() if w not in ("nvidia", "tesla")]

    return words(built_on) == words(device_name)


def is_gpu_target(name: str) -> bool:
    """Whether the target named ``name`` (as a report records it) is a GPU's: every target
    but ``cpu`` is. The one spelling of that test for a target known only by its name."""
    return name.strip().lower() != CPU.name


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


def families_served(level: str, built_on: str,
                    compute_capability: tuple[int, int]) -> tuple[Target, ...]:
    """The families of ``compute_capability`` an engine built on the GPU ``built_on`` with
    hardware compatibility ``level`` is meant for: with ``none`` those of its GPU model only,
    else all of them."""
    same = [t for t in TARGETS if t.gpu is not None and t.gpu.compute_capability ==
            compute_capability]
    if level == "none":
        return tuple(t for t in same if t.gpu is not None and same_gpu_model(t.gpu, built_on))
    return tuple(same)


def engine_serves(level: str, built_on: str, compute_capability: tuple[int, int]) -> str:
    """Which GPUs an engine is meant for, in words (``inspect``, the merged config)."""
    cc = f"{compute_capability[0]}.{compute_capability[1]}"
    if level == "same_compute_capability":
        return (f"every GPU of compute capability {cc}, through hardware compatibility "
                f"same_compute_capability (built on {built_on})")
    if level == "ampere+":
        return (f"every GPU of compute capability 8.0 or newer, through hardware compatibility "
                f"ampere+ (built on {built_on})")
    return (f"the {built_on} alone (hardware compatibility none: other GPU models of compute "
            f"capability {cc} need their own engine, or one built with "
            f"same_compute_capability)")


def target_for_gpu(gpu_name: str, compute_capability: tuple[int, int]) -> Target | None:
    """The first target whose GPU has this compute capability and (loosely) this name."""
    words = gpu_name.lower().replace("-", " ").split()
    same_cc = [t for t in TARGETS if t.gpu and t.gpu.compute_capability == compute_capability]
    for target in same_cc:  # the full name first: A100-SXM4-80GB is p4de, not p4d
        assert target.gpu is not None
        if same_gpu_model(target.gpu, gpu_name):
            return target
    for target in same_cc:
        assert target.gpu is not None
        # whole words: "L4" must not match "NVIDIA L40S"
        if target.gpu.name.split("-")[0].lower() in words:
            return target
    return same_cc[0] if same_cc else None


def architecture_for(compute_capability: tuple[int, int]) -> str:
    """The GPU architecture of a compute capability (``"unknown"`` past the table)."""
    major, minor = compute_capability
    if major == 7:
        return "Volta" if minor < 5 else "Turing"
    if major == 8:
        return "Ada Lovelace" if minor >= 9 else "Ampere"
    return {6: "Pascal", 9: "Hopper", 10: "Blackwell", 12: "Blackwell"}.get(major, "unknown")


def local_gpu_target(gpu_name: str, compute_capability: tuple[int, int]) -> Target:
    """The target of a local GPU: its family from the table, or one named after its
    compute capability (``sm86``) when no listed instance family has that GPU model (an A10
    is not g5's A10G: an engine built on it is meant for the A10)."""
    known = target_for_gpu(gpu_name, compute_capability)
    if known is not None and known.gpu is not None and same_gpu_model(known.gpu, gpu_name):
        return known
    major, minor = compute_capability
    gpu = Gpu(gpu_name, compute_capability, architecture_for(compute_capability), 0)
    return Target(f"sm{major}{minor}", gpu, (), ())


def engine_support_problem(target: Target) -> str | None:
    """Why no TensorRT that trtpack supports can build engines for ``target``, or None."""
    if target.gpu is None or target.gpu.compute_capability >= MIN_ENGINE_COMPUTE_CAPABILITY:
        return None
    return (f"target '{target.name}' is {target.gpu.name} ({target.gpu.architecture}, compute "
            f"capability {target.gpu.sm}): TensorRT 10.5 and later do not support it, and "
            f"trtpack builds engines with TensorRT 10.12+")


def portability_problem(target: Target, level: HardwareCompatibility) -> str | None:
    """Why ``level`` cannot be used for ``target``'s engines, or None."""
    if level == "ampere+" and target.gpu is not None and \
            target.gpu.compute_capability < AMPERE:
        return (
            f"hardware compatibility 'ampere+' needs an Ampere or newer GPU (compute "
            f"capability 8.0+), but target '{target.name}' is {target.gpu.name} "
            f"({target.gpu.architecture}, {target.gpu.sm})"
        )
    return None


def gpu_mismatch(target: Target, gpu_name: str, compute_capability: tuple[int, int],
                 hardware_compatibility: HardwareCompatibility = "none") -> str | None:
    """Why an engine for ``target`` cannot be built or run on this GPU, or None if it can.

    With hardware compatibility ``none`` an engine is meant for the GPU model it was built on
    (the device names compared, ``same_gpu_model``); with ``same_compute_capability`` for any
    GPU of its compute capability; with ``ampere+`` for any GPU of compute capability 8.0 or
    newer, so any such GPU can build it for any such target.
    """
    if target.gpu is None:
        return None
    cc = f"{compute_capability[0]}.{compute_capability[1]}"
    if hardware_compatibility == "ampere+":
        if compute_capability >= AMPERE and target.gpu.compute_capability >= AMPERE:
            return None
        return (
            f"an 'ampere+' engine for target '{target.name}' ({target.gpu.name}, "
            f"{target.gpu.sm}) needs an Ampere or newer GPU, but this machine's GPU is "
            f"{gpu_name} (compute capability {cc})"
        )
    if target.gpu.compute_capability != compute_capability:
        return (
            f"target '{target.name}' is {target.gpu.name} (compute capability {target.gpu.sm}) "
            f"but this machine's GPU is {gpu_name} (compute capability {cc})"
        )
    if hardware_compatibility == "none" and not same_gpu_model(target.gpu, gpu_name):
        return (
            f"target '{target.name}' is {target.gpu.name} but this machine's GPU is {gpu_name} "
            f"(both compute capability {cc}): an engine built with hardware compatibility "
            f"'none' is meant for the GPU model it was built on (TensorRT's kNONE); build on "
            f"the {target.gpu.name}, or with --portable same_compute_capability"
        )
    return None
