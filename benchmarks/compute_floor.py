"""The compute floor of a build's verification: this machine's FP32 GEMM rate, and the FP32
FLOPs of one forward pass over every profile corner (what each verification pass runs: the
PyTorch reference, the ONNX model, the CPU model), so a build's time can be read against
the least time its checks need.

    python benchmarks/compute_floor.py --recipe bert-large --profile 1x128:16x128:128x128 \
        --threads 2 --json benchmarks/results/compute-floor-bert-large.json

GEMM rate: ``torch.matmul`` and ``numpy.matmul`` of float32 matrices shaped like a
transformer's feed-forward projection (tokens x hidden x 4 hidden) on ``--threads`` threads,
best of ``--repeats``. FLOPs: one forward pass of the recipe's module at each corner, counted
by ``torch.utils.flop_counter`` on PyTorch's meta device (no weights, nothing computed; the
module as ``trtpack.pytorch.footprint`` builds it, attention as separate operations, as the
ONNX graph runs it). The floor is passes x FLOPs / rate: what the checks cost if every
matrix product ran at the measured rate and nothing else took time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine

PASSES = ("PyTorch reference", "ONNX model (verify)", "CPU model (cpu_model)")


def gemm_rate(threads: int, repeats: int, m: int, k: int, n: int) -> dict[str, float]:
    """GFLOP/s of float32 (m x k) @ (k x n): best and median of ``repeats``, torch and numpy
    (numpy's BLAS threads follow OMP/OPENBLAS_NUM_THREADS, set before numpy is imported)."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    flops = 2.0 * m * k * n
    found: dict[str, float] = {}
    for name, mul, x, y in (("torch", torch.matmul, torch.from_numpy(a), torch.from_numpy(b)),
                            ("numpy", np.matmul, a, b)):
        mul(x, y)  # warm-up
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            mul(x, y)
            times.append(time.perf_counter() - started)
        found[f"{name}_best_gflops"] = round(flops / min(times) / 1e9, 1)
        found[f"{name}_median_gflops"] = round(flops / statistics.median(times) / 1e9, 1)
    return found


def corner_flops(recipe_name: str, profile: str | None) -> list[dict[str, object]]:
    """FLOPs of one forward pass at each corner of the build's profiles."""
    import numpy as np
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from trtpack.api import BuildRequest, resolve_options
    from trtpack.pytorch.footprint import meta_module, unfuse_attention

    options, _ = resolve_options(BuildRequest(
        recipe_name, profiles=[profile] if profile else [], target="cpu",
        random_weights=True))
    from torch.utils._python_dispatch import TorchDispatchMode

    scalar_ops = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default}

    class Scalars(TorchDispatchMode):
        """A value read back into Python (no data on the meta device) reads as 1 / True, as
        in ``trtpack.pytorch.footprint``: the path of a batch without padding."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func in scalar_ops:
                return True if args[0].dtype == torch.bool else \
                    1.0 if args[0].is_floating_point() else 1
            return func(*args, **(kwargs or {}))

    module = meta_module(options.recipe).eval()
    unfuse_attention(module)
    dtypes = {spec.name: torch.from_numpy(np.zeros(0, dtype=spec.dtype)).dtype
              for spec in options.recipe.input_specs()}
    rows = []
    for index, prof in enumerate(options.profiles):
        for which, shapes in prof.corners():
            feeds = {name: torch.ones(tuple(shape), dtype=dtypes[name], device="meta")
                     for name, shape in shapes.items()}
            with torch.no_grad(), FlopCounterMode(display=False) as counter, Scalars():
                module(**feeds)
            rows.append({"profile": index, "corner": which,
                         "shapes": {n: list(s) for n, s in shapes.items()},
                         "flops": int(counter.get_total_flops())})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="bert-large")
    parser.add_argument("--profile", default="1x128:16x128:128x128",
                        help="the build's --profile (empty: the recipe's own)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gemm", default="16384x1024x4096",
                        help="M x K x N of the timed product (tokens x hidden x 4 hidden)")
    parser.add_argument("--build-seconds", type=float,
                        help="a measured build's wall time, printed beside the floor")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    m, k, n = (int(x) for x in args.gemm.split("x"))
    rate = gemm_rate(args.threads, args.repeats, m, k, n)
    corners = corner_flops(args.recipe, args.profile or None)
    per_pass = sum(int(c["flops"]) for c in corners)  # type: ignore[call-overload]
    largest = max(corners, key=lambda c: int(c["flops"]))  # type: ignore[call-overload]
    best = max(rate["torch_best_gflops"], rate["numpy_best_gflops"]) * 1e9
    floor = len(PASSES) * per_pass / best
    print(f"machine: {machine()}")
    print(f"FP32 GEMM {args.gemm} on {args.threads} threads: torch {rate['torch_best_gflops']}"
          f" GFLOP/s best ({rate['torch_median_gflops']} median), numpy "
          f"{rate['numpy_best_gflops']} ({rate['numpy_median_gflops']})")
    print(f"{args.recipe} --profile {args.profile or '(recipe)'}: one forward pass over every "
          f"corner {per_pass / 1e12:.2f} TFLOP (largest corner {largest['corner']} "
          f"{largest['shapes']}: {int(largest['flops']) / 1e12:.2f} TFLOP)")  # type: ignore[call-overload]
    print(f"verification: {len(PASSES)} passes ({', '.join(PASSES)}) = "
          f"{len(PASSES) * per_pass / 1e12:.1f} TFLOP; floor at the best measured rate "
          f"{floor:.0f} s" + (f"; the build took {args.build_seconds:.0f} s "
                              f"({args.build_seconds / floor:.2f}x the floor)"
                              if args.build_seconds else ""))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine(), "recipe": args.recipe, "profile": args.profile,
            "threads": args.threads, "gemm": args.gemm, "rate": rate, "corners": corners,
            "flops_per_pass": per_pass, "passes": list(PASSES), "floor_seconds": floor,
            "build_seconds": args.build_seconds}, indent=2))


if __name__ == "__main__":
    main()
