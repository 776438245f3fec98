"""Verify: the FP32 ONNX in ONNX Runtime against PyTorch at every profile corner.

Also saves the ONNX Runtime outputs (``fp32_outputs.npz``): the reference that the precision
and engine stages are compared with."""

from __future__ import annotations

from dataclasses import dataclass

from trtpack.cases import load_cases, save_cases, with_outputs
from trtpack.options import BuildPlan
from trtpack.report import JsonObject
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import StageContext, StageMetrics, StageOutcome
from trtpack.verify.compare import compare_cases, run_onnxruntime, saved_tokenizer_text


@dataclass
class VerifyMetrics(StageMetrics):
    cases: int
    failed: int  # verification rows that failed
    max_abs_diff: float


CHECK = "onnx-vs-torch"
CHECK_ONNX_IN = "simplified-vs-input-onnx"  # ONNX in: the reference is the user's ONNX


def fingerprint(plan: BuildPlan) -> JsonObject:
    r = plan.recipe
    return {"tolerance": r.verify.model_dump(), "metrics": [o.model_dump() for o in r.outputs]}


def run(ctx: StageContext) -> StageOutcome:
    cases = load_cases(ctx.needs(ctx.artifacts.reference, "reference"))
    ctx.progress(f"ONNX Runtime on {len(cases)} cases (min/opt/max of every profile)")
    outputs = run_onnxruntime(ctx.needs(ctx.artifacts.onnx, "onnx"), cases)
    ctx.log.info("ONNX Runtime ran every case; comparing")
    onnx_in = ctx.plan.recipe.source.onnx is not None
    recipe = ctx.plan.recipe
    rows = compare_cases(CHECK_ONNX_IN if onnx_in else CHECK, recipe, "fp32", cases, outputs,
                         saved_tokenizer_text(ctx.artifacts.tokenizer, recipe))
    fp32_outputs = ctx.stage_dir / "fp32_outputs.npz"
    # ONNX in: later stages are compared with the user's ONNX itself
    save_cases(fp32_outputs, cases if onnx_in else with_outputs(cases, outputs))
    ctx.log.info("compared and saved")
    failed = sum(not r.passed for r in rows)
    worst = max((r.max_abs_diff for r in rows), default=0.0)
    return StageOutcome(
        artifacts=Artifacts(fp32_outputs=fp32_outputs),
        verification=rows,
        metrics=VerifyMetrics(cases=len(cases), failed=failed, max_abs_diff=worst),
        message=f"{len(rows) - failed}/{len(rows)} checks passed, max abs diff {worst:.2e}",
    )
