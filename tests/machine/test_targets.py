"""Target families: lookup, GPU matching, portability (pure; no GPU needed)."""

from __future__ import annotations

import pytest

from trtpack.errors import UserInputError
from trtpack.machine.targets import (
    TARGETS,
    architecture_for,
    gpu_mismatch,
    local_gpu_target,
    portability_problem,
    resolve_target,
    target_for_gpu,
)

EXPECTED = {
    # family: (GPU, compute capability) — the table the issue asks for
    "g4dn": ("T4", (7, 5)),
    "g5": ("A10G", (8, 6)),
    "g6": ("L4", (8, 9)),
    "g6e": ("L40S", (8, 9)),
    "p3": ("V100", (7, 0)),
    "p4d": ("A100-SXM4-40GB", (8, 0)),
    "p4de": ("A100-SXM4-80GB", (8, 0)),
    "p5": ("H100", (9, 0)),
    "p5e": ("H200", (9, 0)),
    "p5en": ("H200", (9, 0)),
}


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_table_has_each_family_with_its_gpu(family: str) -> None:
    target = resolve_target(family)
    assert target.gpu is not None
    assert (target.gpu.name, target.gpu.compute_capability) == EXPECTED[family]


@pytest.mark.parametrize(("name", "family"), [
    ("g5", "g5"), ("A10G", "g5"), ("g5.2xlarge", "g5"), ("g5.xlarge", "g5"), (" T4 ", "g4dn"),
    ("p4de.24xlarge", "p4de"), ("h200", "p5e"), ("cpu", "cpu"),
])
def test_resolve_by_family_alias_or_instance_type(name: str, family: str) -> None:
    assert resolve_target(name).name == family


def test_unknown_target_names_the_known_ones() -> None:
    with pytest.raises(UserInputError, match=r"unknown target 'g99'.*g5"):
        resolve_target("g99")


def test_names_are_unique() -> None:
    names = [t.name for t in TARGETS]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(("gpu", "cc", "family"), [
    ("NVIDIA A10G", (8, 6), "g5"),
    ("NVIDIA L40S", (8, 9), "g6e"),
    ("NVIDIA L4", (8, 9), "g6"),
    ("Tesla T4", (7, 5), "g4dn"),
    ("NVIDIA H100 80GB HBM3", (9, 0), "p5"),
    ("NVIDIA A100-SXM4-80GB", (8, 0), "p4de"),
    ("NVIDIA A100-SXM4-40GB", (8, 0), "p4d"),
])
def test_target_for_local_gpu(gpu: str, cc: tuple[int, int], family: str) -> None:
    target = target_for_gpu(gpu, cc)
    assert target is not None and target.name == family


def test_local_gpu_outside_the_table_gets_a_compute_capability_target() -> None:
    target = local_gpu_target("NVIDIA GeForce RTX 5090", (12, 0))
    assert target.name == "sm120"
    assert target.gpu is not None and target.gpu.architecture == "Blackwell"
    assert gpu_mismatch(target, "NVIDIA GeForce RTX 5090", (12, 0)) is None


def test_mismatch_names_both_gpus() -> None:
    why = gpu_mismatch(resolve_target("g5"), "Tesla T4", (7, 5))
    assert why is not None and "A10G" in why and "Tesla T4" in why and "7.5" in why
    assert gpu_mismatch(resolve_target("g5"), "NVIDIA A10G", (8, 6)) is None
    assert gpu_mismatch(resolve_target("cpu"), "Tesla T4", (7, 5)) is None


def test_same_compute_capability_is_enough_only_when_built_so() -> None:
    """Issue 45, item 2: with hardware compatibility ``none`` an engine is meant for the GPU
    model it was built on (TensorRT ``include/NvInfer.h`` at a892d22, lines 10396-10423:
    ``kNONE``; ``kSAME_COMPUTE_CAPABILITY`` is the opt-in for other models of that compute
    capability), so an L4 does not build g6e's L40S engine unless asked to, though both are
    8.9. Before: compute capability alone was compared."""
    why = gpu_mismatch(resolve_target("g6e"), "NVIDIA L4", (8, 9))
    assert why is not None and "L40S" in why and "NVIDIA L4" in why
    assert "same_compute_capability" in why
    assert gpu_mismatch(resolve_target("g6e"), "NVIDIA L4", (8, 9),
                        "same_compute_capability") is None
    assert gpu_mismatch(resolve_target("g6e"), "NVIDIA L40S", (8, 9)) is None
    # the device names as drivers report them, normalized
    assert gpu_mismatch(resolve_target("p5"), "NVIDIA H100 80GB HBM3", (9, 0)) is None
    assert gpu_mismatch(resolve_target("p5e"), "NVIDIA H100 80GB HBM3", (9, 0)) is not None
    assert gpu_mismatch(resolve_target("p4d"), "NVIDIA A100-SXM4-80GB", (8, 0)) is not None
    assert gpu_mismatch(resolve_target("g4dn"), "Tesla T4", (7, 5)) is None


def test_a_gpu_model_outside_the_table_is_its_own_target() -> None:
    """An A10 (8.6) is not g5's A10G: ``--target auto`` names it after its compute
    capability, and its engines are meant for it."""
    target = local_gpu_target("NVIDIA A10", (8, 6))
    assert target.name == "sm86"
    assert gpu_mismatch(target, "NVIDIA A10", (8, 6)) is None
    assert gpu_mismatch(resolve_target("g5"), "NVIDIA A10", (8, 6)) is not None


def test_fleet_repositories_hold_one_engine_per_gpu_model() -> None:
    from trtpack.machine.targets import fleet_repositories

    names = [[t.name for t in repo] for repo in fleet_repositories()]
    assert names == [["g4dn", "g5", "g6", "p4d", "p5"], ["g6e", "p4de", "p5e"]]
    shared = [[t.name for t in repo] for repo in fleet_repositories("same_compute_capability")]
    assert shared == [["g4dn", "g5", "g6", "p4d", "p5"]]


def test_ampere_plus_builds_on_any_ampere_or_newer_gpu() -> None:
    g5 = resolve_target("g5")
    assert gpu_mismatch(g5, "NVIDIA L4", (8, 9), "ampere+") is None
    assert gpu_mismatch(g5, "NVIDIA H100", (9, 0), "ampere+") is None
    why = gpu_mismatch(g5, "Tesla T4", (7, 5), "ampere+")
    assert why is not None and "Ampere or newer" in why


def test_ampere_plus_is_refused_for_pre_ampere_targets() -> None:
    assert portability_problem(resolve_target("g4dn"), "ampere+") is not None
    assert portability_problem(resolve_target("p3"), "ampere+") is not None
    assert portability_problem(resolve_target("g5"), "ampere+") is None
    assert portability_problem(resolve_target("g4dn"), "none") is None


@pytest.mark.parametrize(("cc", "arch"), [
    ((7, 0), "Volta"), ((7, 5), "Turing"), ((8, 0), "Ampere"), ((8, 6), "Ampere"),
    ((8, 9), "Ada Lovelace"), ((9, 0), "Hopper"), ((10, 0), "Blackwell"), ((3, 5), "unknown"),
])
def test_architecture_for(cc: tuple[int, int], arch: str) -> None:
    assert architecture_for(cc) == arch


def test_table_architectures_agree_with_compute_capability() -> None:
    for t in TARGETS:
        if t.gpu is not None:
            assert architecture_for(t.gpu.compute_capability) == t.gpu.architecture, t.name
