"""The CPU INT8 model of a convolutional model (one with a Conv whose weight is constant):
ONNX Runtime's static quantization (``trtpack.precision.cpu.static_int8``), calibrated on
the build's calibration split, gated per sample like every CPU INT8 form (the profile
corners and the held-out split the calibration never saw, ``--min-int8-share`` counted as
ONNX Runtime runs it: Conv, MatMul and Gemm on integer kernels), then timed against the FP32
model at each profile corner.

It is served when it passes its gates and is faster; otherwise the FP32 model is served
and the build says why (``ServedInt8.fp32_reason``). Either way the candidate's worst
sample, its integer-kernel Conv count and its p50 per corner are reported
(``ServedInt8.candidate``). Under ``--precision auto`` the timing and the choice are
``auto_choice``'s, as for every CPU candidate."""

from __future__ import annotations

import math
from pathlib import Path

from trtpack.cases import Case
from trtpack.report import JsonObject, VerificationRow
from trtpack.stages.base import StageContext
from trtpack.stages.cpu_int8_serving import (
    CHECK_INT8,
    CHECK_INT8_HELDOUT,
    ServedInt8,
    calibration,
    share_failures,
    verify_rows,
)

# rounds of the timing against FP32 at each corner (auto_choice's seconds a corner)
ROUNDS = 3


def serve_conv_int8(ctx: StageContext, work: Path, source: Path, fp32_path: Path,
                    cases: list[Case]) -> ServedInt8:
    """The static INT8 candidate of ``source`` built into ``<stage>/int8``, gated, timed
    against ``fp32_path`` (not under ``--precision auto``) and served or declined."""
    import onnx

    from trtpack.precision.cpu.int8 import held_out_cases, held_out_rows, runtime_op_counts
    from trtpack.precision.cpu.static_int8 import (
        STATIC_FORM,
        integer_layers,
        quantize_static_int8,
        weight_layers,
    )
    from trtpack.precision.int8.qdq import HISTOGRAM_METHODS

    settings = ctx.plan.recipe.precision_options.int8
    method = ctx.plan.calibration_method or settings.calibration_method
    cal, tokenizer = calibration(ctx)
    if method in HISTOGRAM_METHODS:  # trtpack's own Q/DQ only: ONNX Runtime's has no MSE
        cal.warnings.append(f"--calibration-method {method}: the CPU's static INT8 form (ONNX "
                            "Runtime's quantizer, which has no MSE calibrator) used max")
        method = "max"
    out = ctx.stage_dir / "int8" / "model.onnx"
    ctx.progress(f"CPU INT8: static quantization of Conv/MatMul/Gemm ({method} calibration "
                 f"on {cal.samples} samples)")
    try:
        quantize_static_int8(source, work / "static", out, cal.feeds, method)
    except Exception as e:  # a graph ONNX Runtime's quantizer cannot take
        reason = f"the static INT8 candidate could not be built: {type(e).__name__}: {e}"[:300]
        return ServedInt8(out, [], False, STATIC_FORM, (0, 0), {}, failures=[reason],
                          tried=[{"form": STATIC_FORM, "passed": False, "failures": [reason],
                                  "status": "failed"}],
                          fp32_reason=reason, warnings=list(cal.warnings))
    rows = verify_rows(ctx, out, cases, CHECK_INT8, "int8")
    held = held_out_cases(ctx.needs(ctx.artifacts.onnx, "onnx"), cal)
    rows += held_out_rows(CHECK_INT8_HELDOUT, ctx.plan.recipe, held, out, cal, tokenizer)
    layers = weight_layers(onnx.load(str(out), load_external_data=False))
    runs = integer_layers(runtime_op_counts(out, work))
    integer_convs, integer_matmuls = min(runs.convs, layers.convs), min(runs.matmuls,
                                                                         layers.matmuls)
    share = (integer_convs + integer_matmuls, layers.total)
    failures = [f"{r.check} {r.corner}: {r.reason}" for r in rows if not r.passed][:5]
    failures += share_failures(ctx.plan, share, "weight Conv/MatMul/Gemm layers")
    candidate: JsonObject = {
        "form": STATIC_FORM, "calibration": method, "calibration_samples": cal.samples,
        "integer_convs": integer_convs, "weight_convs": layers.convs,
        "integer_matmuls": integer_matmuls, "weight_matmuls": layers.matmuls,
        **worst_sample(rows), "passed": not failures}
    served = ServedInt8(out, rows, not failures, f"int8, {STATIC_FORM}", share, runs.kernels,
                        failures=failures, candidate=candidate, warnings=list(cal.warnings))
    if not ctx.plan.auto_precision:
        fp32_ms, int8_ms = time_against_fp32(ctx, fp32_path, out, cases)
        candidate["p50_ms"], candidate["fp32_p50_ms"] = int8_ms, fp32_ms
        served.fp32_reason = fp32_reason(failures, fp32_ms, int8_ms)
    served.tried = [{"form": STATIC_FORM, "passed": served.passed, "failures": failures,
                     "status": "failed" if served.fp32_reason or not served.passed
                     else "served"}]
    return served


def worst_sample(rows: list[VerificationRow]) -> JsonObject:
    """The worst sample the candidate was judged on (the profile corners and the held-out
    split): its metric, value and where; and the held-out split's worst alone."""
    judged = [r for r in rows if r.metric_value is not None]
    held = [r.metric_value for r in judged
            if r.check == CHECK_INT8_HELDOUT and r.metric_value is not None]
    if not judged:
        return {"worst": None}
    row = min(judged, key=lambda r: r.metric_value if r.metric_value is not None else math.inf)
    return {"worst": row.metric_value, "worst_metric": row.metric, "worst_at":
            f"{row.check} {row.corner} {row.output}" + (
                f" sample {row.worst_sample}" if row.worst_sample is not None else ""),
            "threshold": row.threshold, "heldout_worst": min(held) if held else None}


def time_against_fp32(ctx: StageContext, fp32_path: Path, int8_path: Path, cases: list[Case]
                      ) -> tuple[dict[str, float], dict[str, float]]:
    """p50 (ms) of the FP32 and INT8 models at each profile corner, timed in rotation."""
    from trtpack.precision.cpu.auto_choice import Candidate, time_candidates
    from trtpack.runtimes.onnxruntime import cpu_session

    ctx.progress("CPU INT8: timing the INT8 candidate against FP32 at every profile corner")
    candidates = [Candidate("fp32", fp32_path, True, None),
                  Candidate("int8", int8_path, True, None)]
    sessions = {c.name: cpu_session(c.path, spinning=False) for c in candidates}
    time_candidates(candidates, cases, sessions, rounds=ROUNDS)
    return candidates[0].p50_ms, candidates[1].p50_ms


def fp32_reason(failures: list[str], fp32_ms: dict[str, float], int8_ms: dict[str, float]
                ) -> str | None:
    """Why the FP32 model is served instead of the INT8 candidate, or None: its gates
    failed, or it is no faster (the geometric mean of its p50 over FP32's at the corners)."""
    if failures:
        return "the INT8 candidate failed its gates (" + "; ".join(failures[:2]) + ")"
    ratios = [int8_ms[k] / fp32_ms[k] for k in int8_ms if fp32_ms.get(k)]
    if not ratios:
        return None
    ratio = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    if ratio >= 1.0:
        return (f"the INT8 candidate passed its gates but gains nothing here: its p50 is "
                f"{ratio:.2f}x FP32's (geometric mean over the profile corners)")
    return None
