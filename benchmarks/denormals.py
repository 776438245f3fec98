"""Whether subnormal floats cost the design card's checks time (issue 47): each pass that
verifies the model, run with and without flushing subnormals to zero, sides alternating in
one process, CPU-seconds per profile corner, and what the flush changes in the outputs.

    python benchmarks/denormals.py BUILD_DIR [--random-weights] [--seed 0] [--rounds 4] \
        [--threads 1] [--json FILE]

BUILD_DIR is a finished ``trtpack build ... --target cpu`` of a model trtpack exported (a
2-layer bert-large recipe is a stand-in for the design card at a twelfth of its cost). The
passes: verify's ONNX Runtime session on ``artifacts/simplify/model.onnx`` and the
cpu_model stage's on ``artifacts/cpu_model/fp32/model.onnx`` (``cpu_session(few_runs=True)``,
pre-packed as the checks decide), with and without ONNX Runtime's
``session.set_denormal_as_zero`` (FTZ/DAZ on its threads); the PyTorch reference (the
recipe's model as the export stage loads it, ``--random-weights``/``--seed`` as the build
was made) with and without ``torch.set_flush_denormal(True)``. Inputs: the build's own
reference cases (the profile corners' padded text). Printed per pass and side: median
CPU-seconds per corner (the figure a loaded machine inflates least), the number of subnormal
values in the outputs, the largest difference between the sides and from the saved PyTorch
outputs at every corner.

Measured (issue 47, 2026-11-28, loaded): no pass ran faster with the flush and every output
was bit-identical; benchmarks/README.md, "Denormals are not the cost".
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine

SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)  # 1.1754944e-38

Run = Callable[[dict[str, np.ndarray]], np.ndarray]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def subnormals(a: np.ndarray) -> int:
    return int(((a != 0) & (np.abs(a) < SMALLEST_NORMAL)).sum())


def onnxruntime_side(path: Path, feeds: list[dict[str, np.ndarray]], threads: int,
                     flush: bool) -> Run:
    """A session with verify's options (``cpu_session(few_runs=True)``, pre-packed as
    ``few_runs_prepacked`` decides), subnormals flushed or not; runs one feed, first output."""
    import onnxruntime as ort

    from trtpack.runtimes.onnxruntime import few_runs_prepacked

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not few_runs_prepacked(feeds):
        options.add_session_config_entry("session.disable_prepacking", "1")
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.intra_op_num_threads = threads
    if flush:
        options.add_session_config_entry("session.set_denormal_as_zero", "1")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return lambda feed: session.run(None, {k: v for k, v in feed.items() if k in names})[0]


def torch_side(module: Any, input_names: list[str], flush: bool) -> Run:
    import torch

    def run(feed: dict[str, np.ndarray]) -> np.ndarray:
        torch.set_flush_denormal(flush)
        try:
            with torch.inference_mode():
                out = module(*[torch.from_numpy(feed[n]) for n in input_names])
        finally:
            torch.set_flush_denormal(False)
        return out[0].float().numpy()

    return run


def compare(name: str, sides: dict[bool, Callable[[], Run]], cases: list[Any], rounds: int
            ) -> dict[str, Any]:
    """Both sides (``sides[flush]`` makes the runner) over every case, alternating."""
    seconds: dict[bool, list[list[float]]] = {False: [], True: []}
    outputs: dict[bool, list[np.ndarray]] = {}
    for round_ in range(rounds):
        for flush in (False, True) if round_ % 2 == 0 else (True, False):
            run = sides[flush]()
            per_corner, outs = [], []
            for case in cases:
                started = cpu_seconds()
                outs.append(run(case.inputs))
                per_corner.append(cpu_seconds() - started)
            seconds[flush].append(per_corner)
            outputs[flush] = outs
            print(f"{name} round {round_} {'flush' if flush else 'plain'}: "
                  f"{sum(per_corner):.2f} CPU-s ({', '.join(f'{s:.2f}' for s in per_corner)})",
                  flush=True)
    corners = []
    for i, case in enumerate(cases):
        reference = next(iter(case.outputs.values()))
        plain, flushed = outputs[False][i], outputs[True][i]
        corners.append({
            "corner": case.label,
            "median_cpu_s": {side: float(np.median([s[i] for s in seconds[flush]]))
                             for side, flush in (("plain", False), ("flush", True))},
            "subnormal_outputs": {"plain": subnormals(plain), "flush": subnormals(flushed)},
            "max_abs_plain_vs_flush": float(np.abs(plain - flushed).max()),
            "max_abs_vs_pytorch": {"plain": float(np.abs(plain - reference).max()),
                                   "flush": float(np.abs(flushed - reference).max())}})
    total = {side: float(np.median([sum(s) for s in seconds[flush]]))
             for side, flush in (("plain", False), ("flush", True))}
    print(f"{name}: median {total['plain']:.2f} CPU-s plain, {total['flush']:.2f} flush")
    for c in corners:
        print(f"  {c['corner']}: plain-vs-flush {c['max_abs_plain_vs_flush']:.3g}, vs PyTorch "
              f"{c['max_abs_vs_pytorch']['plain']:.3g} / {c['max_abs_vs_pytorch']['flush']:.3g}"
              f", subnormal outputs {c['subnormal_outputs']['plain']}")
    return {"median_cpu_s": total, "corners": corners}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path)
    parser.add_argument("--random-weights", action="store_true",
                        help="the build was made with --random-weights (the torch pass)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import torch

    from trtpack.cases import load_cases
    from trtpack.pytorch.models import load_model
    from trtpack.sources.recipe_files import load_recipe_file
    from trtpack.stages.export import output_selector

    torch.set_num_threads(args.threads)
    artifacts = args.build / "artifacts"
    cases = load_cases(artifacts / "export" / "reference.npz")
    feeds = [c.inputs for c in cases]
    result: dict[str, Any] = {"build": str(args.build), "threads": args.threads,
                              "machine": machine(), "passes": {}}
    for name, model in (("verify (ONNX Runtime)", artifacts / "simplify" / "model.onnx"),
                        ("cpu_model (ONNX Runtime)",
                         artifacts / "cpu_model" / "fp32" / "model.onnx")):
        if model.is_file():
            result["passes"][name] = compare(name, {
                flush: (lambda m=model, f=flush: onnxruntime_side(m, feeds, args.threads, f))
                for flush in (False, True)}, cases, args.rounds)
    recipe = load_recipe_file(args.build / "recipe.yaml")
    loaded = load_model(recipe, random_weights=args.random_weights, seed=args.seed)
    module = output_selector(loaded.module, recipe)
    names = [i.name for i in recipe.inputs]
    result["passes"]["reference (PyTorch)"] = compare(
        "reference (PyTorch)", {flush: (lambda f=flush: torch_side(module, names, f))
                                for flush in (False, True)}, cases, args.rounds)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
