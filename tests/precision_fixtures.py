"""Helpers for the precision-stage tests: run the stage directly on the FP32 artifacts of a
real tiny-bert build (the session's ``tiny_build``), with recipes changed per test."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import numpy as np

from trtpack.options import BuildPlan
from trtpack.report import VerificationRow
from trtpack.sources.recipe import Recipe
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import StageContext

REPO = Path(__file__).resolve().parents[1]
CALIBRATION_TEXT = REPO / "data" / "calibration" / "sentences.txt"
HELD_OUT_TEXT = REPO / "data" / "calibration" / "heldout.txt"
TINY_PROFILES = ["1x4:2x8:4x16", "2x16:4x32:8x64"]  # those of conftest's tiny_build


def fp32_artifacts(build_dir: Path) -> dict[str, Path]:
    """The artifacts a precision stage sees, from a finished fp32 build folder."""
    arts = build_dir / "artifacts"
    onnx = arts / "simplify" / "model.onnx"
    if not onnx.is_file():
        onnx = arts / "export" / "model.onnx"
    found = {"onnx": onnx, "fp32_outputs": arts / "verify" / "fp32_outputs.npz"}
    if (arts / "export" / "tokenizer").is_dir():
        found["tokenizer"] = arts / "export" / "tokenizer"
    return found


def build_options(model: str, precision: str, out: Path, profiles: list[str] | None = None,
                  **changes: Any) -> BuildPlan:
    from trtpack.api import BuildRequest, resolve_options

    # FP16 is converted for a GPU target (--target cpu serves FP32 and skips it)
    gpu = precision == "fp16"
    plan, _ = resolve_options(BuildRequest(
        model=model, target="g5" if gpu else "cpu", build_engine=not gpu,
        precision=precision, profiles=profiles or [], random_weights=True, out=out))
    return dataclasses.replace(plan, **changes)


def with_recipe(plan: BuildPlan, **recipe_changes: Any) -> BuildPlan:
    """``options`` with recipe fields replaced (values validated through the Recipe model)."""
    data = plan.recipe.model_dump()
    data.update(recipe_changes)
    return dataclasses.replace(plan, recipe=Recipe.model_validate(data))


def strict_gate(plan: BuildPlan, precision: str, **tolerance: float) -> BuildPlan:
    """``options`` with the recipe's ``precision`` gate replaced by ``tolerance``
    (``min_cosine``, ``atol``, ...)."""
    verify = plan.recipe.verify.model_dump()
    verify[precision] = tolerance
    return with_recipe(plan, verify=verify)


def make_context(plan: BuildPlan, artifacts: dict[str, Path], stage_dir: Path
                 ) -> tuple[StageContext, list[str], Path]:
    """A precision StageContext logging to a file; (context, progress messages, log path)."""
    stage_dir.mkdir(parents=True)
    log_path = stage_dir.parent / f"{stage_dir.name}.log"
    logger = logging.getLogger(f"trtpack.test.precision.{stage_dir}")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.addHandler(logging.FileHandler(log_path))
    messages: list[str] = []
    kwargs: dict[str, Any] = {
        "plan": plan, "stage": "precision", "stage_dir": stage_dir,
        "artifacts": Artifacts.from_named(artifacts), "log": logger,
        "on_progress": lambda event: messages.append(event.message),
    }
    if "build_dir" in {f.name for f in dataclasses.fields(StageContext)}:
        kwargs["build_dir"] = stage_dir.parent
    return StageContext(**kwargs), messages, log_path


@dataclasses.dataclass
class PrecisionRun:
    """The precision stage's outcome as report.json and the stage cache record it: its
    artifacts by name, its metrics as a dict."""

    artifacts: dict[str, Path]
    metrics: dict[str, Any]
    verification: list[VerificationRow]
    warnings: list[str]
    message: str


def run_stage(plan: BuildPlan, artifacts: dict[str, Path], stage_dir: Path
              ) -> tuple[PrecisionRun, list[str], Path]:
    """Run the precision stage once; (outcome, progress messages, log file)."""
    from trtpack.stages import precision

    ctx, messages, log_path = make_context(plan, artifacts, stage_dir)
    try:
        outcome = precision.run(ctx)
    finally:
        for handler in list(ctx.log.handlers):
            ctx.log.removeHandler(handler)
            handler.close()
    return PrecisionRun(outcome.artifacts.named(), outcome.metrics.to_dict(),
                        outcome.verification, outcome.warnings, outcome.message
                        ), messages, log_path


def tiny_npz(path: Path, samples: int = 48, seq: int = 16, seed: int = 3) -> Path:
    """Realistic tiny-bert calibration arrays: in-vocabulary ids, padded masks."""
    from trtpack.sources.resolve import resolve_model
    from trtpack.verify.samples import make_inputs

    recipe = resolve_model("tiny-bert")
    shapes = {s.name: (samples, seq) for s in recipe.input_specs()}
    feeds = make_inputs(recipe.input_specs(), shapes, vocab_size=1000, seed=seed)
    with open(path, "wb") as f:
        np.savez(f, **feeds)  # type: ignore[arg-type]
    return path


def transformer_graph(nodes: list[Any], inits: list[Any], inputs: dict[str, int],
                      outputs: tuple[str, ...] = ("y",)) -> Any:
    """A small ONNX model of ``nodes`` (default and ``com.microsoft`` domains, opset 18) whose
    inputs are FLOAT (batch, seq, width) tensors, ``inputs`` giving each one's width."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, "block", [helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                       ["batch", "seq", width])
                         for name, width in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in outputs],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid("com.microsoft", 1)])
