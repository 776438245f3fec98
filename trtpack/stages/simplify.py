"""Simplify with onnxsim, keeping the dynamic axes. onnxsim sees the graph without its large
weights (see ``trtpack.onnx_tools.simplify_graph``), so models over 2 GB are simplified too and the
weights are never copied through protobuf. This stage runs in a process of its own that
imported onnx and onnxsim while the export ran; onnxsim runs in a fork of it, so a crash in
its C++ code or a hang (``TRTPACK_ONNXSIM_TIMEOUT`` seconds, default 1800) keeps the
unsimplified model and the report says why: this stage never fails the build.

On a graph trtpack exported (not a user's ONNX, whose outputs later stages match exactly),
each erf GELU is then written in the order ONNX Runtime fuses
(``trtpack.onnx_tools.gelu_form``): the same values as written, and every ONNX Runtime
session over the graph (verify's, the precision stage's) runs one ``Gelu`` kernel instead of
five passes."""

from __future__ import annotations

import contextlib
import errno
import json
import os
from dataclasses import dataclass
from pathlib import Path

from trtpack.onnx_tools.files import graph_summary
from trtpack.onnx_tools.simplify_graph import import_onnxsim, simplify_file
from trtpack.options import BuildPlan
from trtpack.processes import NO_SPACE_EXIT, run_forked
from trtpack.report import JsonObject
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import StageContext, StageMetrics, StageOutcome

TIMEOUT_ENV = "TRTPACK_ONNXSIM_TIMEOUT"
DEFAULT_TIMEOUT_SECONDS = 1800.0


@dataclass
class SimplifyMetrics(StageMetrics):
    nodes_before: int
    nodes_after: int  # == nodes_before when onnxsim was skipped or failed
    op_types: dict[str, int] | None = None
    weights_outside_onnxsim: int | None = None  # initializers onnxsim never saw
    external_data: bool | None = None
    gelus_rewired: int | None = None  # erf GELUs written in ONNX Runtime's fusable order


def preload() -> None:
    """Import onnxsim (without torch: ``import_onnxsim``) while the stages before run: the
    stage's process runs it after its ``warm_modules`` (``isolate.import_warm``), a stage
    server's template once (``pipeline.stage_server``)."""
    with contextlib.suppress(ImportError):  # not installed: run() says so
        import_onnxsim()


def rewires_gelus(plan: BuildPlan) -> bool:
    """Whether the erf GELUs are rewritten: on a graph trtpack exported, not on a user's ONNX."""
    return plan.recipe.source.onnx is None


def fingerprint(plan: BuildPlan) -> JsonObject:
    return {"tool": "onnxsim", "node_metadata": 1, "rewire_gelus": rewires_gelus(plan)}


def timeout_seconds() -> float:
    return float(os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_SECONDS)


def _dynamic_dims(path: Path) -> dict[str, list[str | int]]:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return {
        v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in (*model.graph.input, *model.graph.output)
    }


def run(ctx: StageContext) -> StageOutcome:
    src = ctx.needs(ctx.artifacts.onnx, "onnx")
    before = graph_summary(src)["nodes"]
    try:
        import_onnxsim()
    except ImportError:
        reason = "onnxsim is not installed; kept as exported (pip install onnxsim)"
        return StageOutcome(status="skipped", message=reason, warnings=[reason],
                            metrics=SimplifyMetrics(before, before))
    dst = ctx.stage_dir / "model.onnx"
    result_path = ctx.stage_dir / "onnxsim.json"
    output = ctx.stage_dir / "onnxsim.log"
    ctx.progress(f"onnxsim on {before} nodes")
    limit = timeout_seconds()
    code = run_forked(simplify_file, (str(src), str(dst), str(result_path),
                                      rewires_gelus(ctx.plan)), limit, output)
    if code == NO_SPACE_EXIT:  # not onnxsim's failure: the build's (said in words)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(ctx.stage_dir))
    text = output.read_text(errors="replace") if output.is_file() else ""
    output.unlink(missing_ok=True)
    ctx.log.info("onnxsim output:\n%s", text)
    failure = None if code == 0 else f"timed out after {limit:g} s" if code is None else (
        (text.strip().splitlines() or [f"exit code {code}"])[-1])
    if failure is None and _dynamic_dims(dst) != _dynamic_dims(src):
        failure = "it changed the model's input/output shapes"
    if failure is not None:
        for path in (dst, dst.with_name(dst.name + ".data"), result_path):
            path.unlink(missing_ok=True)
        reason = f"onnxsim failed ({failure}); kept the unsimplified model"
        return StageOutcome(status="skipped", message=reason, warnings=[reason],
                            metrics=SimplifyMetrics(before, before))
    result = json.loads(result_path.read_text())
    result_path.unlink()
    after = result["nodes_after"]
    return StageOutcome(
        artifacts=Artifacts(onnx=dst),
        metrics=SimplifyMetrics(
            before, after, op_types=graph_summary(dst)["op_types"],
            weights_outside_onnxsim=result["weights_outside_onnxsim"],
            external_data=result["external_data"], gelus_rewired=result["gelus_rewired"]),
        message=f"{before} → {after} nodes",
    )
