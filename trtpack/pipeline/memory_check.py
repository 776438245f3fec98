"""The memory a build will need at each profile corner, estimated before any stage runs and
checked against what this machine has (``resources.available_memory``): a profile no stage
could hold is refused in seconds (exit 2) instead of being found by the kernel's OOM killer
an hour in. ``--skip-memory-check`` builds anyway.

The estimate works from the model itself, not from architecture fields: from the ONNX graph
(an ONNX model in), or from one forward pass of the PyTorch module traced on the meta device
(``pytorch.footprint``). Each stage's process is then its imports, some copies of the
weights, and a multiple of the activations (``resources.activation_bytes``), by the
constants of ``STAGE_MEMORY``, calibrated in ``benchmarks/memory_estimate.py``
(``benchmarks/README.md``: estimate against measured peak per stage).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from trtpack.errors import MemoryRefusal, UserInputError
from trtpack.onnx_tools.footprint import Footprint, graph_footprint, load_graph
from trtpack.options import BuildPlan
from trtpack.processes import run_forked
from trtpack.resources import AvailableMemory, available_memory

MB = 2**20


@dataclass(frozen=True)
class StageMemory:
    """One stage's process, as the estimate models it: ``base`` bytes of imports and
    bookkeeping, ``weight_copies`` times the weights, ``activation_factor`` times the
    activations of the PyTorch module run eagerly (``eager``: export) or of the ONNX graph
    (``runtime``: ONNX Runtime, whose arena grows past the planned peak)."""

    stage: str
    base: int
    weight_copies: float
    activation_factor: float
    runs: str  # "eager" (PyTorch) or "runtime" (ONNX Runtime)


# calibrated on tiny-bert, minilm and a convolutional ONNX model (benchmarks/README.md)
STAGE_MEMORY: tuple[StageMemory, ...] = (
    # the export's imports alone measured 530 MB on tiny-bert in a venv in use for a while and
    # 615-630 MB in a just-installed one (the same imports map more of the shared libraries'
    # file pages there: RssFile 114 against 178 MB, RssAnon the same), as in CI's fresh clone
    StageMemory("export", 700 * MB, 1.5, 1.5, "eager"),
    StageMemory("import", 150 * MB, 1.5, 4.0, "runtime"),
    StageMemory("verify", 150 * MB, 1.5, 4.0, "runtime"),
    # FP32/FP16: the fusions run with the weights left on disk, then ONNX Runtime checks the
    # fused model at the corners, as verify does (bert-base, bert-large: benchmarks/README.md);
    # its imports alone measured 196-201 MB on tiny-bert
    StageMemory("cpu_model", 250 * MB, 1.5, 4.0, "runtime"),
    # TensorRT-RTX's parser and builder (nothing runs: no activations) hold the ONNX's
    # weights about three times (parsed, in the network, in the serialized engine): at FP32
    # (the estimate's weights; FP16/INT8 graphs need about half) 338 MB on tiny-bert, 653 MB
    # on minilm, 1,147 MB on distilbert, 7,337 MB on big-embedding (2.46 GB of weights);
    # bert-large FP16 2.48 GB (benchmarks/README.md, "Compile check")
    StageMemory("compile_check", 400 * MB, 3.0, 0.0, "runtime"),
)
# INT8 builds: the CPU forms load the fused model's weights, split the outlier channels and
# quantize (ONNX Runtime's quantizer holds its own copies); fitted while the FP32 fusions
# still loaded the weights (they now stay on disk), so a bound from above
CPU_MODEL_INT8 = StageMemory("cpu_model", 200 * MB, 6.0, 1.5, "runtime")
# INT8 for a GPU target: the precision stage's process, trtpack's own Q/DQ (no ModelOpt
# worker): the FP32 references and the calibration in one ONNX Runtime session (the weights,
# pre-packed, and one batch's activations), then ONNX Runtime checking the Q/DQ model at the
# corners, as verify does, two runs at a time; fitted on bert-base and bert-large at
# 1x128:16x128:128x128 as an upper bound (benchmarks/README.md, "INT8's precision stage").
# ModelOpt's quantize, which it replaced, held about ten copies of the weights (below)
PRECISION_INT8 = StageMemory("precision", 300 * MB, 2.5, 4.0, "runtime")
# the same with ``mse`` calibration: the calibration run also holds one calibration batch's
# activations of every quantized tensor while it counts them into histograms (bert-large's
# design card: 5,629 MB against max's 3,472 MB; benchmarks/README.md, "INT8 calibration by
# least squared error"). Fitted as an upper bound where the calibration batch (the opt
# corner) is 1/8 of the max corner's rows or less, as in the design profile; a calibration
# batch as large as the max corner holds up to 8 times more than this models
PRECISION_INT8_MSE = StageMemory("precision", 300 * MB, 2.5, 6.0, "runtime")
# INT8 through ModelOpt's quantize (entropy calibration, op types other than MatMul/Gemm/
# Conv, FP16 kept nodes without the fallback): its worker held about ten copies of the
# weights at once and ran each calibration batch with its activations alive together;
# fitted on bert-base and bert-large (8.2 and 18.7 GB measured) as an upper bound
PRECISION_INT8_MODELOPT = StageMemory("precision", 1600 * MB, 12.0, 4.0, "runtime")
# A stage with a head start (``Stage.head_start``: the CPU model fusing its graph, weights
# left on disk) runs its process beside the stage before it, which counts it in its peak:
# verify measured 130-200 MB more with it on tiny-bert and minilm (benchmarks/README.md)
HEAD_START = 200 * MB


@dataclass(frozen=True)
class CornerEstimate:
    """The estimate at one profile corner: the model's footprint there and the bytes each
    stage of this build would need."""

    profile: int
    corner: str
    shapes: dict[str, list[int]]
    weights: int
    activations: dict[str, int]  # "eager" / "runtime" -> bytes
    stages: dict[str, int]  # stage -> estimated peak bytes

    @property
    def largest(self) -> tuple[str, int]:
        stage = max(self.stages, key=lambda s: self.stages[s])
        return stage, self.stages[stage]

    def shapes_text(self) -> str:
        return ", ".join(f"{n}={'x'.join(str(d) for d in s)}" for n, s in self.shapes.items())


def _stages(plan: BuildPlan) -> list[StageMemory]:
    """The modelled stages of this build; one that runs just before a stage with a head
    start holds ``HEAD_START`` more."""
    from trtpack.pipeline.stage import STAGES

    runs = [s for s in STAGES if s.applies(plan) and s.skip_reason(plan) is None]
    names = {s.name for s in runs}
    beside_head_start = {s.name for s, after in itertools.pairwise(runs) if after.head_start}
    int8 = plan.precision == "int8" or plan.auto_precision
    found = []
    modelled = (*STAGE_MEMORY, int8_precision_memory(plan)) if int8 else STAGE_MEMORY
    for m in modelled:
        if m.stage not in names:
            continue
        m = CPU_MODEL_INT8 if int8 and m.stage == CPU_MODEL_INT8.stage else m
        found.append(replace(m, base=m.base + HEAD_START) if m.stage in beside_head_start
                     else m)
    return found


def int8_precision_memory(plan: BuildPlan) -> StageMemory:
    """The INT8 precision stage's model: trtpack's own Q/DQ (with ``mse``'s histograms or
    without), or ModelOpt's worker."""
    from trtpack.precision.int8.qdq import HISTOGRAM_METHODS, first_conversion_is_own

    if not first_conversion_is_own(plan):
        return PRECISION_INT8_MODELOPT
    method = plan.calibration_method or plan.recipe.precision_options.int8.calibration_method
    # auto: the same histogram pass as mse, one judging session at a time (choose_method)
    return PRECISION_INT8_MSE if method in HISTOGRAM_METHODS else PRECISION_INT8


def stage_bytes(model: StageMemory, weights: int, activations: int) -> int:
    return int(model.base + model.weight_copies * weights
               + model.activation_factor * activations)


def estimate_corners(plan: BuildPlan) -> list[CornerEstimate]:
    """The max corner of every profile of ``plan``, estimated (imports torch for a PyTorch
    model: run it in a process of its own, ``estimate_in_child``). A profile's max is at
    least its min and opt in every dimension (``shapes``' rule, as TensorRT's), and a model
    needs no less memory as its inputs grow: the max corner is the one that needs the most,
    and tracing the other two (twice each, eager and as ONNX Runtime runs it) is left out
    (what it cost: benchmarks/README.md, "Figures behind design choices")."""
    corners = [(index, which, shapes) for index, profile in enumerate(plan.profiles)
               for which, shapes in profile.corners() if which == "max"]
    shape_list = [{n: list(s) for n, s in shapes.items()} for _, _, shapes in corners]
    footprints: dict[str, list[Footprint]]
    if plan.recipe.source.onnx:
        graph = load_graph(Path(plan.recipe.source.onnx))
        footprints = {"runtime": [graph_footprint(graph, s) for s in shape_list]}
    else:
        from trtpack.pytorch.footprint import recipe_footprints

        footprints = recipe_footprints(plan.recipe, shape_list)
    stages = _stages(plan)
    found = []
    for k, (index, which, _) in enumerate(corners):
        acts = {runs: f[k].activations for runs, f in footprints.items()}
        weights = footprints["runtime"][k].weights
        found.append(CornerEstimate(
            index, which, shape_list[k], weights, acts,
            {m.stage: stage_bytes(m, weights, acts.get(m.runs, acts["runtime"]))
             for m in stages}))
    return found


def output_bytes(plan: BuildPlan, shapes: dict[str, list[int]]) -> int | None:
    """The bytes of the model's outputs at a corner, from the recipe's declared output axes
    (a name is the input axis of that name; FP32): they are activations too (kept to the
    end), so this is a lower bound of the activations known without loading anything. None
    when an axis is not known at the corner."""
    dims: dict[str, int] = {}
    for spec in plan.recipe.input_specs():
        for axis, size in zip(spec.axes, shapes.get(spec.name, ()), strict=False):
            if isinstance(axis, str):
                dims.setdefault(axis, size)
    total = 0
    for output in plan.recipe.outputs:
        count = 1
        for axis in output.axes:
            known = axis if isinstance(axis, int) else dims.get(axis)
            if known is None or known < 0:
                return None
            count *= known
        total += 4 * count
    return total


def lower_bounds(plan: BuildPlan) -> list[CornerEstimate]:
    """Every corner's estimate with the weights left out and the outputs as the only
    activations (``output_bytes``): no import, no model loaded."""
    stages = _stages(plan)
    found = []
    for index, profile in enumerate(plan.profiles):
        for which, corner in profile.corners():
            shapes = {n: list(s) for n, s in corner.items()}
            outputs = output_bytes(plan, shapes)
            if outputs is not None:
                found.append(CornerEstimate(
                    index, which, shapes, 0, {"runtime": outputs, "eager": outputs},
                    {m.stage: stage_bytes(m, 0, outputs) for m in stages}))
    return found


def _estimate_to_file(plan: BuildPlan, path: str) -> int:
    estimates = estimate_corners(plan)
    Path(path).write_text(json.dumps([asdict(e) for e in estimates]))
    return 0


ESTIMATES = "memory"  # the stage cache's folder of stored estimates (files: no cache entry)


def stored_estimate(plan: BuildPlan) -> Path | None:
    """Where the estimates of a PyTorch model's build are kept in the stage cache, keyed like
    its export stage (model files, recipe, profiles) and trtpack's code and packages: a
    rebuild does not trace the module again. None for an ONNX model (its graph is read in
    well under a second) or without the cache."""
    if not plan.use_cache or plan.recipe.source.onnx:
        return None
    from trtpack.pipeline.cache import tool_versions
    from trtpack.stages.export import fingerprint

    key = hashlib.sha256(json.dumps({"export": fingerprint(plan), "versions": tool_versions()},
                                    sort_keys=True, default=str).encode()).hexdigest()[:24]
    return plan.cache_dir / ESTIMATES / f"{key}.json"


def estimate_in_child(plan: BuildPlan, timeout: float = 120.0
                      ) -> list[CornerEstimate] | str:
    """``estimate_corners`` in a forked process (torch's imports do not stay in the build's
    own process), or as stored by an earlier build (``stored_estimate``); the estimates, or
    why there are none (one line)."""
    stored = stored_estimate(plan)
    if stored is not None and stored.is_file():
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            return [CornerEstimate(**e) for e in json.loads(stored.read_text())]
    with tempfile.TemporaryDirectory(prefix="trtpack-memory-") as tmp:
        result, log = Path(tmp) / "estimate.json", Path(tmp) / "estimate.log"
        code = run_forked(_estimate_to_file, (plan, str(result)), timeout, log)
        if code != 0 or not result.is_file():
            lines = [line for line in log.read_text(errors="replace").splitlines()
                     if line.strip()] if log.is_file() else []
            why = lines[-1].strip() if lines else f"ran past {timeout:.0f} s" \
                if code is None else f"exit {code}"
            return why
        if stored is not None:
            _store(stored, result.read_text())
        return [CornerEstimate(**e) for e in json.loads(result.read_text())]


def gb(n: float) -> str:
    if n >= 2**30:
        return f"{n / 2**30:,.1f} GB"
    return f"{n / MB:,.0f} MB" if n >= MB else f"{n / 1024:,.0f} KB"


def refusal(estimate: CornerEstimate, available: AvailableMemory,
            lower_bound: bool = False) -> MemoryRefusal:
    stage, needed = estimate.largest
    model = next(m for m in (*STAGE_MEMORY, CPU_MODEL_INT8, PRECISION_INT8)
                 if m.stage == stage)
    activations = estimate.activations.get(model.runs, estimate.activations["runtime"])
    what = (f"at least {gb(needed)} in the {stage} stage (its outputs alone are "
            f"{gb(activations)})" if lower_bound else
            f"about {gb(needed)} in the {stage} stage (weights {gb(estimate.weights)}, "
            f"activations {gb(activations)})")
    return MemoryRefusal(
        f"profile {estimate.profile} {estimate.corner} ({estimate.shapes_text()}) needs {what},"
        f" and {gb(available.bytes)} is available ({available.source})",
        hint="choose a smaller --profile, or add --skip-memory-check to build anyway")


def memory_available() -> AvailableMemory | None:
    """``resources.available_memory``, a bad ``TRTPACK_MEMORY_AVAILABLE`` as bad input."""
    try:
        return available_memory()
    except ValueError as e:
        raise UserInputError(str(e)) from None


def check_build_memory(plan: BuildPlan, available: AvailableMemory | None = None,
                       trace_in_export: bool = False) -> list[str]:
    """Refuse (``MemoryRefusal``, exit 2) a build whose estimate at some corner exceeds the
    memory available, naming the corner; the warnings when nothing could be estimated.
    ``trace_in_export``: a PyTorch model whose estimate is not stored is traced in the export
    stage's own process instead (``check_in_export``), which imports torch and its model code
    anyway, rather than in a process of its own that imports them once more."""
    available = available or memory_available()
    if available is None:
        return ["memory not checked: this system does not say how much memory is available"]
    over = [e for e in lower_bounds(plan) if e.largest[1] > available.bytes]
    if over:  # known without loading the model
        raise refusal(max(over, key=lambda e: e.largest[1]), available, lower_bound=True)
    if (trace_in_export and traced_in_export(plan)) or not meta_traceable(plan):
        return []
    return _check_estimates(estimate_in_child(plan), available)


def meta_traceable(plan: BuildPlan) -> bool:
    """Whether the model can be estimated beyond its outputs (``lower_bounds``): an ONNX
    graph or a PyTorch module that runs on the meta device; a TorchScript module cannot (its
    weights cannot move there)."""
    return plan.recipe.source.torchscript is None


def traced_in_export(plan: BuildPlan) -> bool:
    """A PyTorch model whose estimate is not stored: ``check_build_memory(trace_in_export=
    True)`` leaves its trace to the export stage (``check_in_export``)."""
    if plan.recipe.source.onnx:
        return False
    stored = stored_estimate(plan)
    return stored is None or not stored.is_file()


def _check_estimates(estimates: list[CornerEstimate] | str,
                     available: AvailableMemory) -> list[str]:
    if isinstance(estimates, str):
        return [f"memory not estimated ({estimates}); the build goes on unchecked"]
    over = [e for e in estimates if e.largest[1] > available.bytes]
    if over:
        raise refusal(max(over, key=lambda e: e.largest[1]), available)
    return []


def check_in_export(plan: BuildPlan,
                    available: AvailableMemory | None = None) -> list[str]:
    """``check_build_memory``'s trace of a PyTorch model, in the export stage's process
    before the export starts (torch and the model code are imported there anyway): the
    estimate is stored for a rebuild (``stored_estimate``), a corner over the memory
    available is refused (``MemoryRefusal``: the build stops and writes nothing), and the
    warnings when nothing could be estimated."""
    if not plan.check_memory_in_export or plan.recipe.source.onnx \
            or not meta_traceable(plan):
        return []
    available = available or memory_available()
    if available is None:
        return []  # check_build_memory said so already
    stored = stored_estimate(plan)
    if stored is not None and stored.is_file():
        return []  # check_build_memory checked it
    try:
        estimates: list[CornerEstimate] | str = estimate_corners(plan)
    except Exception as e:  # the model's own failure: the export itself says it
        lines = [line for line in str(e).splitlines() if line.strip()]
        estimates = f"{type(e).__name__}: {lines[0].strip()}" if lines else type(e).__name__
    if stored is not None and not isinstance(estimates, str):
        _store(stored, json.dumps([asdict(e) for e in estimates]))
    return _check_estimates(estimates, available)


def _store(stored: Path, text: str) -> None:
    with contextlib.suppress(OSError):
        stored.parent.mkdir(parents=True, exist_ok=True)
        partial = stored.with_name(f"{stored.name}.tmp-{os.getpid()}")
        partial.write_text(text)
        partial.replace(stored)
