"""The exported graph's attention as torch.onnx writes it from transformers' SDPA attention (the
default) and from its eager attention (``set_attn_implementation("eager")``), issue 47: what
ONNX Runtime at ``ORT_ENABLE_ALL`` makes of each (the operators of the graph it runs, written
with ``optimized_model_filepath``) and the verify stage's ONNX Runtime pass on each
(``verify.compare.run_onnxruntime`` at every profile corner), in rotation, wall and CPU seconds.

    python benchmarks/export_attention.py [--recipe bert-large] \
        [--profile 1x128:16x128:128x128] [--set config.num_hidden_layers=4] [--rounds 2] \
        [--work DIR] [--json FILE]

Both graphs come from one loaded model (random weights), exported by the export stage's own
``export_onnx``; the passes' outputs are compared with each other (max abs diff) and with
PyTorch's (the SDPA module's).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, self_usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="bert-large")
    parser.add_argument("--profile", default="1x128:16x128:128x128")
    parser.add_argument("--set", action="append", default=[], help="a recipe KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import numpy as np
    import onnx

    from trtpack.api import BuildRequest, resolve_options
    from trtpack.pytorch.footprint import unfuse_attention
    from trtpack.pytorch.models import load_model
    from trtpack.runtimes.onnxruntime import cpu_session
    from trtpack.stages.export import build_cases, output_selector
    from trtpack.stages.reference_pass import copy_sharing_weights, run_torch
    from trtpack.stages.torch_export import export_onnx
    from trtpack.verify.compare import run_onnxruntime

    plan, _ = resolve_options(BuildRequest(args.recipe, profiles=[args.profile], target="cpu",
                                           random_weights=True, overrides=args.set))
    recipe = plan.recipe
    loaded = load_model(recipe, random_weights=True, seed=plan.seed)
    wrapper = output_selector(loaded.module, recipe)
    log = logging.getLogger("export_attention")
    work = args.work or Path(tempfile.mkdtemp(prefix="export-attention-"))
    cases, _, _ = build_cases(plan, loaded)
    run_torch(wrapper, recipe, cases)
    graphs: dict[str, Path] = {}
    operators: dict[str, dict[str, int]] = {}
    for name in ("sdpa", "eager"):
        module = copy_sharing_weights(wrapper)
        assert module is not None
        if name == "eager" and not unfuse_attention(module):
            sys.exit(f"error: {args.recipe} has no transformers attention to switch")
        (work / name).mkdir(parents=True, exist_ok=True)
        graphs[name] = work / name / "model.onnx"
        export_onnx(module, plan, graphs[name], log)
        optimized = work / name / "optimized.onnx"
        cpu_session(graphs[name], few_runs=True, optimized_model_path=optimized)
        operators[name] = dict(Counter(n.op_type for n in onnx.load(
            str(optimized), load_external_data=False).graph.node).most_common())
        optimized.unlink()
        for extra in optimized.parent.glob("optimized.onnx*"):
            extra.unlink()
        print(json.dumps({"graph": name, "optimized_operators": operators[name]}), flush=True)
    rows: list[dict[str, Any]] = []
    outputs: dict[str, list[dict[str, Any]]] = {}
    for index in range(args.rounds):
        for name, path in graphs.items():
            before = self_usage()
            outputs[name] = run_onnxruntime(path, cases)
            after = self_usage()
            row = {"round": index, "graph": name, "wall": round(after[1] - before[1], 2),
                   "cpu": round(after[0] - before[0], 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    differences = {
        name: [max(float(np.max(np.abs(out[k] - case.outputs[k]))) for k in case.outputs)
               for out, case in zip(outputs[name], cases, strict=True)]
        for name in graphs}
    between = [max(float(np.max(np.abs(a[k] - b[k]))) for k in a)
               for a, b in zip(outputs["sdpa"], outputs["eager"], strict=True)]
    print(json.dumps({"max_abs_vs_pytorch": differences, "max_abs_between": between}))
    for name in graphs:
        mine = [r for r in rows if r["graph"] == name]
        print(f"{name}: wall s " + " / ".join(str(r["wall"]) for r in mine)
              + ", CPU s " + " / ".join(str(r["cpu"]) for r in mine))
    if args.work is None:
        shutil.rmtree(work)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine(), "command": " ".join(["python", *sys.argv]),
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "recipe": args.recipe, "profile": args.profile, "set": args.set,
            "optimized_operators": operators, "max_abs_vs_pytorch": differences,
            "max_abs_between": between, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
