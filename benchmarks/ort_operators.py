"""Where a check's ONNX Runtime pass spends its time, by operator (issue 47): ONNX Runtime's
own profiler (``enable_profiling``) over one run of a finished build's model at one profile
corner, in the session the checks make (``cpu_session(few_runs=True)``, pre-packed as they
decide), kernel time summed by operator type and by node.

    python benchmarks/ort_operators.py BUILD_DIR [--model verify|cpu_model] [--corner max] \
        [--threads 1] [--runs 2] [--top 12] [--json FILE]

``verify`` runs ``artifacts/simplify/model.onnx`` (the plain graph verify checks and hands
on), ``cpu_model`` the fused FP32 CPU model (``artifacts/cpu_model/fp32/model.onnx``).
Inputs: the build's reference case at ``--corner``. The first run is not counted (it
allocates); the kernel times are wall time inside each kernel, so on a loaded machine read
the shares, not the seconds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine

MODELS = {"verify": Path("simplify") / "model.onnx",
          "cpu_model": Path("cpu_model") / "fp32" / "model.onnx"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path)
    parser.add_argument("--model", choices=sorted(MODELS), default="verify")
    parser.add_argument("--corner", default="max", help="min, opt or max (profile 0's)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=2, help="runs, the first not counted")
    parser.add_argument("--top", type=int, default=12, help="nodes listed")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import onnxruntime as ort

    from trtpack.cases import load_cases
    from trtpack.runtimes.onnxruntime import few_runs_prepacked

    artifacts = args.build / "artifacts"
    cases = load_cases(artifacts / "export" / "reference.npz")
    case = next(c for c in cases if c.corner == args.corner)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not few_runs_prepacked([c.inputs for c in cases]):
        options.add_session_config_entry("session.disable_prepacking", "1")
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.intra_op_num_threads = args.threads
    options.enable_profiling = True
    with tempfile.TemporaryDirectory(prefix="ort-operators-") as tmp:
        options.profile_file_prefix = os.path.join(tmp, "profile")
        session = ort.InferenceSession(str(artifacts / MODELS[args.model]), options,
                                       providers=["CPUExecutionProvider"])
        names = {i.name for i in session.get_inputs()}
        feed = {k: v for k, v in case.inputs.items() if k in names}
        for _ in range(max(args.runs, 2)):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    counted_from = runs[0]["ts"] + runs[0]["dur"] if runs else 0
    by_op: collections.Counter[str] = collections.Counter()
    by_node: collections.Counter[tuple[str, str]] = collections.Counter()
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") \
                and e["ts"] >= counted_from:
            op = e["args"]["op_name"]
            by_op[op] += e["dur"]
            by_node[(op, e["name"].removesuffix("_kernel_time"))] += e["dur"]
    total = sum(by_op.values()) or 1
    print(f"{args.model} at {case.corner} ({case.shapes}), {args.threads} thread(s), "
          f"{max(args.runs, 2) - 1} run(s) counted:")
    for op, us in by_op.most_common():
        if us:
            print(f"  {op:28s} {us / 1e6:8.3f} s {100 * us / total:5.1f} %")
    print("slowest nodes:")
    for (op, node), us in by_node.most_common(args.top):
        print(f"  {op:24s} {node:48s} {us / 1e6:.3f} s")
    if args.json:
        result: dict[str, Any] = {
            "build": str(args.build), "model": args.model, "corner": case.corner,
            "threads": args.threads, "machine": machine(),
            "operators": {op: {"seconds": us / 1e6, "share": us / total}
                          for op, us in by_op.most_common()}}
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
