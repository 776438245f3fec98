"""The benchmark scripts' own arithmetic (benchmarks/ is not a package: loaded by path):
the CPU anchor's rotation, its rotation-by-rotation pairs and the issue's checks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def anchor() -> ModuleType:
    return load("cpu_anchor")


def test_each_rotation_runs_every_call_in_a_new_order(anchor: ModuleType) -> None:
    order: list[str] = []
    calls = {name: (lambda name=name: order.append(name)) for name in "abcd"}
    timed = anchor.time_rotation(calls, rounds=6, seconds=0.0)
    rotations = ["".join(order[12 + 4 * i:16 + 4 * i]) for i in range(6)]  # after warm-up
    assert all(sorted(r) == list("abcd") for r in rotations)
    followers = {r[r.index("a") + 1] for r in rotations if not r.endswith("a")}
    assert len(followers) > 1  # "a" is not always followed by the same call
    assert all(len(t["round_p50_ms"]) == 6 for t in timed.values())


def timing(*rounds: float) -> dict[str, object]:
    return {"p50_ms": sorted(rounds)[len(rounds) // 2], "round_p50_ms": list(rounds)}


def test_pairs_are_read_rotation_by_rotation(anchor: ModuleType) -> None:
    # a load burst in rotation 2 slows both: the per-rotation ratio stays 2
    timings = {"8x128": {"trtpack fp32": timing(10, 50, 10),
                         "optimum O2": timing(20, 100, 20)}}
    assert anchor.paired_ratios(timings) == {"optimum O2 / trtpack fp32": {"8x128": 2.0}}


def test_checks_fail_on_one_slower_corner(anchor: ModuleType) -> None:
    fast = {"trtpack fp32": timing(1), "optimum O2": timing(2), "optimum O3": timing(2),
            "trtpack int8": timing(1), "optimum dynamic int8": timing(2)}
    slow = {**fast, "trtpack fp32": timing(3)}
    result = {"timings": {"1x8": fast, "8x128": slow},
              "accuracy": {"trtpack int8": {"worst": 0.995}}}
    checks = anchor.checks(result)
    assert list(checks.values()) == [False, True, True]
    result["timings"] = {"1x8": fast, "8x128": fast}
    result["accuracy"] = {"trtpack int8": {"worst": 0.989}}
    assert list(anchor.checks(result).values()) == [True, True, False]


def test_the_optimum_venv_never_takes_a_cuda_torch(anchor: ModuleType) -> None:
    assert anchor.TORCH_CPU.endswith("+cpu")
    assert not any(p.startswith("torch") for p in anchor.optimum_pins())


@pytest.fixture(scope="module")
def compute_floor() -> ModuleType:
    return load("compute_floor")


def test_onnxruntime_pass_multiplies_as_numpy(compute_floor: ModuleType, tmp_path: Path
                                              ) -> None:
    import numpy as np

    rng = np.random.default_rng(1)
    a = rng.standard_normal((48, 32), dtype=np.float32)
    b = rng.standard_normal((32, 24), dtype=np.float32)
    for prepacked in (False, True):
        (got,) = compute_floor.onnxruntime_matmul(b, 1, prepacked, tmp_path)(a)
        np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_each_runtime_timed_on_a_tiny_gemm(compute_floor: ModuleType) -> None:
    rates = compute_floor.gemm_rates(threads=1, repeats=2, m=64, k=32, n=48, prepacked=False)
    assert set(rates) == {"torch", "onnxruntime", "numpy"}
    assert all(r["best_gflops"] >= r["median_gflops"] > 0 for r in rates.values())


def test_each_pass_at_the_rate_of_its_runtime(compute_floor: ModuleType) -> None:
    rates = {"torch": {"best_gflops": 100.0}, "onnxruntime": {"best_gflops": 400.0},
             "numpy": {"best_gflops": 10_000.0}}  # numpy runs no pass: never the floor's
    passes = compute_floor.floor_seconds(4_000_000_000_000, rates)
    assert list(passes.values()) == [40.0, 10.0, 10.0]
    assert [runtime for _, runtime in compute_floor.PASSES] == ["torch", "onnxruntime",
                                                               "onnxruntime"]
