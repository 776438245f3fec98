"""Both torch.onnx exporters on one model: export time, peak memory, graph size, accuracy.

    python benchmarks/exporters.py --recipe bert-large --json exporters.json

Each exporter runs in its own process on the recipe's architecture with random weights
(seed 0), at the recipe's first profile's opt shape. "export peak" is the process's RSS peak
while in the export call (the loaded model included); "process peak" covers the whole child
(model load, export, a PyTorch and an ONNX Runtime run for the accuracy column).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _measure import machine, run_measured

CHILD = r"""
import json, sys, time
from pathlib import Path
import numpy as np
from trtpack.api import BuildRequest, resolve_options
from trtpack.pytorch.models import load_model
from trtpack.stages import export as ex
from trtpack.stages.torch_export import export_onnx
from trtpack.onnx_tools.files import graph_summary
import logging
options, _ = resolve_options(BuildRequest(model=sys.argv[1], target="cpu", random_weights=True))
options = type(options)(**{**options.__dict__, "recipe": options.recipe.model_copy(
    update={"exporter": sys.argv[2]})})
loaded = load_model(options.recipe, random_weights=True, seed=0)
wrapper = ex.output_selector(loaded.module, options.recipe)
out = Path(sys.argv[3]) / "model.onnx"
from trtpack.resources import ResourceMeter
with ResourceMeter() as meter:
    export_onnx(wrapper, options, out, logging.getLogger("bench"))
seconds, export_peak = meter.seconds, meter.peak_mb
cases = ex.build_cases(options, loaded)[1:2]   # the opt corner
ex.run_torch(wrapper, options.recipe, cases)
import onnxruntime as ort
sess = ort.InferenceSession(str(out))
got = sess.run(None, cases[0].inputs)[0]
diff = float(np.abs(got - cases[0].outputs[options.recipe.outputs[0].name]).max())
print(json.dumps({"export_seconds": seconds, "export_peak_mb": export_peak,
                  "nodes": graph_summary(out)["nodes"],
                  "max_abs_diff_vs_torch": diff}))
"""

SIMPLIFY = r"""
import json, sys, onnx, onnxsim, time
m = onnx.load(sys.argv[1]); t = time.perf_counter()
s, _ = onnxsim.simplify(m, check_n=0)
print(json.dumps({"nodes_after_onnxsim": len(s.graph.node),
                  "onnxsim_seconds": time.perf_counter() - t}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--recipe", default="bert-large")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for exporter in ("dynamo", "legacy"):
        with tempfile.TemporaryDirectory() as tmp:
            m = run_measured([sys.executable, "-c", CHILD, args.recipe, exporter, tmp])
            if m.returncode != 0:
                raise SystemExit(f"{exporter} failed:\n{m.stderr[-3000:]}")
            row = {"exporter": exporter, **json.loads(m.stdout.strip().splitlines()[-1]),
                   "process_seconds": m.seconds, "peak_mb": m.peak_mb}
            s = run_measured([sys.executable, "-c", SIMPLIFY, str(Path(tmp) / "model.onnx")])
            if s.returncode == 0:
                row.update(json.loads(s.stdout.strip().splitlines()[-1]))
                row["onnxsim_peak_mb"] = s.peak_mb
            rows.append(row)
    print(f"| exporter | export s (in call) | export peak MB | process s | process peak MB "
          f"| nodes | nodes after onnxsim | onnxsim peak MB | max abs diff vs torch |  "
          f"({args.recipe})")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['exporter']} | {r['export_seconds']:.1f} | {r['export_peak_mb']:,.0f} | "
              f"{r['process_seconds']:.1f} | "
              f"{r['peak_mb']:,.0f} | {r['nodes']} | {r.get('nodes_after_onnxsim', '—')} | "
              f"{r.get('onnxsim_peak_mb', 0):,.0f} | {r['max_abs_diff_vs_torch']:.2e} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "recipe": args.recipe,
                                         "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
