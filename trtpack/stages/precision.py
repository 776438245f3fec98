"""Precision: the FP32 ONNX made FP16 (ModelOpt AutoCast) or INT8 (ModelOpt PTQ, Q/DQ),
then verified per sample against the FP32 ONNX (``trtpack.precision``). TensorRT 11 takes
precision from the ONNX, so this model is what the engine stage builds.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trtpack.errors import StageError, UserInputError
from trtpack.options import BuildPlan
from trtpack.precision.calibration.data import DEFAULT_TEXT, calibration_path
from trtpack.precision.calibration.files import file_sha256
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
from trtpack.precision.int8.qdq import QUANTIZER_VARIABLE, first_conversion_is_own
from trtpack.precision.metrics import Fp16Metrics, Int8Metrics
from trtpack.precision.modelopt_jobs import MODELOPT_MODES, ModelOptWorker
from trtpack.precision.source import prepare_source
from trtpack.report import JsonObject
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import StageContext, StageMetrics, StageOutcome

# Bump when the conversion or the search changes what this stage produces (cache key).
ALGORITHM_VERSION = 7


def fingerprint(plan: BuildPlan) -> JsonObject:
    r = plan.recipe
    path = calibration_path(plan) if plan.precision == "int8" else None
    if path is not None and not path.is_file():
        raise UserInputError(f"calibration file {path} does not exist")
    return {
        "algorithm": ALGORITHM_VERSION,
        "int8_quantizer": os.environ.get(QUANTIZER_VARIABLE) or "trtpack",
        "search": [SEARCH_MARGIN, SEARCH_PER_NODE, MAX_INT8_ROUNDS, MAX_FP16_ROUNDS,
                   FP16_FIRST_NODES, MAX_SEARCH_EVALUATIONS, FALLBACK_QUANTIZE_OP_TYPES,
                   GREEDY_FAILURES, SENSITIVITY_SAMPLES],
        "precision": plan.precision,
        "precision_options": r.precision_options.model_dump(),
        "verify": r.verify.model_dump(),
        "outputs": [o.model_dump() for o in r.outputs],
        "calibration_sha256": file_sha256(path) if path is not None else None,
        "default_text_sha256": file_sha256(DEFAULT_TEXT)
        if plan.precision == "int8" and path is None else None,
        "calibration_method": plan.calibration_method,
        "min_int8_share": plan.min_int8_share,
        "fallback": plan.fallback,
        "seed": plan.seed,
        "profiles": [p.to_dict() for p in plan.profiles],
    }


_EARLY_WORKERS: dict[str, ModelOptWorker] = {}  # started by warm_up, by precision


def warm_up(plan: BuildPlan, build_dir: Path) -> None:
    """In the stage's own process, before its job: start the ModelOpt worker so it imports
    ModelOpt while the stages before this one run."""
    if plan.precision == "fp16" or (plan.precision == "int8"
                                    and not first_conversion_is_own(plan)):
        _EARLY_WORKERS[plan.precision] = ModelOptWorker(plan.precision, build_dir)


@dataclass
class PrecisionMetrics(StageMetrics):
    """The conversion's own metrics (``trtpack.precision.metrics``), as report.json holds
    them."""

    conversion: Fp16Metrics | Int8Metrics

    def to_dict(self) -> JsonObject:
        return self.conversion.as_dict()


class ConversionView:
    """What a conversion sees of its stage (``trtpack.precision.conversion.ConversionContext``):
    the stage's context, with the artifacts it reads by their names."""

    def __init__(self, ctx: StageContext) -> None:
        self.context = ctx
        self.plan = ctx.plan
        self.stage = ctx.stage
        self.stage_dir = ctx.stage_dir
        self.log: logging.Logger = ctx.log
        self.artifacts = ctx.artifacts.named()

    def progress(self, message: str) -> None:
        self.context.progress(message)

    def artifact(self, name: str) -> Path:
        if name not in self.artifacts:
            raise StageError(self.stage, f"needs artifact '{name}' that no earlier stage produced")
        return self.artifacts[name]


def run(ctx: StageContext) -> StageOutcome:
    precision = ctx.plan.precision
    if precision not in MODELOPT_MODES:
        raise UserInputError(f"the precision stage converts to fp16 or int8, not {precision}")
    return convert(ctx, precision)


def convert(ctx: StageContext, precision: str, share_gate: bool = True) -> StageOutcome:
    """The FP16 or INT8 conversion of the FP32 ONNX into ``ctx.stage_dir`` (the CPU model
    stage runs the INT8 one itself, only when its first CPU form fails; ``share_gate``
    False: ``--min-int8-share`` is judged on the model served instead)."""
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=ctx.stage_dir))
    # the first conversion's worker imports ModelOpt while its job is prepared here (none
    # when trtpack's own INT8 Q/DQ makes it)
    worker = _EARLY_WORKERS.pop(precision, None) or (
        None if precision == "int8" and first_conversion_is_own(ctx.plan)
        else ModelOptWorker(precision, ctx.stage_dir))
    try:
        source = prepare_source(ctx.needs(ctx.artifacts.onnx, "onnx"), work / "source")
        view = ConversionView(ctx)
        result = (Fp16Conversion(view, work, source, worker).run() if precision == "fp16"
                  else Int8Conversion(view, work, source, worker, share_gate=share_gate).run())
    finally:
        if worker is not None:
            worker.close()
        shutil.rmtree(work, ignore_errors=True)
    return StageOutcome(artifacts=Artifacts.from_named(result.artifacts),
                        metrics=PrecisionMetrics(result.metrics),
                        verification=result.verification, warnings=result.warnings,
                        message=result.message)
