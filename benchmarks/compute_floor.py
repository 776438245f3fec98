"""The compute floor of a build's verification: the FP32 FLOPs of one forward pass over every
profile corner (what each verification pass runs), each pass at the GEMM rate of the
runtime that runs it, measured in the same sitting, so a build's time can be read against
the least time its checks need.

    python benchmarks/compute_floor.py --recipe bert-large --profile 1x128:16x128:128x128 \
        --threads 2 --json benchmarks/results/compute-floor-bert-large.json \
        [--build OUT]   # a finished build of that command: its time and stages beside the floor

The passes and their runtimes: the PyTorch reference (``export``: torch), the ONNX model
(``verify``: ONNX Runtime) and the CPU model (``cpu_model``: ONNX Runtime). GEMM rates: a
float32 (M x K) @ (K x N) product shaped like a transformer's feed-forward projection
(tokens x hidden x 4 hidden) on ``--threads`` threads, timed in rotation (torch, ONNX
Runtime, numpy, ``--repeats`` rounds; best and median): ``torch.matmul``; ONNX Runtime's
MLAS through a one-``MatMul`` session whose weight is an initializer, pre-packed or not as
trtpack's checks decide for these corners (``runtimes.onnxruntime.few_runs_prepacked``);
numpy only as information (its BLAS, e.g. OpenBLAS under ``OPENBLAS_CORETYPE``, runs no
pass), with the core type it ran under. FLOPs: one forward pass of the recipe's module at
each corner, counted by ``torch.utils.flop_counter`` on PyTorch's meta device (no weights,
nothing computed; the module as ``trtpack.pytorch.footprint`` builds it, attention as
separate operations, as the ONNX graph runs it). The floor is the sum over the passes of
FLOPs / the rate of the pass's runtime (the best measured): what the checks cost if every
matrix product ran at that rate and nothing else took time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine

# each verification pass and the runtime that runs it
PASSES = (("PyTorch reference (export)", "torch"), ("ONNX model (verify)", "onnxruntime"),
          ("CPU model (cpu_model)", "onnxruntime"))
RUNTIMES = ("torch", "onnxruntime", "numpy")  # numpy: information only


def onnxruntime_matmul(b: Any, threads: int, prepacked: bool, folder: Path
                       ) -> Callable[[Any], object]:
    """``a @ b`` by ONNX Runtime's MLAS: a one-MatMul model with ``b`` as its initializer,
    in a session with trtpack's options for its checks (``cpu_session(few_runs=True)``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from trtpack.runtimes.onnxruntime import cpu_session

    k, n = b.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], "gemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])],
        [numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "gemm.onnx"
    onnx.save_model(model, str(path))
    session = cpu_session(path, threads, few_runs=True, prepacked=prepacked)
    return lambda a: session.run(["y"], {"a": a})


def numpy_blas() -> dict[str, str]:
    """numpy's BLAS and the core type it runs (``OPENBLAS_CORETYPE`` where set, else what
    OpenBLAS detected, read through threadpoolctl where installed)."""
    found = {"openblas_coretype_env": os.environ.get("OPENBLAS_CORETYPE", "(not set)")}
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return found
    for pool in threadpool_info():
        if pool.get("user_api") == "blas":
            found.update({"library": str(pool.get("internal_api")),
                          "version": str(pool.get("version")),
                          "architecture": str(pool.get("architecture"))})
            break
    return found


def gemm_rates(threads: int, repeats: int, m: int, k: int, n: int, prepacked: bool
               ) -> dict[str, dict[str, float]]:
    """GFLOP/s of float32 (m x k) @ (k x n) per runtime (``RUNTIMES``): best and median of
    ``repeats`` rounds, the runtimes taking turns within each round (numpy's BLAS threads
    follow OMP/OPENBLAS_NUM_THREADS, set before numpy is imported)."""
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    flops = 2.0 * m * k * n
    with tempfile.TemporaryDirectory(prefix="compute-floor-") as tmp:
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        ort_matmul = onnxruntime_matmul(b, threads, prepacked, Path(tmp))
        calls: dict[str, Callable[[], object]] = {
            "torch": lambda: torch.matmul(ta, tb),
            "onnxruntime": lambda: ort_matmul(a),
            "numpy": lambda: np.matmul(a, b)}
        times: dict[str, list[float]] = {name: [] for name in calls}
        for call in calls.values():  # warm-up
            call()
        for _ in range(repeats):
            for name, call in calls.items():
                started = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - started)
    return {name: {"best_gflops": round(flops / min(t) / 1e9, 1),
                   "median_gflops": round(flops / statistics.median(t) / 1e9, 1)}
            for name, t in times.items()}


def floor_seconds(flops_per_pass: int, rates: dict[str, dict[str, float]]
                  ) -> dict[str, float]:
    """Each pass's floor (s): its FLOPs at the best rate of the runtime that runs it."""
    return {name: flops_per_pass / (rates[runtime]["best_gflops"] * 1e9)
            for name, runtime in PASSES}


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


def build_record(out: Path) -> dict[str, Any]:
    """A finished build's wall time, peak and stage times (its ``report.json``)."""
    report = json.loads((out / "report.json").read_text())
    return {"out": str(out), "total_seconds": report.get("total_seconds"),
            "peak_memory_mb": report.get("peak_memory_mb"),
            "stages": {s["name"]: round(s["seconds"], 1) for s in report["stages"]
                       if s.get("seconds") is not None}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="bert-large")
    parser.add_argument("--profile", default="1x128:16x128:128x128",
                        help="the build's --profile (empty: the recipe's own)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gemm", default="16384x1024x4096",
                        help="M x K x N of the timed product (tokens x hidden x 4 hidden)")
    parser.add_argument("--build", type=Path,
                        help="a finished build of this recipe and profile: its time and "
                             "stages beside the floor (report.json)")
    parser.add_argument("--build-seconds", type=float,
                        help="a measured build's wall time, printed beside the floor")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import numpy as np

    from trtpack.runtimes.onnxruntime import few_runs_prepacked

    m, k, n = (int(x) for x in args.gemm.split("x"))
    corners = corner_flops(args.recipe, args.profile or None)
    # pre-packed as trtpack's checks are at these corners (the rows they run)
    prepacked = few_runs_prepacked(
        {name: np.empty(shape) for name, shape in c["shapes"].items()}  # type: ignore[attr-defined]
        for c in corners)
    rates = gemm_rates(args.threads, args.repeats, m, k, n, prepacked)
    per_pass = sum(int(c["flops"]) for c in corners)  # type: ignore[call-overload]
    largest = max(corners, key=lambda c: int(c["flops"]))  # type: ignore[call-overload]
    passes = floor_seconds(per_pass, rates)
    floor = sum(passes.values())
    build = build_record(args.build) if args.build else None
    seconds = args.build_seconds or (build or {}).get("total_seconds")
    blas = numpy_blas()
    print(f"machine: {machine()}")
    print(f"FP32 GEMM {args.gemm} on {args.threads} threads, GFLOP/s best (median): "
          + ", ".join(f"{name} {r['best_gflops']} ({r['median_gflops']})"
                      for name, r in rates.items())
          + f"; ONNX Runtime's weight {'pre-packed' if prepacked else 'not pre-packed'} as "
          f"trtpack's checks at these corners; numpy (information only) on {blas}")
    print(f"{args.recipe} --profile {args.profile or '(recipe)'}: one forward pass over every "
          f"corner {per_pass / 1e12:.2f} TFLOP (largest corner {largest['corner']} "
          f"{largest['shapes']}: {int(largest['flops']) / 1e12:.2f} TFLOP)")  # type: ignore[call-overload]
    print("verification floor: " + " + ".join(
        f"{name} {s:.1f} s ({runtime})" for (name, runtime), s in
        zip(PASSES, passes.values(), strict=True)) + f" = {floor:.0f} s"
          + (f"; the build took {seconds:.0f} s ({seconds / floor:.2f}x the floor)"
             if seconds else ""))
    if build:
        print("the build's stages (s): " + ", ".join(f"{k} {v}" for k, v in
                                                   build["stages"].items())
              + f"; peak {build['peak_memory_mb']:.0f} MB")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine(), "measured_at": time.strftime("%Y-%m-%d %H:%M UTC",
                                                               time.gmtime()),
            "command": " ".join(["python", *sys.argv]),
            "recipe": args.recipe, "profile": args.profile,
            "threads": args.threads, "gemm": args.gemm, "rates_gflops": rates,
            "onnxruntime_prepacked": prepacked, "numpy_blas": blas, "corners": corners,
            "flops_per_pass": per_pass,
            "passes": [{"pass": name, "runtime": runtime, "floor_seconds": round(s, 2)}
                       for (name, runtime), s in zip(PASSES, passes.values(), strict=True)],
            "floor_seconds": round(floor, 2), "build_seconds": seconds, "build": build},
            indent=2) + "\n")


if __name__ == "__main__":
    main()
