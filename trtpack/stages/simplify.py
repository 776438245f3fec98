"""Simplify with onnxsim, keeping the dynamic axes. onnxsim sees the graph without its large
weights (see ``_simplify_worker``), so models over 2 GB are simplified too and the weights
are never copied through protobuf. When onnxsim fails, the unsimplified model is kept and
the report says why: this stage never fails the build."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from trtpack.options import BuildOptions
from trtpack.stages.base import StageContext, StageOutcome
from trtpack.stages.export import graph_summary

TIMEOUT_SECONDS = 1800


def fingerprint(options: BuildOptions) -> dict[str, Any]:
    return {"tool": "onnxsim", "node_metadata": 1}


def _dynamic_dims(path: Any) -> dict[str, list[str | int]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in (*model.graph.input, *model.graph.output)
    }


def run(ctx: StageContext) -> StageOutcome:
    src = ctx.artifact("onnx")
    before = graph_summary(src)["nodes"]
    try:
        import onnxsim  # noqa: F401
    except ImportError:
        reason = "onnxsim is not installed; kept as exported (pip install onnxsim)"
        return StageOutcome(status="skipped", message=reason, warnings=[reason],
                            metrics={"nodes_before": before, "nodes_after": before})
    dst = ctx.stage_dir / "model.onnx"
    result_path = ctx.stage_dir / "onnxsim.json"
    ctx.progress(f"onnxsim on {before} nodes")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "trtpack.stages._simplify_worker", str(src), str(dst),
             str(result_path)],
            capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False,
        )
        ctx.log.info("onnxsim stdout:\n%s\nstderr:\n%s", proc.stdout, proc.stderr)
        failure = None if proc.returncode == 0 else (
            (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1])
    except subprocess.TimeoutExpired:
        failure = f"timed out after {TIMEOUT_SECONDS} s"
    if failure is None and _dynamic_dims(dst) != _dynamic_dims(src):
        failure = "it changed the model's input/output shapes"
    if failure is not None:
        dst.unlink(missing_ok=True)
        result_path.unlink(missing_ok=True)
        reason = f"onnxsim failed ({failure}); kept the unsimplified model"
        return StageOutcome(status="skipped", message=reason, warnings=[reason],
                            metrics={"nodes_before": before, "nodes_after": before})
    result = json.loads(result_path.read_text())
    result_path.unlink()
    after = result["nodes_after"]
    return StageOutcome(
        artifacts={"onnx": dst},
        metrics={"nodes_before": before, "nodes_after": after,
                 "op_types": graph_summary(dst)["op_types"],
                 "weights_outside_onnxsim": result["weights_outside_onnxsim"],
                 "external_data": result["external_data"]},
        message=f"{before} → {after} nodes",
    )
