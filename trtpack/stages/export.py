"""Export: load the model once, record PyTorch outputs at every profile corner, write ONNX
(``trtpack.stages.torch_export``: the exporters).

The reference cases (inputs + PyTorch outputs) are saved so later stages never need the
model or torch again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtpack.cases import Case, save_cases
from trtpack.errors import UserInputError
from trtpack.onnx_tools.files import graph_summary
from trtpack.options import BuildPlan
from trtpack.pytorch.models import LoadedModel, load_model, source_directory
from trtpack.pytorch.user_modules import call_program_module, load_torchscript
from trtpack.report import JsonObject
from trtpack.sources.recipe import Recipe
from trtpack.stages.artifacts import Artifacts
from trtpack.stages.base import StageContext, StageMetrics, StageOutcome
from trtpack.stages.reference_pass import (
    RowPieces,
    beside_cases,
    copy_sharing_weights,
    reference_beside,
    run_torch,
)
from trtpack.stages.torch_export import export_onnx
from trtpack.verify.sample_files import SampleInputs, file_state
from trtpack.verify.samples import make_inputs

if TYPE_CHECKING:
    import torch

# Young objects collected 140x less often than Python's default (700, 10, 10) in the
# export's process, which makes millions of short-lived objects while tracing. Only here: other
# stages keep the default (applied everywhere, it raised a later stage's memory peak).
GC_THRESHOLDS = (100_000, 50, 100)


@dataclass
class ExportMetrics(StageMetrics):
    parameters: int
    weights: str  # "pretrained" or "random"
    nodes: int
    opset: int | None
    source: str  # what the model came from, in words ("TorchScript silero_vad.jit")
    exporter: str  # the exporter that wrote the model: "dynamo" or "legacy" (TorchScript)
    exporter_fallback: str  # why the TorchScript exporter wrote it instead ("" when it did not)
    external_data: bool  # weights in model.onnx.data
    decomposition: str  # whether the exporter's decomposition re-trace ran, and why
    cases: int  # reference cases (profile corners)
    op_types: dict[str, int]
    sample_inputs: str | None = None  # where --sample-inputs' samples were fed, or None


def _directory_fingerprint(path: Path | None) -> list[tuple[str, int, int]]:
    if path is None or not path.is_dir():
        return []
    return sorted(
        (str(p.relative_to(path)), p.stat().st_size, int(p.stat().st_mtime))
        for p in path.rglob("*") if p.is_file()
    )


def fingerprint(plan: BuildPlan) -> JsonObject:
    r = plan.recipe
    return {
        "source": r.source.model_dump(),
        "source_files": plan.source_files,  # a PyTorch source's files (their contents)
        "files": _directory_fingerprint(source_directory(r.source)),
        "task": r.task, "model_class": r.model_class, "config": r.config,
        "tokenizer": r.tokenizer, "pooling": r.pooling.model_dump() if r.pooling else None,
        "vocab_size": r.vocab_size,
        "tokenizer_source": r.tokenizer_source.model_dump() if r.tokenizer_source else None,
        "inputs": [i.model_dump() for i in r.inputs],
        "outputs": [o.model_dump() for o in r.outputs],
        "opset": plan.opset, "exporter": r.exporter,
        "profiles": [p.to_dict() for p in plan.profiles],
        "random_weights": plan.random_weights, "seed": plan.seed,
        "sample_inputs": file_state(plan.sample_inputs),
    }


def output_selector(model: torch.nn.Module, recipe: Recipe) -> torch.nn.Module:
    import torch

    input_names = [i.name for i in recipe.inputs]
    output_names = [o.name for o in recipe.outputs]
    constants = dict(recipe.source.arguments)
    positional = recipe.source.exported_program is not None  # as it was exported

    class OutputSelector(torch.nn.Module):
        """Positional inputs in the recipe's order, a tuple of the recipe's outputs."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            named = dict(zip(input_names, args, strict=True))
            out = call_program_module(self.model, named) if positional else \
                self.model(**named, **constants)
            if isinstance(out, torch.Tensor):
                return (out,)
            if isinstance(out, dict) or hasattr(out, "keys"):
                missing = [n for n in output_names if n not in out]
                if missing:
                    raise UserInputError(
                        f"model has no output {missing}; it returns {list(out.keys())}"
                    )
                return tuple(out[n] for n in output_names)
            return tuple(out[: len(output_names)])

    selector = OutputSelector()
    selector.training = False  # the model is in eval mode already (an unlifted
    return selector            # ExportedProgram's module refuses .eval())


def _vocab_size(loaded: LoadedModel, recipe: Recipe) -> int:
    if recipe.vocab_size:
        return recipe.vocab_size
    for obj in (loaded.config, loaded.tokenizer):
        size = getattr(obj, "vocab_size", None)
        if isinstance(size, int) and size > 0:
            return size
    return 30522


def build_cases(plan: BuildPlan, loaded: LoadedModel
                ) -> tuple[list[Case], list[str], str | None]:
    """The verification cases, warnings (corners no --sample-inputs sample fits) and where
    the --sample-inputs samples were fed (``SampleInputs.trace``)."""
    specs = plan.recipe.input_specs()
    samples = SampleInputs.of(plan, _vocab_size(loaded, plan.recipe))
    cases: list[Case] = []
    for index, profile in enumerate(plan.profiles):
        for k, (corner, shapes) in enumerate(profile.corners()):
            inputs = make_inputs(specs, shapes, tokenizer=loaded.tokenizer,
                                 vocab_size=_vocab_size(loaded, plan.recipe),
                                 seed=plan.seed + 10 * index + k, offset=5 * k + index,
                                 values=plan.recipe.value_rules())
            if not samples.use(inputs, shapes):
                samples.unfitted.append(f"profile {index} {corner}")
            cases.append(Case(index, corner, inputs))
    return cases, samples.warnings(), samples.trace(plan.sample_inputs, len(cases))


def run(ctx: StageContext) -> StageOutcome:
    plan = ctx.plan
    recipe = plan.recipe
    ctx.progress("loading the model" + (" (random weights)" if plan.random_weights else ""))
    loaded = load_model(recipe, random_weights=plan.random_weights, seed=plan.seed)
    wrapper = output_selector(loaded.module, recipe)
    fresh = None
    if recipe.source.torchscript:
        path = recipe.source.torchscript
        fresh = lambda: output_selector(load_torchscript(path), recipe)  # noqa: E731
    cases, sample_warnings, samples_fed = build_cases(plan, loaded)
    model_bytes = sum(t.numel() * t.element_size() for t in
                      (*loaded.module.parameters(), *loaded.module.buffers()))
    exporter = "legacy" if recipe.source.torchscript else recipe.exporter
    onnx_path = ctx.stage_dir / "model.onnx"
    exporting = f"exporting to ONNX (opset {plan.opset}, {exporter} exporter)"
    beside = copy_sharing_weights(wrapper) if fresh is None and len(cases) > 1 else None
    if beside is None:
        ctx.progress("running PyTorch at every profile corner")
        run_torch(wrapper, recipe, cases, fresh)
        # the exporter traces in Python, on one core: later stages' processes may import on
        # the other
        ctx.spare_core(model_bytes)
        ctx.progress(exporting)
        exported = export_onnx(wrapper, plan, onnx_path, ctx.log,
                               saved=fresh() if fresh is not None else None)
    else:
        parameters = sum(p.numel() for p in loaded.module.parameters())
        besides = beside_cases(cases, parameters)
        left = [c for c in cases if all(c is not b for b in besides)]
        pieces = RowPieces.of(left[0], recipe, parameters) if len(left) == 1 else None
        ctx.spare_core(model_bytes)  # before the progress line, as above (the build's order)
        ctx.progress(f"{exporting}, PyTorch at {len(besides)} of {len(cases)} profile corners "
                     "beside" + (f", then at the rows of {left[0].corner}" if pieces else ""))
        exported = reference_beside(wrapper, recipe, besides,
                                    lambda: export_onnx(beside, plan, onnx_path, ctx.log),
                                    pieces)
        if pieces is not None:
            ctx.log.info("%s: %d of %d rows computed beside the exporter, in pieces of %d",
                         left[0].corner, pieces.beside, pieces.total, pieces.rows)
        elif left:
            ctx.progress(f"running PyTorch at the largest profile corner ({left[0].corner})")
            run_torch(wrapper, recipe, left)
    reference = ctx.stage_dir / "reference.npz"
    save_cases(reference, cases)
    ctx.log.info("PyTorch outputs of %d cases saved", len(cases))
    summary = graph_summary(onnx_path)
    ctx.log.info("ONNX model written: %d nodes", summary["nodes"])
    warnings_out: list[str] = list(sample_warnings)
    if exported.fallback:
        warnings_out.append(f"{exported.fallback}; exported with the TorchScript exporter "
                            "(dynamo=False) instead, verified against PyTorch the same way")
    if summary["opset"] != plan.opset:
        warnings_out.append(f"exporter wrote opset {summary['opset']}, asked for {plan.opset}")
    tok_dir = config_path = None
    if loaded.tokenizer is not None:
        tok_dir = ctx.stage_dir / "tokenizer"
        loaded.tokenizer.save_pretrained(str(tok_dir))
    if loaded.config is not None:
        config_path = ctx.stage_dir / "config.json"
        loaded.config.to_json_file(str(config_path))
    params = sum(p.numel() for p in loaded.module.parameters())
    return StageOutcome(
        artifacts=Artifacts(onnx=onnx_path, reference=reference, tokenizer=tok_dir,
                            model_config=config_path),
        metrics=ExportMetrics(
            parameters=params, weights=loaded.weights, nodes=summary["nodes"],
            source=recipe.source.describe(),
            opset=summary["opset"], exporter=exported.exporter,
            exporter_fallback=exported.fallback, external_data=exported.external_data,
            decomposition=exported.decomposition, cases=len(cases),
            op_types=summary["op_types"], sample_inputs=samples_fed),
        warnings=warnings_out,
        message=f"{recipe.source.describe()}: {summary['nodes']} nodes, opset "
                f"{summary['opset']}, {exported.exporter} "
                f"exporter{' (fallback)' if exported.fallback else ''}, "
                f"{params / 1e6:.1f}M parameters ({loaded.weights} weights)"
                + (f", {samples_fed}" if samples_fed else ""),
    )
