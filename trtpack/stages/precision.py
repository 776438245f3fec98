"""Precision: the FP32 ONNX made FP16 (ModelOpt AutoCast) or INT8 (ModelOpt PTQ, Q/DQ),
then verified per sample against the FP32 ONNX (``trtpack.precision``). TensorRT 11 takes
precision from the ONNX, so this model is what the engine stage builds.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from trtpack.errors import UserInputError
from trtpack.options import BuildOptions
from trtpack.precision.calibration.data import DEFAULT_TEXT, calibration_path
from trtpack.precision.calibration.files import file_sha256
from trtpack.precision.conversion import ConversionResult
from trtpack.precision.fp16.conversion import FP16_FIRST_NODES, MAX_FP16_ROUNDS, Fp16Conversion
from trtpack.precision.int8.conversion import Int8Conversion
from trtpack.precision.int8.fallback import (
    FALLBACK_QUANTIZE_OP_TYPES,
    GREEDY_FAILURES,
    MAX_INT8_ROUNDS,
    MAX_SEARCH_EVALUATIONS,
    SEARCH_MARGIN,
    SEARCH_PER_NODE,
    SENSITIVITY_SAMPLES,
)
from trtpack.precision.modelopt_jobs import ModelOptWorker
from trtpack.precision.source import prepare_source
from trtpack.stages.base import StageContext, StageOutcome

# Bump when the conversion or the search changes what this stage produces (cache key).
ALGORITHM_VERSION = 5


def fingerprint(options: BuildOptions) -> dict[str, Any]:
    r = options.recipe
    path = calibration_path(options) if options.precision == "int8" else None
    if path is not None and not path.is_file():
        raise UserInputError(f"calibration file {path} does not exist")
    return {
        "algorithm": ALGORITHM_VERSION,
        "search": [SEARCH_MARGIN, SEARCH_PER_NODE, MAX_INT8_ROUNDS, MAX_FP16_ROUNDS,
                   FP16_FIRST_NODES, MAX_SEARCH_EVALUATIONS, FALLBACK_QUANTIZE_OP_TYPES,
                   GREEDY_FAILURES, SENSITIVITY_SAMPLES],
        "precision": options.precision,
        "precision_options": r.precision_options.model_dump(),
        "verify": r.verify.model_dump(),
        "outputs": [o.model_dump() for o in r.outputs],
        "calibration_sha256": file_sha256(path) if path is not None else None,
        "default_text_sha256": file_sha256(DEFAULT_TEXT)
        if options.precision == "int8" and path is None else None,
        "calibration_method": options.calibration_method,
        "min_int8_share": options.min_int8_share,
        "fallback": options.fallback,
        "seed": options.seed,
        "profiles": [p.to_dict() for p in options.profiles],
    }


_EARLY_WORKERS: dict[str, ModelOptWorker] = {}  # started by warm_up, by precision


def warm_up(options: BuildOptions, build_dir: Path) -> None:
    """In the stage's own process, before its job: start the ModelOpt worker so it imports
    ModelOpt while the stages before this one run."""
    if options.precision in ("fp16", "int8"):
        _EARLY_WORKERS[options.precision] = ModelOptWorker(options.precision, build_dir)


def run(ctx: StageContext) -> StageOutcome:
    precision = ctx.options.precision
    if precision not in ("fp16", "int8"):
        raise UserInputError(f"the precision stage converts to fp16 or int8, not {precision}")
    result = convert(ctx, precision)
    return StageOutcome(artifacts=result.artifacts, metrics=result.metrics.as_dict(),
                        verification=result.verification, warnings=result.warnings,
                        message=result.message)


def convert(ctx: StageContext, precision: str, share_gate: bool = True) -> ConversionResult:
    """The FP16 or INT8 conversion of the FP32 ONNX into ``ctx.stage_dir`` (the CPU model
    stage runs the INT8 one itself, only when its first CPU form fails; ``share_gate``
    False: ``--min-int8-share`` is judged on the model served instead)."""
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=ctx.stage_dir))
    # the first conversion's worker imports ModelOpt while its job is prepared here
    worker = _EARLY_WORKERS.pop(precision, None) or ModelOptWorker(precision, ctx.stage_dir)
    try:
        source = prepare_source(ctx.artifact("onnx"), work / "source")
        if precision == "fp16":
            return Fp16Conversion(ctx, work, source, worker).run()
        return Int8Conversion(ctx, work, source, worker, share_gate=share_gate).run()
    finally:
        worker.close()
        shutil.rmtree(work, ignore_errors=True)
